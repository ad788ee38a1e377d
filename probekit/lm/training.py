"""Language-model training on the offline byte corpus, static or grown in depth (MIDAS).

A run trains a GPT-2-style byte-level LM (:mod:`probekit.lm.corpus`) with AdamW (linear
warmup, cosine decay, weight decay on matrices, gradient clipping) on the next-token loss of
every position. With ``growth != "static"`` it starts at ``initial_layers`` and, at the stage
boundaries of a Prop-alpha schedule (:func:`probekit.training.growth.growth_plan`), writes a
checkpoint, grows it (:func:`~probekit.training.growth.grow_checkpoint`: copied layers carry
their AdamW moments), writes the grown checkpoint and keeps training. MIDAS-plus
(``residual_scale_start``) multiplies the update of newly inserted layers by a scale that ramps
linearly to 1 over ``residual_scale_steps`` steps. ``layernorm_scaling`` (static runs) trains
with LayerNorm Scaling (:func:`~probekit.training.models.layernorm_scales`): the LN gains and
biases of layer ``l`` are parametrised as ``1/sqrt(l)`` times the trained ones; checkpoints hold
the scaled values in a plain HF GPT-2 (its forward is the training forward, bit for bit) and the
trained ones in ``layernorm_scaling.safetensors``, from which a resumed run goes on
(:mod:`probekit.lm.layernorm_scaling`).

Training FLOPs are counted as 6 · parameters · tokens per step, summed over stages, so static
and grown runs can be compared at equal final depth. Output folder::

    out/run_config.json   {"kind": "lm", "lm": LMConfig fields} (read back by run_folders.load_run)
    out/metrics.jsonl     step, depth, lr, train loss, validation loss and perplexity, FLOPs
    out/stage{k}-before/  checkpoint before the k-th growth;  out/stage{k}-after/  after it
    out/step{n}/          every ``save_every`` steps, if set
    out/final/            the final checkpoint (HF GPT-2 + optimizer.safetensors, and under
                          layernorm_scaling the unscaled LN gains: layernorm_scaling.safetensors)

A killed run started again with the same settings resumes from its last checkpoint
(:mod:`probekit.lm.checkpoints`).

``precision`` ("auto": bf16 autocast on CUDA, fp32 on CPU; "fp32"; "bf16") sets the forwards'
precision; weights and AdamW moments are float32 (:mod:`probekit.training.precision`). Between
sync points (evaluations, saves, growth stages, the end) the loop never waits for the device:
each interval's batches go to the device in one copy, the loss and the non-finite checks stay
there, and a run whose loss or weights became NaN/inf stops at the next sync point, naming the
first such step, before anything is saved (the loop both trainers run:
:mod:`probekit.training.loop`; :class:`LMTrainer` supplies the LM run's steps). The forward
is given an explicit causal mask, as transformers' GPT-2 without an attention mask reads a
device value in every forward.

Example:
    >>> import tempfile
    >>> cfg = LMConfig(n_layers=2, initial_layers=1, block_size=1, growth="midas", d_model=16,
    ...                n_heads=2, steps=4, batch_size=2, seq_len=16, eval_every=2,
    ...                eval_sequences=2, corpus_max_files=30)
    >>> run = train_lm(cfg, tempfile.mkdtemp(), progress=False, device="cpu")
    >>> [p.name for p in run.checkpoints], int(run.metrics.depth.iloc[-1])
    (['stage1-before', 'stage1-after'], 2)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from probekit.errors import CheckpointError, NumericalError
from probekit.lm.checkpoints import (
    CHECKPOINT_FOLDER,
    adamw,
    checked_metrics,
    comparable_settings,
    kept_in,
    load_checkpoint,
    resumable_checkpoints,
    save_checkpoint,
)
from probekit.lm.config import LMConfig
from probekit.lm.corpus import VOCAB_SIZE, ByteCorpus
from probekit.lm.layernorm_scaling import scale_layernorms
from probekit.training.checkpoint import (
    FIX,
    RUN_CONFIG,
    check_same_settings,
    read_run_config,
    recover_checkpoint,
    remove_leftovers,
    write_run_config,
)
from probekit.training.checks import is_int, is_real
from probekit.training.growth import grow_checkpoint
from probekit.training.loop import (
    Trainer,
    checked_device,
    first_failure,
    read_on_host,
    train_in_folder,
)
from probekit.training.memory import LAYER_OVERHEAD_BYTES, TRAIN_BYTES_PER_PARAM
from probekit.training.metrics import write_metrics
from probekit.training.precision import autocast, resolve_precision
from probekit.training.schedule import resolve_device


@dataclass
class LMRun:
    """What :func:`train_lm` returns: the metrics table, final checkpoint and FLOPs."""

    metrics: pd.DataFrame
    final: Path
    flops: float
    checkpoints: list[Path]


class LMTrainer(Trainer):
    """The LM trainer: one run's state and its steps (growth, update, evaluation,
    checkpoints) as :func:`~probekit.training.loop.run_loop` drives them."""

    def __init__(self, cfg: LMConfig, out: Path, device: str | None) -> None:
        import transformers

        self.cfg = self.settings = cfg
        self.out = out
        self.plan = cfg.plan()
        self.corpus = ByteCorpus(cfg.corpus_root, max_files=cfg.corpus_max_files)
        self.device = resolve_device(device)
        self.precision = resolve_precision(cfg.precision, self.device)
        n_val = min(cfg.eval_sequences, len(self.corpus.stream("validation")) // cfg.seq_len)
        self.val = self.corpus.sequences("validation", cfg.seq_len, n=n_val)
        torch.manual_seed(cfg.seed)
        config = cfg.hf_config(self.plan.depths[0])
        self.model = transformers.GPT2LMHeadModel(config)
        if cfg.layernorm_scaling:
            scale_layernorms(self.model)
        # transformers wraps its `to` in functools.wraps(nn.Module.to), which mypy reads as an
        # unbound function (self = the device)
        self.model = self.model.to(self.device).train()  # type: ignore[arg-type]
        self.optimizer = adamw(self.model, cfg)
        self.stages = dict(zip(self.plan.boundaries, range(1, len(self.plan.depths)), strict=True))
        self.scaler: ResidualScale | None = None
        self.scale_start_step = 0
        self.step, self.flops, self.seconds = 0, 0.0, 0.0
        self.started = time.perf_counter()  # the loop's start (begin): ``seconds`` go on from it
        self.rows: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []
        self.batches: torch.Tensor | None = None  # [steps, batch, seq_len] from batch_start
        self.batch_start = 0
        # on the device, read at sync points: the last loss, the first step whose loss was
        # not finite (and that loss), the first update that made weights non-finite
        none = torch.tensor(-1, device=self.device)
        self.last_loss = torch.tensor(float("nan"), device=self.device)
        self.bad_loss_step, self.bad_loss, self.bad_weight_step = none, self.last_loss, none
        # the causal mask, given explicitly: without an attention mask transformers' GPT-2
        # reads a device value every forward (its packed-sequence check); with this 4-D mask
        # the CPU logits are bit-identical to the maskless forward's
        T = cfg.seq_len
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        self.causal = causal[None, None].expand(cfg.batch_size, 1, T, T)

    def save(self, path: Path) -> Path:
        state = {"step": self.step, "flops": self.flops}
        return save_checkpoint(self.model, self.optimizer, path, self.cfg, state)

    def recover(self) -> None:
        """Undo what a kill left: half-swapped checkpoints and ``.*.tmp`` leftovers."""
        if not self.out.is_dir():
            return
        for name in {p.name.split(".")[1] for p in self.out.glob(".*.*.*")}:
            if CHECKPOINT_FOLDER.match(name):  # a kill during an atomic checkpoint swap
                recover_checkpoint(self.out / name)
        remove_leftovers(self.out, ("metrics.jsonl", RUN_CONFIG))

    def start_over(self) -> None:
        """``resume=False``: remove the checkpoints and metrics of an earlier run in ``out``."""
        for folder in self.out.iterdir() if self.out.is_dir() else ():
            if CHECKPOINT_FOLDER.match(folder.name) and (folder / RUN_CONFIG).is_file():
                shutil.rmtree(folder, ignore_errors=True)
        (self.out / "metrics.jsonl").unlink(missing_ok=True)

    def write_config(self) -> None:
        write_run_config(self.out, "lm", {"lm": asdict(self.cfg)})

    def finished(self) -> bool:
        return self.step >= self.cfg.steps and (self.out / "final").is_dir()

    def finish(self, trained: bool) -> None:
        """A run that trained writes its final checkpoint."""
        if trained:
            self.save(self.out / "final")

    def resume(self) -> None:
        """Go on from the last complete checkpoint under ``out`` (none: start from step 0).

        A damaged checkpoint is skipped with a warning naming it, and the one before it used;
        :class:`CheckpointError` when none is left."""
        found, problems = resumable_checkpoints(self.out, self.cfg.steps)
        for step, order, folder in reversed(found):
            try:
                self._resume_from(folder, step)
            except CheckpointError as err:
                problems.append(err.problem)
                continue
            if problems:
                warnings.warn(
                    f"{'; '.join(problems)}; resuming from {folder} (step {step})", stacklevel=3
                )
            self.checkpoints = [
                p for s, o, p in found if (s, o) <= (step, order) and p.name != "final"
            ]
            return
        if problems:
            raise CheckpointError(
                f"no checkpoint in {self.out} can be resumed: {'; '.join(problems)}", fix=FIX
            )

    def _resume_from(self, folder: Path, step: int) -> None:
        """Load the checkpoint ``folder`` (at ``step``) and the metrics up to it."""
        saved = (read_run_config(folder) or {}).get("lm")
        if isinstance(saved, dict):  # a run written before the options existed
            saved = comparable_settings({"layernorm_scaling": False, "precision": "auto", **saved})
        check_same_settings(folder, saved, comparable_settings(asdict(self.cfg)))
        state = json.loads((folder / "trainer_state.json").read_text())
        flops = state.get("flops")
        if not is_real(flops) or flops < 0:
            raise CheckpointError(f"{folder / 'trainer_state.json'} gives flops {flops!r}", fix=FIX)
        rows = checked_metrics(self.out / "metrics.jsonl", step, self.cfg)
        model, optimizer = load_checkpoint(folder, self.cfg, step, self.device)
        self.model, self.optimizer = model, optimizer
        self.step, self.flops = step, float(flops)
        self.rows = rows
        seconds = self.rows[-1].get("seconds") if self.rows else 0.0
        self.seconds = float(seconds) if is_real(seconds) else 0.0
        self._rescale_after_resume()

    def _rescale_after_resume(self) -> None:
        """Re-attach the MIDAS-plus scale of the last growth before the resumed step."""
        grown = [
            (b, k)
            for b, k in self.stages.items()
            if b <= self.step and self.model.config.n_layer >= self.plan.depths[k]
        ]
        if grown and self.cfg.residual_scale_start is not None:
            b, k = max(grown)
            self._attach_scale(self.out / f"stage{k}-after", b)

    def _attach_scale(self, after: Path, step: int) -> None:
        try:
            inserted = json.loads((after / "growth.json").read_text())["inserted"]
            if not all(is_int(i) and 0 <= i < self.model.config.n_layer for i in inserted):
                raise ValueError(f"inserted layers {inserted}")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{after / 'growth.json'} is unreadable ({err})", fix=FIX
            ) from err
        self.scaler = ResidualScale(self.model.transformer.h, inserted)
        self.scale_start_step = step

    def close_scale(self) -> None:
        if self.scaler is not None:
            self.scaler.close()
            self.scaler = None

    def grow(self, k: int) -> None:
        """Stage ``k``: checkpoint, grow the checkpoint, and train on from the grown one."""
        cfg = self.cfg
        self.close_scale()
        before = self.save(self.out / f"stage{k}-before")
        after = grow_checkpoint(before, self.out / f"stage{k}-after", cfg.growth, cfg.block_size)
        self.checkpoints += [before, after]
        self.model, self.optimizer = load_checkpoint(after, cfg, self.step, self.device)
        if cfg.residual_scale_start is not None:
            self._attach_scale(after, self.step)

    def prepare(self, stop: int) -> None:
        """The batches of steps ``self.step .. stop - 1``, drawn on the host as
        :meth:`ByteCorpus.batch` draws them, sent to the device in one copy."""
        cfg = self.cfg
        batches = [
            self.corpus.batch("train", cfg.seq_len, cfg.batch_size, cfg.seed, s)
            for s in range(self.step, stop)
        ]
        self.hold_batches(torch.stack(batches))

    def train_step(self) -> torch.Tensor:
        """One AdamW step at ``self.step``; returns the training loss (on the device).

        Nothing here waits for the device: a non-finite loss or update is recorded on it and
        raised at the next sync point (:meth:`check`)."""
        cfg, step = self.cfg, self.step
        start = cfg.residual_scale_start  # set whenever a scaler is (grow, resume)
        if self.scaler is not None and start is not None:
            ramp = min(1.0, (step - self.scale_start_step) / max(1, cfg.residual_scale_steps))
            self.scaler.scale = start + (1 - start) * ramp
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr_at(step)
        loss = self.batch_loss(self.batch_at(step))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        with torch.no_grad():
            self.last_loss = loss.detach()
            finite = torch.isfinite(self.last_loss)
            self.bad_loss_step, new = first_failure(self.bad_loss_step, finite, step)
            self.bad_loss = torch.where(new, self.last_loss, self.bad_loss)
            finite = torch.stack([p.isfinite().all() for p in self.model.parameters()]).all()
            self.bad_weight_step, _ = first_failure(self.bad_weight_step, finite, step)
        self.flops += 6.0 * self.model.num_parameters() * self.tokens_per_step()
        self.step += 1
        return loss

    def batch_loss(self, batch: torch.Tensor) -> torch.Tensor:
        """The training loss of a prepared batch: next-token cross-entropy at every position
        (a trainer on other batches, e.g. with a loss mask, supplies its own)."""
        with autocast(self.device, self.precision):
            logits = self.model(batch, attention_mask=self.causal, use_cache=False).logits
        return F.cross_entropy(
            logits[:, :-1].float().reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1)
        )

    def tokens_per_step(self) -> int:
        """Tokens one step trains on (the FLOPs count: 6 x parameters x tokens)."""
        return self.cfg.batch_size * self.cfg.seq_len

    def check(self) -> None:
        """The sync point: raise :class:`NumericalError` if a loss or an update since the
        start was not finite (the first of them), before anything is saved."""
        loss_step, loss, weight_step = read_on_host(
            self.bad_loss_step, self.bad_loss, self.bad_weight_step
        )
        if loss_step >= 0 and (weight_step < 0 or loss_step <= weight_step):
            raise self._diverged(f"the training loss became {loss} at step {int(loss_step)}")
        if weight_step >= 0:
            raise self._diverged(f"the update of step {int(weight_step)} made weights NaN/inf")

    def _diverged(self, what: str) -> NumericalError:
        """The error of a run that diverged, naming the checkpoint it leaves."""
        return NumericalError(
            f"{what}; {kept_in(self.out, self.cfg.steps)}",
            fix="lower the learning rate, raise the warmup or keep grad_clip on",
        )

    def evaluate(self) -> float:
        """Append a metrics row, rewrite ``metrics.jsonl``; returns the validation loss."""
        val_loss = _validation_loss(self.model, self.val, self.device, self.precision)
        self.rows.append(
            {
                "step": self.step,
                "depth": self.model.config.n_layer,
                "lr": self.optimizer.param_groups[0]["lr"],
                "train_loss": float(self.last_loss),
                "val_loss": val_loss,
                "val_perplexity": math.exp(val_loss),
                "flops": self.flops,
                "seconds": self.seconds + time.perf_counter() - self.started,
            }
        )
        write_metrics(self.out / "metrics.jsonl", self.rows)
        return val_loss

    def progress_numbers(self) -> dict[str, Any]:
        row = self.rows[-1]
        return dict(
            loss=f"{row['train_loss']:.3f}", val_loss=f"{row['val_loss']:.3f}", depth=row["depth"]
        )

    def checkpoint_due(self) -> bool:
        """Every ``save_every`` steps (if set) before the end (``final``: :meth:`finish`)."""
        cfg, step = self.cfg, self.step
        if not cfg.save_every:
            return False
        return step % cfg.save_every == 0 and step < cfg.steps

    def save_if_due(self) -> None:
        if self.checkpoint_due():  # step{n}; the end's checkpoint is final (finish)
            self.checkpoints.append(self.save(self.out / f"step{self.step}"))

    def description(self) -> str:
        return f"train {self.cfg.growth}"

    def kept(self) -> str:
        return kept_in(self.out, self.cfg.steps)

    def begin(self) -> None:
        """Start the clock of the ``seconds`` column (going on from a resumed run's)."""
        self.started = time.perf_counter()

    def begin_interval(self) -> None:
        """At a stage boundary: grow the model (unless the resumed checkpoint is grown)."""
        k = self.stages.get(self.step)
        if k is not None and self.model.config.n_layer < self.plan.depths[k]:
            self.grow(k)

    def end(self) -> None:
        self.close_scale()

    def sync_intervals(self) -> list[int]:
        cfg = self.cfg
        return [cfg.eval_every] + ([cfg.save_every] if cfg.save_every else [])

    def other_sync_points(self) -> list[int]:
        """The growth stages' boundaries."""
        return list(self.stages)

    def elements_per_step(self) -> int:
        return self.cfg.batch_size * self.cfg.seq_len


def train_lm(
    cfg: LMConfig,
    out_dir: str | os.PathLike,
    progress: bool = True,
    device: str | None = None,
    resume: bool = True,
) -> LMRun:
    """Train a byte-level LM (static or grown) and return its metrics and final checkpoint.

    A run killed part way resumes from its last checkpoint (``step{n}``, a growth stage or
    ``final``) when started again with the same settings and ``resume``, and ends with weights
    bit-identical (on CPU) to an uninterrupted run; set ``save_every`` to checkpoint between
    growth stages. ``device``: None or "auto" for CUDA when present, else e.g. "cpu".
    """
    cfg.validate()
    n_params = lm_params(
        cfg.n_layers, cfg.d_model, cfg.d_mlp or 4 * cfg.d_model, VOCAB_SIZE, cfg.seq_len
    )
    what = f"training an LM of {n_params} parameters"
    dev = checked_device(cfg, device, lm_run_bytes(cfg, VOCAB_SIZE), what)
    out = Path(out_dir)
    trainer = LMTrainer(cfg, out, dev)  # reads the corpus: raises before anything is written
    train_in_folder(trainer, resume=resume, progress=progress)
    return LMRun(pd.DataFrame(trainer.rows), out / "final", trainer.flops, trainer.checkpoints)


class ResidualScale:
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


@torch.no_grad()
def _validation_loss(
    model, tokens: torch.Tensor, device: torch.device, precision: str = "auto"
) -> float:
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for chunk in tokens.split(16):
        chunk = chunk.to(device)
        with autocast(device, precision):
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


def lm_params(n_layers: int, d_model: int, d_mlp: int, vocab: int, n_positions: int) -> int:
    """Parameters of a GPT-2 with tied embeddings (the LM trainer's models)."""
    per_layer = 4 * d_model * d_model + 2 * d_model * d_mlp + 9 * d_model + d_mlp
    return n_layers * per_layer + (vocab + n_positions) * d_model + 2 * d_model


def lm_run_bytes(cfg: LMConfig, vocab: int) -> int:
    """Estimated bytes of training the LM run ``cfg`` at its final depth."""
    d_mlp = cfg.d_mlp or 4 * cfg.d_model
    params = lm_params(cfg.n_layers, cfg.d_model, d_mlp, vocab, cfg.seq_len)
    tokens = cfg.batch_size * cfg.seq_len
    per_token = 16 * cfg.d_model + 2 * d_mlp + cfg.n_heads * cfg.seq_len
    acts = tokens * cfg.n_layers * per_token * 4 + tokens * vocab * 4 * 3
    return params * TRAIN_BYTES_PER_PARAM + acts + cfg.n_layers * LAYER_OVERHEAD_BYTES


__all__ = ["LMRun", "LMTrainer", "ResidualScale", "lm_params", "lm_run_bytes", "train_lm"]
