"""Residual-stream similarity and relative norms per layer.

Write h_{l+1} = h_l + a_l + m_l with a_l the attention update and m_l the MLP update of layer l.
Per token, then averaged over all selected tokens of all prompts pooled (both conventions:
the reference code of Csordas et al. 2025, ``analyze_norms.py``, pools tokens the same way):

- ``cos_out_in``   cos(h_{l+1}, h_l)         how much a layer turns the stream,
- ``cos_attn_in``  cos(a_l, h_l)             whether attention writes along or against it,
- ``cos_mlp_mid``  cos(m_l, h_l + a_l),
- ``cos_update_in`` cos(a_l + m_l, h_l)     whether the whole update writes along the stream,
- ``attn_rel``     ||a_l|| / ||h_l||,
- ``mlp_rel``      ||m_l|| / ||h_l + a_l||,
- ``update_rel``   ||a_l + m_l|| / ||h_l||   the layer's relative update size.

The conventions differ only where a norm is tiny: ``"probekit"`` divides by ``||x|| + 1e-12``
and gives cosines torch's ``eps=1e-12``; ``"csordas2025"`` does what ``analyze_norms.py`` does,
dividing by ``max(||x||, 1e-6)`` and taking torch's default cosine ``eps=1e-8`` (each norm
clamped at 1e-8). For residual norms above 1e-6 the two agree to float64 rounding.

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
from probekit.analyses.common import (
    TokenMeans,
    check_outputs_finite,
    result_meta,
    second_half,
)
from probekit.analyses.depth.conventions import relative_from_norms
from probekit.data import Data, position_mask
from probekit.interventions import InterventionSetting, check_setting
from probekit.model import Model, load
from probekit.progress import counted
from probekit.result import Result
from probekit.words import AXES, figure_words

RESIDUAL_MEASURES = (
    "cos_out_in",
    "cos_attn_in",
    "cos_mlp_mid",
    "attn_rel",
    "mlp_rel",
    "update_rel",
    "cos_update_in",
)
COSINE_EPS = {"probekit": 1e-12, "csordas2025": 1e-8}
"""The ``eps`` of :func:`torch.nn.functional.cosine_similarity` per convention (1e-8 is torch's
default, which ``analyze_norms.py`` uses)."""


def residual_measures(
    h_in: torch.Tensor,
    attn: torch.Tensor,
    mlp: torch.Tensor,
    h_out: torch.Tensor,
    convention: str = "probekit",
) -> dict[str, torch.Tensor]:
    """The per-token measures of :data:`RESIDUAL_MEASURES` for one layer (float64); the norms
    divided by and the cosine eps as ``convention`` says (see the module docstring).

    Example:
        >>> h, a = torch.full((1, 4), 1e-9), torch.full((1, 4), 1e-9)
        >>> [round(float(residual_measures(h, a, a, h + 2 * a, c)["attn_rel"]), 4)
        ...  for c in COSINE_EPS]
        [0.9995, 0.002]
    """
    h_in, attn, mlp, h_out = (t.double() for t in (h_in, attn, mlp, h_out))
    mid, update = h_in + attn, attn + mlp
    eps = COSINE_EPS[convention]

    def cos(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(x, y, dim=-1, eps=eps)

    def rel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return relative_from_norms(x.norm(dim=-1), y.norm(dim=-1), convention)

    return {
        "cos_out_in": cos(h_out, h_in),
        "cos_attn_in": cos(attn, h_in),
        "cos_mlp_mid": cos(mlp, mid),
        "attn_rel": rel(attn, h_in),
        "mlp_rel": rel(mlp, mid),
        "update_rel": rel(update, h_in),
        "cos_update_in": cos(update, h_in),
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
            subplot_titles=(figure_words("residual", "left"), figure_words("residual", "right")),
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
        fig.update_xaxes(title_text=AXES["layer"])
        figures.integer_axis(fig, "x", n=int(self.df.layer.max()) + 1)
        fig.update_yaxes(title_text=figure_words("residual", "y_left"), row=1, col=1)
        fig.update_yaxes(title_text=figure_words("residual", "y_right"), row=1, col=2)
        return figures.base_layout(fig, figure_words("residual"), width=1100)


@torch.no_grad()
def residual_stats(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    batch_size: int | None = None,
    setting: InterventionSetting = InterventionSetting(),
) -> ResidualResult:
    """Measure the residual-stream similarities and relative norms of every layer.

    Only the tensors of the layer being run are held; each layer's measures are reduced to
    token sums inside its output hook. ``setting``: only its ``convention`` is read (nothing
    is intervened on), 'probekit' or 'csordas2025': both pool tokens; 'csordas2025' clamps the
    norms it divides by at 1e-6 and uses torch's default cosine eps (1e-8), as the reference's
    ``analyze_norms.py`` does.
    """
    model = load(model)
    convention = check_setting(setting).convention
    acc = TokenMeans()
    for batch in counted(model.prepare(data, batch_size)):
        mask = position_mask(batch, positions)

        def reduce(layer: int, mask: torch.Tensor = mask) -> Any:
            def fn(h_in, attn, mlp, h_out) -> None:
                for name, values in residual_measures(h_in, attn, mlp, h_out, convention).items():
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
