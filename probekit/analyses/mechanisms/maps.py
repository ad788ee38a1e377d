"""Embedding and hidden-state maps, and cosine heatmaps of last-token states between pairs.

* :func:`embedding_map` lays the token embeddings out in 2-D (PCA, t-SNE or UMAP), coloured by
  token value. An inferential anchor model places the item tokens along arithmetic sequences;
  ``summary["neighbour_ratio"]`` (mean distance between consecutive tokens t, t+1 over the mean
  distance between all token pairs, in the full embedding space) is well below 1 then, about 1
  for a random embedding; ``order_corr`` is the largest |Spearman correlation| of token value
  with a map axis.
* :func:`hidden_state_map` does the same for the last-token state at every layer (and sublayer
  output), one point per input, coloured by anchor pair (or any group labels), with the
  held-out pairs and their mirrors marked. ``summary["mirror_ratio_<site>_<l>"]``: distance
  between the centroids of a held-out pair and its mirror over the mean distance between pair
  centroids (small = the model treats the two alike, as the symmetric solution does).
* :func:`pair_cosines` compares, per layer, the last-token states of two anchor pairs on inputs
  with *equal inferential targets* (e.g. (3,3) with key x and (2,2) with key x - 6: both want
  x - 4): for each target value the states are averaged over inputs, and the cosine between two
  pairs is averaged over the target values they share. Symmetric with ones on the diagonal.

Example:
    >>> embedding_map(model, tokens=range(20, 100)).figure().show()               # doctest: +SKIP
    >>> data = [task.dataset("test_data"), task.dataset("test_task")]              # doctest: +SKIP
    >>> hidden_state_map(model, data, task=task, method="umap").figure().show()  # doctest: +SKIP
    >>> pair_cosines(model, data).figure().show()                                 # doctest: +SKIP
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
from probekit.analyses.mechanisms.probes import gather
from probekit.analyses.weights.condensation import cosine_matrix
from probekit.data import task_data
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result

METHODS = ("pca", "tsne", "umap")
SITES = ("resid", "attn_out", "mlp_out")


# ---------------------------------------------------------------- helpers
def reduce(x: np.ndarray, method: str = "pca", seed: int = 0) -> tuple[np.ndarray, dict]:
    """2-D coordinates of the rows of ``x`` by PCA, t-SNE or UMAP, and method details.

    Example:
        >>> xy, info = reduce(np.random.default_rng(0).normal(size=(30, 5)))
        >>> xy.shape, round(sum(info["explained_variance"]), 2) <= 1.0
        ((30, 2), True)
    """
    if method not in METHODS:
        raise InputError(f"unknown map method {method!r}", fix=f"use one of {METHODS}")
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n < 4:
        raise InputError(f"{n} points are too few for a map", fix="pass at least 4 points")
    if method == "pca":
        from sklearn.decomposition import PCA

        pca = PCA(n_components=2, random_state=seed).fit(x)
        return pca.transform(x), {"explained_variance": pca.explained_variance_ratio_.tolist()}
    if method == "tsne":
        from sklearn.manifold import TSNE

        perplexity = float(min(30, max(2, (n - 1) // 3)))
        xy = TSNE(
            n_components=2, perplexity=perplexity, random_state=seed, init="pca"
        ).fit_transform(x)
        return xy, {"perplexity": perplexity}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import umap

        n_neighbors = int(min(15, n - 1))
        xy = umap.UMAP(n_components=2, n_neighbors=n_neighbors, random_state=seed).fit_transform(x)
    return np.asarray(xy), {"n_neighbors": n_neighbors}


def _is_anchor(data: Any) -> bool:
    return all(hasattr(data, a) for a in ("tokens", "targets", "composite", "positions", "pairs"))


def _concat(data: Any) -> Any:
    """One task data set from a list of them (e.g. seen-pair and held-out splits)."""
    return task_data(data) or data


def _pair_labels(pairs: torch.Tensor) -> list[str]:
    return [f"({a},{b})" for a, b in pairs.tolist()]


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _site_hook(model: Model, site: str, layer: int) -> str:
    """Hook of the state after ``layer`` (resid) or of its sublayer output."""
    if site == "resid":
        return model.hook_name(layer, "resid_out")
    return model.hook_name(layer, site)


def _check(model: Model, sites: Sequence[str], layers: Sequence[int] | None) -> list[int]:
    bad_sites = set(sites) - set(SITES)
    if bad_sites or not sites:
        raise InputError(f"unknown sites {sorted(bad_sites)}", fix=f"use any of {SITES}")
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    bad = [x for x in layers if not 0 <= x < model.n_layers]
    if bad:
        raise InputError(
            f"layers {bad} are outside the model's {model.n_layers} layers",
            fix=f"use layer indices in 0..{model.n_layers - 1}",
        )
    return layers


def _last_states(model: Model, batches: list, hook: str) -> np.ndarray:
    acts, valid = gather(model, batches, hook)
    last = valid.cumsum(-1).argmax(-1)
    return acts[np.arange(len(acts)), last]


# ---------------------------------------------------------------- embedding map
class EmbeddingMapResult(Result):
    """Token embeddings in 2-D. ``df``: ``token``, ``x``, ``y``. ``summary``: ``method``,
    ``neighbour_ratio``, ``order_corr``, and for PCA ``explained_variance_1/2``."""

    kind = "embedding_map"

    def figure(self) -> go.Figure:
        fig = go.Figure(
            go.Scatter(
                x=self.df.x,
                y=self.df.y,
                mode="markers+text",
                text=self.df.token.astype(str),
                textposition="top center",
                textfont={"size": 8},
                marker={
                    "color": self.df.token,
                    "colorscale": figures.SEQUENTIAL,
                    "size": 8,
                    "colorbar": {"title": {"text": "token"}},
                },
                hovertemplate="token %{text}<extra></extra>",
            )
        )
        s = self.summary
        return figures.base_layout(
            fig,
            f"Token embeddings ({s.get('method')}): neighbour ratio "
            f"{s.get('neighbour_ratio', float('nan')):.2f}, |rank corr| with an axis "
            f"{s.get('order_corr', float('nan')):.2f}",
            "map 1",
            "map 2",
        )


def embedding_map(
    model: Any,
    data: Any = None,
    *,
    tokens: Sequence[int] | None = None,
    method: str = "pca",
    seed: int = 0,
) -> EmbeddingMapResult:
    """Map token embeddings (W_E rows) to 2-D, coloured by token value.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: unused (weights only).
        tokens: token ids to map (default: all but 0; e.g. ``range(20, 100)`` for anchor items).
        method: 'pca', 'tsne' or 'umap'.

    Example:
        >>> embedding_map(model, tokens=range(20, 100), method="tsne")  # doctest: +SKIP
    """
    model = load(model)
    ids = np.arange(1, model.d_vocab) if tokens is None else np.asarray([int(t) for t in tokens])
    bad = ids[(ids < 0) | (ids >= model.d_vocab)]
    if bad.size:
        raise InputError(
            f"token ids {bad[:5].tolist()} are outside the vocabulary [0, {model.d_vocab})",
            fix="pass token ids of this model's vocabulary",
        )
    emb = model.bridge.W_E.detach().to("cpu", torch.float64).numpy()[ids]
    xy, info = reduce(emb, method, seed)
    df = pd.DataFrame({"token": ids, "x": xy[:, 0], "y": xy[:, 1]})
    summary: dict[str, Any] = {"method": method, "n_tokens": len(ids)}
    summary["neighbour_ratio"] = neighbour_ratio(emb, ids)
    summary["order_corr"] = max(abs(_spearman(ids, xy[:, k])) for k in (0, 1))
    for k, v in enumerate(info.get("explained_variance", []), start=1):
        summary[f"explained_variance_{k}"] = float(v)
    return EmbeddingMapResult(df, summary, {"method": method, "seed": seed, **info})


def neighbour_ratio(emb: np.ndarray, ids: np.ndarray) -> float:
    """Mean distance of consecutive tokens (t, t+1 both in ``ids``) over the mean distance of
    all pairs: about 1 for unordered embeddings, small for a token line.

    Example:
        >>> line = np.arange(10.0)[:, None] * np.ones((1, 3))
        >>> round(neighbour_ratio(line, np.arange(10)), 3)
        0.273
    """
    pos = {int(t): i for i, t in enumerate(ids)}
    steps = [(pos[t], pos[t + 1]) for t in pos if t + 1 in pos]
    if not steps or len(ids) < 3:
        return float("nan")
    a, b = np.array(steps).T
    near = np.linalg.norm(emb[a] - emb[b], axis=1).mean()
    diff = emb[:, None] - emb[None]
    dist = np.sqrt((diff**2).sum(-1))
    mean_all = dist[np.triu_indices(len(ids), 1)].mean()
    return float(near / mean_all) if mean_all > 0 else float("nan")


# ---------------------------------------------------------------- hidden-state map
class HiddenMapResult(Result):
    """Last-token states in 2-D per site and layer.

    ``df``: ``site``, ``layer``, ``sample``, ``x``, ``y``, ``group`` (anchor pair or label),
    ``marked`` (held-out pair or its mirror). ``summary``: ``mirror_ratio_<site>_<layer>`` per
    map (anchor data with marked pairs), ``method``.
    """

    kind = "hidden_state_map"

    def figure(self, site: str = "resid") -> go.Figure:
        part = self.df[self.df.site == site]
        layers = sorted(set(part.layer))
        cols = min(3, len(layers))
        rows = -(-len(layers) // cols)
        fig = make_subplots(
            rows=rows,
            cols=cols,
            subplot_titles=[
                f"{site} after layer {ly}"
                + (
                    f" (mirror ratio {self.summary[f'mirror_ratio_{site}_{ly}']:.2f})"
                    if self.summary.get(f"mirror_ratio_{site}_{ly}") is not None
                    else ""
                )
                for ly in layers
            ],
        )
        groups = list(dict.fromkeys(sorted(part.group.astype(str))))
        for i, ly in enumerate(layers):
            sub = part[part.layer == ly]
            for k, g in enumerate(groups):
                pts = sub[sub.group.astype(str) == g]
                marked = bool(pts.marked.any())
                fig.add_trace(
                    go.Scatter(
                        x=pts.x,
                        y=pts.y,
                        mode="markers",
                        name=g,
                        legendgroup=g,
                        showlegend=i == 0,
                        marker={
                            "color": figures.PALETTE[k % len(figures.PALETTE)]
                            if len(groups) <= len(figures.PALETTE)
                            else f"hsl({int(360 * k / len(groups))},65%,50%)",
                            "symbol": "diamond" if marked else "circle",
                            "size": 9 if marked else 5,
                            "line": {"width": 1 if marked else 0, "color": "black"},
                        },
                    ),
                    row=i // cols + 1,
                    col=i % cols + 1,
                )
        figures.base_layout(
            fig,
            f"Last-token states ({self.summary.get('method')}), coloured by group; "
            "diamonds: held-out pairs and their mirrors",
        )
        fig.update_layout(height=360 * rows + 80, width=420 * cols + 150)
        return fig


def hidden_state_map(
    model: Any,
    data: Any,
    *,
    groups: Sequence[Any] | None = None,
    task: Any = None,
    sites: Sequence[str] = ("resid",),
    layers: Sequence[int] | None = None,
    method: str = "pca",
    max_points: int | None = 2000,
    seed: int = 0,
    batch_size: int | None = 512,
) -> HiddenMapResult:
    """Map the last-token state after each layer (or sublayer output) to 2-D.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: AnchorData, a list of them (concatenated), or token data with ``groups``.
        groups: one colour label per sequence (default for anchor data: the pair).
        task: the AnchorTask; its held-out pairs and their mirrors are marked (default: pairs
            (4,3) and (3,4) when present).
        sites: any of 'resid' (the stream after the layer), 'attn_out', 'mlp_out'.
        layers: layers to map (default all).
        method: 'pca', 'tsne' or 'umap'.
        max_points: map at most this many inputs (a seeded random subset).

    Example:
        >>> hidden_state_map(model, task.dataset("test_data"), method="tsne")  # doctest: +SKIP
    """
    model = load(model)
    layers = _check(model, sites, layers)
    if method not in METHODS:
        raise InputError(f"unknown map method {method!r}", fix=f"use one of {METHODS}")
    data = _concat(data)
    anchor = _is_anchor(data)
    tokens = data.tokens if anchor else data
    batches = model.prepare(tokens, batch_size)
    n = sum(len(b.tokens) for b in batches)
    if groups is None:
        if not anchor:
            groups = ["all"] * n
        else:
            groups = _pair_labels(data.pairs)
    groups = [str(g) for g in groups]
    if len(groups) != n:
        raise InputError(
            f"{len(groups)} group labels for {n} sequences", fix="give one label per sequence"
        )
    marked_pairs = _marked_pairs(task, groups)
    marked = np.array([g in marked_pairs for g in groups])
    keep = np.arange(n)
    if max_points is not None and n > max_points:
        keep = np.sort(np.random.default_rng(seed).choice(n, max_points, replace=False))
    frames = []
    summary: dict[str, Any] = {"method": method, "n_points": len(keep)}
    g_arr = np.array(groups)[keep]
    for site in sites:
        for layer in layers:
            states = _last_states(model, batches, _site_hook(model, site, layer))[keep]
            xy, _ = reduce(states, method, seed)
            frames.append(
                pd.DataFrame(
                    {
                        "site": site,
                        "layer": layer,
                        "sample": keep,
                        "x": xy[:, 0],
                        "y": xy[:, 1],
                        "group": g_arr,
                        "marked": marked[keep],
                    }
                )
            )
            summary[f"mirror_ratio_{site}_{layer}"] = _mirror_ratio(states, g_arr, marked_pairs)
    meta = {
        "sites": list(sites),
        "layers": layers,
        "method": method,
        "marked": sorted(marked_pairs),
    }
    return HiddenMapResult(pd.concat(frames, ignore_index=True), summary, meta)


def _marked_pairs(task: Any, groups: Sequence[str]) -> set[str]:
    held = [tuple(p) for p in task.heldout_pairs] if task is not None else [(4, 3)]
    out = set()
    for a, b in held:
        for p in (f"({a},{b})", f"({b},{a})"):
            if p in set(groups):
                out.add(p)
    return out


def _mirror_ratio(states: np.ndarray, groups: np.ndarray, marked: set[str]) -> float | None:
    """Held-out-vs-mirror centroid distance over the mean distance between group centroids."""
    names = sorted(set(groups))
    if len(marked) < 2 or len(names) < 3:
        return None
    cent = {g: states[groups == g].mean(0) for g in names}
    stack = np.stack([cent[g] for g in names])
    dist = np.sqrt(((stack[:, None] - stack[None]) ** 2).sum(-1))
    mean_all = dist[np.triu_indices(len(names), 1)].mean()
    pairs = sorted(marked)
    ratios = []
    for p in pairs:
        a, b = p.strip("()").split(",")
        mirror = f"({b},{a})"
        if mirror in cent and mirror != p and p < mirror:
            ratios.append(np.linalg.norm(cent[p] - cent[mirror]) / mean_all)
    return float(np.mean(ratios)) if ratios and mean_all > 0 else None


# ---------------------------------------------------------------- pair cosines
class PairCosineResult(Result):
    """Cosine between anchor pairs' last-token states at equal inferential targets, per layer.

    ``df``: ``site``, ``layer``, ``pair_i``, ``pair_j``, ``cosine``, ``n_targets`` (shared
    target values), ``same_shift`` (the two pairs have the same composite shift).
    ``summary``: per layer ``mean_cos_<site>_<l>`` over distinct pairs and the pairs'
    ``most_similar_<site>_<l>``.
    """

    kind = "pair_cosines"

    def matrix(self, layer: int, site: str = "resid") -> pd.DataFrame:
        part = self.df[(self.df.layer == layer) & (self.df.site == site)]
        order = list(dict.fromkeys(part.pair_i))
        return part.pivot(index="pair_i", columns="pair_j", values="cosine").loc[order, order]

    def figure(self, site: str = "resid") -> go.Figure:
        layers = sorted(set(self.df[self.df.site == site].layer))
        fig = make_subplots(
            rows=1, cols=len(layers), subplot_titles=[f"after layer {ly}" for ly in layers]
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
                    colorbar={"title": {"text": "cosine"}},
                    hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
                ),
                row=1,
                col=i + 1,
            )
            fig.update_yaxes(autorange="reversed", row=1, col=i + 1)
        figures.base_layout(
            fig, f"Cosine of last-token states ({site}) between pairs at equal inferential targets"
        )
        fig.update_layout(height=480, width=430 * len(layers) + 100)
        return fig


def pair_cosines(
    model: Any,
    data: Any,
    *,
    sites: Sequence[str] = ("resid",),
    layers: Sequence[int] | None = None,
    batch_size: int | None = 512,
) -> PairCosineResult:
    """Cosine of last-token states between anchor pairs on inputs with equal composite targets.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: AnchorData or a list of them (e.g. seen and held-out pairs together).
        sites: any of 'resid', 'attn_out', 'mlp_out'.
        layers: layers to compare at (default all).

    Example:
        >>> both = [task.dataset("test_data"), task.dataset("test_task")]  # doctest: +SKIP
        >>> pair_cosines(model, both).matrix(1).loc["(4,3)", "(3,4)"]     # doctest: +SKIP
    """
    model = load(model)
    layers = _check(model, sites, layers)
    data = _concat(data)
    if not _is_anchor(data):
        raise InputError("pair cosines need anchor-task data", fix="pass task.dataset(split)")
    batches = model.prepare(data.tokens, batch_size)
    labels = np.array(_pair_labels(data.pairs))
    targets = data.composite.numpy()
    keys = data.keys.numpy()
    pairs = sorted(set(labels), key=lambda p: tuple(int(v) for v in p.strip("()").split(",")))
    shift = {p: int(targets[labels == p][0] - keys[labels == p][0]) for p in pairs}
    rows = []
    summary: dict[str, Any] = {}
    for site in sites:
        for layer in layers:
            states = _last_states(model, batches, _site_hook(model, site, layer))
            means: dict[str, dict[int, np.ndarray]] = {}
            for p in pairs:
                sel = labels == p
                frame = pd.DataFrame(states[sel]).groupby(targets[sel]).mean()
                means[p] = {int(t): frame.loc[t].to_numpy() for t in frame.index}
            distinct = []
            for pi in pairs:
                for pj in pairs:
                    shared = sorted(set(means[pi]) & set(means[pj]))
                    if shared:
                        a = np.stack([means[pi][t] for t in shared])
                        b = np.stack([means[pj][t] for t in shared])
                        cos = float(
                            np.mean(
                                [
                                    cosine_matrix(np.stack([x, y]))[0, 1]
                                    for x, y in zip(a, b, strict=True)
                                ]
                            )
                        )
                    else:
                        cos = float("nan")
                    if pi == pj:
                        cos = 1.0 if shared else float("nan")
                    rows.append(
                        {
                            "site": site,
                            "layer": layer,
                            "pair_i": pi,
                            "pair_j": pj,
                            "cosine": cos,
                            "n_targets": len(shared),
                            "same_shift": shift[pi] == shift[pj],
                        }
                    )
                    if pi < pj and np.isfinite(cos):
                        distinct.append((cos, pi, pj))
            if distinct:
                summary[f"mean_cos_{site}_{layer}"] = float(np.mean([c for c, _, _ in distinct]))
                best = max(distinct)
                summary[f"most_similar_{site}_{layer}"] = f"{best[1]}~{best[2]} ({best[0]:.3f})"
    meta = {"sites": list(sites), "layers": layers}
    return PairCosineResult(pd.DataFrame(rows), summary, meta)


__all__ = [
    "METHODS",
    "EmbeddingMapResult",
    "HiddenMapResult",
    "PairCosineResult",
    "embedding_map",
    "hidden_state_map",
    "neighbour_ratio",
    "pair_cosines",
    "reduce",
]
