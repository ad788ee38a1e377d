"""Spectra of the weights: singular values, stable rank, embedding covariance eigenvalues.

:func:`spectra` gives the singular values and the stable rank ``sum_i (s_i / s_max)^2`` of every
weight matrix (per layer W_Q, W_K, W_V, W_O, W_in, W_gate, W_out as :meth:`probekit.Model.weights`
gives them; then W_E and W_U) and the eigenvalues of the token-embedding covariance. Weights
only: no data.
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
from probekit.analyses.weights.embeddings import token_ids
from probekit.errors import InputError
from probekit.model import WEIGHT_NAMES, Model, load
from probekit.result import Result
from probekit.words import AXES, figure_words


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


class SpectraResult(Result):
    """Singular values of every weight matrix and eigenvalues of the embedding covariance.

    ``df`` columns: ``layer`` (-1 for W_E / W_U / the embedding covariance), ``matrix``,
    ``index`` (0 = largest), ``value`` (singular value, or eigenvalue for ``emb_cov``),
    ``normalized`` (value / largest). ``summary``: ``emb_cov_top_share`` (largest eigenvalue
    over the trace) and ``emb_cov_effective_rank`` (participation ratio (sum e)^2 / sum e^2).
    Per matrix: :meth:`stable_rank` (and the table :meth:`stable_ranks`).
    """

    kind = "spectra"

    def stable_rank(self, matrix: str, layer: int | None = None) -> float:
        """Stable rank of one matrix: a per-layer one (``layer`` given) or W_E / W_U."""
        ranks = self.stable_ranks()
        hit = ranks[(ranks.matrix == matrix) & (ranks.layer == (-1 if layer is None else layer))]
        if hit.empty:
            raise InputError(
                f"no matrix {matrix!r} at layer {layer}",
                fix=f"use one of {sorted(set(ranks.matrix))} (layer=None for W_E / W_U)",
            )
        return float(hit.stable_rank.iloc[0])

    def stable_ranks(self) -> pd.DataFrame:
        """One row per matrix: layer, matrix, stable rank (from the singular values in df)."""
        singular = self.df[self.df.matrix != "emb_cov"]
        rows = [
            {"layer": ly, "matrix": m, "stable_rank": float((part.normalized**2).sum())}
            for (ly, m), part in singular.groupby(["layer", "matrix"], sort=False)
        ]
        return pd.DataFrame(rows)

    def figure(self) -> go.Figure:
        fig = make_subplots(
            rows=1,
            cols=3,
            subplot_titles=(
                figure_words("spectra", "singular"),
                figure_words("spectra", "ranks"),
                figure_words("spectra", "covariance"),
            ),
        )
        singular = self.df[self.df.matrix != "emb_cov"]
        for i, ((ly, m), part) in enumerate(singular.groupby(["layer", "matrix"], sort=False)):
            fig.add_trace(_spectrum_trace(part, ly, m, i), row=1, col=1)
        ranks = self.stable_ranks()
        per_layer = ranks[ranks.layer >= 0]
        for m, part in per_layer.groupby("matrix", sort=False):
            fig.add_trace(
                go.Scatter(
                    x=part.layer,
                    y=part.stable_rank,
                    mode="lines+markers",
                    name=m,
                    legendgroup=m,
                    showlegend=False,
                    line={"color": _color(m)},
                ),
                row=1,
                col=2,
            )
        cov = self.df[self.df.matrix == "emb_cov"]
        fig.add_trace(
            go.Bar(
                x=cov["index"],
                y=cov["value"],
                name=figure_words("spectra", "covariance_legend"),
                marker_color="#264653",
                showlegend=False,
            ),
            row=1,
            col=3,
        )
        figures.log_axis(fig, "y", row=1, col=1)
        figures.log_axis(fig, "y", row=1, col=3, values=cov["value"])
        fig.update_xaxes(title_text=figure_words("spectra", "x_singular"), row=1, col=1)
        fig.update_yaxes(title_text=figure_words("spectra", "y_singular"), row=1, col=1)
        fig.update_xaxes(title_text=AXES["layer"], row=1, col=2)
        figures.integer_axis(fig, "x", n=int(per_layer.layer.max()) + 1, row=1, col=2)
        fig.update_yaxes(title_text=AXES["stable_rank"], row=1, col=2)
        fig.update_xaxes(title_text=figure_words("spectra", "x_covariance"), row=1, col=3)
        fig.update_yaxes(title_text=figure_words("spectra", "y_covariance"), row=1, col=3)
        figures.base_layout(
            fig,
            figure_words(
                "spectra",
                stable_rank=self.stable_rank("W_E"),
                top_share=self.summary.get("emb_cov_top_share", float("nan")),
            ),
            width=1150,
            height=420,
        )
        return fig


def _color(name: str) -> str:
    return figures.PALETTE[list(WEIGHT_NAMES + ("W_E", "W_U")).index(name) % len(figures.PALETTE)]


def _spectrum_trace(part: pd.DataFrame, layer: int, name: str, i: int) -> go.Scatter:
    """One matrix's spectrum; the legend shows each matrix once (its first layer's line)."""
    return go.Scatter(
        x=part["index"],
        y=part["normalized"],
        mode="lines",
        name=name,
        legendgroup=name,
        showlegend=layer <= 0,
        hovertext=name if layer < 0 else f"{name} layer {layer}",
        line={"color": _color(name)},
        opacity=0.5 + 0.5 * (i % 2),
    )


@torch.no_grad()
def spectra(model: Model, *, tokens: Sequence[int] | None = None) -> SpectraResult:
    """Singular values and stable rank of every weight, eigenvalues of the embedding covariance.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        tokens: token ids whose embeddings enter the covariance (default: the whole vocabulary;
            for an anchor task pass e.g. ``range(20, 100)``).

    Example:
        >>> from probekit.toy import toy_model
        >>> res = spectra(toy_model("gpt2", n_layers=1), tokens=range(20, 40))
        >>> 1.0 <= res.stable_rank("W_Q", layer=0) <= 32, 1.0 <= res.stable_rank("W_E") <= 32
        (True, True)
    """
    model = load(model)
    mats: dict[tuple[int, str], Any] = dict(model.weights())
    mats[(-1, "W_E")] = model.embedding
    mats[(-1, "W_U")] = model.unembedding
    frames = [_spectrum_frame(layer, name, singular_values(w)) for (layer, name), w in mats.items()]
    ids = token_ids(model, tokens)
    eig = embedding_covariance_eigenvalues(model.embedding[ids])
    frames.append(_spectrum_frame(-1, "emb_cov", eig))
    total = float(eig.sum())
    summary = {
        "emb_cov_top_share": float(eig[0] / total) if total > 0 else float("nan"),
        "emb_cov_effective_rank": float(total**2 / (eig**2).sum()) if total > 0 else float("nan"),
    }
    meta = {"tokens": None if tokens is None else [int(t) for t in ids], "model": repr(model)}
    return SpectraResult(pd.concat(frames, ignore_index=True), summary, meta)


def _spectrum_frame(layer: int, name: str, values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "layer": layer,
            "matrix": name,
            "index": np.arange(values.size),
            "value": values,
            "normalized": values / values[0] if values[0] > 0 else np.zeros_like(values),
        }
    )


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


__all__ = [
    "SpectraResult",
    "embedding_covariance_eigenvalues",
    "singular_values",
    "spectra",
    "stable_rank",
]
