"""Checkpoint I/O of a stack of anchor runs: save every run's folder, resume them together.

Each run's folder (``checkpoint/`` for a single run, ``checkpoint/<name>/`` in a stack) holds
the Hugging Face model, ``optimizer.safetensors`` (the run's AdamW moments and, under
LayerNorm Scaling, the unscaled LN gains ``unscaled.<name>``), ``trainer_state.json`` (step,
loss sums, divergence, schedule) and ``run_config.json`` (kind ``"anchor"``). The whole
``checkpoint`` folder is replaced atomically. The checkpoints kept over training
(``keep_checkpoints``) go to ``checkpoints/step-000500/`` (``checkpoints/<name>/step-000500/`` in a
stack), each written whole and renamed into place, never rewritten (:func:`keep_stack`). No
process-wide RNG state is saved: the run draws from generators of its own seeded by (seed,
step), so two identical runs write byte-identical weights and moments (the process-wide RNG
entries of older checkpoints are checked, not restored).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from probekit.anchor import AnchorTask, TrainConfig, train
    >>> from probekit.training import ModelConfig
    >>> cfg = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), steps=1, batch_size=8,
    ...                   eval_every=1, task=AnchorTask(n_train=64, n_test=16))
    >>> out = train(cfg, tempfile.mkdtemp(), progress=False)
    >>> sorted(p.name for p in out.checkpoint.iterdir())[-3:]
    ['optimizer.safetensors', 'run_config.json', 'trainer_state.json']
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch

from probekit.errors import CheckpointError, NumericalError
from probekit.io import atomic_write_text, swapped_directory
from probekit.model.checkpoint import KEPT_CHECKPOINTS
from probekit.training.checkpoint import (
    FIX,
    RUN_CONFIG,
    check_finite_tensors,
    check_moments,
    check_rng_entries,
    check_same_settings,
    check_tensors,
    load_moments,
    new_temp_folder,
    previous_of,
    read_run_config,
    read_trainer_state,
    recover_checkpoint,
    save_moments,
    save_quietly,
    set_aside,
    swap_in,
    write_run_config,
)
from probekit.training.metrics import read_metrics
from probekit.training.models import ModelConfig, layernorm_scales, scale_layernorm, to_hf_model
from probekit.training.optim import StackedAdamW


class _Stack(Protocol):
    """What this module reads and restores of a stack (``trainer.AnchorStack``)."""

    cfgs: list[Any]  # the runs' TrainConfigs
    out: Path
    mcfg: ModelConfig
    params: dict[str, torch.Tensor]
    optimizer: StackedAdamW
    device: torch.device
    M: int
    step: int
    loss_sum: list[float]
    loss_count: int
    diverged: list[int | None]
    elapsed: float
    metrics: list[dict[str, Any]]
    hf: Any  # the GPT2LMHeadModel checkpoints are written through

    def run_dir(self, root: Path, m: int) -> Path: ...


def _trainer_state(stack: _Stack, m: int) -> dict[str, Any]:
    cfg, last = stack.cfgs[m], max(0, stack.step - 1)
    return {
        "step": stack.step,
        "loss_sum": stack.loss_sum[m],
        "loss_count": stack.loss_count,
        "diverged_at": stack.diverged[m],
        "elapsed_s": stack.elapsed,
        "scheduler": {
            "kind": "warmup_cosine",
            "last_lr": cfg.lr_at(last),
            "multiplier": cfg.schedule(last),
        },
    }


def _check_finite_run(stack: _Stack, m: int) -> None:
    """Refuse to write run ``m`` when it holds non-finite weights."""
    bad = [k for k, v in stack.params.items() if not bool(torch.isfinite(v[m]).all())]
    if bad:
        raise NumericalError(
            f"run {stack.cfgs[m].name!r} holds non-finite weights ({', '.join(bad[:4])}) at "
            f"step {stack.step}; no checkpoint of them is written",
            fix="lower lr, raise gamma (smaller init) or keep grad_clip on",
        )


def _write_runs(stack: _Stack, tmp: Path) -> None:
    """Every run's checkpoint folder under ``tmp``; a run with non-finite weights is refused."""
    for m in range(stack.M):
        _check_finite_run(stack, m)
        d = stack.run_dir(tmp, m)
        d.mkdir(parents=True, exist_ok=True)
        _write_model(stack, m, d)
        moments = stack.optimizer.state_dict(index=m)
        save_moments(
            d / "optimizer.safetensors",
            moments["exp_avg"],
            moments["exp_avg_sq"],
            extra=_unscaled(stack, m),
        )
        _write_state(stack, m, d)


def _write_model(stack: _Stack, m: int, d: Path) -> None:
    """Run ``m``'s Hugging Face model into ``d`` (through the one model built for saving)."""
    stack.hf = to_hf_model(stack.mcfg, stack.params, m, model=stack.hf)
    save_quietly(stack.hf, d)


def _write_state(stack: _Stack, m: int, d: Path) -> None:
    """Run ``m``'s ``trainer_state.json`` and ``run_config.json`` into ``d``."""
    atomic_write_text(d / "trainer_state.json", json.dumps(_trainer_state(stack, m)))
    write_run_config(d, "anchor", stack.cfgs[m].to_dict())


# --- checkpoints over training ---
KEPT = KEPT_CHECKPOINTS
"""The folder of a run's kept checkpoints (``TrainConfig.keep_checkpoints``)."""


def kept_root(out: Path, name: str | None) -> Path:
    """Where a run's kept checkpoints go: ``out/checkpoints/`` for a single run,
    ``out/checkpoints/<name>/`` for the run ``name`` of a stack (one folder per run, so that
    ``probekit timeline`` of that folder reads one run)."""
    return out / KEPT if name is None else out / KEPT / name


def kept_folder(root: Path, step: int) -> Path:
    """The kept checkpoint of ``step`` below ``root``: ``step-000500`` (six digits at least,
    so the folders sort by step)."""
    return root / f"step-{step:06d}"


def keep_stack(stack: _Stack, single: bool) -> list[Path]:
    """Write every run's kept checkpoint of ``stack.step`` (a Hugging Face model with its
    ``trainer_state.json`` and ``run_config.json``, no optimizer), each folder written whole
    beside its place and renamed into it (:func:`probekit.io.swapped_directory`). A folder
    already there is left as it is: a resumed run passes the steps of its kept checkpoints
    again and computes the same weights. Returns the folders written."""
    written = []
    for m, cfg in enumerate(stack.cfgs):
        folder = kept_folder(kept_root(stack.out, None if single else cfg.name), stack.step)
        if folder.is_dir():
            continue
        _check_finite_run(stack, m)
        with swapped_directory(folder) as tmp:
            _write_model(stack, m, tmp)
            _write_state(stack, m, tmp)
        written.append(folder)
    return written


def remove_kept_leftovers(out: Path) -> None:
    """Remove the half-written ``.step-*.tmp`` folders a kill left among the kept checkpoints
    (the run folder is locked: no writer is alive)."""
    root = out / KEPT
    for tmp in [*root.glob(".step-*.tmp"), *root.glob("*/.step-*.tmp")]:
        shutil.rmtree(tmp, ignore_errors=True)


#: the key prefix of the unscaled LN gains and biases of a LayerNorm-Scaling anchor run in its
#: optimizer file (``optimizer.safetensors``)
UNSCALED_LN_PREFIX = "unscaled."


def _unscaled(stack: _Stack, m: int) -> dict[str, torch.Tensor]:
    """Under LayerNorm Scaling the checkpoint's model holds the scaled LN gains and biases; the
    trained (unscaled) ones go beside them, so a resumed run goes on from them exactly."""
    if not stack.mcfg.layernorm_scaling:
        return {}
    names = layernorm_scales(stack.mcfg.n_layers)
    return {UNSCALED_LN_PREFIX + k: stack.params[k][m].detach().cpu().contiguous() for k in names}


def _check_unscaled(stack: _Stack, d: Path, weights: dict, other: dict) -> None:
    """The unscaled LN gains are in the optimizer file and fold into the saved model's."""
    if not stack.mcfg.layernorm_scaling:
        return
    path = d / "optimizer.safetensors"
    for k, factor in layernorm_scales(stack.mcfg.n_layers).items():
        raw = other.get(UNSCALED_LN_PREFIX + k)
        if raw is None or tuple(raw.shape) != tuple(weights[k].shape):
            raise CheckpointError(f"{path} lacks the unscaled LayerNorm gain {k!r}", fix=FIX)
        if not torch.equal(scale_layernorm(raw, factor), weights[k]):
            raise CheckpointError(
                f"{path}: the unscaled {k!r} does not fold into the model's", fix=FIX
            )


def save_stack(stack: _Stack) -> None:
    """Write every run's checkpoint under ``stack.out / "checkpoint"``, keeping the one before
    as ``checkpoint.previous`` (see :func:`probekit.training.checkpoint.swap_in`)."""
    root = stack.out / "checkpoint"
    tmp = new_temp_folder(root)
    try:
        _write_runs(stack, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, root)


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; any failure to read it is a :class:`CheckpointError`."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path} is missing", fix=FIX)
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error type on a damaged file
        raise CheckpointError(f"{path} is corrupt or truncated ({err})", fix=FIX) from err


def _read_run(stack: _Stack, d: Path, m: int) -> tuple[dict, dict, tuple]:
    """One run's trainer state, weights and optimizer file, checked against its config."""
    try:
        saved = read_run_config(d)
    except CheckpointError as err:
        raise _incomplete(d, err) from err
    if saved is None:
        raise _incomplete(d, CheckpointError(f"{d / RUN_CONFIG} is missing"))
    # a run saved before the precision setting existed trained at "auto"
    saved = {"precision": "auto", **saved}
    saved = {k: v for k, v in saved.items() if k not in IGNORED_ON_RESUME}
    check_same_settings(d, saved, stack.cfgs[m].comparable())
    try:
        return _read_files(stack, d, m)
    except CheckpointError as err:
        raise _incomplete(d, err) from err


#: saved settings a resumed run need not share (they change neither the model nor the data)
IGNORED_ON_RESUME = ("device", "kind", "deterministic", "keep_checkpoints")


def _incomplete(d: Path, err: CheckpointError) -> CheckpointError:
    return CheckpointError(f"checkpoint {d} is incomplete or unreadable: {err.problem}", fix=FIX)


def _read_files(stack: _Stack, d: Path, m: int) -> tuple[dict, dict, tuple]:
    """The trainer state, weights and moments of run ``m`` in ``d``, checked complete."""
    state = read_trainer_state(d, stack.cfgs[m].steps)
    weights = _load_tensors(d / "model.safetensors")
    shapes = {k: tuple(v.shape[1:]) for k, v in stack.params.items()}
    tied = ("lm_head.weight",) if "lm_head.weight" not in weights else ()
    check_tensors(d / "model.safetensors", weights, shapes, optional=tied)
    check_finite_tensors(d / "model.safetensors", weights)
    optimizer = load_moments(d / "optimizer.safetensors", _load_tensors)
    check_moments(d / "optimizer.safetensors", optimizer, shapes)
    check_rng_entries(d, optimizer[2], state)
    _check_unscaled(stack, d, weights, optimizer[2])
    return state, weights, optimizer


def _read_all(stack: _Stack, root: Path) -> list[tuple[dict, dict, tuple]]:
    states = [_read_run(stack, stack.run_dir(root, m), m) for m in range(stack.M)]
    steps = {state["step"] for state, _, _ in states}
    if len(steps) != 1:
        raise CheckpointError(
            f"checkpoints under {root} are at different steps {sorted(steps)}", fix=FIX
        )
    return states


@torch.no_grad()
def _restore(stack: _Stack, states: list[tuple[dict, dict, tuple]]) -> None:
    for m, (state, weights, (exp_avg, exp_avg_sq, other)) in enumerate(states):
        for k in stack.params:
            src = other.get(UNSCALED_LN_PREFIX + k, weights.get(k))
            if src is None and k == "lm_head.weight":  # pragma: no cover
                src = weights["transformer.wte.weight"]
            stack.params[k][m] = src.to(stack.device)
        stack.optimizer.load_state_dict({"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, index=m)
        stack.loss_sum[m] = state["loss_sum"]
        stack.diverged[m] = state["diverged_at"]
    state = states[0][0]
    stack.loss_count = state["loss_count"]
    stack.step = state["step"]
    stack.elapsed = state.get("elapsed_s", 0.0)


def _metrics(stack: _Stack) -> list[dict[str, Any]]:
    """The metrics rows up to the resumed step, checked to hold the last evaluation."""
    settings, step = stack.cfgs[0], stack.step
    path = stack.out / "metrics.jsonl"
    rows = read_metrics(path, step)
    last_eval = settings.last_evaluation(step)
    if last_eval == 0 and not settings.eval_at_start:
        return rows
    have = {r.get("run") for r in rows if r["step"] == last_eval}
    lost = [c.name for c in stack.cfgs if c.name not in have]
    if lost:
        what = "is missing" if not path.exists() else f"lacks the rows of step {last_eval}"
        raise CheckpointError(
            f"{path} {what} (runs {lost}) although the checkpoint is at step {step}",
            fix=f"pass resume=False / --no-resume to train again, or delete {stack.out}",
        )
    return rows


def resume_stack(stack: _Stack) -> bool:
    """Load the stack's last complete checkpoint, if any; True when it resumed.

    A checkpoint that cannot be read is moved to ``checkpoint.corrupt`` (with a warning naming
    the damaged file) and the previous one is used; when none is left, :class:`CheckpointError`.
    """
    root = stack.out / "checkpoint"
    recover_checkpoint(root)
    if not root.exists():
        return False
    try:
        states = _read_all(stack, root)
    except CheckpointError as err:
        states = _fall_back(stack, root, err)
    _restore(stack, states)
    stack.metrics = _metrics(stack)
    return True


def _fall_back(stack: _Stack, root: Path, err: CheckpointError) -> list:
    """Resume from ``checkpoint.previous`` after ``root`` failed to read with ``err``."""
    prev = previous_of(root)
    if not prev.is_dir():
        raise err
    try:
        states = _read_all(stack, prev)
    except CheckpointError as second:
        raise CheckpointError(
            f"{err.problem}; the previous checkpoint is unreadable too ({second.problem})",
            fix=FIX,
        ) from second
    step = states[0][0]["step"]
    set_aside(root)
    os.replace(prev, root)
    warnings.warn(
        f"{err.problem}; resuming from the previous checkpoint (step {step}); the damaged one "
        f"is kept in {root.with_name('checkpoint.corrupt')}",
        stacklevel=3,
    )
    return _read_all(stack, root)


__all__ = [
    "KEPT",
    "keep_stack",
    "kept_folder",
    "kept_root",
    "remove_kept_leftovers",
    "resume_stack",
    "save_stack",
]
