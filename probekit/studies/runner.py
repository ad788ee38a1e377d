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
runner says the planned FLOPs and a time estimate (:func:`cpu_seconds`, a cost model fitted to
measured members, scaled by the finished members' measured time over their estimate); after
each member, the time left at that ratio.

Example:
    >>> plan = pd.DataFrame({"name": ["a", "b"], "flops": [2e12, 4e12]})
    >>> print(plan_cost(plan, speed=2.0).split(": ")[1])
    about 3 min (the estimate for a 2-core CPU times 2.00, the finished members' measured time \
over theirs)
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
from probekit.studies.data import StudyData

STUDY_FILE = "study.json"
MEMBER_FILE = "member.json"
MEMBERS_CSV = "members.csv"
SUMMARY_FILE = "summary.json"

CPU_FLOPS_PER_SECOND = 7.0e10
"""The rate of the training FLOPs (6 x parameters x tokens) of the byte-level LMs of ``--scale
cpu`` on the 2-core machine, fitted with :data:`CPU_SECONDS_PER_LAYER_TOKEN` and
:data:`MEMBER_SECONDS` to the measured times of the 58 members of the two CPU-preset studies
(docs/studies.md, "What a study costs")."""

CPU_SECONDS_PER_LAYER_TOKEN = 6.7e-6
"""Seconds per token per layer that the FLOP count leaves out (attention scores, LayerNorm,
GELU, optimizer and each operation's dispatch): at the CPU preset's widths (32-144) this
time grows with depth at a fixed parameter count, so a deep narrow member takes about three
times a shallow wide one of the same FLOPs. Fitted with :data:`CPU_FLOPS_PER_SECOND`."""

MEMBER_SECONDS = 5.0
"""A member's time besides its training steps on the 2-core machine (reading the corpus,
building the model, the final evaluation), fitted with :data:`CPU_FLOPS_PER_SECOND`."""

GPU_FLOPS_PER_SECOND = 2.0e14
"""The sustained training throughput assumed for ``--scale paper`` on one GPU: 200 TFLOP/s,
about 20% of an H100's dense bf16 peak (an assumption, not a measurement)."""


CPU_LIMIT_HOURS = 24.0
"""The longest estimated CPU time (:func:`cpu_seconds`) a GPU-sized study (``--scale paper``)
may start on a CPU with the local executor: above it the study is refused before any work
(:func:`check_cpu_time`); smaller flags that bring it under are the way to run such shapes
here."""


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


def check_study_folder(
    out: Path, kind: str, config: dict[str, Any], corpus: dict[str, Any] | None = None
) -> None:
    """Write ``OUT/study.json`` or check the one there: another study or another config in
    the same folder is refused (a :class:`ConfigError` naming the settings that differ), and
    so is other pretraining data (``corpus``: :meth:`~probekit.studies.data.StudyData.record`,
    its fingerprint against the one saved; a study saved without one is not checked)."""
    path = out / STUDY_FILE
    wanted = json.loads(json.dumps({"study": kind, "config": config}))
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"{path} is unreadable ({err})", fix="remove it, or use another --out"
            ) from err
        if {k: saved.get(k) for k in wanted} != wanted:
            raise ConfigError(
                f"{out} holds a {saved.get('study', '?')} study with other settings "
                f"({_differences(saved, wanted)})",
                fix="use another --out, or the settings it was started with",
            )
        _check_same_corpus(out, saved.get("corpus"), corpus)
        return
    out.mkdir(parents=True, exist_ok=True)
    record = {**wanted, "corpus": corpus} if corpus else wanted
    atomic_write_text(path, json.dumps(record, indent=1))


def _check_same_corpus(out: Path, saved: Any, corpus: dict[str, Any] | None) -> None:
    """Refuse a resumed study whose pretraining text is not the saved fingerprint's."""
    if not isinstance(saved, dict) or corpus is None:
        return
    if saved.get("fingerprint") != corpus["fingerprint"]:
        raise ConfigError(
            f"{out} holds a study pretrained on other data: {saved.get('source')} "
            f"(fingerprint {saved.get('fingerprint')}) there, {corpus['source']} (fingerprint "
            f"{corpus['fingerprint']}) now",
            fix="resume it on the data it was started with, or use another --out",
        )


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


def cpu_seconds(plan: pd.DataFrame) -> pd.Series:
    """Each planned member's estimated seconds on the 2-core CPU: :data:`MEMBER_SECONDS` +
    FLOPs / :data:`CPU_FLOPS_PER_SECOND` + :data:`CPU_SECONDS_PER_LAYER_TOKEN` x depth x
    tokens trained on (``flops / (6 n_params)``). ``plan`` needs ``flops``, ``depth`` and
    ``n_params`` (without them, the FLOPs alone).

    Example:
        >>> plan = pd.DataFrame({"flops": [6e12], "depth": [2], "n_params": [1_000_000]})
        >>> round(float(cpu_seconds(plan).iloc[0]), 1)  # 5 + 6e12 / 7e10 + 6.7e-6 * 2 * 1e6
        104.1
    """
    seconds = MEMBER_SECONDS + plan["flops"].astype(float) / CPU_FLOPS_PER_SECOND
    if {"depth", "n_params"} <= set(plan.columns):
        tokens = plan["flops"].astype(float) / (6.0 * plan["n_params"].astype(float))
        seconds = seconds + CPU_SECONDS_PER_LAYER_TOKEN * plan["depth"] * tokens
    return seconds


def plan_cost(plan: pd.DataFrame, device: str = "cpu", speed: float | None = None) -> str:
    """The planned members' FLOPs and a time estimate, in words: on a GPU at
    :data:`GPU_FLOPS_PER_SECOND`; on the CPU by :func:`cpu_seconds`, times ``speed`` (the
    measured time of the finished members over their estimate, when some have finished)."""
    flops = float(plan["flops"].sum())
    head = f"{len(plan)} members, {flops:.2e} training FLOPs"
    if device == "gpu":
        hours = flops / GPU_FLOPS_PER_SECOND / 3600
        return (
            f"{head}: about {hours:,.0f} GPU-hours at {GPU_FLOPS_PER_SECOND:.0e} FLOP/s per GPU "
            "(assumed: about 20% of an H100's dense bf16 peak)"
        )
    seconds = float(cpu_seconds(plan).sum())
    if speed is None:
        return (
            f"{head}: about {_duration(seconds)} on a 2-core CPU ({CPU_FLOPS_PER_SECOND:.0e} "
            f"FLOP/s, {CPU_SECONDS_PER_LAYER_TOKEN * 1e6:g} µs per token per layer and "
            f"{MEMBER_SECONDS:g} s per member, fitted to measured members)"
        )
    return (
        f"{head}: about {_duration(seconds * speed)} (the estimate for a 2-core CPU times "
        f"{speed:.2f}, the finished members' measured time over theirs)"
    )


def uses_cpu(device: str) -> bool:
    """Whether members trained locally on ``device`` run on the CPU ("auto": no CUDA here)."""
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device.startswith("cpu")


def check_cpu_time(plan: pd.DataFrame, scale: str | None, device: str, executor: str) -> None:
    """Refuse a GPU-sized study (``scale="paper"``) that would train here on the CPU for more
    than :data:`CPU_LIMIT_HOURS` by the dry run's estimate: one :class:`ConfigError` naming
    the estimate and the ways out, before any work. Ray members may run on a cluster's GPUs:
    not refused."""
    if scale != "paper" or executor != "local" or not uses_cpu(device):
        return
    seconds = float(cpu_seconds(plan).sum())
    if seconds <= CPU_LIMIT_HOURS * 3600:
        return
    raise ConfigError(
        f"the paper-scale study would train {len(plan)} members on this CPU for about "
        f"{_duration(seconds)} by the dry run's estimate ({float(plan['flops'].sum()):.2e} "
        f"FLOPs; the limit is {CPU_LIMIT_HOURS:g} h)",
        fix="run it on a GPU (--device cuda) or a cluster (--executor ray --ray-address ...), "
        "see its plan with --dry-run, or shrink it (--budgets, --depths, --seeds, --steps) "
        "or use --scale cpu",
    )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    if seconds < 3 * 365 * 86400:
        return f"{seconds / 86400:,.0f} days"
    return f"{seconds / (365 * 86400):,.0f} years"


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
    clock = StudyClock(plan, rows, progress)
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


class StudyClock:
    """The time estimates: before training (:func:`cpu_seconds` of the planned members, scaled
    by the finished members' measured time over their estimate) and after each member (the
    members left, scaled by the same ratio measured so far)."""

    def __init__(self, plan: pd.DataFrame, rows: dict[str, dict[str, Any]], say: bool) -> None:
        self.plan = plan.set_index("name", drop=False)
        self.estimate = dict(zip(plan["name"], cpu_seconds(plan), strict=True))
        self.done_estimate = sum(float(self.estimate[n]) for n in rows)
        self.done_seconds = sum(float(r.get("seconds", 0.0)) for r in rows.values())
        self.left: list[str] = []
        self.say = say

    def speed(self) -> float | None:
        """The finished members' measured seconds over their estimate, or None."""
        if self.done_seconds > 0 and self.done_estimate > 0:
            return self.done_seconds / self.done_estimate
        return None

    def before(self, names: Sequence[str]) -> None:
        self.left = list(names)
        if not self.say:
            return
        finished = len(self.estimate) - len(names)
        if not names:
            log(f"all {finished} members are finished: nothing to train")
            return
        again = f" ({finished} finished before, not trained again)" if finished else ""
        log("to train: " + plan_cost(self.plan.loc[list(names)], speed=self.speed()) + again)

    def after(self, name: str, row: dict[str, Any]) -> None:
        self.left = [n for n in self.left if n != name]
        self.done_estimate += float(self.estimate[name])
        self.done_seconds += float(row.get("seconds", 0.0))
        speed = self.speed()
        if self.say and speed:
            seconds = sum(float(self.estimate[n]) for n in self.left) * speed
            left = _duration(seconds) if self.left else "nothing"
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
    scale: str | None,
    plan_device: str,
    device: str,
    executor: str,
    ray_address: str | None,
    progress: bool,
    dry_run: bool,
    data: StudyData | None = None,
    seq_len: int = 0,
) -> S:
    """A planned study's course: with ``dry_run``, print the plan and its cost (on
    ``plan_device``'s rate, and this CPU's for a GPU-sized plan here) and return; else check
    the CPU time (:func:`check_cpu_time`), the executor, the pretraining ``data`` (read and
    checked for the plan's most ``tokens`` and ``seq_len``; None: the members are not
    pretrained) and the study folder before any work, run the members (``train`` each),
    raise the failures as one error, and write the result (``build``: :func:`write_results`)."""
    if dry_run:
        if data is not None:
            data.check()
        if progress:
            cost = plan_cost(study.plan, device=plan_device)
            if plan_device == "gpu" and executor == "local" and uses_cpu(device):
                cost += "\non this CPU (no GPU here): " + plan_cost(study.plan).split(": ", 1)[1]
            if data is not None:
                cost = f"pretrained on {data.describe()}\n{cost}"
                cost += _data_note(data, int(study.plan["tokens"].max()), seq_len)
            print_plan(study.plan, dry_run_columns, cost)
        return study
    check_cpu_time(study.plan, scale, device, executor)  # before any work
    check_executor(executor, study.out if executor == "ray" else None)
    if data is None:
        check_study_folder(study.out, kind, study.meta)
    else:
        corpus = data.read(int(study.plan["tokens"].max()), seq_len)
        check_study_folder(study.out, kind, study.meta, data.record(corpus))
        data.write(corpus, study.out)
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


def _data_note(data: StudyData, tokens: int, seq_len: int) -> str:
    """For a dry run on a folder of files (the standard library by default, quick to read):
    the line saying that a real run would refuse it (too little text for the plan), or
    nothing. A text file or data set is not read by a dry run."""
    if data.prepared:
        return ""
    try:
        data.read(tokens, seq_len)
    except ProbekitError as err:
        return f"\nnote: a real run would be refused: {err}"
    return ""


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
    "CPU_LIMIT_HOURS",
    "CPU_SECONDS_PER_LAYER_TOKEN",
    "GPU_FLOPS_PER_SECOND",
    "MEMBERS_CSV",
    "MEMBER_FILE",
    "STUDY_FILE",
    "SUMMARY_FILE",
    "MemberTask",
    "Study",
    "carry_out",
    "check_cpu_time",
    "check_study_folder",
    "cpu_seconds",
    "finished_row",
    "member_steps",
    "plan_cost",
    "preset_of",
    "print_plan",
    "raise_failures",
    "resumable",
    "run_member",
    "run_members",
    "uses_cpu",
    "write_results",
]
