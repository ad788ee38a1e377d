"""Checkpoint I/O shared by both trainers: the run config, AdamW moments, RNG state, recovery.

A probekit checkpoint folder holds a Hugging Face GPT-2 (``config.json`` + ``model.safetensors``),
``optimizer.safetensors`` (AdamW moments ``exp_avg.<name>`` / ``exp_avg_sq.<name>``, and the
torch/numpy RNG state under ``rng.*``), ``trainer_state.json`` (step and what the loop needs to
go on) and ``run_config.json``: the run's settings with a ``kind`` field, ``"anchor"`` (the
:class:`~probekit.training.trainer.TrainConfig` fields) or ``"lm"`` (``{"lm": LMConfig
fields}``). :func:`probekit.training.runs.load_run` reads it back. Nothing is pickled.

Example:
    >>> import tempfile, torch
    >>> folder = Path(tempfile.mkdtemp())
    >>> save_moments(folder / "optimizer.safetensors", {"w": torch.ones(2)}, {"w": torch.zeros(2)})
    >>> load_moments(folder / "optimizer.safetensors")[0]["w"].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probekit.errors import CheckpointError, ConfigError
from probekit.io import atomic_write_text

RUN_CONFIG = "run_config.json"
KINDS = ("anchor", "lm")


def write_run_config(folder: str | os.PathLike, kind: str, settings: dict[str, Any]) -> Path:
    """Write ``folder/run_config.json``: ``settings`` with the run ``kind`` in front.

    Anchor settings are the TrainConfig fields at the top level; LM settings sit under ``"lm"``
    (the layout readers written before the ``kind`` field expect).

    Example:
        >>> import tempfile
        >>> path = write_run_config(tempfile.mkdtemp(), "lm", {"lm": {"steps": 3}})
        >>> json.loads(path.read_text())["kind"]
        'lm'
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown run kind {kind!r}", fix=f"use one of {list(KINDS)}")
    body = {"kind": kind, **{k: v for k, v in settings.items() if k != "kind"}}
    return atomic_write_text(Path(folder) / RUN_CONFIG, json.dumps(body, indent=1))


def read_run_config(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON of ``folder/run_config.json`` as written; None when there is none.

    Raises :class:`CheckpointError` when the file is there but not a readable JSON object.
    """
    path = Path(folder) / RUN_CONFIG
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{path} is unreadable ({err})",
            fix="delete the folder and train again, or pass an intact checkpoint",
        ) from err
    if not isinstance(stored, dict):
        raise CheckpointError(
            f"{path} holds {type(stored).__name__}, not the settings of a run",
            fix="pass a checkpoint written by probekit train",
        )
    return stored


def save_moments(
    path: str | os.PathLike,
    exp_avg: dict[str, torch.Tensor],
    exp_avg_sq: dict[str, torch.Tensor],
    extra: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write AdamW moments by parameter name (plus ``extra`` tensors) to one safetensors file."""
    from safetensors.torch import save_file

    tensors = {}
    for name in exp_avg:
        tensors["exp_avg." + name] = exp_avg[name].detach().cpu().contiguous()
        tensors["exp_avg_sq." + name] = exp_avg_sq[name].detach().cpu().contiguous()
    tensors.update(extra or {})
    save_file(tensors, str(path))


def load_moments(
    path: str | os.PathLike,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Inverse of :func:`save_moments`: ``(exp_avg, exp_avg_sq, other tensors)`` by name."""
    from safetensors.torch import load_file

    exp_avg, exp_avg_sq, other = {}, {}, {}
    for key, value in load_file(str(path)).items():
        if key.startswith("exp_avg."):
            exp_avg[key[len("exp_avg.") :]] = value
        elif key.startswith("exp_avg_sq."):
            exp_avg_sq[key[len("exp_avg_sq.") :]] = value
        else:
            other[key] = value
    return exp_avg, exp_avg_sq, other


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The process's torch, numpy and python RNG state as (tensors, JSON-ready dict)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    tensors = {
        "rng.torch": torch.get_rng_state(),
        "rng.numpy": torch.from_numpy(np_state[1].astype(np.int64)),
    }
    state = {
        "rng_numpy": {
            "kind": np_state[0],
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "rng_python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }
    return tensors, state


def set_rng_state(tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`; parts missing from an older checkpoint are left alone."""
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"])
    npk = state.get("rng_numpy")
    if npk is not None and "rng.numpy" in tensors:
        key = tensors["rng.numpy"].numpy().astype(np.uint32)
        np.random.set_state(
            (npk["kind"], key, npk["pos"], npk["has_gauss"], npk["cached_gaussian"])
        )
    py = state.get("rng_python")
    if py is not None:
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))


def recover_checkpoint(root: Path) -> None:
    """Undo what a kill in the middle of an atomic checkpoint swap leaves behind.

    ``atomic_directory`` moves the old checkpoint aside (``.checkpoint.*.old/old``) before it
    renames the new one into place; a kill between the two renames leaves no ``checkpoint``.
    Put the old one back, and remove half-written ``.checkpoint.*.tmp`` folders.
    """
    parent = root.parent
    if not parent.is_dir():
        return
    for tmp in parent.glob(f".{root.name}.*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    olds = sorted(parent.glob(f".{root.name}.*.old"), key=lambda p: p.stat().st_mtime)
    for old in olds:
        if not root.exists() and (old / "old").is_dir():
            os.replace(old / "old", root)
        shutil.rmtree(old, ignore_errors=True)


def save_quietly(model: Any, path: Path) -> None:
    """``save_pretrained`` without the Hugging Face progress bar."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def unreadable(folder: Path, err: Exception) -> CheckpointError:
    """The error for a checkpoint that is there but cannot be read back."""
    return CheckpointError(
        f"checkpoint {folder} is incomplete or unreadable ({err})",
        fix="delete it to start over, or pass resume=False / --no-resume",
    )


def check_same_settings(folder: Path, saved: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to resume from a checkpoint written with other settings."""
    if saved != wanted:
        raise ConfigError(
            f"the checkpoint in {folder} was written by a run with other settings",
            fix="use a new output folder, the original settings, or --no-resume",
        )
