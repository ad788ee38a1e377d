"""Many checkpoints at once: a depth timeline and many diagnoses, each checkpoint one task.

The same executors as a sweep (:mod:`probekit.executor`): ``"local"`` measures the
checkpoints one after another in this process, ``"ray"`` runs each as one Ray task on a
cluster (``ray_address``) or a local Ray. The fault rules are the sweep's: a task whose worker
dies is run again by Ray; a checkpoint that fails for its own reason (an unreadable folder, a
model probekit does not support) is recorded as failed with its error, and the others go on.
Under Ray the checkpoints and ``out_dir`` must be paths every node sees (a shared filesystem).

:func:`distributed_depth_timeline` returns what
:func:`probekit.analyses.across_checkpoints.depth_timeline` returns for the same checkpoints (equal
numbers; tested). :func:`diagnose_many` writes one report folder per checkpoint
(:func:`probekit.report.save_report`, swapped in whole, so no folder is ever half-written) and a
table of their headline numbers; run again, it skips the reports already written.

Example:
    >>> from probekit.toy import toy_hf_model, toy_tokens
    >>> series = [("static", step, toy_hf_model(seed=step)) for step in (100, 200)]
    >>> tl = distributed_depth_timeline(series, toy_tokens(), executor="local")
    >>> tl.table()["second_half_share"].shape
    (2,)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from probekit.analyses.across_checkpoints import (
    Checkpoint,
    DepthTimelineResult,
    checked_checkpoints,
    depth_headlines,
    timeline,
)
from probekit.data import Data
from probekit.errors import InputError, ProbekitError
from probekit.executor import Failed, check_executor, log, run_tasks
from probekit.io import atomic_write_text, read_json
from probekit.report import diagnose, save_report
from probekit.result import Result
from probekit.words import COMPARISON_HEADINGS, figure_words, label


def _one_timeline(job: tuple[Checkpoint, Any, dict[str, Any]]) -> pd.DataFrame:
    """The depth headlines of one checkpoint, as :func:`timeline` rows (one task)."""
    entry, data, options = job
    return timeline([entry], depth_headlines, data, **options).df


def distributed_depth_timeline(
    checkpoints: Iterable[Checkpoint],
    data: Data | Callable[[Any], Data],
    *,
    positions: str = "all",
    batch_size: int | None = None,
    n_bootstrap: int = 0,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool = False,
) -> DepthTimelineResult:
    """:func:`probekit.analyses.across_checkpoints.depth_timeline`, each checkpoint one task of
    ``executor``.

    The result is that function's; checkpoints that failed are left out of the table and
    listed in ``summary["failed"]`` (``"run@step": error``). All failing is an
    :class:`~probekit.errors.InputError` naming the first error.
    """
    entries = checked_checkpoints(checkpoints)
    check_executor(executor)
    options = {"positions": positions, "batch_size": batch_size, "n_bootstrap": n_bootstrap}
    jobs = [(entry, data, options) for entry in entries]

    def done(i: int, value: Any) -> None:
        if progress and isinstance(value, Failed):
            log(f"{entries[i][0]}@{entries[i][1]}: failed: {value.error}")

    frames = run_tasks(
        _one_timeline,
        jobs,
        executor=executor,
        ray_address=ray_address,
        on_done=done,
        progress=progress,
        desc="timeline checkpoints",
    )
    failed = {
        f"{e[0]}@{e[1]}": v.error
        for e, v in zip(entries, frames, strict=True)
        if isinstance(v, Failed)
    }
    kept = [(e, v) for e, v in zip(entries, frames, strict=True) if not isinstance(v, Failed)]
    if not kept:
        raise InputError(
            f"every checkpoint failed; the first: {next(iter(failed.values()))}",
            fix="check the checkpoint paths (every node must see them under Ray)",
        )
    df = pd.concat([v for _, v in kept], ignore_index=True)
    summary: dict[str, Any] = {
        "n_checkpoints": len(kept),
        "runs": sorted({str(e[0]) for e, _ in kept}),
    }
    if failed:
        summary["failed"] = failed
    meta = {"analyzer": "depth_headlines", "options": options, "executor": executor}
    return DepthTimelineResult(df, summary, meta)


class DiagnosesResult(Result):
    """:func:`diagnose_many`'s table: one row per checkpoint (``name``, ``source``,
    ``status``, ``report``, the headline numbers); ``summary``: ``n_ok``, ``n_failed``,
    ``failed`` (name: error)."""

    kind = "diagnoses"

    def figure(self, measure: str = "second_half_share") -> go.Figure:
        ok = self.df[self.df["status"] == "ok"]
        fig = go.Figure(go.Bar(x=ok["name"], y=ok[measure]))
        words = COMPARISON_HEADINGS.get(measure) or label(measure)
        fig.update_layout(
            title=figure_words("diagnoses", measure=words),
            xaxis_title=figure_words("diagnoses", "x"),
            yaxis_title=words,
            template="plotly_white",
        )
        return fig


LOAD_OPTIONS = ("dtype", "storage")
"""The options of :func:`diagnose_many` that go to :func:`probekit.load` (``dtype`` as a name:
``"stored"``, ``"float32"``, ...), not to the diagnosis."""


def _one_diagnosis(job: tuple[str, Any, Any, Path, dict[str, Any]]) -> dict[str, Any]:
    """Diagnose one checkpoint and swap its report in whole (one task)."""
    name, source, data, folder, options = job
    loading = {key: options[key] for key in LOAD_OPTIONS if key in options}
    options = {key: value for key, value in options.items() if key not in LOAD_OPTIONS}
    diagnosis = diagnose(_loaded(source, **loading) if loading else source, data, **options)
    save_report(diagnosis, folder, title=f"probekit depth diagnosis: {name}", images=False)
    return diagnosis.headline


def _loaded(source: Any, dtype: str | None = None, storage: str = "auto") -> Any:
    """``source`` loaded in the dtype named ``dtype`` (None or ``"stored"``: as stored), its
    weights kept as ``storage`` says (:func:`probekit.load`)."""
    import torch

    from probekit.model import load

    torch_dtype = None if dtype in (None, "stored") else getattr(torch, str(dtype))
    return load(source, dtype=torch_dtype, storage=storage)


def _written_headline(folder: Path) -> dict[str, Any] | None:
    """The headline of a report already written in ``folder``, else None."""
    try:  # a pipe there would block, JSON nested too deep would raise: neither is a report
        summary = read_json(folder / "summary.json", 2**26, "a report's summary.json")
    except (OSError, ProbekitError):
        return None
    headline = summary.get("headline") if isinstance(summary, dict) else None
    return headline if isinstance(headline, dict) and (folder / "report.html").is_file() else None


def _check_names(checkpoints: Mapping[str, Any]) -> None:
    if not checkpoints:
        raise InputError("no checkpoints given", fix="pass {name: checkpoint path, ...}")
    for name in checkpoints:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise InputError(
                f"checkpoint name {name!r} is not a plain folder name",
                fix="name each checkpoint with letters, digits, '-', '_' and '.'",
            )


def diagnose_many(
    checkpoints: Mapping[str, Any],
    data: Data,
    out_dir: str | os.PathLike,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    resume: bool = True,
    progress: bool = False,
    **options: Any,
) -> DiagnosesResult:
    """:func:`probekit.report.diagnose` of every ``{name: checkpoint}``, each one task.

    Writes ``out_dir/<name>/`` (the report of :func:`~probekit.report.save_report`, without
    images) and ``out_dir/diagnoses.csv`` (the returned table). ``options`` go to
    ``diagnose``, except :data:`LOAD_OPTIONS` (``dtype``, ``storage``), which go to
    :func:`probekit.load`. With ``resume``, a report already in ``out_dir/<name>/`` is reused.
    """
    _check_names(checkpoints)
    check_executor(executor, out_dir)
    out = Path(out_dir)
    names = list(checkpoints)
    headlines: dict[str, Any] = {}
    if resume:
        for name in names:
            written = _written_headline(out / name)
            if written is not None:
                headlines[name] = written
    todo = [n for n in names if n not in headlines]
    if executor == "local":  # each diagnosis's analyses get their live lines here
        options = {"progress": progress, **options}
    jobs = [(n, checkpoints[n], data, out / n, options) for n in todo]

    def done(i: int, value: Any) -> None:
        headlines[todo[i]] = value
        if progress:
            what = f"failed: {value.error}" if isinstance(value, Failed) else "report written"
            log(f"{todo[i]}: {what}")

    run_tasks(
        _one_diagnosis,
        jobs,
        executor=executor,
        ray_address=ray_address,
        on_done=done,
        progress=progress,
        desc="diagnoses",
        done_before=len(names) - len(todo),
    )
    return _diagnoses_table(names, checkpoints, headlines, out, executor)


def _diagnoses_table(
    names: list[str],
    checkpoints: Mapping[str, Any],
    headlines: dict[str, Any],
    out: Path,
    executor: str,
) -> DiagnosesResult:
    rows, failed = [], {}
    for name in names:
        value = headlines[name]
        row: dict[str, Any] = {"name": name, "source": str(checkpoints[name])}
        if isinstance(value, Failed):
            failed[name] = value.error
            row.update(status=f"failed: {value.error}", report="")
        else:
            row.update(status="ok", report=str(out / name / "report.html"))
            row.update({k: v for k, v in value.items() if not isinstance(v, list | dict)})
        rows.append(row)
    df = pd.DataFrame(rows)
    summary: dict[str, Any] = {"n_ok": len(names) - len(failed), "n_failed": len(failed)}
    if failed:
        summary["failed"] = failed
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "diagnoses.csv", df.to_csv(index=False))
    return DiagnosesResult(df, summary, {"executor": executor})


__all__ = ["DiagnosesResult", "diagnose_many", "distributed_depth_timeline"]
