"""Levine et al. (2020): a depth x width grid of language models, for the width at which a
deeper model of the same size stops losing to a shallower one.

:func:`width_transition` pretrains one byte-level GPT-2 per depth x width x seed (GPT-2 blocks,
``d_mlp = 4 d_model``, heads of ``head_dim`` each dividing ``d_model``) on the byte corpus
(:func:`~probekit.lm.train_lm`) and tables its validation loss beside its exact parameter
count; :func:`~probekit.studies.transition_width` and
:func:`~probekit.studies.fit_transition` read the transition from that table. The study runs
through :mod:`probekit.studies.runner` (a folder that resumes, local or Ray).

Example:
    >>> import tempfile
    >>> study = width_transition(tempfile.mkdtemp(), scale="cpu", dry_run=True, progress=False)
    >>> sorted(set(study.plan.depth)), sorted(set(study.plan.width))
    ([1, 2, 4, 6], [32, 48, 64, 96, 128])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.errors import ConfigError
from probekit.lm import training as _training
from probekit.lm.config import LMConfig
from probekit.lm.corpus import VOCAB_SIZE
from probekit.sources import DatasetChoice
from probekit.studies.data import StudyData
from probekit.studies.runner import Study, carry_out, member_steps, preset_of, resumable
from probekit.training.families import gpt2_parameter_count

COLUMNS = [
    "depth",
    "width",
    "d_mlp",
    "n_heads",
    "n_params",
    "seed",
    "lm_val_loss",
    "pretrain_flops",
    "seconds",
]
"""The members table's columns, in order (``OUT/members.csv``)."""

DRY_RUN_COLUMNS = ["name", "depth", "width", "d_mlp", "n_heads", "n_params", "seed", "tokens"]
DRY_RUN_COLUMNS += ["flops"]

PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {
        "depths": [1, 2, 4, 6],
        "widths": [32, 48, 64, 96, 128],
        "seeds": [0, 1],
        "head_dim": 16,
        "lm": {"seq_len": 64, "batch_size": 16, "steps": 600, "lr": 3e-3},
        "lm_extra": {"eval_every": 200, "corpus_max_files": 400},
        "device": "cpu",
    },
    # Levine et al.'s depths; widths and token counts are estimates (docs/studies.md)
    "paper": {
        "depths": [6, 12, 18, 24, 30, 36, 42, 48],
        "widths": [256, 384, 512, 768, 1024, 1536, 2048],
        "seeds": [0],
        "head_dim": 64,
        "lm": {"seq_len": 1024, "batch_size": 256, "steps": None, "lr": 6e-4},
        "lm_extra": {"eval_every": 1000},
        "tokens_per_parameter": 20,
        "device": "gpu",
    },
}
"""``scale="cpu"`` and ``scale="paper"``: their settings (any argument given overrides them)."""

DEFAULTS: dict[str, Any] = {
    "depths": [1, 2, 4],
    "widths": [32, 64, 128],
    "seeds": [0],
    "head_dim": 16,
    "lm": {"seq_len": 64, "batch_size": 16, "steps": 200, "lr": 3e-3},
    "lm_extra": {"eval_every": 100},
    "device": "cpu",
}


class TransitionStudy(Study):
    """:func:`width_transition`'s study: ``plan``, ``members`` (:data:`COLUMNS`), ``meta``,
    ``result`` (a :class:`~probekit.studies.results.TransitionResult`), ``page``."""


def _positive_ints(name: str, values: Sequence[int], example: str, least: int = 1) -> list[int]:
    values = list(values)
    if len(values) < least or any(not isinstance(v, int) or v < 1 for v in values):
        raise ConfigError(
            f"{name} {values} must be {least}+ positive integers", fix=f"e.g. {example}"
        )
    return sorted(set(values))


def heads_of(width: int, head_dim: int) -> int:
    """The heads of a width: ``width // head_dim`` (1 below one head's width)."""
    if width >= head_dim and width % head_dim:
        raise ConfigError(
            f"width {width} is not a multiple of the head width {head_dim}",
            fix=f"use widths that are multiples of {head_dim} (or narrower than it: one head)",
        )
    return max(1, width // head_dim)


def width_transition(
    out: str | Path,
    *,
    depths: Sequence[int] | None = None,
    widths: Sequence[int] | None = None,
    seeds: Sequence[int] | None = None,
    scale: str | None = None,
    steps: int | None = None,
    corpus: str | None = None,
    text: str | os.PathLike | None = None,
    dataset: str | DatasetChoice | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    device: str | None = None,
    progress: bool = True,
    dry_run: bool = False,
) -> TransitionStudy:
    """Levine et al.'s grid in the folder ``out``: every depth x width x seed pretrained on
    the byte corpus (one of ``corpus``: a folder of ``.py`` files, ``text``: a text file,
    ``dataset``: a data set's name or file or a :class:`~probekit.sources.DatasetChoice`;
    default the standard library: see :mod:`probekit.studies.data`).

    ``scale``: ``"cpu"``, ``"paper"`` (never trained here: its ``dry_run`` prints the cost)
    or None; the other arguments override the scale's settings. Fewer than 3 depths and
    widths that are not multiples of the head width are one :class:`ConfigError` before
    any work. A killed study run again resumes.
    """
    preset = preset_of(scale, PRESETS, DEFAULTS)
    lm = dict(preset["lm"])
    if steps is not None:
        lm["steps"] = steps
    config = {
        "depths": _positive_ints(
            "depths", preset["depths"] if depths is None else depths, "1,2,4", least=3
        ),
        "widths": _positive_ints("widths", preset["widths"] if widths is None else widths, "32,64"),
        "seeds": sorted(set(preset["seeds"] if seeds is None else seeds)),
        "head_dim": preset["head_dim"],
        "lm": lm,
        "lm_extra": dict(preset["lm_extra"]),
        "tokens_per_parameter": preset.get("tokens_per_parameter"),
        "corpus": corpus,
    }
    data = StudyData.of(corpus, text, dataset, preset["lm_extra"].get("corpus_max_files"))
    config |= data.config()
    if not config["seeds"] or any(not isinstance(s, int) or s < 0 for s in config["seeds"]):
        raise ConfigError(f"seeds {config['seeds']} must be integers >= 0", fix="e.g. 0,1")
    device = device or ("cpu" if preset["device"] == "cpu" else "auto")
    plan, jobs = _plan(config, device, data.corpus_root(Path(out)))
    study = TransitionStudy(Path(out), plan, pd.DataFrame(columns=COLUMNS), config)
    return carry_out(
        study,
        "transition",
        jobs,
        train_member,
        columns=COLUMNS,
        dry_run_columns=DRY_RUN_COLUMNS,
        build="transition_result",
        scale=scale,
        plan_device=preset["device"],
        device=device,
        executor=executor,
        ray_address=ray_address,
        progress=progress,
        dry_run=dry_run,
        data=data,
        seq_len=lm["seq_len"],
    )


def _plan(
    config: dict[str, Any], device: str, corpus_root: str | None
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """One planned row and one job per member (``corpus_root``: what the members pretrain
    on); the runs' settings are checked here."""
    rows, jobs = [], []
    for depth in config["depths"]:
        for width in config["widths"]:
            for seed in config["seeds"]:
                cfg = _lm_config(config, depth, width, seed, corpus_root)
                n = gpt2_parameter_count(
                    depth, width, 4 * width, VOCAB_SIZE, cfg.seq_len, tie_embeddings=True
                )
                tokens = cfg.steps * cfg.batch_size * cfg.seq_len
                rows.append(
                    {
                        "name": f"L{depth}-w{width}-s{seed}",
                        "depth": depth,
                        "width": width,
                        "d_mlp": 4 * width,
                        "n_heads": cfg.n_heads,
                        "n_params": n,
                        "seed": seed,
                        "tokens": tokens,
                        "flops": 6.0 * n * tokens,
                    }
                )
                jobs.append({"lm": asdict(cfg), "device": device})
    return pd.DataFrame(rows), jobs


def _lm_config(
    config: dict[str, Any], depth: int, width: int, seed: int, corpus_root: str | None
) -> LMConfig:
    """One member's LM run settings (checked: a ConfigError here)."""
    lm = dict(config["lm"])
    n = gpt2_parameter_count(depth, width, 4 * width, VOCAB_SIZE, lm["seq_len"], True)
    steps = member_steps(lm, n, config["tokens_per_parameter"])
    del lm["steps"]
    cfg = LMConfig(
        n_layers=depth,
        d_model=width,
        d_mlp=4 * width,
        n_heads=heads_of(width, config["head_dim"]),
        seed=seed,
        steps=int(steps),
        corpus_root=corpus_root,
        **lm,
        **config["lm_extra"],
    )
    cfg = resumable(cfg)
    cfg.validate()
    return cfg


def train_member(folder: Path, job: dict[str, Any]) -> dict[str, Any]:
    """Pretrain one member of the grid in ``folder``."""
    run = _training.train_lm(
        LMConfig(**job["lm"]), folder / "pretrain", progress=False, device=job["device"]
    )
    return {
        "lm_val_loss": float(run.metrics.val_loss.iloc[-1]),
        "pretrain_flops": float(run.flops),
    }


__all__ = ["COLUMNS", "PRESETS", "TransitionStudy", "heads_of", "width_transition"]
