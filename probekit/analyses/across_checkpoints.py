"""Any analyzer across checkpoints: how its numbers evolve over training.

:func:`timeline` runs one analyzer on a series of checkpoints (the stages of a grown run, or a
static run at the same steps) and gathers what it measured into one tidy table with ``run``
and ``step`` columns, so that e.g. the second-half share can be plotted against the training
step with static and grown runs side by side. By default the numbers gathered are the
analyzer's whole-result scalars (its ``summary``); ``rows=`` takes any other part of its result.

Each checkpoint is ``(run, step, model)`` where ``model`` is anything :func:`probekit.load`
accepts; models are loaded one at a time and released, so a long series never holds more than
one model. :func:`depth_timeline` is the thin variant for the depth-use headline numbers.

Example:
    >>> from probekit.toy import toy_hf_model, toy_tokens
    >>> from probekit.analyses.depth.contributions import contributions
    >>> series = [("static", step, toy_hf_model(seed=step)) for step in (100, 200)]
    >>> tl = timeline(series, contributions, toy_tokens(), components=["layer"])
    >>> tl.table()["second_half_share"].shape
    (2,)
    >>> fig = tl.figure("second_half_share")     # one line per run over the step
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Real
from pathlib import Path
from typing import Any, TypeVar, overload

import pandas as pd
import plotly.graph_objects as go

from probekit import figures
from probekit.analyses.common import result_meta
from probekit.analyses.depth.contributions import contributions
from probekit.analyses.depth.residual import residual_stats
from probekit.analyses.depth.skips import skip_effects
from probekit.analyses.depth.swaps import layer_swaps
from probekit.data import Data
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.model.checkpoint import KEPT_CHECKPOINTS, checkpoints_below
from probekit.result import Result
from probekit.words import AXES, figure_words

Checkpoint = tuple[str, float, Any]
"""``(run, step, model)``: a run label, its training step (any real number), and a model
source."""


class TimelineResult(Result):
    """``df`` columns: ``run``, ``step``, ``measure``, ``value`` (one row per checkpoint and
    number; extra columns when ``rows=`` gives them). ``summary``: ``n_checkpoints``, ``runs``.
    """

    kind = "timeline"

    def table(self) -> pd.DataFrame:
        """Wide table: one row per (run, step), one column per measure."""
        return self.df.pivot_table(index=["run", "step"], columns="measure", values="value")

    def last(self, measure: str) -> pd.Series:
        """The value of ``measure`` at the last step of each run, indexed by run."""
        part = self.df[self.df.measure == measure].sort_values("step")
        return part.groupby("run")["value"].last()

    def figure(self, measure: str) -> go.Figure:
        part = self.df[self.df.measure == measure].sort_values(["run", "step"])
        return figures.lines(
            part,
            "step",
            "value",
            "run",
            figure_words("timeline", measure=figures.words(measure).capitalize()),
            AXES["training_step"],
            figures.words(measure),
        )


def scalar_rows(result: Result) -> pd.DataFrame:
    """The numeric whole-result scalars of ``result.summary`` as ``measure``/``value`` rows."""
    numbers = {
        k: float(v)
        for k, v in result.summary.items()
        if isinstance(v, Real) and not isinstance(v, bool)
    }
    return pd.DataFrame({"measure": list(numbers), "value": list(numbers.values())})


# --- checkpoints over training ---
_STEP_FOLDER = re.compile(r"^step-?(\d+)$")


def run_checkpoints(folder: str | os.PathLike) -> list[Checkpoint]:
    """The checkpoints a run folder kept over training, ``(run, step, path)`` ordered by step.

    ``folder`` is a run folder whose ``checkpoints/`` holds ``step-000500/`` folders (an
    anchor run trained with ``keep_checkpoints``; for a run of a stack pass
    ``OUT/checkpoints/<run>``), or a folder of ``step-N``/``stepN`` checkpoints itself; ``run``
    is the run folder's name.

    Example:
        >>> import tempfile
        >>> from probekit.toy import toy_hf_model
        >>> run = Path(tempfile.mkdtemp()) / "g0.5"
        >>> for step in (20, 100):
        ...     toy_hf_model("gpt2").save_pretrained(run / "checkpoints" / f"step-{step:06d}")
        >>> [(r, s, p.name) for r, s, p in run_checkpoints(run)]
        [('g0.5', 20, 'step-000020'), ('g0.5', 100, 'step-000100')]
    """
    root = Path(folder)
    kept = root / KEPT_CHECKPOINTS
    base = kept if kept.is_dir() else root
    found = []
    for path in checkpoints_below(base, limit=100_000, depth=1):
        match = _STEP_FOLDER.match(path.name)
        if match:
            found.append((root.name, int(match[1]), path))
    if not found:
        raise InputError(
            f"{folder} holds no checkpoints kept over training (no {KEPT_CHECKPOINTS}/step-N/ "
            "folders)",
            fix="train with keep_checkpoints (probekit train --keep-checkpoints 500), or pass "
            "[(run, step, checkpoint), ...]",
        )
    return sorted(found, key=lambda entry: entry[1])


def checked_checkpoints(
    entries: Iterable[Checkpoint] | str | os.PathLike,
) -> list[Checkpoint]:
    """``entries`` as a list, each checked to be ``(run, step, model)`` with a numeric step;
    a run folder stands for the checkpoints it kept (:func:`run_checkpoints`)."""
    if isinstance(entries, str | os.PathLike):
        return run_checkpoints(entries)
    checkpoints = list(entries)
    if not checkpoints:
        raise InputError("no checkpoints given", fix="pass [(run, step, model_or_path), ...]")
    for entry in checkpoints:
        if not (isinstance(entry, Sequence) and len(entry) == 3):
            raise InputError(
                f"checkpoint entry {entry!r} is not (run, step, model)",
                fix="pass tuples like ('static', 1000, 'runs/static/step1000')",
            )
        if isinstance(entry[1], bool) or not isinstance(entry[1], Real):
            raise InputError(
                f"the step {entry[1]!r} of checkpoint {entry[0]!r} is not a number",
                fix="give each checkpoint its training step as a number",
            )
    return checkpoints


TimelineT = TypeVar("TimelineT", bound=TimelineResult)


@overload
def timeline(
    checkpoints: Iterable[Checkpoint] | str | os.PathLike,
    analyzer: Callable[..., Result],
    data: Data | Callable[[Model], Data] | None = None,
    *,
    rows: Callable[[Result], pd.DataFrame] = scalar_rows,
    result_class: type[TimelineT],
    summarize: Callable[[pd.DataFrame], Mapping[str, Any]] | None = None,
    **options: Any,
) -> TimelineT: ...


@overload
def timeline(
    checkpoints: Iterable[Checkpoint] | str | os.PathLike,
    analyzer: Callable[..., Result],
    data: Data | Callable[[Model], Data] | None = None,
    *,
    rows: Callable[[Result], pd.DataFrame] = scalar_rows,
    summarize: Callable[[pd.DataFrame], Mapping[str, Any]] | None = None,
    **options: Any,
) -> TimelineResult: ...


def timeline(
    checkpoints: Iterable[Checkpoint] | str | os.PathLike,
    analyzer: Callable[..., Result],
    data: Data | Callable[[Model], Data] | None = None,
    *,
    rows: Callable[[Result], pd.DataFrame] = scalar_rows,
    result_class: type[TimelineResult] = TimelineResult,
    summarize: Callable[[pd.DataFrame], Mapping[str, Any]] | None = None,
    **options: Any,
) -> TimelineResult:
    """Run ``analyzer`` on every ``(run, step, model)`` checkpoint and gather its numbers.

    Args:
        checkpoints: ``(run, step, model)`` entries (models load one at a time), or a run
            folder that kept checkpoints over training (:func:`run_checkpoints`).
        analyzer: any probekit analyzer, ``analyzer(model, data, **options)`` for analyzers of
            activations or ``analyzer(model, **options)`` for analyzers of weights
            (``data=None``).
        data: the data for all checkpoints, or a function of the loaded model returning it.
        rows: what to gather from each result as a DataFrame (default :func:`scalar_rows`);
            ``run`` and ``step`` columns are added.
        result_class: the :class:`TimelineResult` subclass to return (its own figure).
        summarize: extra summary entries computed from the gathered table.
        **options: passed to the analyzer on every checkpoint.
    """
    checkpoints = checked_checkpoints(checkpoints)
    frames = []
    for run, step, source in checkpoints:
        model = load(source)
        if data is None:
            result = analyzer(model, **options)
        else:
            result = analyzer(model, data(model) if callable(data) else data, **options)
        frame = rows(result).copy()
        frame.insert(0, "step", step)
        frame.insert(0, "run", str(run))
        frames.append(frame)
        del model, result
    df = pd.concat(frames, ignore_index=True)
    summary: dict[str, Any] = {
        "n_checkpoints": len(checkpoints),
        "runs": sorted({str(r) for r, _, _ in checkpoints}),
    }
    if summarize is not None:
        summary.update(summarize(df))
    meta = {"analyzer": getattr(analyzer, "__name__", repr(analyzer)), "options": options}
    return result_class(df, summary, meta)


# ---------------------------------------------------------------- the depth-use variant
class DepthHeadlines(Result):
    """The depth-use headline numbers of one model (``summary`` only; ``df`` is empty)."""

    kind = "depth_headlines"


def depth_headlines(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    batch_size: int | None = None,
    n_bootstrap: int = 0,
) -> DepthHeadlines:
    """Contributions, residual similarity, skip effects and adjacent swaps, headlines only."""
    model = load(model)
    contrib = contributions(
        model, data, components=("layer",), positions=positions, batch_size=batch_size
    )
    resid = residual_stats(model, data, positions=positions, batch_size=batch_size)
    skips = skip_effects(model, data, positions=positions, batch_size=batch_size)
    swaps = layer_swaps(
        model,
        data,
        pairs="adjacent",
        blocks=None,
        n_bootstrap=n_bootstrap,
        positions=positions,
        batch_size=batch_size,
    )
    summary = {
        "n_layers": contrib.summary["n_layers"],
        "loss": contrib.summary["clean_loss"],
        "second_half_share": contrib.summary["second_half_share"],
        "depth_score_normalized": skips.summary["depth_score_normalized"],
        "cos_out_in_second_half": resid.summary["cos_out_in_second_half"],
        "update_rel_second_half": resid.summary["update_rel_second_half"],
        "n_blocks": swaps.summary["n_blocks"],
        "mean_adjacent_swap_delta": swaps.summary["mean_adjacent_swap_delta"],
    }
    meta = result_meta(model, n_bootstrap=n_bootstrap, positions=positions, batch_size=batch_size)
    return DepthHeadlines(pd.DataFrame(), summary, meta)


class DepthTimelineResult(TimelineResult):
    """:class:`TimelineResult` of :func:`depth_headlines`; ``figure`` defaults to the
    second-half share."""

    kind = "depth_timeline"

    def figure(self, measure: str = "second_half_share") -> go.Figure:
        return super().figure(measure)


def depth_timeline(
    checkpoints: Iterable[Checkpoint] | str | os.PathLike,
    data: Data | Callable[[Any], Data],
    *,
    positions: str = "all",
    batch_size: int | None = None,
    n_bootstrap: int = 0,
) -> DepthTimelineResult:
    """:func:`timeline` of the depth-use headline numbers (:func:`depth_headlines`), one
    checkpoint after another in this process (:func:`probekit.cluster.distributed_depth_timeline`
    runs each checkpoint as a task of an executor instead, with the same numbers).

    ``data`` is the data for all checkpoints, or a function of the loaded model returning it;
    ``checkpoints`` may be a run folder that kept checkpoints (:func:`run_checkpoints`).
    """
    return timeline(
        checkpoints,
        depth_headlines,
        data,
        result_class=DepthTimelineResult,
        positions=positions,
        batch_size=batch_size,
        n_bootstrap=n_bootstrap,
    )


__all__ = [
    "Checkpoint",
    "DepthTimelineResult",
    "checked_checkpoints",
    "TimelineResult",
    "depth_headlines",
    "depth_timeline",
    "run_checkpoints",
    "scalar_rows",
    "timeline",
]
