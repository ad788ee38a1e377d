"""The study runner, one home for both studies (:mod:`~probekit.studies.depth_vs_width`,
:mod:`~probekit.studies.transition`): a study folder of member runs that resumes after a kill.

A study folder::

    OUT/study.json        {"study": kind, "config": ...}: checked on resume (another config in
                          the same folder is refused, with the fix)
    OUT/members/<name>/   one probekit run folder per member (an LM run, a fine-tuning run)
    OUT/members/<name>/member.json
                          the member's row, written atomically last: the member is finished
    OUT/members.csv       the members table (one row per finished member)
    OUT/summary.json, OUT/index.html
                          the result's summary and page (:mod:`probekit.studies.results`)

Finished members are never trained again; an unfinished one resumes from its own checkpoints
(its runs save every ``eval_every`` steps). Members run through
:func:`probekit.executor.run_tasks`, in this process or as Ray tasks. Before training the
runner says the planned FLOPs and a time estimate (from the finished members' measured rate,
else from :data:`CPU_FLOPS_PER_SECOND`); after each member, the time left at the measured rate.

Example:
    >>> plan = pd.DataFrame({"name": ["a", "b"], "flops": [2e12, 4e12]})
    >>> print(plan_cost(plan, rate=1e10))
    2 members, 6.00e+12 training FLOPs: about 10 min at 1.0e+10 FLOP/s (measured here)
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from probekit.errors import ConfigError, ProbekitError, ProbekitWarning
from probekit.executor import Failed, check_executor, log, run_tasks
from probekit.io import atomic_write_text
from probekit.lm.config import LMConfig
from probekit.lm.finetune import FinetuneConfig

STUDY_FILE = "study.json"
MEMBER_FILE = "member.json"
MEMBERS_CSV = "members.csv"
SUMMARY_FILE = "summary.json"

CPU_FLOPS_PER_SECOND = 2.0e10
"""Training FLOPs per second of the byte-level LMs of ``--scale cpu`` (0.2-1M parameters) on
the 2-core machine, measured (100 steps of a 300k-parameter member at depths 1, 4 and 8 took
6-10 s for 1.8e11 FLOPs): the estimate before any member has finished."""

MEMBER_SECONDS = 3.0
"""A member's time besides its training steps on the 2-core machine (reading the corpus,
building the model, the final evaluation), measured: added per member to the estimate."""

GPU_FLOPS_PER_SECOND = 2.0e14
"""The sustained training throughput assumed for ``--scale paper`` on one GPU: 200 TFLOP/s,
about 20% of an H100's dense bf16 peak (an assumption, not a measurement)."""


@dataclass
class Study:
    """A study's folder and tables: ``plan`` (every member, as planned: shape, tokens, FLOPs),
    ``members`` (the finished members' table, empty after a dry run), ``meta`` (the config),
    ``result`` (the study's :class:`~probekit.result.Result` from
    :mod:`probekit.studies.results`; None after a dry run) and ``page`` (``OUT/index.html``)."""

    out: Path
    plan: pd.DataFrame
    members: pd.DataFrame
    meta: dict[str, Any]
    result: Any = None
    page: Path | None = None
    failed: dict[str, str] = field(default_factory=dict)


def check_study_folder(out: Path, kind: str, config: dict[str, Any]) -> None:
    """Write ``OUT/study.json`` or check the one there: another study or another config in
    the same folder is refused (a :class:`ConfigError` naming the settings that differ)."""
    path = out / STUDY_FILE
    wanted = json.loads(json.dumps({"study": kind, "config": config}))
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"{path} is unreadable ({err})", fix="remove it, or use another --out"
            ) from err
        if saved != wanted:
            raise ConfigError(
                f"{out} holds a {saved.get('study', '?')} study with other settings "
                f"({_differences(saved, wanted)})",
                fix="use another --out, or the settings it was started with",
            )
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(wanted, indent=1))


def _differences(saved: dict[str, Any], wanted: dict[str, Any]) -> str:
    """The settings that differ between two study files, in words (nested ones dotted)."""
    if saved.get("study") != wanted["study"]:
        return f"it is a {saved.get('study')} study, not a {wanted['study']} study"
    old, new = _flat(saved.get("config") or {}), _flat(wanted["config"])
    names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    shown = "; ".join(f"{k}: {old.get(k)!r:.60} there, {new.get(k)!r:.60} now" for k in names[:3])
    return shown + (f"; and {len(names) - 3} more" if len(names) > 3 else "")


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"lm": {"steps": 30}}`` as ``{"lm.steps": 30}``."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def finished_row(out: Path, name: str) -> dict[str, Any] | None:
    """The row of a finished member (its ``member.json``), or None."""
    path = out / "members" / name / MEMBER_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged result file: the member is trained (resumed) again


@dataclass(frozen=True)
class MemberTask:
    """One member's work, as a task: ``train(folder, job)`` returns its measured numbers."""

    train: Callable[[Path, dict[str, Any]], dict[str, Any]]
    folder: Path
    job: dict[str, Any]
    planned: dict[str, Any]


def run_member(task: MemberTask) -> dict[str, Any]:
    """Train one member and write its ``member.json`` (atomically, last); ``seconds`` is the
    wall-clock time of this call (a resumed member's: from its resume)."""
    started = time.perf_counter()
    measured = task.train(task.folder, task.job)
    row = {**task.planned, **measured, "seconds": time.perf_counter() - started}
    atomic_write_text(task.folder / MEMBER_FILE, json.dumps(row, indent=1))
    return row


def plan_cost(plan: pd.DataFrame, device: str = "cpu", rate: float | None = None) -> str:
    """The planned members' FLOPs and a time estimate, in words."""
    flops = float(plan["flops"].sum())
    head = f"{len(plan)} members, {flops:.2e} training FLOPs"
    if device == "gpu":
        hours = flops / GPU_FLOPS_PER_SECOND / 3600
        return (
            f"{head}: about {hours:,.0f} GPU-hours at {GPU_FLOPS_PER_SECOND:.0e} FLOP/s per GPU "
            "(assumed: about 20% of an H100's dense bf16 peak)"
        )
    if rate is None:
        seconds = flops / CPU_FLOPS_PER_SECOND + MEMBER_SECONDS * len(plan)
        return (
            f"{head}: about {_duration(seconds)} on this CPU at {CPU_FLOPS_PER_SECOND:.1e} "
            f"FLOP/s and {MEMBER_SECONDS:g} s per member (measured on a 2-core machine)"
        )
    return f"{head}: about {_duration(flops / rate)} at {rate:.1e} FLOP/s (measured here)"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def run_members(
    out: Path,
    plan: pd.DataFrame,
    jobs: Sequence[dict[str, Any]],
    train: Callable[[Path, dict[str, Any]], dict[str, Any]],
    columns: Sequence[str],
    *,
    executor: str = "local",
    ray_address: str | None = None,
    device: str = "cpu",
    progress: bool = True,
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Train the unfinished members of ``plan`` (one row each, with ``name`` and ``flops``;
    ``jobs[i]`` is row i's job) and return the members table (``columns``, finished members
    in plan order) and the failed members' errors. Writes ``OUT/members.csv``. ``device``:
    what a Ray task asks for (a GPU for ``"cuda"``, or ``"auto"`` on a cluster with GPUs)."""
    check_executor(executor, out if executor == "ray" else None)
    rows: dict[str, dict[str, Any]] = {}
    todo: list[int] = []
    for i, name in enumerate(plan["name"]):
        row = finished_row(out, name)
        if row is None:
            todo.append(i)
        else:
            rows[name] = row
    clock = _Clock(plan, rows, progress)
    clock.before([plan["name"].iloc[i] for i in todo])
    tasks = [
        MemberTask(train, out / "members" / plan["name"].iloc[i], dict(jobs[i]), _planned(plan, i))
        for i in todo
    ]
    failed: dict[str, str] = {}

    def done(k: int, value: Any) -> None:
        name = plan["name"].iloc[todo[k]]
        if isinstance(value, Failed):
            failed[name] = value.error
            if progress:
                log(f"member {name} failed: {value.error}")
            return
        rows[name] = value
        clock.after(name, value)

    run_tasks(
        run_member,
        tasks,
        executor=executor,
        ray_address=ray_address,
        device=device,
        on_done=done,
        progress=progress,
        desc="members",
    )
    table = pd.DataFrame(
        [rows[n] for n in plan["name"] if n in rows], columns=["name", *columns]
    ).drop(columns="name")
    atomic_write_text(out / MEMBERS_CSV, table.to_csv(index=False))
    return table, failed


def _planned(plan: pd.DataFrame, i: int) -> dict[str, Any]:
    """Row i of the plan as JSON types."""
    return json.loads(plan.iloc[i].to_json())


class _Clock:
    """The time estimates: before training (planned FLOPs at the finished members' rate, else
    the CPU rate) and after each member (the FLOPs left at the rate measured so far)."""

    def __init__(self, plan: pd.DataFrame, rows: dict[str, dict[str, Any]], say: bool) -> None:
        self.flops = dict(zip(plan["name"], plan["flops"], strict=True))
        self.done_flops = sum(float(r.get("flops", 0.0)) for r in rows.values())
        self.done_seconds = sum(float(r.get("seconds", 0.0)) for r in rows.values())
        self.left = 0.0
        self.say = say
        self.started = time.perf_counter()

    def rate(self) -> float | None:
        if self.done_seconds > 0 and self.done_flops > 0:
            return self.done_flops / self.done_seconds
        return None

    def before(self, names: Sequence[str]) -> None:
        self.left = sum(float(self.flops[n]) for n in names)
        if not self.say:
            return
        finished = len(self.flops) - len(names)
        if not names:
            log(f"all {finished} members are finished: nothing to train")
            return
        plan = pd.DataFrame({"flops": [self.flops[n] for n in names]})
        again = f" ({finished} finished before, not trained again)" if finished else ""
        log("to train: " + plan_cost(plan, rate=self.rate()) + again)

    def after(self, name: str, row: dict[str, Any]) -> None:
        planned = float(self.flops[name])
        self.left -= planned
        self.done_flops += planned
        self.done_seconds += float(row.get("seconds", 0.0))
        rate = self.rate()
        if self.say and rate:
            left = _duration(self.left / rate) if self.left > 0 else "nothing"
            log(f"member {name} finished in {float(row.get('seconds', 0)):.0f} s; {left} left")


S = TypeVar("S", bound=Study)
C = TypeVar("C", LMConfig, FinetuneConfig)


def preset_of(scale: str | None, presets: Mapping[str, Any], defaults: Any) -> Any:
    """The settings of ``scale`` (one of ``presets``; None: ``defaults``), else a
    :class:`ConfigError`."""
    if scale is None:
        return defaults
    if scale not in presets:
        raise ConfigError(f"unknown scale {scale!r}", fix="use 'cpu' or 'paper' (or None)")
    return presets[scale]


def member_steps(lm: dict[str, Any], n_params: int, tokens_per_parameter: float | None) -> int:
    """A member's training steps: ``lm["steps"]``, or (None: the paper's scale) the steps that
    give ``tokens_per_parameter`` tokens per parameter (at least 1)."""
    if lm["steps"] is not None:
        return int(lm["steps"])
    assert tokens_per_parameter is not None, "a preset without steps gives tokens per parameter"
    tokens = tokens_per_parameter * n_params
    return max(1, round(tokens / (lm["batch_size"] * lm["seq_len"])))


def resumable(cfg: C) -> C:
    """A member run's settings (an ``LMConfig`` or ``FinetuneConfig``) evaluating at most
    every ``steps`` and saving a checkpoint at every evaluation before the last, so a killed
    member resumes from its last evaluation."""
    cfg = replace(cfg, eval_every=min(cfg.eval_every, cfg.steps))
    return replace(cfg, save_every=cfg.eval_every if cfg.eval_every < cfg.steps else None)


def carry_out(
    study: S,
    kind: str,
    jobs: list[dict[str, Any]],
    train: Callable[[Path, dict[str, Any]], dict[str, Any]],
    *,
    columns: Sequence[str],
    dry_run_columns: Sequence[str],
    build: str,
    plan_device: str,
    device: str,
    executor: str,
    ray_address: str | None,
    progress: bool,
    dry_run: bool,
) -> S:
    """A planned study's course: with ``dry_run``, print the plan and its cost (on
    ``plan_device``'s rate) and return; else check the executor and the study folder before
    any work, run the members (``train`` each), raise the failures as one error, and write the
    result (``build``: :func:`write_results`)."""
    if dry_run:
        if progress:
            print_plan(study.plan, dry_run_columns, plan_cost(study.plan, device=plan_device))
        return study
    check_executor(executor, study.out if executor == "ray" else None)  # before any work
    check_study_folder(study.out, kind, study.meta)
    study.members, study.failed = run_members(
        study.out,
        study.plan,
        jobs,
        train,
        columns,
        executor=executor,
        ray_address=ray_address,
        device=device,
        progress=progress,
    )
    raise_failures(study.failed, study.out)
    return write_results(study, build)


def write_results(study: S, build: str) -> S:
    """Build the result (``probekit.studies.results.<build>``), write ``OUT/summary.json``
    and ``OUT/index.html`` (with ``OUT/depth_summary.csv``, and ``OUT/transitions.csv`` for a
    transition study); a table the builder refuses (a :class:`ProbekitError`) is a
    :class:`ProbekitWarning`, the members' tables kept."""
    from probekit.studies import results

    if study.members.empty:
        return study
    try:
        result = getattr(results, build)(study.members, study.meta)
    except ProbekitError as err:  # e.g. a fit refused: the trained members are kept
        warnings.warn(
            f"the members of {study.out} are trained and tabled ({MEMBERS_CSV}), but their "
            f"result could not be built: {err}",
            ProbekitWarning,
            stacklevel=3,
        )
        return study
    study.result = result
    atomic_write_text(study.out / SUMMARY_FILE, json.dumps(_json_safe(result.summary), indent=1))
    study.page = results.write_study_page(result, study.out)
    return study


def _json_safe(value: Any) -> Any:
    """NaN and infinities as None, numpy scalars as Python numbers (a JSON file)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def raise_failures(failed: dict[str, str], out: Path) -> None:
    """After the run: members that failed are one error (the finished ones are kept)."""
    if failed:
        first = next(iter(failed.items()))
        raise ProbekitError(
            f"{len(failed)} member(s) of the study in {out} failed (first: {first[0]}: {first[1]})",
            fix="fix the cause and run the same command again: finished members are kept",
        )


def print_plan(plan: pd.DataFrame, columns: Sequence[str], cost: str) -> None:
    """The dry run's table and cost (stdout)."""
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        shown = plan[list(columns)].copy()
        for name in ("tokens", "flops", "pretrain_flops", "finetune_flops"):
            if name in shown:
                shown[name] = shown[name].map(lambda v: f"{v:.3g}")
        print(shown.to_string(index=False))
    print(cost)


__all__ = [
    "CPU_FLOPS_PER_SECOND",
    "GPU_FLOPS_PER_SECOND",
    "MEMBERS_CSV",
    "MEMBER_FILE",
    "STUDY_FILE",
    "SUMMARY_FILE",
    "MemberTask",
    "Study",
    "carry_out",
    "check_study_folder",
    "finished_row",
    "member_steps",
    "plan_cost",
    "preset_of",
    "print_plan",
    "raise_failures",
    "resumable",
    "run_member",
    "run_members",
    "write_results",
]
