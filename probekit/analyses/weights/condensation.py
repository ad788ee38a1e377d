"""Condensation and complexity of the weights: neuron cosine groups, spectra, stable rank.

*Condensation* (small-initialization training): the input weights of many neurons line up, so the
cosine-similarity matrix between neurons' input weight vectors shows blocks. For every layer and
every matrix among W_Q, W_K, W_V and the MLP input W_in, :func:`condensation` computes that matrix
with the neurons reordered by average-linkage clustering, groups neurons whose clusters stay
above ``threshold`` (default 0.7), and reports the number of groups, the share of the largest
group and a *condensation score* in [0, 1]: the fraction of neuron pairs whose cosine is at least
``threshold`` (about 0 for random weights, 1 when every neuron points the same way).

A neuron of W_Q is one output unit of the query projection (``n_heads * d_head`` of them per
layer, each with a ``d_model`` input weight vector); of W_in one MLP hidden unit. Biases are not
part of the vectors.

:func:`spectra` gives the singular values and the stable rank ``sum_i (s_i / s_max)^2`` of every
weight matrix (per layer W_Q, W_K, W_V, W_O, W_in, W_gate, W_out; then W_E and W_U) and the
eigenvalues of the token-embedding covariance. :func:`condensation_timeline` runs both over a
series of checkpoints of one run.

Weights are read through the bridge's stacked TransformerLens-style parameters
(:func:`weight_matrices`), so nothing here knows an architecture.

Example:
    >>> res = condensation(model)                              # doctest: +SKIP
    >>> res.summary["score_W_in_0"], res.summary["groups_W_in_0"]  # doctest: +SKIP
    (0.41, 3)
    >>> spectra(model).summary["stable_rank_W_E"]              # doctest: +SKIP
    2.7
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
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result

NEURON_MATRICES = ("W_Q", "W_K", "W_V", "W_in")
"""The matrices whose neurons' input weights :func:`condensation` compares."""

ALL_MATRICES = ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out")
"""Per-layer matrices of :func:`spectra` (W_gate only in gated MLPs); W_E and W_U come after."""


# ---------------------------------------------------------------- weights (model-handle helper)
def weight_matrices(model: Any, names: Sequence[str] = ALL_MATRICES) -> dict[tuple[int, str], Any]:
    """Every per-layer weight as a 2-D tensor ``[d_in, n_out]`` (columns = neurons).

    Reads the bridge's stacked TransformerLens weights: W_Q/W_K/W_V ``[L, heads, d_model, d_head]``
    become ``[d_model, heads * d_head]`` (grouped K/V keep their own number of heads), W_O
    ``[L, heads, d_head, d_model]`` becomes ``[heads * d_head, d_model]``, W_in/W_gate
    ``[d_model, d_mlp]`` and W_out ``[d_mlp, d_model]`` stay as they are. Names a model lacks
    (W_gate in a non-gated MLP) are left out. Returns float64 CPU tensors keyed ``(layer, name)``.

    This belongs on the model handle (``Model.weight_matrices()``); it lives here until it moves.

    Example:
        >>> w = weight_matrices(model, ["W_in"])      # doctest: +SKIP
        >>> w[(0, "W_in")].shape                      # doctest: +SKIP
        torch.Size([32, 128])
    """
    model = load(model)
    unknown = set(names) - set(ALL_MATRICES)
    if unknown:
        raise InputError(f"unknown weight matrices {sorted(unknown)}", fix=f"use {ALL_MATRICES}")
    out: dict[tuple[int, str], Any] = {}
    with torch.no_grad():
        for name in names:
            try:
                stacked = getattr(model.bridge, name)
            except AttributeError:
                continue
            if stacked is None:
                continue
            stacked = stacked.detach().to("cpu", torch.float64)
            for layer in range(stacked.shape[0]):
                w = stacked[layer]
                if name in ("W_Q", "W_K", "W_V"):  # [heads, d_model, d_head]
                    w = w.permute(1, 0, 2).reshape(w.shape[1], -1)
                elif name == "W_O":  # [heads, d_head, d_model]
                    w = w.reshape(-1, w.shape[-1])
                out[(layer, name)] = w
    return out


def _embedding(model: Model) -> torch.Tensor:
    return model.bridge.W_E.detach().to("cpu", torch.float64)


def _unembedding(model: Model) -> torch.Tensor:
    return model.bridge.W_U.detach().to("cpu", torch.float64)


# ---------------------------------------------------------------- maths
def cosine_matrix(vectors: Any) -> np.ndarray:
    """Cosine similarity between the rows of ``vectors`` ``[n, d]`` (zero rows give 0).

    Example:
        >>> cosine_matrix(np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])).round(3).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    v = np.asarray(vectors.numpy() if isinstance(vectors, torch.Tensor) else vectors, dtype=float)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    unit = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    cos = np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(cos, np.where(norms[:, 0] > 0, 1.0, 0.0))
    return cos


def stable_rank(matrix: Any) -> float:
    """``sum_i (s_i / s_max)^2`` over the singular values ``s_i`` (0 for a zero matrix).

    Example:
        >>> stable_rank(np.outer([1.0, 2.0, 3.0], [1.0, -1.0]))
        1.0
    """
    s = singular_values(matrix)
    return float(((s / s[0]) ** 2).sum()) if s.size and s[0] > 0 else 0.0


def singular_values(matrix: Any) -> np.ndarray:
    """Singular values of a 2-D matrix, largest first."""
    m = np.asarray(matrix.numpy() if isinstance(matrix, torch.Tensor) else matrix, dtype=float)
    if m.ndim != 2:
        raise InputError(f"a matrix of shape {m.shape} is not 2-D", fix="pass a 2-D matrix")
    return np.linalg.svd(m, compute_uv=False)


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
    ``summary``: per ``<matrix>_<layer>`` the ``groups_``, ``largest_share_``, ``score_`` and
    ``mean_abs_cos_``; ``threshold``; ``mean_score`` over all matrices.
    """

    kind = "condensation"

    def matrix(self, layer: int, name: str) -> np.ndarray:
        """The reordered cosine matrix of one (layer, matrix)."""
        part = self.df[(self.df.layer == layer) & (self.df.matrix == name)]
        n = int(part.i.max()) + 1
        out = np.full((n, n), np.nan)
        out[part.i.to_numpy(), part.j.to_numpy()] = part.cosine.to_numpy()
        return out

    def figure(self, layer: int | None = None) -> go.Figure:
        """Reordered cosine matrices, one panel per (layer, matrix); ``layer`` picks one layer."""
        keys = self.df[["layer", "matrix"]].drop_duplicates()
        if layer is not None:
            keys = keys[keys.layer == layer]
        keys = list(keys.itertuples(index=False, name=None))
        names = list(dict.fromkeys(m for _, m in keys))
        layers = sorted({ly for ly, _ in keys})
        titles = []
        for ly in layers:
            for name in names:
                key = f"{name}_{ly}"
                titles.append(
                    f"L{ly} {name}: {self.summary.get('groups_' + key, '?')} groups, "
                    f"score {self.summary.get('score_' + key, float('nan')):.2f}"
                )
        fig = make_subplots(
            rows=len(layers), cols=len(names), subplot_titles=titles, horizontal_spacing=0.04
        )
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
                        colorbar={"title": {"text": "cosine"}},
                        hovertemplate="%{y} vs %{x}: %{z:.3f}<extra></extra>",
                    ),
                    row=r + 1,
                    col=c + 1,
                )
                fig.update_yaxes(autorange="reversed", showticklabels=False, row=r + 1, col=c + 1)
                fig.update_xaxes(showticklabels=False, row=r + 1, col=c + 1)
        figures.base_layout(
            fig,
            f"Condensation: cosine between neurons' input weights (clustered, threshold "
            f"{self.summary.get('threshold', 0.7)})",
        )
        fig.update_layout(height=max(320, 260 * len(layers)), width=max(500, 260 * len(names)))
        return fig


def _condensation_rows(
    matrices: dict[tuple[int, str], Any], threshold: float
) -> tuple[list[pd.DataFrame], dict[str, Any]]:
    frames, summary = [], {}
    for (layer, name), w in matrices.items():
        cos = cosine_matrix(w.T)  # rows = neurons' input weight vectors
        order, labels = cluster_order(cos, threshold)
        n = cos.shape[0]
        ii, jj = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        ordered = cos[np.ix_(order, order)]
        frames.append(
            pd.DataFrame(
                {
                    "layer": layer,
                    "matrix": name,
                    "i": ii.ravel(),
                    "j": jj.ravel(),
                    "neuron_i": order[ii.ravel()],
                    "neuron_j": order[jj.ravel()],
                    "cosine": ordered.ravel(),
                    "group_i": labels[order][ii.ravel()],
                    "group_j": labels[order][jj.ravel()],
                }
            )
        )
        off = ~np.eye(n, dtype=bool)
        key = f"{name}_{layer}"
        summary[f"groups_{key}"] = int(labels.max()) + 1
        summary[f"largest_share_{key}"] = float(np.bincount(labels).max() / n)
        summary[f"score_{key}"] = float((cos[off] >= threshold).mean()) if n > 1 else 1.0
        summary[f"mean_abs_cos_{key}"] = float(np.abs(cos[off]).mean()) if n > 1 else 1.0
    return frames, summary


def condensation(
    model: Any,
    data: Any = None,
    *,
    matrices: Sequence[str] = NEURON_MATRICES,
    layers: Sequence[int] | None = None,
    threshold: float = 0.7,
) -> CondensationResult:
    """Cosine similarity between neurons' input weights, clustered into groups.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: unused (weights only); accepted so every analyzer has the same call shape.
        matrices: any of W_Q, W_K, W_V, W_in (neurons = output units; input vectors compared).
        layers: layer indices to analyse (default all).
        threshold: cosine at which neurons count as one group (default 0.7).

    Example:
        >>> res = condensation(model, threshold=0.7)   # doctest: +SKIP
        >>> res.figure(layer=0).show()                  # doctest: +SKIP
    """
    model = load(model)
    threshold = _check_threshold(threshold)
    unknown = set(matrices) - set(NEURON_MATRICES)
    if unknown:
        raise InputError(
            f"unknown neuron matrices {sorted(unknown)}", fix=f"use any of {NEURON_MATRICES}"
        )
    layers = _check_layers(model, layers)
    weights = {
        k: v for k, v in weight_matrices(model, list(matrices)).items() if k[0] in set(layers)
    }
    if not weights:
        raise InputError(
            f"the model exposes none of {list(matrices)}", fix=f"use any of {NEURON_MATRICES}"
        )
    frames, summary = _condensation_rows(dict(sorted(weights.items())), threshold)
    scores = [v for k, v in summary.items() if k.startswith("score_")]
    summary = {"threshold": threshold, "mean_score": float(np.mean(scores)), **summary}
    meta = {"matrices": list(matrices), "layers": list(layers), "model": repr(model)}
    return CondensationResult(pd.concat(frames, ignore_index=True), summary, meta)


def _check_layers(model: Model, layers: Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(model.n_layers))
    layers = [int(x) for x in layers]
    bad = [x for x in layers if not 0 <= x < model.n_layers]
    if bad:
        raise InputError(
            f"layers {bad} are outside the model's {model.n_layers} layers",
            fix=f"use layer indices in 0..{model.n_layers - 1}",
        )
    return layers


# ---------------------------------------------------------------- spectra
class SpectraResult(Result):
    """Singular values of every weight matrix and eigenvalues of the embedding covariance.

    ``df`` columns: ``layer`` (-1 for W_E / W_U / the embedding covariance), ``matrix``,
    ``index`` (0 = largest), ``value`` (singular value, or eigenvalue for ``emb_cov``),
    ``normalized`` (value / largest). ``summary``: ``stable_rank_<matrix>_<layer>``,
    ``stable_rank_W_E``, ``stable_rank_W_U``, ``emb_cov_top_share`` (largest eigenvalue over
    the trace) and ``emb_cov_effective_rank`` (participation ratio (sum e)^2 / sum e^2).
    """

    kind = "spectra"

    def stable_ranks(self) -> pd.DataFrame:
        """One row per matrix: layer, matrix, stable rank (from the singular values in df)."""
        sv = self.df[self.df.matrix != "emb_cov"]
        rows = [
            {"layer": ly, "matrix": m, "stable_rank": float((part.normalized**2).sum())}
            for (ly, m), part in sv.groupby(["layer", "matrix"], sort=False)
        ]
        return pd.DataFrame(rows)

    def figure(self) -> go.Figure:
        fig = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=(
                "normalized singular values",
                "stable rank per layer",
                "token-embedding covariance eigenvalues",
            ),
        )
        sv = self.df[self.df.matrix != "emb_cov"]
        for i, ((ly, m), part) in enumerate(sv.groupby(["layer", "matrix"], sort=False)):
            label = m if ly < 0 else f"{m} L{ly}"
            fig.add_trace(
                go.Scatter(
                    x=part["index"],
                    y=part["normalized"],
                    mode="lines",
                    name=label,
                    legendgroup=m,
                    line={
                        "color": figures.PALETTE[
                            list(ALL_MATRICES + ("W_E", "W_U")).index(m) % len(figures.PALETTE)
                        ]
                    },
                    opacity=0.5 + 0.5 * (i % 2),
                ),
                row=1,
                col=1,
            )
        ranks = self.stable_ranks()
        per_layer = ranks[ranks.layer >= 0]
        for k, (m, part) in enumerate(per_layer.groupby("matrix", sort=False)):
            fig.add_trace(
                go.Scatter(
                    x=part.layer,
                    y=part.stable_rank,
                    mode="lines+markers",
                    name=f"{m} stable rank",
                    line={"color": figures.PALETTE[k % len(figures.PALETTE)]},
                ),
                row=1,
                col=2,
            )
        cov = self.df[self.df.matrix == "emb_cov"]
        fig.add_trace(
            go.Bar(
                x=cov["index"], y=cov["value"], name="emb cov eigenvalue", marker_color="#264653"
            ),
            row=1,
            col=3,
        )
        fig.update_yaxes(type="log", row=1, col=1)
        fig.update_yaxes(type="log", row=1, col=3)
        fig.update_xaxes(title_text="index", row=1, col=1)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=2)
        fig.update_xaxes(title_text="eigenvalue index", row=1, col=3)
        figures.base_layout(
            fig,
            f"Spectra: stable rank of W_E {self.summary.get('stable_rank_W_E', float('nan')):.2f}"
            f", embedding covariance top share "
            f"{self.summary.get('emb_cov_top_share', float('nan')):.2f}",
        )
        fig.update_layout(height=420, width=1250)
        return fig


def spectra(
    model: Any,
    data: Any = None,
    *,
    tokens: Sequence[int] | None = None,
) -> SpectraResult:
    """Singular values and stable rank of every weight, eigenvalues of the embedding covariance.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: unused (weights only).
        tokens: token ids whose embeddings enter the covariance (default: the whole vocabulary;
            for an anchor task pass e.g. ``range(20, 100)``).

    Example:
        >>> spectra(model, tokens=range(20, 100)).stable_ranks()  # doctest: +SKIP
    """
    model = load(model)
    mats: dict[tuple[int, str], Any] = dict(weight_matrices(model))
    mats[(-1, "W_E")] = _embedding(model)
    mats[(-1, "W_U")] = _unembedding(model)
    frames, summary = [], {}
    for (layer, name), w in mats.items():
        s = singular_values(w)
        norm = s / s[0] if s[0] > 0 else np.zeros_like(s)
        frames.append(
            pd.DataFrame(
                {
                    "layer": layer,
                    "matrix": name,
                    "index": np.arange(s.size),
                    "value": s,
                    "normalized": norm,
                }
            )
        )
        key = name if layer < 0 else f"{name}_{layer}"
        summary[f"stable_rank_{key}"] = float((norm**2).sum())
    emb = _embedding(model)
    ids = _token_ids(model, tokens)
    eig = embedding_covariance_eigenvalues(emb[ids])
    frames.append(
        pd.DataFrame(
            {
                "layer": -1,
                "matrix": "emb_cov",
                "index": np.arange(eig.size),
                "value": eig,
                "normalized": eig / eig[0] if eig[0] > 0 else np.zeros_like(eig),
            }
        )
    )
    total = float(eig.sum())
    summary["emb_cov_top_share"] = float(eig[0] / total) if total > 0 else float("nan")
    summary["emb_cov_effective_rank"] = (
        float(total**2 / (eig**2).sum()) if total > 0 else float("nan")
    )
    meta = {"tokens": None if tokens is None else [int(t) for t in ids], "model": repr(model)}
    return SpectraResult(pd.concat(frames, ignore_index=True), summary, meta)


def embedding_covariance_eigenvalues(embeddings: Any) -> np.ndarray:
    """Eigenvalues (largest first, >= 0) of the covariance of embedding rows ``[n, d]``."""
    e = np.asarray(
        embeddings.numpy() if isinstance(embeddings, torch.Tensor) else embeddings, dtype=float
    )
    if e.shape[0] < 2:
        raise InputError(
            f"{e.shape[0]} token(s) cannot give a covariance", fix="pass at least two token ids"
        )
    cov = np.cov(e, rowvar=False)
    return np.clip(np.sort(np.linalg.eigvalsh(cov))[::-1], 0.0, None)


def _token_ids(model: Model, tokens: Sequence[int] | None) -> np.ndarray:
    if tokens is None:
        return np.arange(model.d_vocab)
    ids = np.asarray([int(t) for t in tokens])
    bad = ids[(ids < 0) | (ids >= model.d_vocab)]
    if bad.size:
        raise InputError(
            f"token ids {bad[:5].tolist()} are outside the vocabulary [0, {model.d_vocab})",
            fix="pass token ids of this model's vocabulary",
        )
    return ids


# ---------------------------------------------------------------- timeline
class TimelineResult(Result):
    """Condensation and stable-rank headline numbers over a series of checkpoints.

    ``df`` columns: ``step`` (the label given per checkpoint), ``quantity`` (e.g.
    ``score``, ``groups``, ``stable_rank``), ``matrix``, ``layer``, ``value``. ``summary``:
    ``n_checkpoints``, ``onset_step`` (first step whose mean condensation score reaches
    ``onset_score``, or None) and the first and last mean scores.
    """

    kind = "condensation_timeline"

    def figure(self) -> go.Figure:
        fig = make_subplots(
            rows=1, cols=3, subplot_titles=("condensation score", "groups", "stable rank")
        )
        for col, quantity in enumerate(("score", "groups", "stable_rank"), start=1):
            part = self.df[self.df.quantity == quantity]
            for k, ((m, ly), sub) in enumerate(part.groupby(["matrix", "layer"], sort=False)):
                fig.add_trace(
                    go.Scatter(
                        x=sub.step,
                        y=sub.value,
                        mode="lines+markers",
                        name=f"{m} L{ly}" if ly >= 0 else m,
                        legendgroup=quantity,
                        showlegend=col != 2,
                        line={"color": figures.PALETTE[k % len(figures.PALETTE)]},
                    ),
                    row=1,
                    col=col,
                )
            fig.update_xaxes(title_text="checkpoint step", row=1, col=col)
        onset = self.summary.get("onset_step")
        figures.base_layout(fig, f"Condensation over training (onset step: {onset})")
        fig.update_layout(height=420, width=1250)
        return fig


def condensation_timeline(
    checkpoints: Sequence[Any],
    steps: Sequence[float] | None = None,
    *,
    threshold: float = 0.7,
    onset_score: float = 0.2,
    matrices: Sequence[str] = NEURON_MATRICES,
) -> TimelineResult:
    """Condensation score, groups and stable ranks of each checkpoint of one run.

    Args:
        checkpoints: model sources in training order (directories, HF models, handles).
        steps: the step of each checkpoint (default 0, 1, 2, ...).
        threshold: grouping threshold of :func:`condensation`.
        onset_score: mean condensation score that marks the onset of condensation.
        matrices: neuron matrices of :func:`condensation`.

    Example:
        >>> paths = ["runs/a/step100", "runs/a/step500", "runs/a/step2000"]  # doctest: +SKIP
        >>> condensation_timeline(paths, steps=[100, 500, 2000]).figure()    # doctest: +SKIP
    """
    checkpoints = list(checkpoints)
    if not checkpoints:
        raise InputError("no checkpoints given", fix="pass a list of checkpoint directories")
    steps = list(range(len(checkpoints))) if steps is None else [float(s) for s in steps]
    if len(steps) != len(checkpoints):
        raise InputError(
            f"{len(steps)} steps for {len(checkpoints)} checkpoints",
            fix="give one step per checkpoint",
        )
    rows: list[dict[str, Any]] = []
    means = []
    for step, source in zip(steps, checkpoints, strict=True):
        model = load(source)
        cond = condensation(model, matrices=matrices, threshold=threshold)
        means.append(cond.summary["mean_score"])
        for key, value in cond.summary.items():
            for quantity in ("score", "groups", "largest_share"):
                prefix = f"{quantity}_"
                if key.startswith(prefix):
                    name, layer = key[len(prefix) :].rsplit("_", 1)
                    rows.append(
                        {
                            "step": step,
                            "quantity": quantity,
                            "matrix": name,
                            "layer": int(layer),
                            "value": float(value),
                        }
                    )
        for name, w in weight_matrices(model).items():
            rows.append(
                {
                    "step": step,
                    "quantity": "stable_rank",
                    "matrix": name[1],
                    "layer": name[0],
                    "value": stable_rank(w),
                }
            )
        rows.append(
            {
                "step": step,
                "quantity": "stable_rank",
                "matrix": "W_E",
                "layer": -1,
                "value": stable_rank(_embedding(model)),
            }
        )
    onset = next((s for s, m in zip(steps, means, strict=True) if m >= onset_score), None)
    summary = {
        "n_checkpoints": len(checkpoints),
        "onset_step": onset,
        "first_mean_score": means[0],
        "last_mean_score": means[-1],
    }
    meta = {"threshold": threshold, "onset_score": onset_score, "steps": steps}
    return TimelineResult(pd.DataFrame(rows), summary, meta)


__all__ = [
    "ALL_MATRICES",
    "NEURON_MATRICES",
    "CondensationResult",
    "SpectraResult",
    "TimelineResult",
    "cluster_order",
    "condensation",
    "condensation_timeline",
    "cosine_matrix",
    "embedding_covariance_eigenvalues",
    "singular_values",
    "spectra",
    "stable_rank",
    "weight_matrices",
]
