"""Language-model training on the offline byte corpus, static or grown in depth (MIDAS).

A run trains a GPT-2-style byte-level LM (:mod:`probekit.tasks.corpus`) with AdamW (linear
warmup, cosine decay, weight decay on matrices, gradient clipping) on the next-token loss of
every position. With ``growth != "static"`` it starts at ``initial_layers`` and, at the stage
boundaries of a Prop-alpha schedule (:func:`probekit.training.growth.growth_plan`), writes a
checkpoint, grows it (:func:`~probekit.training.growth.grow_checkpoint`: copied layers carry
their AdamW moments), writes the grown checkpoint and keeps training. MIDAS-plus
(``residual_scale_start``) multiplies the update of newly inserted layers by a scale that ramps
linearly to 1 over ``residual_scale_steps`` steps.

Training FLOPs are counted as 6 · parameters · tokens per step, summed over stages, so static
and grown runs can be compared at equal final depth. Output folder::

    out/run_config.json   the LMConfig
    out/metrics.jsonl     step, depth, lr, train loss, validation loss and perplexity, FLOPs
    out/stage{k}-before/  checkpoint before the k-th growth;  out/stage{k}-after/  after it
    out/step{n}/          every ``save_every`` steps, if set
    out/final/            the final checkpoint (HF GPT-2 + optimizer.safetensors)

Example:
    >>> cfg = LMConfig(n_layers=4, initial_layers=2, growth="midas", d_model=32, steps=6,
    ...                batch_size=2, seq_len=16, eval_every=3, corpus_max_files=30)
    >>> run = train_lm(cfg, tempfile.mkdtemp(), progress=False)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from probekit.errors import CheckpointError, ConfigError, NumericalError
from probekit.io import atomic_directory, atomic_write_text
from probekit.tasks.corpus import BOS, EOS, VOCAB_SIZE, ByteCorpus
from probekit.training.checkpoint import write_run_config
from probekit.training.growth import METHODS, grow_checkpoint, growth_plan


@dataclass
class LMConfig:
    """A language-model run. ``n_layers`` is the final depth; grown runs start at
    ``initial_layers`` and add ``block_size`` layers per stage. ``corpus_root`` is a folder of
    ``.py`` files (default: the Python standard library)."""

    n_layers: int = 8
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int | None = None
    seq_len: int = 128
    batch_size: int = 32
    steps: int = 2000
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    growth: str = "static"
    initial_layers: int = 2
    block_size: int = 2
    alpha: float = 1.0
    residual_scale_start: float | None = None
    residual_scale_steps: int = 200
    eval_every: int = 200
    eval_sequences: int = 64
    corpus_root: str | None = None
    corpus_max_files: int | None = None
    save_every: int | None = None

    def validate(self) -> None:
        """Raise :class:`ConfigError` on settings that cannot be trained."""
        if self.growth not in ("static",) + METHODS:
            raise ConfigError(
                f"unknown growth {self.growth!r}", fix=f"use 'static' or one of {list(METHODS)}"
            )
        for name in (
            "n_layers",
            "d_model",
            "n_heads",
            "seq_len",
            "batch_size",
            "steps",
            "eval_every",
            "eval_sequences",
        ):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be positive", fix=f"set {name} >= 1")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}",
                fix="choose n_heads dividing d_model",
            )
        if self.residual_scale_start is not None and not 0 <= self.residual_scale_start <= 1:
            raise ConfigError("residual_scale_start must be in [0, 1]", fix="use e.g. 0.1")
        self.plan()

    def plan(self):
        """The growth plan (a single stage for static runs)."""
        if self.growth == "static":
            return growth_plan(self.n_layers, self.n_layers, self.steps, block_size=1)
        return growth_plan(
            self.initial_layers,
            self.n_layers,
            self.steps,
            method=self.growth,
            block_size=self.block_size,
            alpha=self.alpha,
        )

    def hf_config(self, n_layers: int):
        import transformers

        return transformers.GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_positions=self.seq_len,
            n_embd=self.d_model,
            n_layer=n_layers,
            n_head=self.n_heads,
            n_inner=self.d_mlp,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=BOS,
            eos_token_id=EOS,
            architectures=["GPT2LMHeadModel"],
        )


@dataclass
class LMRun:
    """What :func:`train_lm` returns: the metrics table, final checkpoint and FLOPs."""

    metrics: pd.DataFrame
    final: Path
    flops: float
    checkpoints: list[Path]


def _optimizer(model: torch.nn.Module, cfg: LMConfig) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )


def _lr_factor(cfg: LMConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _save(model, optimizer, path: Path, cfg: LMConfig, state: dict) -> Path:
    """An HF checkpoint plus AdamW moments (safetensors) and trainer state (JSON)."""
    from safetensors.torch import save_file

    names = {id(p): n for n, p in model.named_parameters()}
    moments = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p)
            if st:
                moments["exp_avg." + names[id(p)]] = st["exp_avg"].detach().cpu().contiguous()
                moments["exp_avg_sq." + names[id(p)]] = st["exp_avg_sq"].detach().cpu().contiguous()
    with atomic_directory(path) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if moments:
            save_file(moments, str(tmp / "optimizer.safetensors"))
        atomic_write_text(tmp / "trainer_state.json", json.dumps(state))
        write_run_config(tmp, "lm", {"lm": asdict(cfg)})
    return path


def _load(path: Path, cfg: LMConfig, step: int, device: torch.device):
    """Model and optimizer from a checkpoint, the AdamW moments restored."""
    import transformers
    from safetensors.torch import load_file

    from probekit.model import from_pretrained_complete

    model = from_pretrained_complete(transformers.GPT2LMHeadModel, path).to(device)
    model.train()
    optimizer = _optimizer(model, cfg)
    moments_path = path / "optimizer.safetensors"
    if moments_path.exists():
        moments = load_file(str(moments_path))
        for name, p in model.named_parameters():
            if "exp_avg." + name in moments:
                optimizer.state[p] = {
                    "step": torch.tensor(float(step)),
                    "exp_avg": moments["exp_avg." + name].to(device),
                    "exp_avg_sq": moments["exp_avg_sq." + name].to(device),
                }
    return model, optimizer


class _ResidualScale:
    """MIDAS-plus: scale some blocks' update, h + s * (block(h) - h); hooks go on close()."""

    def __init__(self, blocks, layers: list[int]) -> None:
        self.scale = 1.0
        self.handles = []
        for i in layers:
            self.handles.append(blocks[i].register_forward_pre_hook(self._keep, with_kwargs=True))
            self.handles.append(blocks[i].register_forward_hook(self._scale))
        self._input: torch.Tensor | None = None

    def _keep(self, module, args, kwargs):
        self._input = args[0] if args else kwargs["hidden_states"]

    def _scale(self, module, args, output):
        if self.scale == 1.0:
            return output
        hidden = output[0] if isinstance(output, tuple) else output
        scaled = self._input + self.scale * (hidden - self._input)
        return (scaled,) + tuple(output[1:]) if isinstance(output, tuple) else scaled

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def train_lm(
    cfg: LMConfig, out_dir: str | os.PathLike, progress: bool = True, device: str | None = None
) -> LMRun:
    """Train a byte-level LM (static or grown) and return its metrics and final checkpoint."""
    import transformers
    from tqdm.auto import tqdm

    cfg.validate()
    plan = cfg.plan()
    corpus = ByteCorpus(cfg.corpus_root, max_files=cfg.corpus_max_files)  # raises before training
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_run_config(out, "lm", {"lm": asdict(cfg)})
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    val = corpus.sequences(
        "validation",
        cfg.seq_len,
        n=min(cfg.eval_sequences, len(corpus.stream("validation")) // cfg.seq_len),
    )
    torch.manual_seed(cfg.seed)
    model = transformers.GPT2LMHeadModel(cfg.hf_config(plan.depths[0])).to(dev).train()
    optimizer = _optimizer(model, cfg)
    boundaries = dict(zip(plan.boundaries, range(1, len(plan.depths)), strict=True))
    scaler: _ResidualScale | None = None
    scale_start_step = 0
    flops, rows, checkpoints = 0.0, [], []
    tokens_per_step = cfg.batch_size * cfg.seq_len
    start = time.perf_counter()
    bar = tqdm(total=cfg.steps, desc=f"train {cfg.growth}", disable=not progress)
    try:
        for step in range(cfg.steps):
            if step in boundaries:
                k = boundaries[step]
                if scaler is not None:
                    scaler.close()
                    scaler = None
                state = {"step": step, "flops": flops}
                before = _save(model, optimizer, out / f"stage{k}-before", cfg, state)
                after = grow_checkpoint(before, out / f"stage{k}-after", cfg.growth, cfg.block_size)
                checkpoints += [before, after]
                model, optimizer = _load(after, cfg, step, dev)
                if cfg.residual_scale_start is not None:
                    inserted = json.loads((after / "growth.json").read_text())["inserted"]
                    scaler = _ResidualScale(model.transformer.h, inserted)
                    scale_start_step = step
            if scaler is not None:
                ramp = min(1.0, (step - scale_start_step) / max(1, cfg.residual_scale_steps))
                scaler.scale = cfg.residual_scale_start + (1 - cfg.residual_scale_start) * ramp
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * _lr_factor(cfg, step)
            batch = corpus.batch("train", cfg.seq_len, cfg.batch_size, cfg.seed, step).to(dev)
            logits = model(batch, use_cache=False).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1))
            if not torch.isfinite(loss):
                raise NumericalError(
                    f"the training loss became {float(loss)} at step {step}",
                    fix="lower the learning rate or raise the warmup; earlier checkpoints are kept",
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            flops += 6.0 * model.num_parameters() * tokens_per_step
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                state = {"step": step + 1, "flops": flops}
                checkpoints.append(_save(model, optimizer, out / f"step{step + 1}", cfg, state))
            if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
                val_loss = _validation_loss(model, val, dev)
                rows.append(
                    {
                        "step": step + 1,
                        "depth": model.config.n_layer,
                        "lr": optimizer.param_groups[0]["lr"],
                        "train_loss": float(loss.detach()),
                        "val_loss": val_loss,
                        "val_perplexity": math.exp(val_loss),
                        "flops": flops,
                        "seconds": time.perf_counter() - start,
                    }
                )
                atomic_write_text(
                    out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows)
                )
                bar.set_postfix(val_loss=f"{val_loss:.3f}", depth=model.config.n_layer)
            bar.update()
    finally:
        bar.close()
        if scaler is not None:
            scaler.close()
    final = _save(model, optimizer, out / "final", cfg, {"step": cfg.steps, "flops": flops})
    return LMRun(pd.DataFrame(rows), final, flops, checkpoints)


@torch.no_grad()
def _validation_loss(model, tokens: torch.Tensor, device: torch.device) -> float:
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for chunk in tokens.split(16):
        chunk = chunk.to(device)
        logits = model(chunk, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB_SIZE).double(),
            chunk[:, 1:].reshape(-1),
            reduction="sum",
        )
        total += float(loss)
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total / count


def load_lm_config(path: str | os.PathLike) -> dict[str, Any]:
    """The LMConfig fields stored with an LM checkpoint or run folder."""
    from probekit.training.runs import load_run

    run = load_run(path)
    if run is None or run.kind != "lm":
        raise CheckpointError(
            f"no LM-run run_config.json in {path}", fix="pass a folder written by train_lm"
        )
    return run.config


__all__ = ["LMConfig", "LMRun", "load_lm_config", "train_lm"]
