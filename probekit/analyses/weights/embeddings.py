"""The token-embedding map: W_E rows in 2-D (PCA, t-SNE or UMAP), coloured by token value.

An inferential anchor model places the item tokens along arithmetic sequences;
``summary["neighbour_ratio"]`` (mean distance between consecutive tokens t, t+1 over the mean
distance between all token pairs, in the full embedding space) is well below 1 then, about 1
for a random embedding; ``order_corr`` is the largest |Spearman correlation| of token value
with a map axis. Weights only: no data.

Example:
    >>> from probekit.toy import toy_model
    >>> res = embedding_map(toy_model("gpt2", n_layers=1), tokens=range(20, 40))
    >>> res.summary["n_tokens"], 0.5 < res.summary["neighbour_ratio"] < 1.5
    (20, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import result_meta
from probekit.analyses.projection import check_method, reduce, spearman
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import figure_words


class EmbeddingMapResult(Result):
    """Token embeddings in 2-D. ``df``: ``token``, ``x``, ``y``. ``summary``: ``method``,
    ``n_tokens``, ``neighbour_ratio``, ``order_corr``, and for PCA ``explained_variance_1/2``
    (the share of variance along each of the two map axes)."""

    kind = "embedding_map"

    def figure(self) -> go.Figure:
        fig = go.Figure(
            go.Scatter(
                x=self.df.x,
                y=self.df.y,
                mode="markers+text",
                text=figures.readable_labels(self.df.x, self.df.y, self.df.token.astype(str)),
                customdata=self.df.token,
                textposition="top center",
                textfont={"size": 9},
                marker={
                    "color": self.df.token,
                    "colorscale": figures.SEQUENTIAL,
                    "size": 8,
                    "colorbar": {"title": {"text": figure_words("embedding_map", "colorbar")}},
                },
                hovertemplate="token %{customdata}<extra></extra>",
            )
        )
        s = self.summary
        return figures.base_layout(
            fig,
            figure_words(
                "embedding_map",
                method=s.get("method"),
                neighbour_ratio=s.get("neighbour_ratio", float("nan")),
                order_corr=s.get("order_corr", float("nan")),
            ),
            figure_words("embedding_map", "x", method=s.get("method")),
            figure_words("embedding_map", "y", method=s.get("method")),
            width=900,
            height=600,
        )


def token_ids(model: Model, tokens: Sequence[int] | None, start: int = 0) -> np.ndarray:
    """``tokens`` as an id array checked against the vocabulary (default: ``start..d_vocab-1``)."""
    if tokens is None:
        return np.arange(start, model.d_vocab)
    ids = np.asarray([int(t) for t in tokens])
    bad = ids[(ids < 0) | (ids >= model.d_vocab)]
    if bad.size:
        raise InputError(
            f"token ids {bad[:5].tolist()} are outside the vocabulary [0, {model.d_vocab})",
            fix="pass token ids of this model's vocabulary",
        )
    return ids


@torch.no_grad()
def embedding_map(
    model: Model,
    *,
    tokens: Sequence[int] | None = None,
    method: str = "pca",
    seed: int = 0,
) -> EmbeddingMapResult:
    """Map token embeddings (W_E rows) to 2-D, coloured by token value.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        tokens: token ids to map (default: all but 0; e.g. ``range(20, 100)`` for anchor items).
        method: 'pca', 'tsne' or 'umap'.
        seed: seeds t-SNE and UMAP.
    """
    model = load(model)
    check_method(method)
    ids = token_ids(model, tokens, start=1)
    emb = model.embedding.numpy()[ids]
    xy, info = reduce(emb, method, seed)
    df = pd.DataFrame({"token": ids, "x": xy[:, 0], "y": xy[:, 1]})
    summary: dict[str, Any] = {"method": method, "n_tokens": len(ids)}
    summary["neighbour_ratio"] = neighbour_ratio(emb, ids)
    summary["order_corr"] = max(abs(spearman(ids, xy[:, k])) for k in (0, 1))
    for k, v in enumerate(info.get("explained_variance", []), start=1):
        summary[f"explained_variance_{k}"] = float(v)
    meta = result_meta(model, method=method, seed=seed, **info)
    return EmbeddingMapResult(df, summary, meta)


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


__all__ = ["EmbeddingMapResult", "embedding_map", "neighbour_ratio"]
