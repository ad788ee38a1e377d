"""An LM run's checkpoint folders: written (a Hugging Face GPT-2, the AdamW moments, the
trainer state and the run's settings), read back with every tensor checked, and found again
when a killed run resumes (the newest complete one; damaged ones named and passed over).

A run's folder holds ``step{n}/``, ``stage{k}-before/``, ``stage{k}-after/`` and ``final/``
(:data:`CHECKPOINT_FOLDER`); at one step they are ordered step < before < after < final.

Example:
    >>> import tempfile
    >>> [bool(CHECKPOINT_FOLDER.match(n)) for n in ("step20", "stage1-after", "final", "run")]
    [True, True, True, False]
    >>> resumable_checkpoints(Path(tempfile.mkdtemp()), steps=10)
    ([], [])
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from probekit.errors import CheckpointError
from probekit.io import atomic_write_text, swapped_directory
from probekit.lm.config import LMConfig
from probekit.lm.layernorm_scaling import (
    UNSCALED_LN_FILE,
    hf_copy,
    hf_name,
    read_unscaled,
    scale_layernorms,
    unscaled_of,
)
from probekit.training.checkpoint import (
    FIX,
    check_finite_tensors,
    check_tensors,
    load_moments,
    save_moments,
    save_quietly,
    write_run_config,
)
from probekit.training.checks import is_int
from probekit.training.loop import kept_checkpoint
from probekit.training.metrics import read_metrics


def adamw(model: torch.nn.Module, cfg: LMConfig) -> torch.optim.AdamW:
    """The AdamW of an LM run: weight decay on the matrices, none on gains and biases."""
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


def save_checkpoint(model, optimizer, path: Path, cfg: LMConfig, state: dict) -> Path:
    """An HF checkpoint plus AdamW moments (safetensors) and trainer state (JSON)."""
    from safetensors.torch import save_file

    exp_avg, exp_avg_sq = {}, {}
    for name, p in model.named_parameters():
        st = optimizer.state.get(p)
        if st:
            exp_avg[hf_name(name)], exp_avg_sq[hf_name(name)] = st["exp_avg"], st["exp_avg_sq"]
    with swapped_directory(path) as tmp:
        save_quietly(hf_copy(model), tmp)
        if cfg.layernorm_scaling:
            save_file(unscaled_of(model), str(tmp / UNSCALED_LN_FILE))
        if exp_avg:
            save_moments(tmp / "optimizer.safetensors", exp_avg, exp_avg_sq)
        atomic_write_text(tmp / "trainer_state.json", json.dumps(state))
        write_run_config(tmp, "lm", {"lm": asdict(cfg)})
    return path


def load_checkpoint(path: Path, cfg: LMConfig, step: int, device: torch.device):
    """Model and optimizer from a checkpoint, the AdamW moments restored (and checked there
    for every parameter once training has begun)."""
    import transformers

    from probekit.model import from_pretrained_complete

    model = from_pretrained_complete(transformers.GPT2LMHeadModel, path)
    check_finite_tensors(path / "model.safetensors", dict(model.named_parameters()))
    if cfg.layernorm_scaling:
        scale_layernorms(model, read_unscaled(path, model))
    model = model.to(device).train()
    optimizer = adamw(model, cfg)
    moments = path / "optimizer.safetensors"
    if not moments.exists():
        if step > 0:
            raise CheckpointError(f"{moments} is missing", fix=FIX)
        return model, optimizer
    try:
        exp_avg, exp_avg_sq, _ = load_moments(moments)
    except Exception as err:  # safetensors raises its own error type on a damaged file
        raise CheckpointError(f"{moments} is corrupt or truncated ({err})", fix=FIX) from err
    shapes = {hf_name(name): tuple(p.shape) for name, p in model.named_parameters()}
    check_tensors(moments, {"exp_avg." + k: v for k, v in exp_avg.items()}, shapes, "exp_avg.")
    check_tensors(
        moments, {"exp_avg_sq." + k: v for k, v in exp_avg_sq.items()}, shapes, "exp_avg_sq."
    )
    for name, p in model.named_parameters():
        optimizer.state[p] = {
            "step": torch.tensor(float(step)),
            "exp_avg": exp_avg[hf_name(name)].to(device),
            "exp_avg_sq": exp_avg_sq[hf_name(name)].to(device),
        }
    return model, optimizer


def checked_metrics(path: Path, step: int, cfg: LMConfig) -> list[dict[str, Any]]:
    """The metrics rows up to ``step``; the row of the last evaluation must be there."""
    rows = read_metrics(path, step)
    last_eval = cfg.last_evaluation(step)
    if last_eval > 0 and not any(r["step"] == last_eval for r in rows):
        what = "is missing" if not path.exists() else f"lacks the row of step {last_eval}"
        raise CheckpointError(f"{path} {what} although a checkpoint is at step {step}", fix=FIX)
    return rows


#: the order at one step of the checkpoint folders a killed run resumes from
_RESUMABLE = {"step": 0, "before": 1, "after": 2, "final": 3}

CHECKPOINT_FOLDER = re.compile(r"^(?:step(?P<n>\d+)|stage(?P<k>\d+)-(?P<when>before|after)|final)$")
"""The name of a checkpoint folder in an LM run's folder: ``step{n}``, ``stage{k}-before``,
``stage{k}-after`` or ``final``."""


def resumable_checkpoints(out: Path, steps: int) -> tuple[list[tuple[int, int, Path]], list[str]]:
    """The checkpoints under ``out`` as (step, order, folder), oldest first, and the problems
    of those whose trainer_state.json is unreadable or holds an impossible step."""
    found, damaged = [], []
    for folder in out.iterdir() if out.is_dir() else ():
        match = CHECKPOINT_FOLDER.match(folder.name)
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


def kept_in(out: Path, steps: int) -> str:
    """What a stopped run leaves: its newest checkpoint, or that there is none."""
    found, _ = resumable_checkpoints(out, steps)
    if not found:
        return kept_checkpoint(None, None)
    step, _, folder = found[-1]
    return kept_checkpoint(step, folder)


def comparable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a resumed run must share with its checkpoint (all but ``deterministic``,
    which changes neither the model nor the data)."""
    return {k: v for k, v in settings.items() if k != "deterministic"}


__all__ = [
    "CHECKPOINT_FOLDER",
    "adamw",
    "checked_metrics",
    "comparable_settings",
    "kept_in",
    "load_checkpoint",
    "resumable_checkpoints",
    "save_checkpoint",
]
