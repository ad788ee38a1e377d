"""Residual-stream similarity and relative norms per layer.

Write h_{l+1} = h_l + a_l + m_l with a_l the attention update and m_l the MLP update of layer l.
Per token, then averaged over all selected tokens of all prompts pooled (both conventions:
the reference code of Csordas et al. 2025, ``analyze_norms.py``, pools tokens the same way, so
``convention="csordas2025"`` gives the same numbers):

- ``cos_out_in``   cos(h_{l+1}, h_l)         how much a layer turns the stream,
- ``cos_attn_in``  cos(a_l, h_l)             whether attention writes along or against it,
- ``cos_mlp_mid``  cos(m_l, h_l + a_l),
- ``cos_update_in`` cos(a_l + m_l, h_l)     whether the whole update writes along the stream,
- ``attn_rel``     ||a_l|| / ||h_l||,
- ``mlp_rel``      ||m_l|| / ||h_l + a_l||,
- ``update_rel``   ||a_l + m_l|| / ||h_l||   the layer's relative update size.

For post-norm models (BERT) a_l and m_l are the changes each sublayer, with its add-norm, makes
to the stream (see :meth:`probekit.Model.update_hooks`), so the decomposition holds exactly.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = residual_stats(toy_model("llama", n_layers=2), toy_tokens())
    >>> res.df.layer.unique().tolist()
    [0, 1]
    >>> fig = res.figure()          # fig.show() in a notebook
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from probekit import figures
from probekit.analyses._common import (
    TokenMeans,
    check_outputs_finite,
    result_meta,
    second_half,
)
from probekit.analyses.depth.conventions import check_convention
from probekit.data import Data, position_mask
from probekit.model import Model, load
from probekit.progress import counted
from probekit.result import Result

RESIDUAL_MEASURES = (
    "cos_out_in",
    "cos_attn_in",
    "cos_mlp_mid",
    "attn_rel",
    "mlp_rel",
    "update_rel",
    "cos_update_in",
)
_EPS = 1e-12


def residual_measures(
    h_in: torch.Tensor, attn: torch.Tensor, mlp: torch.Tensor, h_out: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The per-token measures of :data:`RESIDUAL_MEASURES` for one layer (float64)."""
    h_in, attn, mlp, h_out = (t.double() for t in (h_in, attn, mlp, h_out))
    mid = h_in + attn
    norm = lambda t: t.norm(dim=-1)  # noqa: E731
    return {
        "cos_out_in": F.cosine_similarity(h_out, h_in, dim=-1, eps=_EPS),
        "cos_attn_in": F.cosine_similarity(attn, h_in, dim=-1, eps=_EPS),
        "cos_mlp_mid": F.cosine_similarity(mlp, mid, dim=-1, eps=_EPS),
        "attn_rel": norm(attn) / (norm(h_in) + _EPS),
        "mlp_rel": norm(mlp) / (norm(mid) + _EPS),
        "update_rel": norm(attn + mlp) / (norm(h_in) + _EPS),
        "cos_update_in": F.cosine_similarity(attn + mlp, h_in, dim=-1, eps=_EPS),
    }


class ResidualResult(Result):
    """``df`` columns: ``layer``, ``measure``, ``value``. ``summary``: per measure the mean over
    the first and the second half of the layers (``<measure>_first_half``/``_second_half``)."""

    kind = "residual"

    def table(self) -> pd.DataFrame:
        """Wide table: one row per layer, one column per measure."""
        return self.df.pivot(index="layer", columns="measure", values="value")[
            list(RESIDUAL_MEASURES)
        ]

    def figure(self) -> go.Figure:
        from plotly.subplots import make_subplots

        fig = make_subplots(
            rows=1,
            cols=2,
            subplot_titles=("cosine similarities", "update norms relative to the input"),
        )
        for i, measure in enumerate(RESIDUAL_MEASURES):
            part = self.df[self.df.measure == measure]
            fig.add_trace(
                go.Scatter(
                    x=part.layer,
                    y=part.value,
                    name=figures.words(measure),
                    mode="lines+markers",
                    line={"color": figures.PALETTE[i % len(figures.PALETTE)]},
                ),
                row=1,
                col=1 if measure.startswith("cos") else 2,
            )
        fig.update_xaxes(title_text="layer")
        figures.integer_axis(fig, "x", n=int(self.df.layer.max()) + 1)
        fig.update_yaxes(title_text="cosine", row=1, col=1)
        fig.update_yaxes(title_text="ratio of L2 norms", row=1, col=2)
        return figures.base_layout(
            fig, "Residual stream: similarity and relative update size", width=1100
        )


@torch.no_grad()
def residual_stats(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    batch_size: int | None = None,
    convention: str = "probekit",
) -> ResidualResult:
    """Measure the residual-stream similarities and relative norms of every layer.

    Only the tensors of the layer being run are held; each layer's measures are reduced to
    token sums inside its output hook. ``convention`` ('probekit' or 'csordas2025') is
    accepted for symmetry with the other depth analyses; both pool tokens.
    """
    model = load(model)
    check_convention(convention)
    acc = TokenMeans()
    for batch in counted(model.prepare(data, batch_size)):
        mask = position_mask(batch, positions)

        def reduce(layer: int, mask: torch.Tensor = mask) -> Any:
            def fn(h_in, attn, mlp, h_out) -> None:
                for name, values in residual_measures(h_in, attn, mlp, h_out).items():
                    acc.add((layer, name), values, mask)

            return fn

        fwd = [
            h for layer in range(model.n_layers) for h in model.update_hooks(layer, reduce(layer))
        ]
        check_outputs_finite(model.forward(batch, fwd))
    rows = [
        {"layer": layer, "measure": m, "value": acc.mean((layer, m))}
        for layer in range(model.n_layers)
        for m in RESIDUAL_MEASURES
    ]
    df = pd.DataFrame(rows)
    late = df.layer.isin(second_half(model.n_layers))
    summary: dict = {"n_layers": model.n_layers}
    for m in RESIDUAL_MEASURES:
        part = df.measure == m
        summary[f"{m}_first_half"] = float(df[part & ~late].value.mean())
        summary[f"{m}_second_half"] = float(df[part & late].value.mean())
    meta = result_meta(model, positions=positions, batch_size=batch_size, convention=convention)
    return ResidualResult(df, summary, meta)
