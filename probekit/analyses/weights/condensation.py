"""Condensation of the weights: neuron cosine groups, and their course over checkpoints.

*Condensation* (small-initialization training): the input weights of many neurons line up, so the
cosine-similarity matrix between neurons' input weight vectors shows blocks. For every layer and
every matrix among W_Q, W_K, W_V and the MLP input W_in, :func:`condensation` computes that matrix
with the neurons reordered by average-linkage clustering, groups neurons whose clusters stay
above ``threshold`` (default 0.7), and reports the number of groups, the share of the largest
group and a *condensation score* in [0, 1]: the fraction of neuron pairs whose cosine is at least
``threshold`` (about 0 for random weights, 1 when every neuron points the same way).

A neuron of W_Q is one output unit of the query projection (``n_heads * d_head`` of them per
layer, each with a ``d_model`` input weight vector); of W_in one MLP hidden unit. Biases are not
part of the vectors. Weights come from :meth:`probekit.Model.weights`, so nothing here knows an
architecture. Spectra and stable ranks are in :mod:`probekit.analyses.weights.spectra`;
:func:`condensation_timeline` runs condensation and stable ranks over the checkpoints of a run.

Example:
    >>> from probekit.toy import toy_model
    >>> res = condensation(toy_model("gpt2", n_layers=1), matrices=["W_in"])
    >>> res.groups("W_in", layer=0) > 1, 0.0 <= res.score("W_in", layer=0) < 0.1
    (True, True)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses.across_checkpoints import TimelineResult, run_checkpoints, timeline
from probekit.analyses.common import cosine_matrix
from probekit.analyses.weights.spectra import stable_rank
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import AXES, figure_words

NEURON_MATRICES = ("W_Q", "W_K", "W_V", "W_in")
"""The matrices whose neurons' input weights :func:`condensation` compares."""

STATS = ("groups", "largest_share", "score", "mean_abs_cos")
"""Per (layer, matrix) numbers of :meth:`CondensationResult.stats`."""


def cluster_order(cos: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Leaf order of average-linkage clustering on ``1 - cos`` and group labels at ``threshold``.

    Two neurons share a group when the average cosine between their clusters is at least
    ``threshold`` when they merge. Returns ``(order, labels)``; labels number groups 0.. by size.
    """
    from scipy.cluster.hierarchy import fcluster, leaves_list, linkage
    from scipy.spatial.distance import squareform

    n = cos.shape[0]
    if n == 1:
        return np.zeros(1, dtype=int), np.zeros(1, dtype=int)
    dist = np.clip(1.0 - cos, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    tree = linkage(squareform(dist, checks=False), method="average")
    order = leaves_list(tree)
    raw = fcluster(tree, t=1.0 - threshold, criterion="distance")
    sizes = pd.Series(raw).value_counts()
    rank = {label: i for i, label in enumerate(sizes.index)}
    return order, np.array([rank[r] for r in raw])


def _check_threshold(threshold: float) -> float:
    if not -1.0 < threshold < 1.0:
        raise InputError(f"threshold {threshold} is not in (-1, 1)", fix="use e.g. 0.7")
    return float(threshold)


# ---------------------------------------------------------------- condensation
class CondensationResult(Result):
    """Neuron cosine matrices (reordered) per layer and matrix, and their groups.

    ``df`` columns: ``layer``, ``matrix``, ``i``, ``j`` (positions in the clustered order),
    ``neuron_i``, ``neuron_j`` (original indices), ``cosine``, ``group_i``, ``group_j``.
    ``summary``: ``threshold``; ``mean_score`` over all matrices. Per (matrix, layer):
    :meth:`groups`, :meth:`largest_share`, :meth:`score`, :meth:`mean_abs_cos` (all of them:
    :meth:`stats`).
    """

    kind = "condensation"

    def matrix(self, layer: int, name: str) -> np.ndarray:
        """The reordered cosine matrix of one (layer, matrix)."""
        part = self._part(name, layer)
        n = int(part.i.max()) + 1
        out = np.full((n, n), np.nan)
        out[part.i.to_numpy(), part.j.to_numpy()] = part.cosine.to_numpy()
        return out

    def stats(self) -> pd.DataFrame:
        """One row per (layer, matrix) with its :data:`STATS`."""
        threshold = self.summary["threshold"]
        rows = [
            {"layer": int(layer), "matrix": name, **_stats(part, threshold)}
            for (layer, name), part in self.df.groupby(["layer", "matrix"], sort=False)
        ]
        return pd.DataFrame(rows, columns=["layer", "matrix", *STATS])

    def groups(self, matrix: str, layer: int) -> int:
        """Number of neuron groups of one matrix at one layer."""
        return int(_stats(self._part(matrix, layer), self.summary["threshold"])["groups"])

    def largest_share(self, matrix: str, layer: int) -> float:
        """Share of the neurons in the largest group."""
        return _stats(self._part(matrix, layer), self.summary["threshold"])["largest_share"]

    def score(self, matrix: str, layer: int) -> float:
        """Condensation score: fraction of neuron pairs with cosine >= the threshold."""
        return _stats(self._part(matrix, layer), self.summary["threshold"])["score"]

    def mean_abs_cos(self, matrix: str, layer: int) -> float:
        """Mean |cosine| between distinct neurons."""
        return _stats(self._part(matrix, layer), self.summary["threshold"])["mean_abs_cos"]

    def _part(self, matrix: str, layer: int) -> pd.DataFrame:
        part = self.df[(self.df.layer == layer) & (self.df.matrix == matrix)]
        if part.empty:
            raise InputError(
                f"no condensation of {matrix!r} at layer {layer}",
                fix=f"use matrices {sorted(set(self.df.matrix))} and layers "
                f"{sorted(set(self.df.layer))}",
            )
        return part

    def figure(self, layer: int | None = None) -> go.Figure:
        """Reordered cosine matrices, one panel per (layer, matrix); ``layer`` picks one layer."""
        keys = self.df[["layer", "matrix"]].drop_duplicates()
        if layer is not None:
            keys = keys[keys.layer == layer]
        keys = list(keys.itertuples(index=False, name=None))
        names = list(dict.fromkeys(m for _, m in keys))
        layers = sorted({ly for ly, _ in keys})
        stats = self.stats().set_index(["layer", "matrix"])
        titles = [
            figure_words(
                "condensation",
                "panel",
                layer=ly,
                matrix=name,
                groups=stats.groups.get((ly, name), "?"),
                score=stats.score.get((ly, name), float("nan")),
            )
            for ly in layers
            for name in names
        ]
        fig = make_subplots(
            rows=len(layers), cols=len(names), subplot_titles=titles, horizontal_spacing=0.04
        )
        x_title, y_title = figure_words("condensation", "x"), figure_words("condensation", "y")
        for r, ly in enumerate(layers):
            for c, name in enumerate(names):
                if (ly, name) not in keys:
                    continue
                fig.add_trace(
                    go.Heatmap(
                        z=self.matrix(ly, name),
                        zmin=-1,
                        zmax=1,
                        colorscale=figures.DIVERGING,
                        showscale=(r == 0 and c == 0),
                        colorbar={"title": {"text": figure_words("condensation", "colorbar")}},
                        hovertemplate="neuron %{y} vs %{x}: %{z:.3f}<extra></extra>",
                    ),
                    row=r + 1,
                    col=c + 1,
                )
                fig.update_yaxes(autorange="reversed", showticklabels=False, row=r + 1, col=c + 1)
                fig.update_xaxes(showticklabels=False, row=r + 1, col=c + 1)
                fig.update_xaxes(title_text=x_title, row=r + 1, col=c + 1)
                if c == 0:
                    fig.update_yaxes(title_text=y_title, row=r + 1, col=c + 1)
        figures.base_layout(
            fig,
            figure_words("condensation", threshold=self.summary.get("threshold", 0.7)),
            width=min(figures.MAX_WIDTH, max(500, 260 * len(names) + 120)),
            height=max(340, 280 * len(layers) + 60),
        )
        return fig


def _stats(part: pd.DataFrame, threshold: float) -> dict[str, Any]:
    """Groups, largest share, score and mean |cos| of one (layer, matrix) block of ``df``,
    from the cosine matrix in the neurons' original order."""
    n = int(part.i.max()) + 1
    cos = np.full((n, n), np.nan)
    cos[part.neuron_i.to_numpy(), part.neuron_j.to_numpy()] = part.cosine.to_numpy()
    labels = np.zeros(n, dtype=int)
    labels[part.neuron_i.to_numpy()] = part.group_i.to_numpy()
    off = ~np.eye(n, dtype=bool)
    return {
        "groups": int(labels.max()) + 1,
        "largest_share": float(np.bincount(labels).max() / n),
        "score": float((cos[off] >= threshold).mean()) if n > 1 else 1.0,
        "mean_abs_cos": float(np.abs(cos[off]).mean()) if n > 1 else 1.0,
    }


def _condensation_frame(layer: int, name: str, w: Any, threshold: float) -> pd.DataFrame:
    cos = cosine_matrix(w.T)  # rows = neurons' input weight vectors
    order, labels = cluster_order(cos, threshold)
    n = cos.shape[0]
    ii, jj = (g.ravel() for g in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    return pd.DataFrame(
        {
            "layer": layer,
            "matrix": name,
            "i": ii,
            "j": jj,
            "neuron_i": order[ii],
            "neuron_j": order[jj],
            "cosine": cos[np.ix_(order, order)].ravel(),
            "group_i": labels[order][ii],
            "group_j": labels[order][jj],
        }
    )


@torch.no_grad()
def condensation(
    model: Model,
    *,
    matrices: Sequence[str] = NEURON_MATRICES,
    layers: Sequence[int] | None = None,
    threshold: float = 0.7,
) -> CondensationResult:
    """Cosine similarity between neurons' input weights, clustered into groups.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        matrices: any of W_Q, W_K, W_V, W_in (neurons = output units; input vectors compared).
        layers: layer indices to analyse (default all).
        threshold: cosine at which neurons count as one group (default 0.7).
    """
    model = load(model)
    threshold = _check_threshold(threshold)
    unknown = set(matrices) - set(NEURON_MATRICES)
    if unknown:
        raise InputError(
            f"unknown neuron matrices {sorted(unknown)}", fix=f"use any of {NEURON_MATRICES}"
        )
    layers = _check_layers(model, layers)
    weights = {k: v for k, v in model.weights(list(matrices)).items() if k[0] in set(layers)}
    if not weights:
        raise InputError(
            f"the model exposes none of {list(matrices)}", fix=f"use any of {NEURON_MATRICES}"
        )
    frames = [_condensation_frame(ly, m, w, threshold) for (ly, m), w in sorted(weights.items())]
    meta = {"matrices": list(matrices), "layers": list(layers), "model": repr(model)}
    res = CondensationResult(pd.concat(frames, ignore_index=True), {"threshold": threshold}, meta)
    res.summary["mean_score"] = float(np.mean(res.stats().score.to_list()))
    return res


def _check_layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(model.n_layers))
    return [model.check_layer(x) for x in layers]


# ---------------------------------------------------------------- timeline
class CondensationTimelineResult(TimelineResult):
    """Condensation and stable-rank headline numbers over a series of checkpoints.

    ``df`` columns: ``run``, ``step`` (the label given per checkpoint), ``quantity`` (e.g.
    ``score``, ``groups``, ``stable_rank``), ``matrix``, ``layer``, ``value``. ``summary``:
    ``n_checkpoints``, ``onset_step`` (first step whose mean condensation score reaches
    ``onset_score``, or None) and the first and last mean scores.
    """

    kind = "condensation_timeline"

    # every quantity at once, so no measure to choose as TimelineResult.figure's
    def figure(self) -> go.Figure:  # type: ignore[override]
        fig = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=[
                figure_words("condensation_timeline", q) for q in ("score", "groups", "stable_rank")
            ],
        )
        shown = self.df[self.df.quantity.isin(["score", "groups", "stable_rank"])]
        order = list(dict.fromkeys(shown.matrix))
        n_layers = int(self.df.layer.max()) + 1
        for col, quantity in enumerate(("score", "groups", "stable_rank"), start=1):
            part = self.df[self.df.quantity == quantity]
            for (m, ly), sub in part.groupby(["matrix", "layer"], sort=False):
                fig.add_trace(
                    go.Scatter(
                        x=sub.step,
                        y=sub.value,
                        mode="lines+markers",
                        name=m,
                        legendgroup=m,
                        showlegend=False,
                        opacity=0.35 + 0.65 * (max(ly, 0) + 1) / (n_layers + 1),
                        hovertext=f"{m} layer {ly}" if ly >= 0 else m,
                        line={"color": figures.PALETTE[order.index(m) % len(figures.PALETTE)]},
                    ),
                    row=1,
                    col=col,
                )
            fig.update_xaxes(title_text=AXES["training_step"], row=1, col=col)
        for k, m in enumerate(order):  # one legend entry per matrix (lines: its layers)
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines+markers",
                    name=m,
                    legendgroup=m,
                    line={"color": figures.PALETTE[k % len(figures.PALETTE)]},
                ),
                row=1,
                col=1,
            )
        for col, part in ((1, "y_score"), (2, "y_groups")):
            y_title = figure_words("condensation_timeline", part)
            fig.update_yaxes(title_text=y_title, row=1, col=col)
        fig.update_yaxes(title_text=AXES["stable_rank"], row=1, col=3)
        onset = self.summary.get("onset_step")
        figures.base_layout(
            fig,
            figure_words("condensation_timeline", onset=onset),
            width=1150,
            height=420,
        )
        return fig


def condensation_timeline(
    checkpoints: Sequence[Any] | str | os.PathLike,
    steps: Sequence[float] | None = None,
    *,
    threshold: float = 0.7,
    onset_score: float = 0.2,
    matrices: Sequence[str] = NEURON_MATRICES,
) -> CondensationTimelineResult:
    """Condensation score, groups and stable ranks of each checkpoint of one run.

    Args:
        checkpoints: model sources in training order (directories, HF models, handles), or
            a run folder that kept checkpoints over training (steps read from their folders,
            :func:`~probekit.analyses.across_checkpoints.run_checkpoints`).
        steps: the step of each checkpoint (default 0, 1, 2, ...).
        threshold: grouping threshold of :func:`condensation`.
        onset_score: mean condensation score that marks the onset of condensation.
        matrices: neuron matrices of :func:`condensation`.

    Example:
        >>> from probekit.toy import toy_model
        >>> series = [toy_model("gpt2", n_layers=1, seed=s) for s in (0, 1)]
        >>> res = condensation_timeline(series, steps=[100, 200], matrices=["W_in"])
        >>> res.summary["n_checkpoints"], res.summary["onset_step"]
        (2, None)
    """
    if isinstance(checkpoints, str | os.PathLike):  # a run folder: the checkpoints it kept
        kept = run_checkpoints(checkpoints)
        checkpoints = [path for _, _, path in kept]
        steps = [step for _, step, _ in kept] if steps is None else steps
    checkpoints = list(checkpoints)
    if not checkpoints:
        raise InputError("no checkpoints given", fix="pass a list of checkpoint directories")
    steps = list(range(len(checkpoints))) if steps is None else [float(s) for s in steps]
    if len(steps) != len(checkpoints):
        raise InputError(
            f"{len(steps)} steps for {len(checkpoints)} checkpoints",
            fix="give one step per checkpoint",
        )

    def onset(df: pd.DataFrame) -> dict[str, Any]:
        means = df[df.quantity == "mean_score"].set_index("step")["value"]
        first = next((s for s, m in means.items() if m >= onset_score), None)
        return {
            "onset_step": first,
            "first_mean_score": float(means.iloc[0]),
            "last_mean_score": float(means.iloc[-1]),
        }

    result = timeline(
        [("run", step, source) for step, source in zip(steps, checkpoints, strict=True)],
        checkpoint_weights,
        rows=lambda res: res.df,
        result_class=CondensationTimelineResult,
        summarize=onset,
        matrices=matrices,
        threshold=threshold,
    )
    result.meta.update({"threshold": threshold, "onset_score": onset_score, "steps": steps})
    return result


class CheckpointWeights(Result):
    """Condensation and stable ranks of one checkpoint, as rows of a timeline: ``df`` columns
    ``quantity``, ``matrix``, ``layer``, ``value``."""

    kind = "checkpoint_weights"


def checkpoint_weights(
    model: Model, *, matrices: Sequence[str] = NEURON_MATRICES, threshold: float = 0.7
) -> CheckpointWeights:
    """Groups, largest share and score per matrix, the mean score, then every stable rank."""
    model = load(model)
    cond = condensation(model, matrices=matrices, threshold=threshold)
    rows = [
        {"quantity": q, "matrix": r.matrix, "layer": r.layer, "value": float(v)}
        for r in cond.stats().itertuples(index=False)
        for q, v in (("groups", r.groups), ("largest_share", r.largest_share), ("score", r.score))
    ]
    rows.append(
        {"quantity": "mean_score", "matrix": "", "layer": -1, "value": cond.summary["mean_score"]}
    )
    mats = {**model.weights(), (-1, "W_E"): model.embedding}
    rows += [
        {"quantity": "stable_rank", "matrix": m, "layer": ly, "value": stable_rank(w)}
        for (ly, m), w in mats.items()
    ]
    return CheckpointWeights(pd.DataFrame(rows), {}, {"threshold": threshold})


__all__ = [
    "NEURON_MATRICES",
    "CondensationResult",
    "CondensationTimelineResult",
    "checkpoint_weights",
    "cluster_order",
    "condensation",
    "condensation_timeline",
]
