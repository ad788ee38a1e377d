"""Hidden-state maps and cosine heatmaps of single-position states between groups (pairs).

* :func:`hidden_state_map` lays the state at one position per input (default: the last token)
  after every layer (and sublayer output) out in 2-D, one point per input, coloured by group
  (the task data's ``groups()``, e.g. the anchor pair, or any labels), with the held-out groups
  and their mirrors (``TaskData.mirror_groups()``) marked. :meth:`HiddenMapResult.mirror_ratio`:
  distance between the centroids of a held-out group and its mirror over the mean distance
  between group centroids (small = the model treats the two alike, as the symmetric solution
  does).
* :func:`pair_cosines` compares, per layer, the states of two groups on inputs with *equal
  answers*: the task data's answer named ``answer`` (one of ``TaskData.answers()``; default its
  reference answer, the one its first category names: the anchor task's ``"inferential"``,
  where pairs (3,3) with key x and (2,2) with key x - 6 both want x - 4): for each answer
  value the states are averaged over inputs, and the cosine between two groups is averaged over
  the answer values they share. Symmetric with ones on the diagonal.

Sites are the model's per-block outputs: ``resid_out`` (the residual stream after the block),
``attn_out`` and ``mlp_out`` (see :data:`MAP_SITES`); ``layer`` l is block l. The token-embedding
map (weights only) is :func:`probekit.analyses.weights.embeddings.embedding_map`.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.toy import toy_model
    >>> task = AnchorTask(n_train=64, n_test=32, vocab_size=50, item_high=40)
    >>> model, data = toy_model("gpt2", n_layers=2), task.solution_data()
    >>> res = hidden_state_map(model, data, layers=[1])
    >>> sorted(set(res.df[res.df.marked].group)), res.mirror_ratio("resid_out", 1) > 0
    (['(3,4)', '(4,3)'], True)
    >>> float(pair_cosines(model, data).matrix(0).loc["(4,3)", "(4,3)"])
    1.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses.activations import Position, batches_of, states_at
from probekit.analyses.common import DataOrTask, cosine_matrix, result_meta
from probekit.analyses.projection import check_method, reduce
from probekit.data import TaskData
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import figure_words

MAP_SITES = ("resid_out", "attn_out", "mlp_out")
"""The sites a hidden-state map or a pair cosine reads, each at block ``layer``: the residual
stream after the block (``resid_out``) and the block's attention and MLP outputs."""


# ---------------------------------------------------------------- helpers
def _check(model: Model, sites: Sequence[str], layers: Sequence[int] | None) -> list[int]:
    bad_sites = set(sites) - set(MAP_SITES)
    if bad_sites or not sites:
        raise InputError(
            f"unknown sites {sorted(bad_sites)}",
            fix=f"use any of {MAP_SITES} (resid_out: the residual stream after the layer)",
        )
    if layers is None:
        return list(range(model.n_layers))
    return [model.check_layer(x) for x in layers]


def _states(
    model: Model, batches: list, task: TaskData | None, site: str, layer: int, pos: Position
) -> np.ndarray:
    return states_at(model, batches, model.hook_name(layer, site), task, pos)


# ---------------------------------------------------------------- hidden-state map
class HiddenMapResult(Result):
    """Single-position states in 2-D per site and layer.

    ``df``: ``site``, ``layer``, ``sample``, ``x``, ``y``, ``group`` (e.g. the anchor pair),
    ``marked`` (a held-out group or its mirror), ``mirror_ratio`` (of the row's map, NaN where
    there is none). ``summary``: ``method``, ``n_points``. Per map: :meth:`mirror_ratio`.
    """

    kind = "hidden_state_map"

    def mirror_ratio(self, site: str, layer: int) -> float | None:
        """Held-out-vs-mirror centroid distance over the mean distance between group centroids
        of the map at ``site`` and ``layer`` (None without held-out groups and mirrors)."""
        part = self.df[(self.df.site == site) & (self.df.layer == layer)]
        if part.empty:
            raise InputError(
                f"no map at site {site!r}, layer {layer}",
                fix=f"use sites {sorted(set(self.df.site))} and layers "
                f"{sorted(set(self.df.layer))}",
            )
        value = part.mirror_ratio.iloc[0]
        return None if pd.isna(value) else float(value)

    def _positions(self) -> Any:
        """Where the states were read (``meta["position"]`` in results saved before the key
        was ``positions``)."""
        return self.meta.get("positions", self.meta.get("position", "last"))

    def figure(self, site: str = "resid_out") -> go.Figure:
        part = self.df[self.df.site == site]
        layers = sorted(set(part.layer))
        cols = min(3, len(layers))
        rows = -(-len(layers) // cols)
        titles = []
        for ly in layers:
            ratio = self.mirror_ratio(site, ly)
            mirror = "" if ratio is None else figure_words(self.kind, "mirror", ratio=ratio)
            titles.append(figure_words(self.kind, "panel", site=site, layer=ly) + mirror)
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles)
        groups = list(dict.fromkeys(sorted(part.group.astype(str))))
        for i, ly in enumerate(layers):
            sub = part[part.layer == ly]
            for k, g in enumerate(groups):
                pts = sub[sub.group.astype(str) == g]
                trace = _group_trace(pts, g, k, len(groups), i == 0)
                fig.add_trace(trace, row=i // cols + 1, col=i % cols + 1)
        axis = "PCA" if self.summary.get("method") == "pca" else str(self.summary.get("method"))
        fig.update_xaxes(title_text=figure_words(self.kind, "x", axis=axis))
        fig.update_yaxes(title_text=figure_words(self.kind, "y", axis=axis))
        figures.base_layout(
            fig,
            figure_words(self.kind, positions=self._positions(), method=self.summary.get("method")),
            width=380 * cols + 80,
            height=340 * rows + 60,
        )
        return fig


def _group_trace(pts: pd.DataFrame, group: str, k: int, n_groups: int, legend: bool) -> go.Scatter:
    marked = bool(pts.marked.any())
    color = (
        figures.PALETTE[k % len(figures.PALETTE)]
        if n_groups <= len(figures.PALETTE)
        else f"hsl({int(360 * k / n_groups)},65%,50%)"
    )
    return go.Scatter(
        x=pts.x,
        y=pts.y,
        mode="markers",
        name=group,
        legendgroup=group,
        showlegend=legend,
        marker={
            "color": color,
            "symbol": "diamond" if marked else "circle",
            "size": 9 if marked else 5,
            "line": {"width": 1 if marked else 0, "color": "black"},
        },
    )


@torch.no_grad()
def hidden_state_map(
    model: Model,
    data: DataOrTask,
    *,
    positions: Position = "last",
    groups: Sequence[Any] | None = None,
    mirrors: Sequence[tuple[str, str]] | None = None,
    sites: Sequence[str] = ("resid_out",),
    layers: Sequence[int] | None = None,
    method: str = "pca",
    max_points: int | None = 2000,
    seed: int = 0,
    batch_size: int | None = None,
) -> HiddenMapResult:
    """Map the state at one position per input, after each layer (or sublayer output), to 2-D.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: task data (:class:`~probekit.data.TaskData`, or a list of them, concatenated),
            or token data with ``groups``.
        positions: where each input's state is read: 'last' (the last real token), an index,
            or a role of the task data marking one position per sequence. One position per
            input (one point per input), hence 'last' by default where the depth analyzers
            average over 'all' positions: there the task's answer is predicted.
        groups: one colour label per sequence (default: the task data's ``groups()``).
        mirrors: ``(held-out group, mirror)`` pairs to mark and measure (default: the task
            data's ``mirror_groups()``; none for token data).
        sites: any of 'resid_out' (the stream after the layer), 'attn_out', 'mlp_out'.
        layers: layers to map (default all).
        method: 'pca', 'tsne' or 'umap'.
        max_points: map at most this many inputs (a seeded random subset).
        seed: seeds that subset and t-SNE / UMAP.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
    """
    model = load(model)
    layers = _check(model, sites, layers)
    check_method(method)
    task, batches = batches_of(model, data, batch_size)
    n = sum(len(b.tokens) for b in batches)
    labels, mirrors, marked = _groups(task, groups, mirrors, n)
    keep = np.arange(n)
    if max_points is not None and n > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(n, max_points, replace=False))
    frames = []
    for site in sites:
        for layer in layers:
            states = _states(model, batches, task, site, layer, positions)[keep]
            xy, _ = reduce(states, method, seed)
            ratio = _mirror_ratio(states, labels[keep], mirrors)
            frame = {"site": site, "layer": layer, "sample": keep, "x": xy[:, 0], "y": xy[:, 1]}
            frame.update(group=labels[keep], marked=marked[keep])
            frame["mirror_ratio"] = np.nan if ratio is None else ratio
            frames.append(pd.DataFrame(frame))
    summary: dict[str, Any] = {"method": method, "n_points": len(keep)}
    meta = result_meta(model, positions=positions, batch_size=batch_size, sites=list(sites))
    meta.update(layers=layers, method=method)
    meta["marked"] = sorted({g for pair in mirrors for g in pair} | set(labels[marked]))
    return HiddenMapResult(pd.concat(frames, ignore_index=True), summary, meta)


def _groups(
    task: TaskData | None,
    groups: Sequence[Any] | None,
    mirrors: Sequence[tuple[str, str]] | None,
    n: int,
) -> tuple[np.ndarray, list[tuple[str, str]], np.ndarray]:
    """Group label per sequence, the mirror pairs present, and which sequences are marked."""
    own = groups is None and task is not None
    if groups is None:
        groups = task.groups() if task is not None else ["all"] * n
    labels = np.array([str(g) for g in groups])
    if len(labels) != n:
        raise InputError(
            f"{len(labels)} group labels for {n} sequences", fix="give one label per sequence"
        )
    if mirrors is None:
        mirrors = task.mirror_groups() if own else []
    present = set(labels)
    mirrors = [(str(a), str(b)) for a, b in mirrors if str(a) in present and str(b) in present]
    marked = np.isin(labels, [g for pair in mirrors for g in pair])
    if own:
        marked |= task.heldout().cpu().numpy().astype(bool)
    return labels, mirrors, marked


def _mirror_ratio(
    states: np.ndarray, groups: np.ndarray, mirrors: Sequence[tuple[str, str]]
) -> float | None:
    """Held-out-vs-mirror centroid distance over the mean distance between group centroids."""
    names = sorted(set(groups))
    pairs = list(dict.fromkeys(tuple(sorted(p)) for p in mirrors if p[0] != p[1]))
    if not pairs or len(names) < 3:
        return None
    cent = {g: states[groups == g].mean(0) for g in names}
    stack = np.stack([cent[g] for g in names])
    dist = np.sqrt(((stack[:, None] - stack[None]) ** 2).sum(-1))
    mean_all = dist[np.triu_indices(len(names), 1)].mean()
    ratios = [np.linalg.norm(cent[a] - cent[b]) / mean_all for a, b in pairs]
    return float(np.mean(ratios)) if mean_all > 0 else None


# ---------------------------------------------------------------- pair cosines
class PairCosineResult(Result):
    """Cosine between groups' (anchor pairs') states at equal answers, per layer.

    ``df``: ``site``, ``layer``, ``pair_i``, ``pair_j``, ``cosine``, ``n_targets`` (shared
    answer values). ``summary``: ``n_pairs``. ``meta``: ``answer`` (the name of the answer
    compared at) and ``groups_word`` (the groups in a short plural, for the title). Per layer:
    :meth:`matrix`, :meth:`mean_cosine` (over distinct pairs) and :meth:`most_similar`.
    """

    kind = "pair_cosines"

    def matrix(self, layer: int, site: str = "resid_out") -> pd.DataFrame:
        """Groups x groups table of cosines at one layer and site."""
        part = self._part(layer, site)
        order = list(dict.fromkeys(part.pair_i))
        return part.pivot(index="pair_i", columns="pair_j", values="cosine").loc[order, order]

    def mean_cosine(self, layer: int, site: str = "resid_out") -> float | None:
        """Mean cosine over distinct pairs (i < j) with shared answers (None if none)."""
        distinct = self._distinct(layer, site)
        return float(np.mean(distinct.cosine.to_list())) if len(distinct) else None

    def most_similar(self, layer: int, site: str = "resid_out") -> tuple[str, str, float] | None:
        """The most similar distinct pair ``(pair_i, pair_j, cosine)`` (None if none)."""
        distinct = self._distinct(layer, site)
        if distinct.empty:
            return None
        best = max(zip(distinct.cosine, distinct.pair_i, distinct.pair_j, strict=True))
        return best[1], best[2], float(best[0])

    def _part(self, layer: int, site: str) -> pd.DataFrame:
        part = self.df[(self.df.layer == layer) & (self.df.site == site)]
        if part.empty:
            raise InputError(
                f"no cosines at site {site!r}, layer {layer}",
                fix=f"use sites {sorted(set(self.df.site))} and layers "
                f"{sorted(set(self.df.layer))}",
            )
        return part

    def _distinct(self, layer: int, site: str) -> pd.DataFrame:
        part = self._part(layer, site)
        return part[(part.pair_i < part.pair_j) & np.isfinite(part.cosine)]

    def _title_words(self) -> dict[str, str]:
        """The task's words in the title: its groups and the answer compared at (``groups``
        and ``answer`` where a result saved before they were kept lacks them)."""
        return {
            "groups": str(self.meta.get("groups_word", "groups")),
            "answer": str(self.meta.get("answer", "reference")),
        }

    def figure(self, site: str = "resid_out") -> go.Figure:
        layers = sorted(set(self.df[self.df.site == site].layer))
        cols = min(2, len(layers))
        fig = make_subplots(
            rows=-(-len(layers) // cols),
            cols=cols,
            subplot_titles=[figure_words(self.kind, "panel", site=site, layer=ly) for ly in layers],
        )
        for i, ly in enumerate(layers):
            m = self.matrix(ly, site)
            fig.add_trace(
                go.Heatmap(
                    z=m.to_numpy(),
                    x=list(m.columns),
                    y=list(m.index),
                    zmin=-1,
                    zmax=1,
                    colorscale=figures.DIVERGING,
                    showscale=i == 0,
                    colorbar={"title": {"text": figure_words(self.kind, "colorbar")}},
                    hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
                ),
                row=i // cols + 1,
                col=i % cols + 1,
            )
            fig.update_yaxes(autorange="reversed", row=i // cols + 1, col=i % cols + 1)
        group = str(self.meta.get("group_label", "group"))  # the task's, e.g. "anchor pair"
        fig.update_xaxes(title_text=group)
        fig.update_yaxes(title_text=group, col=1)
        figures.base_layout(
            fig,
            figure_words(self.kind, site=site, **self._title_words()),
            width=430 * min(len(layers), 2) + 100,
            height=480 * -(-len(layers) // 2),
        )
        return fig


@torch.no_grad()
def pair_cosines(
    model: Model,
    data: DataOrTask,
    *,
    positions: Position = "last",
    sites: Sequence[str] = ("resid_out",),
    layers: Sequence[int] | None = None,
    answer: str | None = None,
    batch_size: int | None = None,
) -> PairCosineResult:
    """Cosine of states between groups (anchor pairs) on inputs with equal answers.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: task data with groups and named answers, or a list of them (e.g. seen and
            held-out pairs together).
        positions: where each input's state is read ('last', an index or a one-position role;
            one position per input, 'last' by default as in :func:`hidden_state_map`).
        sites: any of 'resid_out', 'attn_out', 'mlp_out'.
        layers: layers to compare at (default all).
        answer: the name of the task data's answer (one of its ``answers()``) whose equal
            values the groups are compared at; default the reference answer, the one the
            first of its ``categories()`` names (the anchor task: ``"inferential"``).
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
    """
    model = load(model)
    layers = _check(model, sites, layers)
    task, batches = batches_of(model, data, batch_size)
    if task is None:
        raise InputError(
            "pair cosines need anchor-task data or other task data (groups and named answers), "
            "not plain tokens",
            fix="pass task.dataset(split) or task.solution_data()",
        )
    answer = _answer_name(task, answer)
    labels = np.array(task.groups())
    answers = task.answers()[answer].cpu().numpy()
    pairs = sorted(set(labels))
    rows = []
    for site in sites:
        for layer in layers:
            states = _states(model, batches, task, site, layer, positions)
            means = {p: _means_by_answer(states[labels == p], answers[labels == p]) for p in pairs}
            for pair_i in pairs:
                for pair_j in pairs:
                    cos, shared = _pair_cosine(means[pair_i], means[pair_j], pair_i == pair_j)
                    rows.append(
                        {
                            "site": site,
                            "layer": layer,
                            "pair_i": pair_i,
                            "pair_j": pair_j,
                            "cosine": cos,
                            "n_targets": shared,
                        }  # fmt: skip
                    )
    meta = result_meta(model, positions=positions, batch_size=batch_size, sites=list(sites))
    meta["layers"] = layers
    meta.update(group_label=task.group_label, answer=answer)
    meta["groups_word"] = task.solution_wording().groups
    return PairCosineResult(pd.DataFrame(rows), {"n_pairs": len(pairs)}, meta)


def _answer_name(task: TaskData, answer: str | None) -> str:
    """The answer the groups are compared at: ``answer``, else the task's reference answer
    (the first of its categories); an InputError where the task data have no such answer."""
    named = task.answers()
    if answer is None:
        answer = next(iter(task.categories()), None)
        if answer not in named:
            raise InputError(
                f"the task data name no reference answer (first category {answer!r} is not "
                f"among their answers {sorted(named)})",
                fix="pass answer= one of the task data's answers()",
            )
    if answer not in named:
        raise InputError(
            f"the task data have no answer named {answer!r}",
            fix=f"pass answer= one of {sorted(named)}",
        )
    return answer


def _means_by_answer(states: np.ndarray, answers: np.ndarray) -> dict[int, np.ndarray]:
    frame = pd.DataFrame(states).groupby(answers).mean()
    return {int(t): frame.loc[t].to_numpy() for t in frame.index}


def _pair_cosine(
    a: dict[int, np.ndarray], b: dict[int, np.ndarray], same: bool
) -> tuple[float, int]:
    """Mean cosine of two groups' mean states over their shared answers, and how many."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return float("nan"), 0
    if same:
        return 1.0, len(shared)
    cos = [cosine_matrix(np.stack([a[t], b[t]]))[0, 1] for t in shared]
    return float(np.mean(cos)), len(shared)


__all__ = ["MAP_SITES", "HiddenMapResult", "PairCosineResult", "hidden_state_map", "pair_cosines"]
