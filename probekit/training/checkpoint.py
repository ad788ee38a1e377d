"""Checkpoint I/O shared by both trainers: the run config, AdamW moments, recovery.

A probekit checkpoint folder holds a Hugging Face GPT-2 (``config.json`` + ``model.safetensors``),
``optimizer.safetensors`` (AdamW moments ``exp_avg.<name>`` / ``exp_avg_sq.<name>``),
``trainer_state.json`` (step and what the loop needs to go on) and ``run_config.json``: the
run's settings with a ``kind`` field (one of :data:`KINDS`: a task trainer's settings at the
top level, or ``{"lm": LMConfig fields}``). :func:`probekit.run_folders.load_run` reads it
back. Nothing is pickled.

Example:
    >>> import tempfile, torch
    >>> folder = Path(tempfile.mkdtemp())
    >>> save_moments(folder / "optimizer.safetensors", {"w": torch.ones(2)}, {"w": torch.zeros(2)})
    >>> load_moments(folder / "optimizer.safetensors")[0]["w"].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probekit.errors import CheckpointError, ConfigError
from probekit.io import atomic_write_text, umask_mode
from probekit.numerics import all_finite

RUN_CONFIG = "run_config.json"
#: the ``kind`` values a run_config.json may hold: which trainer wrote the run
KINDS = ("anchor", "lm")
#: the way out of a damaged resume state
FIX = "pass resume=False / --no-resume to start over, or delete the run folder"
#: what a resumed checkpoint's trainer_state.json must hold, and the types of its values
_STATE: dict[str, type | tuple[type, ...]] = {
    "step": int,
    "loss_sum": (int, float),
    "loss_count": int,
}


def write_run_config(folder: str | os.PathLike, kind: str, settings: dict[str, Any]) -> Path:
    """Write ``folder/run_config.json``: ``settings`` with the run ``kind`` in front.

    A task trainer's settings sit at the top level; LM settings sit under ``"lm"``
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
    return read_json_object(
        path,
        unreadable=f"{path} is unreadable",
        fix="delete the folder and train again, or pass an intact checkpoint",
        holding="the settings of a run",
        fix_holding="pass a checkpoint written by probekit train",
    )


def read_json_object(
    path: Path, *, unreadable: str, fix: str, holding: str, fix_holding: str | None = None
) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`CheckpointError` when the file cannot be read or
    parsed (``unreadable``, then the error, and ``fix``) or holds something else than an object
    (which should have been ``holding``; ``fix_holding``, default ``fix``)."""
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{unreadable} ({err})", fix=fix) from err
    if not isinstance(stored, dict):
        raise CheckpointError(
            f"{path} holds {type(stored).__name__}, not {holding}",
            fix=fix if fix_holding is None else fix_holding,
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
    loader: Callable[[Path], dict[str, torch.Tensor]] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Inverse of :func:`save_moments`: ``(exp_avg, exp_avg_sq, other tensors)`` by name.

    ``loader`` reads the file (default ``safetensors.torch.load_file``)."""
    from safetensors.torch import load_file

    exp_avg, exp_avg_sq, other = {}, {}, {}
    tensors = loader(Path(path)) if loader else load_file(str(path))
    for key, value in tensors.items():
        if key.startswith("exp_avg."):
            exp_avg[key[len("exp_avg.") :]] = value
        elif key.startswith("exp_avg_sq."):
            exp_avg_sq[key[len("exp_avg_sq.") :]] = value
        else:
            other[key] = value
    return exp_avg, exp_avg_sq, other


#: the process-wide RNG entries checkpoints written before 2026-12 carried (the runs draw from
#: generators of their own, so their checkpoints no longer hold them): tensors in
#: ``optimizer.safetensors``, objects in ``trainer_state.json``
RNG_TENSORS = ("rng.torch", "rng.numpy")
RNG_ENTRIES = ("rng_numpy", "rng_python")


def check_rng_entries(folder: Path, tensors: dict[str, torch.Tensor], state: dict) -> None:
    """The process RNG entries an older checkpoint carries are intact (a damaged one marks a
    damaged checkpoint); raises :class:`CheckpointError` naming the entry.

    They are only checked, never restored: a run draws its initialization and batches from
    generators seeded by (seed, step), so the process-wide RNGs play no part in it, and a
    checkpoint without them is byte-identical between two identical runs.

    Example:
        >>> check_rng_entries(Path("ck"), {}, {"step": 3})
        >>> try:
        ...     check_rng_entries(Path("ck"), {}, {"rng_python": {"state": [1]}})
        ... except CheckpointError as err:
        ...     print(err.problem)
        ck/trainer_state.json: its rng_python entry is not an intact Python RNG state
    """
    checks = {
        "rng.torch": lambda: torch.Generator().set_state(tensors["rng.torch"]),
        "rng_numpy": lambda: _numpy_state(tensors, state["rng_numpy"]),
        "rng_python": lambda: random.Random().setstate(_python_state(state["rng_python"])),
    }
    names = {
        "rng.torch": ("optimizer.safetensors", "torch RNG state"),
        "rng_numpy": ("trainer_state.json", "numpy RNG state"),
        "rng_python": ("trainer_state.json", "Python RNG state"),
    }
    for key, check in checks.items():
        if key not in tensors and key not in state:
            continue
        try:
            check()
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError, OverflowError) as err:
            file, what = names[key]
            raise CheckpointError(
                f"{folder / file}: its {key} entry is not an intact {what}",
                fix=f"{FIX} (a resume falls back to the previous checkpoint by itself when "
                "one is kept)",
            ) from err


def _numpy_state(tensors: dict[str, torch.Tensor], entry: Any) -> None:
    """Set a throwaway numpy RandomState from an older checkpoint's entries (raises if bad)."""
    key = tensors["rng.numpy"].numpy().astype(np.uint32)
    np.random.RandomState().set_state(
        (entry["kind"], key, entry["pos"], entry["has_gauss"], entry["cached_gaussian"])
    )


def _python_state(entry: Any) -> tuple:
    """The ``random.setstate`` tuple of an older checkpoint's ``rng_python`` entry."""
    state = tuple(entry["state"])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in state):
        raise ValueError("the state holds other values than integers")
    return (entry["version"], state, entry["gauss"])


def previous_of(root: Path) -> Path:
    """Where the checkpoint before ``root`` is kept: ``<root>.previous`` beside it."""
    return root.with_name(root.name + ".previous")


def new_temp_folder(root: Path) -> Path:
    """An empty ``.<name>.*.tmp`` folder beside ``root``, with the user's umask permissions."""
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    os.chmod(tmp, umask_mode())  # mkdtemp makes 0700
    return tmp


def swap_in(tmp: Path, root: Path) -> None:
    """Make the complete folder ``tmp`` the checkpoint ``root``; the old ``root`` becomes
    ``<root>.previous`` (the one before that is deleted).

    A kill between the renames leaves no ``root`` but a complete ``<root>.previous``, which
    :func:`recover_checkpoint` puts back on the next start.
    """
    prev = previous_of(root)
    if root.exists():
        if prev.exists():
            trash = new_temp_folder(root)
            os.replace(prev, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(root, prev)
    os.replace(tmp, root)


def set_aside(root: Path) -> Path:
    """Move a damaged checkpoint ``root`` to ``<root>.corrupt`` (replacing an older one)."""
    corrupt = root.with_name(root.name + ".corrupt")
    if corrupt.exists():
        shutil.rmtree(corrupt, ignore_errors=True)
    os.replace(root, corrupt)
    return corrupt


def recover_checkpoint(root: Path) -> None:
    """Undo what a kill in the middle of a checkpoint swap leaves behind.

    :func:`probekit.io.swapped_directory` (LM checkpoints) moves the old folder aside
    (``.checkpoint.*.old/old``) where it cannot exchange the two atomically, before it
    renames the new one into place, :func:`swap_in` moves it to ``<root>.previous``; a kill
    between the two renames leaves no ``checkpoint``. Put the old one back, and remove
    half-written ``.checkpoint.*.tmp`` folders.
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
    prev = previous_of(root)
    if not root.exists() and prev.is_dir():
        os.replace(prev, root)
        warnings.warn(
            f"{root} was missing (a save was interrupted between its two renames); the "
            f"complete {prev.name} (step {_step_of(root)}) is put back and used",
            stacklevel=2,
        )


def _step_of(folder: Path) -> Any:
    """The step a checkpoint's trainer_state.json names, or ``"unknown"``."""
    try:
        return json.loads((folder / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def remove_leftovers(folder: Path, names: tuple[str, ...]) -> None:
    """Delete the ``.<name>.*.tmp`` files a kill during an atomic write left in ``folder``."""
    for name in names:
        for tmp in folder.glob(f".{name}.*.tmp"):
            if tmp.is_file():
                tmp.unlink(missing_ok=True)


def read_trainer_state(folder: Path, steps: int) -> dict[str, Any]:
    """``folder/trainer_state.json``, checked: a JSON object whose step lies in [0, steps]."""
    path = folder / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is missing or unreadable ({err})", fix=FIX) from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds {type(state).__name__}, not an object", fix=FIX)
    for key, kind in _STATE.items():
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(f"{path}: {key} is {value!r}", fix=FIX)
    if not 0 <= state["step"] <= steps:
        raise CheckpointError(
            f"{path}: step {state['step']} is outside the run's [0, {steps}] steps", fix=FIX
        )
    if not math.isfinite(state["loss_sum"]) or state["loss_count"] < 0:
        raise CheckpointError(f"{path}: the loss sums are not finite counts", fix=FIX)
    diverged = state.get("diverged_at")
    if diverged is not None and not (isinstance(diverged, int) and 0 < diverged <= steps):
        raise CheckpointError(f"{path}: diverged_at is {diverged!r}", fix=FIX)
    return state


def check_tensors(
    path: Path,
    tensors: dict[str, torch.Tensor],
    shapes: dict[str, tuple[int, ...]],
    prefix: str = "",
    optional: tuple[str, ...] = (),
) -> None:
    """Every name of ``shapes`` is in ``tensors`` (as ``prefix + name``) with that shape."""
    missing = [k for k in shapes if prefix + k not in tensors and k not in optional]
    wrong = [
        f"{k} {tuple(tensors[prefix + k].shape)} (want {shapes[k]})"
        for k in shapes
        if prefix + k in tensors and tuple(tensors[prefix + k].shape) != shapes[k]
    ]
    if missing or wrong:
        parts = [f"missing {missing[:6]}"] if missing else []
        parts += [f"wrong shapes {wrong[:6]}"] if wrong else []
        raise CheckpointError(f"{path} does not match the run: {'; '.join(parts)}", fix=FIX)


def check_finite_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a checkpoint file whose tensors hold NaN or infinite values, naming the first
    one: probekit never saves such a checkpoint (a diverging run stops before it saves), so
    resuming it could only train on NaN. (A resume then falls back to the previous checkpoint
    when it is sound.)"""
    for name, tensor in tensors.items():
        if not all_finite(tensor):
            raise CheckpointError(
                f"{path} holds NaN or infinite values in {name}, so the run cannot resume from it",
                fix="delete that checkpoint to resume from the one before it, or " + FIX,
            )


def check_moments(path: Path, moments: tuple[dict, dict, dict], shapes: dict) -> None:
    """The AdamW moments of every parameter are in the optimizer file."""
    exp_avg, exp_avg_sq, other = moments
    check_tensors(path, {"exp_avg." + k: v for k, v in exp_avg.items()}, shapes, "exp_avg.")
    check_tensors(
        path, {"exp_avg_sq." + k: v for k, v in exp_avg_sq.items()}, shapes, "exp_avg_sq."
    )


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


def _differences(saved: Any, wanted: Any, prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ between two nested dicts."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        out = []
        for key in sorted(set(saved) | set(wanted), key=str):
            out += _differences(saved.get(key), wanted.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == wanted else [prefix.rstrip(".") or "the settings"]


def check_same_settings(folder: Path, saved: Any, wanted: dict[str, Any]) -> None:
    """Refuse to resume from a checkpoint written with other settings, naming them."""
    if saved != wanted:
        diff = _differences(saved, wanted)
        shown = ", ".join(
            f"{d} (saved {_lookup(saved, d)!r}, now {_lookup(wanted, d)!r})" for d in diff[:5]
        )
        raise ConfigError(
            f"the checkpoint in {folder} was written by a run with other settings: {shown}"
            + (f" and {len(diff) - 5} more" if len(diff) > 5 else ""),
            fix="use a new output folder, the original settings, or --no-resume",
        )


def _lookup(settings: Any, dotted: str) -> Any:
    if dotted == "the settings":
        return settings
    for key in dotted.split("."):
        if not isinstance(settings, dict):
            return settings
        settings = settings.get(key)
    return settings
