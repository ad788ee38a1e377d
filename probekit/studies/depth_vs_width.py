"""Petty et al. (NAACL 2024): depth against width at a fixed parameter budget, measured by
compositional generalization after pretraining and fine-tuning.

:func:`depth_width` runs one member per budget x depth x seed: the parameter-matched byte-level
GPT-2 of that depth (:func:`~probekit.training.families.depth_family`, style ``"width"``:
Petty et al. keep the parameter count by narrowing the model as it deepens, ``d_model`` a
multiple of the heads and ``d_mlp`` near 4 ``d_model`` absorbing the rounding), pretrained on
the byte corpus (:func:`~probekit.lm.train_lm`), then fine-tuned on the composition task
(:func:`~probekit.lm.finetune_lm`; ``from_scratch=True`` trains on the task without
pretraining), scored by exact match on seen and held-out combinations. Each member is a folder
under ``OUT/members/`` (``pretrain/`` and ``finetune/`` run folders, ``member.json`` last); the
study runs through :mod:`probekit.studies.runner`.

Example:
    >>> import tempfile
    >>> study = depth_width(tempfile.mkdtemp(), scale="cpu", dry_run=True, progress=False)
    >>> len(study.plan), study.members.empty
    (18, True)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pandas as pd

from probekit.anchor import AnchorTask, TrainConfig
from probekit.errors import ConfigError
from probekit.lm import finetune as _finetune
from probekit.lm import training as _training
from probekit.lm.config import LMConfig
from probekit.lm.corpus import VOCAB_SIZE
from probekit.lm.finetune import FinetuneConfig
from probekit.sources import DatasetChoice
from probekit.studies.data import StudyData
from probekit.studies.runner import Study, carry_out, member_steps, preset_of, resumable
from probekit.tasks.compositions import CompositionTask
from probekit.training.families import depth_family
from probekit.training.models import ModelConfig

COLUMNS = [
    "budget",
    "depth",
    "d_model",
    "d_mlp",
    "n_heads",
    "n_params",
    "seed",
    "lm_val_loss",
    "lm_perplexity",
    "acc_seen",
    "acc_heldout",
    "pretrain_flops",
    "finetune_flops",
    "seconds",
]
"""The members table's columns, in order (``OUT/members.csv``)."""

DRY_RUN_COLUMNS = ["name", "budget", "depth", "d_model", "d_mlp", "n_heads", "n_params"]
DRY_RUN_COLUMNS += ["seed", "tokens", "pretrain_flops", "finetune_flops", "flops"]

STYLE = "width"
"""The family style: Petty et al. narrow the model (its width) as it deepens."""

PRESETS: dict[str, dict[str, Any]] = {
    # measured here (docs/studies.md): 6-11 s per 100 steps of a 300k member on 2 cores
    "cpu": {
        "budgets": [300_000],
        "depths": [1, 2, 3, 4, 6, 8],
        "seeds": [0, 1, 2],
        "lm": {"seq_len": 64, "batch_size": 16, "steps": 600, "lr": 3e-3, "n_heads": 4},
        "lm_extra": {"eval_every": 200, "corpus_max_files": 400},
        "finetune": {"steps": 800, "batch_size": 32, "lr": 3e-3, "eval_every": 400},
        "task": {"max_number": 99, "max_letters": 4},
        "device": "cpu",
    },
    # Petty et al.'s budgets and depths; token counts are estimates (20 tokens per
    # parameter for pretraining), see docs/studies.md
    "paper": {
        "budgets": [41_000_000, 134_000_000, 374_000_000],
        "depths": {
            41_000_000: [4, 6, 8, 10, 12],
            134_000_000: [4, 8, 12, 18, 24],
            374_000_000: [4, 8, 12, 18, 24, 30, 36],
        },
        "seeds": [0, 1, 2],
        "lm": {"seq_len": 1024, "batch_size": 256, "steps": None, "lr": 6e-4, "n_heads": 8},
        "lm_extra": {"eval_every": 1000},
        "tokens_per_parameter": 20,
        "finetune": {"steps": 10_000, "batch_size": 128, "lr": 1e-4, "eval_every": 1000},
        "task": {},
        "device": "gpu",
    },
}
"""``scale="cpu"`` and ``scale="paper"``: their settings (any argument given overrides them)."""

DEFAULTS: dict[str, Any] = {
    "budgets": [300_000],
    "depths": [1, 2, 4],
    "seeds": [0],
    "lm": {"seq_len": 64, "batch_size": 16, "steps": 200, "lr": 3e-3, "n_heads": 4},
    "lm_extra": {"eval_every": 100},
    "finetune": {"steps": 200, "batch_size": 32, "lr": 3e-3, "eval_every": 100},
    "task": {"max_number": 99, "max_letters": 4},
    "device": "cpu",
}
"""``scale=None``: a small study (the arguments set the rest)."""


class DepthWidthStudy(Study):
    """:func:`depth_width`'s study: ``plan``, ``members`` (:data:`COLUMNS`), ``meta``,
    ``result`` (a :class:`~probekit.studies.results.DepthWidthResult`), ``page``."""


def _depths_per_budget(
    budgets: Sequence[int], depths: Sequence[int] | Mapping[int, Sequence[int]]
) -> dict[int, list[int]]:
    """Each budget's depths (one list for all, or one per budget), at least 3 each."""
    out = {}
    for budget in budgets:
        these = depths.get(budget) if isinstance(depths, Mapping) else depths
        if these is None:
            raise ConfigError(f"no depths given for budget {budget:,}", fix="list its depths")
        these = sorted(set(these))
        if len(these) < 3:
            raise ConfigError(
                f"{len(these)} depth(s) {these} for budget {budget:,}: a fit of accuracy "
                "against depth needs at least 3",
                fix="give at least 3 depths, e.g. --depths 1,2,4",
            )
        out[int(budget)] = these
    return out


def _check_widths(budget: int, depths: Sequence[int], n_heads: int, emb: int) -> None:
    """Refuse a depth whose width (a multiple of the heads) would round to 0 (``emb``: the
    embedding parameters per unit of width)."""
    for depth in depths:
        a, b = 12 * depth, emb + 13 * depth + 2
        exact = (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
        if round(exact / n_heads) < 1:
            raise ConfigError(
                f"at depth {depth} a budget of {budget:,} parameters leaves a width of "
                f"{exact:.1f}, which rounds to 0 heads of {n_heads}",
                fix="raise the budget, use fewer heads, or drop the deepest depths",
            )


def family_table(
    budgets: Sequence[int],
    depths: Mapping[int, Sequence[int]],
    n_heads: int,
    seq_len: int,
    vocab_size: int = VOCAB_SIZE,
    tie_embeddings: bool = True,
) -> pd.DataFrame:
    """The members' shapes: one row per budget x depth (exact parameter counts, within 1%;
    by default the byte-level LM's: vocabulary 259, tied embeddings)."""
    frames = []
    emb = vocab_size * (1 if tie_embeddings else 2) + seq_len
    for budget in budgets:
        _check_widths(budget, depths[budget], n_heads, emb)
        fam = depth_family(
            budget,
            depths[budget],
            style=STYLE,
            n_heads=n_heads,
            vocab_size=vocab_size,
            n_positions=seq_len,
            tie_embeddings=tie_embeddings,
        )
        frames.append(fam.df.assign(budget=int(budget)))
    df = pd.concat(frames, ignore_index=True)
    return df.rename(columns={"params": "n_params"})


def depth_width(
    out: str | Path,
    *,
    budgets: Sequence[int] | None = None,
    depths: Sequence[int] | Mapping[int, Sequence[int]] | None = None,
    seeds: Sequence[int] | None = None,
    scale: str | None = None,
    steps: int | None = None,
    finetune_steps: int | None = None,
    corpus: str | None = None,
    text: str | os.PathLike | None = None,
    dataset: str | DatasetChoice | None = None,
    task: CompositionTask | AnchorTask | str | None = None,
    from_scratch: bool = False,
    executor: str = "local",
    ray_address: str | None = None,
    device: str | None = None,
    progress: bool = True,
    dry_run: bool = False,
) -> DepthWidthStudy:
    """Petty et al.'s study in the folder ``out``: per budget x depth x seed, a
    parameter-matched byte-level GPT-2 pretrained on the corpus (one of ``corpus``: a folder
    of ``.py`` files, ``text``: a text file, ``dataset``: a data set's name or file, or a
    :class:`~probekit.sources.DatasetChoice` with its config, split and column; default the
    standard library: see :mod:`probekit.studies.data`), fine-tuned on ``task`` (default the
    composition task with the scale's inputs; ``from_scratch``: no pretraining), scored.
    ``task="anchor"`` (or an :class:`~probekit.anchor.AnchorTask`): each member is trained on
    the anchor-function task from scratch instead (the second choice).

    ``scale``: ``"cpu"``, ``"paper"`` (never trained here: its ``dry_run`` prints the cost)
    or None; the other arguments override the scale's settings. ``steps``: pretraining steps,
    ``finetune_steps``: fine-tuning steps. Bad budgets and depths are one
    :class:`ConfigError` before any work. A killed study run again resumes.
    """
    preset = preset_of(scale, PRESETS, DEFAULTS)
    data = StudyData.of(corpus, text, dataset, preset["lm_extra"].get("corpus_max_files"))
    config = _config(preset, budgets, depths, seeds, steps, finetune_steps, corpus, task)
    config |= data.config()
    # the anchor task's tokens are not bytes: its members train on it from scratch
    config["from_scratch"] = bool(from_scratch) or config["task_kind"] == "anchor"
    if config["from_scratch"] and (corpus or text or dataset):
        raise ConfigError(
            f"pretraining data ({data.describe()}) is given, but the members are trained on "
            "the task from scratch",
            fix="leave out the corpus, text and dataset, or pretrain (no from_scratch, no anchor)",
        )
    device = device or ("cpu" if preset["device"] == "cpu" else "auto")
    plan, jobs = _plan(config, device, data.corpus_root(Path(out)))
    study = DepthWidthStudy(Path(out), plan, pd.DataFrame(columns=COLUMNS), config)
    return carry_out(
        study,
        "depth-width",
        jobs,
        train_member,
        columns=COLUMNS,
        dry_run_columns=DRY_RUN_COLUMNS,
        build="depth_width_result",
        scale=scale,
        plan_device=preset["device"],
        device=device,
        executor=executor,
        ray_address=ray_address,
        progress=progress,
        dry_run=dry_run,
        data=None if config["from_scratch"] else data,
        seq_len=config["lm"]["seq_len"],
    )


def _config(
    preset: dict[str, Any],
    budgets: Sequence[int] | None,
    depths: Sequence[int] | Mapping[int, Sequence[int]] | None,
    seeds: Sequence[int] | None,
    steps: int | None,
    finetune_steps: int | None,
    corpus: str | None,
    task: CompositionTask | AnchorTask | str | None,
) -> dict[str, Any]:
    """The study's settings as JSON types (what ``study.json`` holds), checked."""
    budgets = list(preset["budgets"] if budgets is None else budgets)
    if not budgets or any(not isinstance(b, int) or b < 1 for b in budgets):
        raise ConfigError(f"budgets {budgets} must be positive integers", fix="e.g. 300000")
    per_budget = _depths_per_budget(budgets, preset["depths"] if depths is None else depths)
    seeds = list(preset["seeds"] if seeds is None else seeds)
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ConfigError(f"seeds {seeds} must be integers >= 0", fix="e.g. 0,1,2")
    lm = dict(preset["lm"])
    if steps is not None:
        lm["steps"] = steps
    finetune = dict(preset["finetune"])
    if finetune_steps is not None:
        finetune["steps"] = finetune_steps
    the_task = _task(task, preset)
    return {
        "budgets": budgets,
        "depths": {str(b): d for b, d in per_budget.items()},
        "seeds": seeds,
        "style": STYLE,
        "lm": lm,
        "lm_extra": dict(preset.get("lm_extra", {})),
        "tokens_per_parameter": preset.get("tokens_per_parameter"),
        "finetune": finetune,
        "task": the_task.to_dict(),
        "task_kind": "anchor" if isinstance(the_task, AnchorTask) else "composition",
        "corpus": corpus,
    }


def _task(
    task: CompositionTask | AnchorTask | str | None, preset: dict[str, Any]
) -> CompositionTask | AnchorTask:
    if task is None:
        task = CompositionTask(**preset["task"])
    if isinstance(task, str):
        if task != "anchor":
            raise ConfigError(
                f"unknown task {task!r}", fix="pass a CompositionTask, an AnchorTask or 'anchor'"
            )
        task = AnchorTask()
    if not isinstance(task, CompositionTask | AnchorTask):
        raise ConfigError(
            f"task {task!r:.60} is not a CompositionTask or an AnchorTask", fix="pass one"
        )
    task.validate()
    return task


def _plan(
    config: dict[str, Any], device: str, corpus_root: str | None
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """One planned row and one job per member (``corpus_root``: what the members pretrain
    on); the runs' settings are checked here."""
    lm = config["lm"]
    depths = {int(b): d for b, d in config["depths"].items()}
    if config["task_kind"] == "anchor":
        return _anchor_plan(config, depths, device)
    shapes = family_table(config["budgets"], depths, lm["n_heads"], lm["seq_len"])
    task = CompositionTask.from_dict(config["task"])
    rows, jobs = [], []
    for shape in shapes.itertuples():
        for seed in config["seeds"]:
            lm_cfg, ft_cfg = _run_configs(config, shape, seed, task, corpus_root)
            tokens = (
                0 if config["from_scratch"] else lm_cfg.steps * lm_cfg.batch_size * lm["seq_len"]
            )
            ft_tokens = ft_cfg.steps * ft_cfg.batch_size * task.seq_len
            n = int(shape.n_params)
            pretrain_flops, finetune_flops = 6.0 * n * tokens, 6.0 * n * ft_tokens
            row: dict[str, Any] = {
                "name": f"b{shape.budget}-L{shape.depth}-s{seed}",
                **_shape_row(shape, seed),
                "tokens": tokens,
                "pretrain_flops": pretrain_flops,
                "finetune_flops": finetune_flops,
                "flops": pretrain_flops + finetune_flops,
            }
            rows.append(row)
            jobs.append(
                {
                    "lm": asdict(lm_cfg),
                    "finetune": {**asdict(ft_cfg), "task": task.to_dict()},
                    "from_scratch": config["from_scratch"],
                    "device": device,
                }
            )
    return pd.DataFrame(rows), jobs


def _anchor_plan(
    config: dict[str, Any], depths: dict[int, list[int]], device: str
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The plan on the anchor-function task: each member trained on it from scratch with the
    anchor trainer (its vocabulary and positions, untied embeddings), the fine-tuning
    settings as its run settings."""
    task = AnchorTask.from_dict(config["task"])
    base = ModelConfig(vocab_size=task.vocab_size, n_positions=task.seq_len)
    shapes = family_table(
        config["budgets"],
        depths,
        config["lm"]["n_heads"],
        base.n_positions,
        vocab_size=base.vocab_size,
        tie_embeddings=False,
    )
    ft = config["finetune"]
    rows, jobs = [], []
    for shape in shapes.itertuples():
        model = replace(
            base,
            n_layers=int(shape.depth),
            d_model=int(shape.d_model),
            d_mlp=int(shape.d_mlp),
            n_heads=int(shape.n_heads),
        )
        for seed in config["seeds"]:
            every = min(ft["eval_every"], ft["steps"])
            run = TrainConfig(
                model=model,
                task=task,
                steps=ft["steps"],
                batch_size=ft["batch_size"],
                lr=ft["lr"],
                eval_every=every,
                checkpoint_every=every,
                seed=int(seed),
                device=device,
            )
            run.validate()
            n = int(shape.n_params)
            flops = 6.0 * n * run.steps * run.batch_size * task.seq_len
            rows.append(
                {
                    "name": f"b{shape.budget}-L{shape.depth}-s{seed}",
                    **_shape_row(shape, seed),
                    "tokens": 0,
                    "pretrain_flops": 0.0,
                    "finetune_flops": flops,
                    "flops": flops,
                }
            )
            jobs.append({"anchor": run.to_dict()})
    return pd.DataFrame(rows), jobs


def _shape_row(shape: Any, seed: int) -> dict[str, Any]:
    """A member's shape, as JSON types."""
    return {
        "budget": int(shape.budget),
        "depth": int(shape.depth),
        "d_model": int(shape.d_model),
        "d_mlp": int(shape.d_mlp),
        "n_heads": int(shape.n_heads),
        "n_params": int(shape.n_params),
        "seed": int(seed),
    }


def _run_configs(
    config: dict[str, Any], shape: Any, seed: int, task: CompositionTask, corpus_root: str | None
) -> tuple[LMConfig, FinetuneConfig]:
    """The member's pretraining and fine-tuning settings (checked: a ConfigError here)."""
    lm = dict(config["lm"])
    steps = member_steps(lm, int(shape.n_params), config["tokens_per_parameter"])
    del lm["steps"]
    lm_cfg = LMConfig(
        n_layers=int(shape.depth),
        d_model=int(shape.d_model),
        d_mlp=int(shape.d_mlp),
        seed=int(seed),
        steps=steps,
        corpus_root=corpus_root,
        **lm,
        **config["lm_extra"],
    )
    lm_cfg = resumable(lm_cfg)
    lm_cfg.validate()
    ft_cfg = resumable(FinetuneConfig(task=task, seed=int(seed), **config["finetune"]))
    ft_cfg.validate()
    if task.seq_len > lm_cfg.seq_len:
        raise ConfigError(
            f"the task's sequences of {task.seq_len} bytes do not fit the context of "
            f"{lm_cfg.seq_len}",
            fix="shorten the task (max_letters, max_number) or use a longer seq_len",
        )
    return lm_cfg, ft_cfg


def train_member(folder: Path, job: dict[str, Any]) -> dict[str, Any]:
    """Pretrain (unless from scratch), fine-tune and score one member in ``folder``."""
    if "anchor" in job:
        return _train_anchor_member(folder, job["anchor"])
    lm_cfg = LMConfig(**job["lm"])
    ft = dict(job["finetune"])
    ft_cfg = FinetuneConfig(**{**ft, "task": CompositionTask.from_dict(ft["task"])})
    device = job["device"]
    if job["from_scratch"]:
        start: Any = lm_cfg
        val_loss, pretrain_flops = math.nan, 0.0
    else:
        pre = _training.train_lm(lm_cfg, folder / "pretrain", progress=False, device=device)
        start = folder / "pretrain"
        val_loss, pretrain_flops = float(pre.metrics.val_loss.iloc[-1]), float(pre.flops)
    run = _finetune.finetune_lm(start, folder / "finetune", ft_cfg, progress=False, device=device)
    summary = run.accuracy.summary
    return {
        "lm_val_loss": val_loss,
        "lm_perplexity": math.exp(val_loss) if math.isfinite(val_loss) else math.nan,
        "acc_seen": float(summary["seen_accuracy"]),
        "acc_heldout": float(summary["heldout_accuracy"]),
        "pretrain_flops": pretrain_flops,
        "finetune_flops": float(run.flops),
    }


def _train_anchor_member(folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Train one member on the anchor-function task from scratch: ``acc_seen`` is the test
    data's accuracy (seen anchor pairs, unseen keys), ``acc_heldout`` the share of the
    held-out pair answered by composing its anchors (the inferential solution)."""
    from probekit.anchor import training as anchor_training

    cfg = TrainConfig.from_dict(settings)
    run = anchor_training.train(cfg, folder / "anchor", progress=False)
    final = run.final
    return {
        "lm_val_loss": math.nan,
        "lm_perplexity": math.nan,
        "acc_seen": float(final["test_data_acc"]),
        "acc_heldout": float(final["test_task_inferential"]),
        "pretrain_flops": 0.0,
    }


__all__ = ["COLUMNS", "PRESETS", "STYLE", "DepthWidthStudy", "depth_width", "train_member"]
