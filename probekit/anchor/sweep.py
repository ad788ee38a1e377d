"""Sweeps over gamma x weight decay x depth x seeds, trained as stacked models, and phase diagrams.

Runs that share a shape and data (same depth and data seed; any gamma, weight decay or learning
rate) train together as one stacked model with a leading model dimension (:func:`train_stack`),
so a sweep costs little more than its largest run on a GPU; each run still ends as its own
Hugging Face checkpoint, numerically the run trained alone (within float tolerance; tested).

Output folder::

    out/stacks/<group>/checkpoint/<run>/   one HF checkpoint per run (stacked mode)
    out/stacks/<group>/metrics.jsonl       metrics of every run of the group (column ``run``),
                                           appended at every evaluation while it trains
    out/stacks/<group>/result.json         the group's table rows, once all its runs finished
    out/runs/<run>/checkpoint/             (with ``stack=False``: one folder per run)
    out/results.csv                        one row per run: best and final accuracies
    out/sweep.json                         the :class:`SweepResult` (reload with Result.load)
    out/phase_diagrams.html                the phase-diagram heatmaps

The stacks are independent: ``executor="ray"`` trains each as one Ray task, on a cluster or
a local Ray (:mod:`probekit.executor`; tasks rather than Ray Tune, and why, are
explained there), with the same table and numbers as the local executor.

Example:
    >>> import tempfile
    >>> from probekit.anchor import AnchorTask
    >>> base = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), steps=2, batch_size=8,
    ...                    eval_every=2, task=AnchorTask(n_train=64, n_test=16))
    >>> res = run_sweep(SweepConfig(base, gammas=[0.3, 0.8], seeds=[0, 1]), tempfile.mkdtemp(),
    ...                 progress=False)
    >>> len(res.df)
    4
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probekit import figures
from probekit.anchor.config import TrainConfig
from probekit.anchor.training import (
    RunOutput,
    check_stack,
    check_stack_fits,
    start_over,
    train_stack,
)
from probekit.errors import ConfigError
from probekit.executor import Failed, check_executor, log, run_tasks
from probekit.io import atomic_write_text
from probekit.result import Result
from probekit.training.checks import check_int, check_real, check_seed, is_int, is_real
from probekit.training.lock import lock_holder, run_folder_lock
from probekit.training.models import ModelConfig
from probekit.words import SETTINGS, figure_words

ACC_METRICS = (
    "train_acc",
    "test_data_acc",
    "test_task_acc",
    "test_task_inferential",
    "test_task_symmetric",
    "test_task_other",
)


def _fraction_heatmap(table: pd.DataFrame, **style: Any) -> go.Heatmap:
    """A heatmap of fractions in [0, 1] from a pivot table, each cell labelled."""
    return go.Heatmap(
        z=table.values,
        x=[f"{v:g}" for v in table.columns],
        y=[f"{v:g}" for v in table.index],
        zmin=0,
        zmax=1,
        colorscale="Viridis",
        text=np.round(table.values, 2),
        texttemplate="%{text}",
        **style,
    )


def _grid_table(df: pd.DataFrame, y: str, x: str, col: str) -> pd.DataFrame:
    """Mean of ``col`` over ``y`` x ``x``, diverged runs left out: a cell whose runs all
    diverged is NaN (no colour) instead of taking the numbers of a broken run."""
    kept = df if "solution" not in df else df[~df["solution"].isin(["diverged", "failed"])]
    table = kept.pivot_table(index=y, columns=x, values=col, aggfunc="mean")
    return table.reindex(index=sorted(df[y].unique()), columns=sorted(df[x].unique()))


@dataclass
class SweepConfig:
    """A grid of runs around ``base``: every gamma x weight decay x depth x seed.

    ``weight_decays`` and ``depths`` default to the base run's. ``max_stack`` caps the number
    of runs per stacked model (memory); ``stack=False`` trains every run alone. ``family`` (a
    :func:`probekit.training.families.depth_family` result) sweeps depth at a fixed parameter
    budget: the depths are the family's and each depth takes its widths from it.
    """

    base: TrainConfig = field(default_factory=TrainConfig)
    gammas: list[float] = field(default_factory=lambda: [0.3, 0.5, 0.8])
    weight_decays: list[float] | None = None
    depths: list[int] | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    stack: bool = True
    max_stack: int | None = None
    family: Any = None

    def __post_init__(self) -> None:
        if self.weight_decays is None:
            self.weight_decays = [self.base.weight_decay]
        if self.family is not None:
            fixed = self.family.meta.get("fixed", {})
            for key in ("vocab_size", "n_positions"):
                if key in fixed and fixed[key] != getattr(self.base.model, key):
                    raise ConfigError(
                        f"the family was sized for {key} {fixed[key]}, the task's models have "
                        f"{getattr(self.base.model, key)}",
                        fix=f"build the family with {key}={getattr(self.base.model, key)}",
                    )
            family_depths = [int(d) for d in self.family.df.depth]
            if self.depths is not None and not set(self.depths) <= set(family_depths):
                raise ConfigError(
                    f"depths {self.depths} are not all in the family {family_depths}",
                    fix="leave depths out to use the family's",
                )
            self.depths = self.depths or family_depths
        if self.depths is None:
            self.depths = [self.base.model.n_layers]
        for name in ("gammas", "weight_decays", "depths", "seeds"):
            if not isinstance(getattr(self, name), list | tuple):
                raise ConfigError(
                    f"the sweep's {name} {getattr(self, name)!r} are not a list",
                    fix="give a list of values, e.g. [0.3, 0.8]",
                )
            values = list(getattr(self, name))
            if not values:
                raise ConfigError(f"the sweep's {name} list is empty", fix="give at least one")
            if len(set(values)) != len(values):
                raise ConfigError(
                    f"the sweep's {name} repeat: {values}", fix="list each value once"
                )
            setattr(self, name, values)
        self._check_values()
        if self.max_stack is not None and (not is_int(self.max_stack) or self.max_stack < 1):
            raise ConfigError(f"max_stack {self.max_stack!r} < 1", fix="use None or >= 1")

    def _filled(self) -> tuple[list[float], list[int]]:
        """The weight decays and depths, which :meth:`__post_init__` fills in when not given."""
        if self.weight_decays is None or self.depths is None:
            raise ConfigError(
                "the sweep's weight_decays or depths are None",
                fix="give lists, or leave them out (the base run's)",
            )
        return self.weight_decays, self.depths

    def _check_values(self) -> None:
        """Every grid value is of the right type and range (before any run is built)."""
        weight_decays, depths = self._filled()
        for g in self.gammas:
            if not is_real(g):
                raise ConfigError(
                    f"the sweep's gamma {g!r} is not a finite number", fix="use e.g. 0.3,0.5,0.8"
                )
        for wd in weight_decays:
            check_real("weight decay", wd, 0, example="0 or e.g. 0.01")
        for depth in depths:
            check_int("depth", depth)
        for seed in self.seeds:
            check_seed("seed", seed)

    def _shape(self, depth: int) -> dict[str, int]:
        """The family's widths at ``depth`` (nothing without a family)."""
        if self.family is None:
            return {}
        row = self.family.df[self.family.df.depth == depth].iloc[0]
        return {key: int(row[key]) for key in ("d_model", "d_mlp", "n_heads")}

    def runs(self) -> list[TrainConfig]:
        """The sweep's runs, each a full :class:`TrainConfig` with a unique name."""
        out = []
        weight_decays, depths = self._filled()
        for depth in depths:
            for gamma in self.gammas:
                for wd in weight_decays:
                    for seed in self.seeds:
                        model = ModelConfig.from_dict(
                            {
                                **self.base.model.to_dict(),
                                "n_layers": int(depth),
                                "gamma": float(gamma),
                                **self._shape(int(depth)),
                            }
                        )
                        out.append(
                            replace(
                                self.base,
                                model=model,
                                weight_decay=float(wd),
                                seed=int(seed),
                                name=f"L{depth}_g{gamma:g}_wd{wd:g}_s{seed}",
                            )
                        )
        return out

    def groups(self) -> list[tuple[str, list[TrainConfig]]]:
        """Runs grouped into stacks (same shape and data), named ``L<depth>[_data<seed>][-<k>]``.

        Each seed draws its own data by default (``TrainConfig.task_seed`` follows the seed),
        so the seeds of one depth train as one stack per seed; set the base's ``task_seed``
        to share one data sample and one stack."""
        by_key: dict[str, list[TrainConfig]] = {}
        for run in self.runs():
            by_key.setdefault(run.stack_key(), []).append(run)
        groups = []
        depths = [runs[0].model.n_layers for runs in by_key.values()]
        for runs in by_key.values():
            name = f"L{runs[0].model.n_layers}"
            if depths.count(runs[0].model.n_layers) > 1:  # one stack per data seed
                name += f"_data{runs[0].task.seed}"
            size = self.max_stack or len(runs)
            chunks = [runs[i : i + size] for i in range(0, len(runs), size)]
            for k, chunk in enumerate(chunks):
                groups.append((name if len(chunks) == 1 else f"{name}-{k}", chunk))
        return groups


def _solution(row: dict[str, Any], threshold: float = 0.9) -> str:
    if row.get("status", "ok") != "ok":
        return "diverged"
    if not np.isfinite(row["final_test_data_acc"]) or row["final_test_data_acc"] < threshold:
        return "memorizing"
    fr = {k: row[f"final_test_task_{k}"] for k in ("inferential", "symmetric", "other")}
    return max(fr, key=fr.__getitem__)


def settings_row(cfg: TrainConfig, steps: float, status: str, checkpoint: str) -> dict:
    """The columns of a sweep row that describe the run rather than its results."""
    return {
        "run": cfg.name,
        "depth": cfg.model.n_layers,
        "gamma": cfg.model.gamma,
        "init_std": cfg.model.init_std(),  # a phase diagram's x axis as well as gamma
        "weight_decay": cfg.weight_decay,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "steps": steps,
        "status": status,
        "checkpoint": checkpoint,
    }


def _summarize(out: RunOutput, cfg: TrainConfig) -> dict[str, Any]:
    m = out.metrics
    row = settings_row(cfg, int(m["step"].iloc[-1]), out.status, str(out.checkpoint))
    for k in ACC_METRICS:
        row[f"final_{k}"] = float(m[k].iloc[-1])
        row[f"best_{k}"] = float(m[k].max())
    row["final_test_data_loss"] = float(m["test_data_loss"].iloc[-1])
    row["solution"] = _solution(row)
    return row


class SweepResult(Result):
    """A sweep's results table (one row per run) and its phase diagrams.

    Example:
        >>> import pandas as pd
        >>> res = SweepResult(pd.DataFrame({"gamma": [0.3, 0.8], "depth": [2, 2],
        ...                                 "final_test_task_inferential": [0.1, 0.9]}), {})
        >>> type(res.phase_diagram("test_task_inferential", "gamma", "depth")).__name__
        'Figure'
    """

    kind = "sweep"

    def phase_diagram(
        self,
        metric: str = "test_task_inferential",
        x: str = "gamma",
        y: str = "depth",
        which: str = "final",
    ) -> go.Figure:
        """Heatmap of ``which``_``metric`` over ``x`` x ``y``, averaged over everything else."""
        col = f"{which}_{metric}"
        if col not in self.df.columns:
            raise ConfigError(
                f"no column {col!r} in the sweep table",
                fix=f"use one of {list(ACC_METRICS)} with which=final|best",
            )
        table = _grid_table(self.df, y, x, col)
        words = metric.replace("test_task_", "held-out ").replace("_", " ")
        fig = go.Figure(
            _fraction_heatmap(
                table,
                colorbar={
                    "title": {"text": figure_words(self.kind, "phase_colorbar", metric=words)}
                },
            )
        )
        fig.update_yaxes(type="category")
        fig.update_xaxes(type="category")
        return figures.base_layout(
            fig,
            figure_words(self.kind, "phase_diagram", which=which, metric=words, x=x, y=y),
            SETTINGS.get(x, x.replace("_", " ")),
            SETTINGS.get(y, y.replace("_", " ")),
            width=700,
            height=500,
        )

    def figure(self) -> go.Figure:
        """The papers' four phase diagrams: held-out inferential / symmetric accuracy over
        gamma x depth and gamma x weight decay, averaged over seeds (and the third axis)."""
        specs = [
            ("test_task_inferential", "depth"),
            ("test_task_symmetric", "depth"),
            ("test_task_inferential", "weight_decay"),
            ("test_task_symmetric", "weight_decay"),
        ]
        fig = make_subplots(
            rows=2,
            cols=2,
            horizontal_spacing=0.12,
            vertical_spacing=0.16,
            subplot_titles=[
                figure_words(self.kind, "panel", category=m.split("_")[-1], y=y.replace("_", " "))
                for m, y in specs
            ],
        )
        for i, (metric, y) in enumerate(specs):
            table = _grid_table(self.df, y, "gamma", f"final_{metric}")
            fig.add_trace(
                _fraction_heatmap(
                    table,
                    showscale=i == 0,
                    colorbar={"title": {"text": figure_words(self.kind, "colorbar")}},
                ),
                row=i // 2 + 1,
                col=i % 2 + 1,
            )
            fig.update_xaxes(
                title_text=SETTINGS["gamma"], type="category", row=i // 2 + 1, col=i % 2 + 1
            )
            fig.update_yaxes(
                title_text=SETTINGS.get(y, y), type="category", row=i // 2 + 1, col=i % 2 + 1
            )
        return figures.base_layout(
            fig,
            figure_words(self.kind),
            width=1000,
            height=760,
        )


def _summary(df: pd.DataFrame) -> dict[str, Any]:
    """Counts per solution, the diverged and failed runs by name, and means over the other
    runs."""
    by = df.groupby("solution")["run"].count().to_dict()
    kept = df[~df["solution"].isin(["diverged", "failed"])]
    diverged = df[df["solution"] == "diverged"]
    failed = df[df["solution"] == "failed"]
    summary: dict[str, Any] = {"n_runs": len(df), **{f"n_{k}": int(v) for k, v in by.items()}}
    if len(diverged):
        summary["diverged"] = {r.run: r.status for r in diverged.itertuples()}
    if len(failed):
        summary["failed"] = {r.run: r.status for r in failed.itertuples()}
    for k in ("inferential", "symmetric"):
        col = f"final_test_task_{k}"
        summary[f"mean_{col}"] = float(kept[col].mean()) if len(kept) else float("nan")
    return summary


@dataclass
class _Group:
    """One stack of a sweep, the unit of work of an executor: its runs and its folder."""

    name: str
    runs: list[TrainConfig]
    folder: Path
    single: bool
    progress: bool = False

    def settings(self) -> dict[str, Any]:
        """What a finished group's ``result.json`` must match to be reused as it is."""
        configs = [c.comparable() for c in self.runs]
        return json.loads(json.dumps({"folder": str(self.folder), "runs": configs}))


#: a finished group's rows, written when its last run ends; a restarted sweep reuses them
DONE_NAME = "result.json"


def _checkpoint_step(group: _Group) -> int | None:
    """The step of the group's checkpoint (its first run's), None if it has none."""
    root = group.folder / "checkpoint"
    state = root if group.single else root / group.runs[0].name
    try:
        return int(json.loads((state / "trainer_state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _wait_for_writer(folder: Path, timeout: float = 60.0) -> None:
    """Wait while another live process holds ``folder``'s lock: the task of a killed driver
    may still be ending when a restarted driver retries it. After ``timeout`` the trainer's own
    lock check decides (it waits for a lock of another host to go stale, see
    :mod:`probekit.training.lock`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        holder = lock_holder(folder)
        if holder is None or holder.is_self() or not holder.alive():
            return
        time.sleep(0.25)


def _train_group(group: _Group) -> dict[str, Any]:
    """Train (or resume) one group; its rows, and the step it resumed from. Runs in the
    driver (local executor) or in a Ray worker (a retried task resumes the same way)."""
    resumed = _checkpoint_step(group)
    _wait_for_writer(group.folder)
    check_stack_fits(group.runs)  # the device and memory, checked where the stack trains
    outs = train_stack(
        group.runs, group.folder, resume=True, progress=group.progress, single=group.single
    )
    rows = [_summarize(o, c) for o, c in zip(outs, group.runs, strict=True)]
    done = {"settings": group.settings(), "rows": rows}
    atomic_write_text(group.folder / DONE_NAME, json.dumps(done, indent=1))
    return {"rows": rows, "resumed_from": resumed}


def _finished_rows(group: _Group) -> list[dict[str, Any]] | None:
    """The rows of a group that already finished with these settings, else None."""
    try:
        done = json.loads((group.folder / DONE_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(done, dict) or done.get("settings") != group.settings():
        return None
    rows = done.get("rows")
    return rows if isinstance(rows, list) and len(rows) == len(group.runs) else None


def _failed_rows(group: _Group, error: str) -> list[dict[str, Any]]:
    """Rows of a group that raised: the run's settings, status ``failed: <error>``, no numbers."""
    nan = float("nan")
    rows = []
    for cfg in group.runs:
        row = settings_row(cfg, nan, f"failed: {error}", "")
        for k in ACC_METRICS:
            row[f"final_{k}"] = row[f"best_{k}"] = nan
        row.update(final_test_data_loss=nan, solution="failed")
        rows.append(row)
    return rows


def _groups(sweep: SweepConfig, out: Path, progress: bool) -> list[_Group]:
    if sweep.stack:
        return [_Group(g, runs, out / "stacks" / g, False, progress) for g, runs in sweep.groups()]
    return [_Group(r.name, [r], out / "runs" / r.name, True, progress) for r in sweep.runs()]


def _start_over_all(groups: list[_Group]) -> None:
    """``resume=False``: every group's checkpoints, metrics and result removed (under its
    lock) before any task starts, so that a retried task resumes its own work."""
    for group in groups:
        with run_folder_lock(group.folder):
            start_over(group.folder)
            (group.folder / DONE_NAME).unlink(missing_ok=True)


def _run_line(row: dict[str, Any]) -> str:
    if row["solution"] == "failed":
        return f"{row['run']}: {row['status']}"
    return (
        f"{row['run']}: {row['solution']} ({row['status']}), held-out inferential "
        f"{row['final_test_task_inferential']:.2f}, symmetric "
        f"{row['final_test_task_symmetric']:.2f}, test data {row['final_test_data_acc']:.2f}"
    )


def _rows_finished_before(groups: list, progress: bool) -> dict[str, list[dict[str, Any]]]:
    """The rows of the groups a previous call finished, by group name (these are skipped)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        finished = _finished_rows(group)
        if finished is not None:
            rows[group.name] = finished
    if progress and rows:
        log(f"{sum(len(r) for r in rows.values())} run(s) already finished, skipped")
    return rows


def run_sweep(
    sweep: SweepConfig,
    out_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
    executor: str = "local",
    ray_address: str | None = None,
) -> SweepResult:
    """Train every run of ``sweep`` (stacked by shape) and write the table and phase diagrams.

    ``executor="local"`` trains the stacks one after another in this process;
    ``executor="ray"`` trains each stack as one Ray task (:mod:`probekit.executor`)
    on the cluster at ``ray_address``, or on a local Ray sized to this machine when None.
    Under Ray ``out_dir`` must be an absolute path that every node sees (a shared
    filesystem). Both give the same table, numbers and files.

    Resumable: run it again with the same arguments after a kill (of the driver or of a
    worker): finished stacks are skipped, unfinished ones resume from their last checkpoint.
    A stack that raises (a run whose loss became NaN when trained alone, one that does not fit
    its device) gives rows with status ``failed: <error>`` and solution ``failed``; the other
    stacks go on, and running the sweep again retries it.
    """
    check_executor(executor, out_dir)
    out = Path(out_dir)
    groups = _groups(sweep, out, progress and executor == "local")
    for group in groups:  # every stack is valid (and, locally, fits), before any trains
        (check_stack_fits if executor == "local" else check_stack)(group.runs)
    if not resume:
        _start_over_all(groups)
    rows = _rows_finished_before(groups, progress)
    todo = [g for g in groups if g.name not in rows]
    info: dict[str, Any] = {g: {"skipped": True} for g in rows}

    def done(i: int, value: Any) -> None:
        group = todo[i]
        if isinstance(value, Failed):
            rows[group.name] = _failed_rows(group, value.error)
            info[group.name] = {"failed": value.error}
        else:
            rows[group.name] = value["rows"]
            info[group.name] = {"resumed_from": value["resumed_from"]}
        if progress:
            for row in rows[group.name]:
                log(_run_line(row))

    run_tasks(
        _train_group,
        todo,
        executor=executor,
        ray_address=ray_address,
        device=sweep.base.device,
        on_done=done,
        progress=progress,
        desc="sweep runs",
        sizes=[len(g.runs) for g in todo],
        done_before=sum(len(r) for r in rows.values()),
    )
    return _write_outputs(sweep, out, [r for g in groups for r in rows[g.name]], executor, info)


def _write_outputs(
    sweep: SweepConfig,
    out: Path,
    rows: list[dict[str, Any]],
    executor: str,
    groups: dict[str, Any],
) -> SweepResult:
    """The sweep's table, saved result and phase diagrams, each written atomically."""
    df = pd.DataFrame(rows)
    meta = {
        "base": sweep.base.to_dict(),
        "gammas": sweep.gammas,
        "weight_decays": sweep.weight_decays,
        "depths": sweep.depths,
        "seeds": sweep.seeds,
        "stack": sweep.stack,
        "family": None if sweep.family is None else sweep.family.df.to_dict("records"),
        "executor": executor,
        "groups": groups,
    }
    summary = _summary(df)
    result = SweepResult(df, summary, meta)
    atomic_write_text(out / "results.csv", df.to_csv(index=False))
    result.save(out / "sweep.json")
    atomic_write_text(
        out / "phase_diagrams.html", result.figure().to_html(include_plotlyjs=True, full_html=True)
    )
    return result


__all__ = ["ACC_METRICS", "SweepConfig", "SweepResult", "run_sweep"]
