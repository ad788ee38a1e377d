"""One reader for probekit run folders: :func:`load_run` says what trained a checkpoint.

Every checkpoint probekit writes holds ``run_config.json`` with a ``kind`` field: ``"anchor"``
(a run of :func:`probekit.anchor.train` on an anchor task) or ``"lm"`` (a run of
:func:`probekit.lm.train_lm` on the byte corpus). Folders written before the ``kind``
field (anchor: the TrainConfig fields with a ``"task"`` key; LM: ``{"lm": {...}}``) read the
same way.

Example:
    >>> import tempfile
    >>> from probekit.anchor import AnchorTask, TrainConfig, train
    >>> from probekit.training import ModelConfig
    >>> cfg = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), steps=1, batch_size=8,
    ...                   eval_every=1, task=AnchorTask(n_train=64, n_test=16))
    >>> out = train(cfg, tempfile.mkdtemp(), progress=False)
    >>> run = load_run(out.out_dir)
    >>> run.kind, run.path == out.checkpoint, run.task.n_train
    ('anchor', True, 64)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from probekit.anchor import AnchorTask, TrainConfig
from probekit.errors import ConfigError
from probekit.lm.config import LMConfig
from probekit.training.checkpoint import KINDS, RUN_CONFIG, read_run_config


@dataclass(frozen=True)
class RunInfo:
    """What :func:`load_run` found: the kind of run, its checkpoint folder and settings.

    ``config`` holds the saved settings (for anchor runs the TrainConfig fields, for LM runs the
    LMConfig fields) without the ``kind`` field; ``task`` is set for anchor runs, ``lm`` for LM
    runs.
    """

    kind: str
    path: Path
    config: dict
    task: AnchorTask | None
    lm: LMConfig | None


def _folder(path: Path) -> Path | None:
    """The folder whose run_config.json describes ``path`` (a checkpoint or a run folder; a
    run folder whose checkpoint swap was interrupted stands for its ``checkpoint.previous``)."""
    if (path / RUN_CONFIG).is_file() and (path / "config.json").is_file():
        return path  # a checkpoint folder
    for inner in ("checkpoint", "final"):  # an anchor run folder; a finished LM run folder
        if (path / inner / RUN_CONFIG).is_file():
            return path / inner
    if (path / RUN_CONFIG).is_file():
        return path
    previous = path / PREVIOUS
    if not os.path.lexists(path / "checkpoint") and (previous / RUN_CONFIG).is_file():
        return previous  # a kill between the two renames of a checkpoint swap
    return None


PREVIOUS = "checkpoint.previous"
"""The checkpoint before the last one in an anchor run folder. A kill between the two renames of
a checkpoint swap leaves it without ``checkpoint/``; the run folder then stands for it (the
next ``probekit train`` puts it back as ``checkpoint/``)."""


def _kind(stored: dict[str, Any]) -> str | None:
    kind = stored.get("kind")
    if kind is None:  # written before the kind field
        return "lm" if "lm" in stored else "anchor" if "task" in stored else None
    if kind not in KINDS:
        raise ConfigError(
            f"run_config.json names an unknown run kind {kind!r}",
            fix=f"use one of {list(KINDS)}, or train the run again",
        )
    return kind


def _lm_config(settings: Any) -> LMConfig:
    if not isinstance(settings, dict):
        raise ConfigError("an LM run_config.json needs an 'lm' object", fix="train the run again")
    known = {f.name for f in fields(LMConfig)}
    unknown = set(settings) - known
    if unknown:
        raise ConfigError(f"unknown LM settings {sorted(unknown)}", fix=f"use only {sorted(known)}")
    cfg = LMConfig(**settings)
    cfg.validate()
    return cfg


def load_run(path: str | os.PathLike) -> RunInfo | None:
    """The run that wrote ``path`` (a checkpoint folder or a run folder holding ``checkpoint/``).

    Returns None when no probekit ``run_config.json`` is there. Raises
    :class:`~probekit.errors.CheckpointError` for an unreadable file and
    :class:`~probekit.errors.ConfigError` for settings that are not a valid run.
    """
    folder = _folder(Path(path))
    if folder is None:
        return None
    stored = read_run_config(folder)
    kind = _kind(stored or {})
    if stored is None or kind is None:
        return None
    if kind == "lm":
        lm = _lm_config(stored.get("lm"))
        return RunInfo("lm", folder, dict(stored["lm"]), None, lm)
    settings = {k: v for k, v in stored.items() if k != "kind"}
    train = TrainConfig.from_dict(settings)
    return RunInfo("anchor", folder, settings, train.task, None)


__all__ = ["RunInfo", "load_run"]
