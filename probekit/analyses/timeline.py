"""Depth use across checkpoints: how contributions, residual similarity and blocks evolve.

:func:`depth_timeline` runs the depth-use analyzers on a series of checkpoints (the stages of
a grown run, or a static run at the same steps) and gathers their headline numbers into one
tidy table, so that e.g. the second-half share can be plotted against the training step with
static and grown runs side by side.

Each checkpoint is given as ``(run, step, model)`` where ``model`` is anything
:func:`probekit.load` accepts; models are loaded one at a time and released, so a long series
never holds more than one model.

Example:
    >>> series = [("static", 1000, "runs/static/step1000"), ("grown", 1000, "runs/grown/step1000")]
    >>> tl = depth_timeline(series, tokens)            # doctest: +SKIP
    >>> tl.figure("second_half_share").show()          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from probekit import figures
from probekit.analyses.depth.contributions import contributions
from probekit.analyses.depth.residual import residual_stats
from probekit.analyses.depth.skips import skip_effects
from probekit.analyses.depth.swaps import layer_swaps
from probekit.data import Data
from probekit.errors import InputError
from probekit.model import load
from probekit.result import Result

Checkpoint = tuple[str, int, Any]


def _headlines(model: Any, data: Data, positions: str, n_bootstrap: int) -> dict[str, float]:
    contrib = contributions(model, data, positions=positions, components=("layer",))
    resid = residual_stats(model, data, positions=positions)
    skips = skip_effects(model, data, positions=positions)
    swaps = layer_swaps(
        model, data, pairs="adjacent", blocks=None, n_bootstrap=n_bootstrap, positions=positions
    )
    return {
        "n_layers": contrib.summary["n_layers"],
        "loss": contrib.summary["clean_loss"],
        "second_half_share": contrib.summary["second_half_share"],
        "depth_score_normalized": skips.summary["depth_score_normalized"],
        "cos_out_in_second_half": resid.summary["cos_out_in_second_half"],
        "update_rel_second_half": resid.summary["update_rel_second_half"],
        "n_blocks": swaps.summary["n_blocks"],
        "mean_adjacent_swap_delta": swaps.summary["mean_adjacent_swap_delta"],
    }


class DepthTimelineResult(Result):
    """``df`` columns: ``run``, ``step``, ``measure``, ``value`` (one row per checkpoint and
    headline measure). ``summary``: per run, the last checkpoint's second-half share
    (``<run>/second_half_share``) and the number of checkpoints."""

    kind = "depth_timeline"

    def table(self) -> pd.DataFrame:
        """Wide table: one row per (run, step), one column per measure."""
        return self.df.pivot_table(index=["run", "step"], columns="measure", values="value")

    def figure(self, measure: str = "second_half_share") -> go.Figure:
        part = self.df[self.df.measure == measure].sort_values(["run", "step"])
        return figures.lines(
            part, "step", "value", "run", f"{measure} over training", "training step", measure
        )


def depth_timeline(
    checkpoints: Iterable[Checkpoint],
    data: Data | Callable[[Any], Data],
    *,
    positions: str = "all",
    n_bootstrap: int = 0,
) -> DepthTimelineResult:
    """Run the depth-use headline analyses on every ``(run, step, model)`` checkpoint.

    ``data`` is the data for all checkpoints, or a function of the loaded model returning it.
    """
    rows = []
    checkpoints = list(checkpoints)
    if not checkpoints:
        raise InputError("no checkpoints given", fix="pass [(run, step, model_or_path), ...]")
    for entry in checkpoints:
        if not (isinstance(entry, Sequence) and len(entry) == 3):
            raise InputError(
                f"checkpoint entry {entry!r} is not (run, step, model)",
                fix="pass tuples like ('static', 1000, 'runs/static/step1000')",
            )
        run, step, source = entry
        model = load(source)
        batch = data(model) if callable(data) else data
        for measure, value in _headlines(model, batch, positions, n_bootstrap).items():
            rows.append(
                {"run": str(run), "step": int(step), "measure": measure, "value": float(value)}
            )
        del model
    df = pd.DataFrame(rows)
    summary: dict[str, Any] = {"n_checkpoints": len(checkpoints)}
    for run, part in df[df.measure == "second_half_share"].groupby("run"):
        summary[f"{run}/second_half_share"] = float(part.sort_values("step").value.iloc[-1])
    return DepthTimelineResult(df, summary, {"positions": positions})


__all__ = ["DepthTimelineResult", "depth_timeline"]
