"""Language-model training on the offline byte corpus, static or grown in depth (MIDAS).

A run trains a GPT-2-style byte-level LM (:mod:`probekit.tasks.corpus`) with AdamW (linear
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
trained ones in ``layernorm_scaling.safetensors``, from which a resumed run goes on.

Training FLOPs are counted as 6 · parameters · tokens per step, summed over stages, so static
and grown runs can be compared at equal final depth. Output folder::

    out/run_config.json   {"kind": "lm", "lm": LMConfig fields} (read back by runs.load_run)
    out/metrics.jsonl     step, depth, lr, train loss, validation loss and perplexity, FLOPs
    out/stage{k}-before/  checkpoint before the k-th growth;  out/stage{k}-after/  after it
    out/step{n}/          every ``save_every`` steps, if set
    out/final/            the final checkpoint (HF GPT-2 + optimizer.safetensors, and under
                          layernorm_scaling the unscaled LN gains: layernorm_scaling.safetensors)

A killed run started again with the same settings resumes from its last checkpoint.

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
import re
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
import torch.nn.functional as F

from probekit.errors import CheckpointError, ConfigError, NumericalError
from probekit.io import atomic_write_text, swapped_directory
from probekit.tasks.corpus import BOS, EOS, VOCAB_SIZE, ByteCorpus
from probekit.training.checkpoint import (
    FIX,
    RUN_CONFIG,
    check_finite_tensors,
    check_same_settings,
    check_tensors,
    load_moments,
    read_run_config,
    recover_checkpoint,
    remove_leftovers,
    save_moments,
    save_quietly,
    write_run_config,
)
from probekit.training.checks import (
    DEPTH_WHY,
    MAX_LAYERS,
    check_bounded,
    check_flag,
    check_int,
    check_optional_int,
    check_real,
    check_str,
    is_int,
    is_real,
)
from probekit.training.growth import METHODS, grow_checkpoint, growth_plan
from probekit.training.loop import (
    RunSettings,
    Trainer,
    checked_device,
    first_failure,
    kept_checkpoint,
    read_on_host,
    train_in_folder,
)
from probekit.training.memory import lm_params, lm_run_bytes
from probekit.training.metrics import read_metrics, write_metrics
from probekit.training.models import gpt2_config, layernorm_scales, scale_layernorm
from probekit.training.precision import autocast, resolve_precision
from probekit.training.schedule import resolve_device

#: LMConfig's own settings that must be positive integers
_POSITIVE = (
    "n_layers",
    "d_model",
    "n_heads",
    "seq_len",
    "eval_sequences",
    "initial_layers",
    "block_size",
    "residual_scale_steps",
)


@dataclass
class LMConfig(RunSettings):
    """A language-model run: the shared run settings
    (:class:`~probekit.training.loop.RunSettings`: seed, steps, batch size, the AdamW schedule,
    ``eval_every``, precision, determinism; an LM run's defaults are set here) and the model,
    growth and corpus. ``n_layers`` is the final depth; grown runs start at ``initial_layers``
    and add ``block_size`` layers per stage. ``corpus_root`` is a folder of ``.py`` files
    (default: the Python standard library). ``layernorm_scaling``: LayerNorm Scaling (Sun et
    al. 2025), static runs only."""

    n_layers: int = 8
    d_model: int = 128
    n_heads: int = 4
    d_mlp: int | None = None
    seq_len: int = 128
    # an LM run's defaults of shared run settings
    batch_size: int = 32
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    eval_every: int = 200
    growth: str = "static"
    initial_layers: int = 2
    block_size: int = 2
    alpha: float = 1.0
    residual_scale_start: float | None = None
    residual_scale_steps: int = 200
    eval_sequences: int = 64
    corpus_root: str | None = None
    corpus_max_files: int | None = None
    save_every: int | None = None
    layernorm_scaling: bool = False

    EXAMPLES: ClassVar[dict[str, str]] = {
        "weight_decay": "0 or e.g. 0.1",
        "min_lr_ratio": "e.g. 0.1",
    }

    def validate(self) -> None:
        """Raise :class:`ConfigError` on settings that cannot be trained (types, ranges,
        finiteness, the growth schedule), before anything is read or built."""
        if not isinstance(self.growth, str) or self.growth not in ("static",) + METHODS:
            raise ConfigError(
                f"unknown growth {self.growth!r}", fix=f"use 'static' or one of {list(METHODS)}"
            )
        for name in _POSITIVE:
            check_int(name, getattr(self, name))
        check_bounded("n_layers", self.n_layers, MAX_LAYERS, DEPTH_WHY)
        self.validate_run()
        for name in ("d_mlp", "save_every", "corpus_max_files"):
            check_optional_int(name, getattr(self, name))
        check_str("corpus_root", self.corpus_root, optional=True)
        check_real("alpha", self.alpha, positive=True, example="e.g. 1.0 (Prop-1)")
        if self.residual_scale_start is not None:
            check_real("residual_scale_start", self.residual_scale_start, 0, 1, example="e.g. 0.1")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}",
                fix="choose n_heads dividing d_model",
            )
        check_flag("layernorm_scaling", self.layernorm_scaling)
        if self.layernorm_scaling and self.growth != "static":
            raise ConfigError(
                f"layernorm_scaling with growth {self.growth!r} is not supported: a copied layer "
                "would move to a depth with another LayerNorm scale",
                fix="train a static model with layernorm_scaling, or grow without it",
            )
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
        """The ``transformers.GPT2Config`` of this run at depth ``n_layers``."""
        return gpt2_config(
            vocab_size=VOCAB_SIZE,
            n_positions=self.seq_len,
            d_model=self.d_model,
            n_layers=n_layers,
            n_heads=self.n_heads,
            d_mlp=self.d_mlp,
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


#: the file of the unscaled LN gains and biases of a LayerNorm-Scaling LM run, in its checkpoint
UNSCALED_LN_FILE = "layernorm_scaling.safetensors"


def _hf_name(name: str) -> str:
    """The HF name of a parameter (``ln_1.parametrizations.weight.original`` -> ``ln_1.weight``)."""
    return name.replace(".parametrizations.", ".").removesuffix(".original")


class _Scaled(torch.nn.Module):
    """A LayerNorm-Scaling gain or bias, parametrised: the trained tensor times 1/sqrt(l)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, unscaled: torch.Tensor) -> torch.Tensor:
        return scale_layernorm(unscaled, self.factor)


def _scale_layernorms(model, unscaled: dict[str, torch.Tensor] | None = None) -> None:
    """Parametrise the layers' LN gains and biases of an HF GPT-2 as LayerNorm Scaling does;
    the trained (unscaled) values are ``unscaled`` (default: the model's current ones)."""
    from torch.nn.utils import parametrize

    modules = dict(model.named_modules())
    for name, factor in layernorm_scales(model.config.n_layer).items():
        owner, kind = name.rsplit(".", 1)
        module = modules[owner]
        if unscaled is not None:
            with torch.no_grad():
                getattr(module, kind).copy_(unscaled[name])
        parametrize.register_parametrization(module, kind, _Scaled(factor))


def _hf_copy(model):
    """A plain GPT-2 holding what ``model`` computes: LayerNorm Scaling folded into the gains."""
    import transformers

    if not any(".parametrizations." in n for n, _ in model.named_parameters()):
        return model
    state = {_hf_name(k): v for k, v in model.state_dict().items()}
    modules = dict(model.named_modules())
    for name in layernorm_scales(model.config.n_layer):
        owner, kind = name.rsplit(".", 1)
        state[name] = getattr(modules[owner], kind).detach()
    plain = transformers.GPT2LMHeadModel(model.config)
    plain.load_state_dict(state)
    return plain


def _unscaled_of(model) -> dict[str, torch.Tensor]:
    """The trained (unscaled) LN gains and biases of a LayerNorm-Scaling model."""
    return {
        _hf_name(n): p.detach().cpu().contiguous()
        for n, p in model.named_parameters()
        if ".parametrizations." in n
    }


def _save(model, optimizer, path: Path, cfg: LMConfig, state: dict) -> Path:
    """An HF checkpoint plus AdamW moments (safetensors) and trainer state (JSON)."""
    from safetensors.torch import save_file

    exp_avg, exp_avg_sq = {}, {}
    for name, p in model.named_parameters():
        st = optimizer.state.get(p)
        if st:
            exp_avg[_hf_name(name)], exp_avg_sq[_hf_name(name)] = st["exp_avg"], st["exp_avg_sq"]
    with swapped_directory(path) as tmp:
        save_quietly(_hf_copy(model), tmp)
        if cfg.layernorm_scaling:
            save_file(_unscaled_of(model), str(tmp / UNSCALED_LN_FILE))
        if exp_avg:
            save_moments(tmp / "optimizer.safetensors", exp_avg, exp_avg_sq)
        atomic_write_text(tmp / "trainer_state.json", json.dumps(state))
        write_run_config(tmp, "lm", {"lm": asdict(cfg)})
    return path


def _load(path: Path, cfg: LMConfig, step: int, device: torch.device):
    """Model and optimizer from a checkpoint, the AdamW moments restored (and checked there
    for every parameter once training has begun)."""
    import transformers

    from probekit.model import from_pretrained_complete

    model = from_pretrained_complete(transformers.GPT2LMHeadModel, path)
    check_finite_tensors(path / "model.safetensors", dict(model.named_parameters()))
    if cfg.layernorm_scaling:
        _scale_layernorms(model, _read_unscaled(path, model))
    model = model.to(device).train()
    optimizer = _optimizer(model, cfg)
    moments = path / "optimizer.safetensors"
    if not moments.exists():
        if step > 0:
            raise CheckpointError(f"{moments} is missing", fix=FIX)
        return model, optimizer
    try:
        exp_avg, exp_avg_sq, _ = load_moments(moments)
    except Exception as err:  # safetensors raises its own error type on a damaged file
        raise CheckpointError(f"{moments} is corrupt or truncated ({err})", fix=FIX) from err
    shapes = {_hf_name(name): tuple(p.shape) for name, p in model.named_parameters()}
    check_tensors(moments, {"exp_avg." + k: v for k, v in exp_avg.items()}, shapes, "exp_avg.")
    check_tensors(
        moments, {"exp_avg_sq." + k: v for k, v in exp_avg_sq.items()}, shapes, "exp_avg_sq."
    )
    for name, p in model.named_parameters():
        optimizer.state[p] = {
            "step": torch.tensor(float(step)),
            "exp_avg": exp_avg[_hf_name(name)].to(device),
            "exp_avg_sq": exp_avg_sq[_hf_name(name)].to(device),
        }
    return model, optimizer


def _read_unscaled(path: Path, model) -> dict[str, torch.Tensor]:
    """The unscaled LN gains of a LayerNorm-Scaling checkpoint, checked to fold into exactly
    the gains its ``model.safetensors`` holds."""
    from safetensors.torch import load_file

    file = path / UNSCALED_LN_FILE
    try:
        unscaled = load_file(str(file))
    except Exception as err:  # safetensors raises its own error type on a damaged file
        what = "is missing" if not file.exists() else f"is corrupt or truncated ({err})"
        raise CheckpointError(f"{file} {what}", fix=FIX) from err
    scales = layernorm_scales(model.config.n_layer)
    check_tensors(file, unscaled, {k: (model.config.n_embd,) for k in scales})
    state = model.state_dict()
    bad = [
        k for k, f in scales.items() if not torch.equal(scale_layernorm(unscaled[k], f), state[k])
    ]
    if bad:
        raise CheckpointError(
            f"{file} does not fold into the LayerNorm gains of {path / 'model.safetensors'} "
            f"({', '.join(bad[:3])})",
            fix=FIX,
        )
    return unscaled


def _checked_metrics(path: Path, step: int, cfg: LMConfig) -> list[dict[str, Any]]:
    """The metrics rows up to ``step``; the row of the last evaluation must be there."""
    rows = read_metrics(path, step)
    last_eval = cfg.last_evaluation(step)
    if last_eval > 0 and not any(r["step"] == last_eval for r in rows):
        what = "is missing" if not path.exists() else f"lacks the row of step {last_eval}"
        raise CheckpointError(f"{path} {what} although a checkpoint is at step {step}", fix=FIX)
    return rows


#: checkpoint folders a killed run resumes from, and their order at one step
_RESUMABLE = {"step": 0, "before": 1, "after": 2, "final": 3}
_FOLDER = re.compile(r"^(?:step(?P<n>\d+)|stage(?P<k>\d+)-(?P<when>before|after)|final)$")


def _checkpoints(out: Path, steps: int) -> tuple[list[tuple[int, int, Path]], list[str]]:
    """The checkpoints under ``out`` as (step, order, folder), oldest first, and the problems
    of those whose trainer_state.json is unreadable or holds an impossible step."""
    found, damaged = [], []
    for folder in out.iterdir() if out.is_dir() else ():
        match = _FOLDER.match(folder.name)
        if match is None or not (folder / "trainer_state.json").is_file():
            continue
        try:
            state = json.loads((folder / "trainer_state.json").read_text())
            step = state["step"] if isinstance(state, dict) else None
        except (OSError, ValueError, KeyError) as err:
            damaged.append(f"{folder / 'trainer_state.json'} is unreadable ({err})")
            continue
        if not is_int(step) or not 0 <= step <= steps:
            damaged.append(f"{folder / 'trainer_state.json'} gives step {step!r}")
            continue
        kind = "step" if match["n"] else match["when"] or "final"
        found.append((int(step), _RESUMABLE[kind], folder))
    return sorted(found), damaged


def _last_step(out: Path, steps: int) -> str:
    """What a stopped run leaves: its newest checkpoint, or that there is none."""
    found, _ = _checkpoints(out, steps)
    if not found:
        return kept_checkpoint(None, None)
    step, _, folder = found[-1]
    return kept_checkpoint(step, folder)


def _after_step(trainer: LMTrainer) -> None:
    """Called after every update: a seam where tests simulate a kill (by replacing it)."""


def _comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a resumed run must share with its checkpoint (all but ``deterministic``,
    which changes neither the model nor the data)."""
    return {k: v for k, v in settings.items() if k != "deterministic"}


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
            _scale_layernorms(self.model)
        self.model = self.model.to(self.device).train()
        self.optimizer = _optimizer(self.model, cfg)
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
        return _save(self.model, self.optimizer, path, self.cfg, state)

    def recover(self) -> None:
        """Undo what a kill left: half-swapped checkpoints and ``.*.tmp`` leftovers."""
        if not self.out.is_dir():
            return
        for name in {p.name.split(".")[1] for p in self.out.glob(".*.*.*")}:
            if _FOLDER.match(name):  # a kill during an atomic checkpoint swap
                recover_checkpoint(self.out / name)
        remove_leftovers(self.out, ("metrics.jsonl", RUN_CONFIG))

    def start_over(self) -> None:
        """``resume=False``: remove the checkpoints and metrics of an earlier run in ``out``."""
        for folder in self.out.iterdir() if self.out.is_dir() else ():
            if _FOLDER.match(folder.name) and (folder / RUN_CONFIG).is_file():
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
        found, problems = _checkpoints(self.out, self.cfg.steps)
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
            saved = _comparable({"layernorm_scaling": False, "precision": "auto", **saved})
        check_same_settings(folder, saved, _comparable(asdict(self.cfg)))
        state = json.loads((folder / "trainer_state.json").read_text())
        flops = state.get("flops")
        if not is_real(flops) or flops < 0:
            raise CheckpointError(f"{folder / 'trainer_state.json'} gives flops {flops!r}", fix=FIX)
        rows = _checked_metrics(self.out / "metrics.jsonl", step, self.cfg)
        model, optimizer = _load(folder, self.cfg, step, self.device)
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
        self.model, self.optimizer = _load(after, cfg, self.step, self.device)
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
        if self.scaler is not None:
            ramp = min(1.0, (step - self.scale_start_step) / max(1, cfg.residual_scale_steps))
            self.scaler.scale = cfg.residual_scale_start + (1 - cfg.residual_scale_start) * ramp
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr_at(step)
        batch = self.batch_at(step)
        with autocast(self.device, self.precision):
            logits = self.model(batch, attention_mask=self.causal, use_cache=False).logits
        loss = F.cross_entropy(
            logits[:, :-1].float().reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1)
        )
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
        self.flops += 6.0 * self.model.num_parameters() * cfg.batch_size * cfg.seq_len
        self.step += 1
        return loss

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
            f"{what}; {_last_step(self.out, self.cfg.steps)}",
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
        return bool(cfg.save_every) and step % cfg.save_every == 0 and step < cfg.steps

    def save_if_due(self) -> None:
        if self.checkpoint_due():  # step{n}; the end's checkpoint is final (finish)
            self.checkpoints.append(self.save(self.out / f"step{self.step}"))

    def after_step(self) -> None:
        _after_step(self)

    def description(self) -> str:
        return f"train {self.cfg.growth}"

    def kept(self) -> str:
        return _last_step(self.out, self.cfg.steps)

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


__all__ = ["UNSCALED_LN_FILE", "LMConfig", "LMRun", "LMTrainer", "ResidualScale", "train_lm"]
