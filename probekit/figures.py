"""Plotly building blocks shared by every result's ``.figure()``.

One look for all of probekit: a clean white template, layer indices on integer axes, a
diverging scale centred on zero for signed quantities and a sequential one otherwise.

Example:
    >>> import numpy as np
    >>> fig = heatmap(np.eye(3), x=[0, 1, 2], y=[0, 1, 2], title="identity")
    >>> fig.layout.title.text
    'identity'
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

TEMPLATE = "plotly_white"
SEQUENTIAL = "Viridis"
DIVERGING = "RdBu_r"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")


MAX_WIDTH = 1200
"""Every figure fits a page of this many pixels (reports, papers)."""

WORDS = {
    # output-change measures (depth and mechanism analyses)
    "prob_l2": "change of the output probabilities (L2)",
    "logit_l2": "change of the logits (L2)",
    "kl": "KL divergence from the clean output (nats)",
    "loss_delta": "change of the loss (nats)",
    "p_target_delta": "change of the target's probability",
    "accuracy_delta": "change of the accuracy (fraction)",
    "pred_changed": "predictions changed (fraction)",
    # components
    "layer": "whole layer",
    "attn": "attention",
    "mlp": "MLP",
    # residual stream
    "cos_out_in": "cos(layer output, layer input)",
    "cos_attn_in": "cos(attention update, layer input)",
    "cos_mlp_mid": "cos(MLP update, MLP input)",
    "cos_update_in": "cos(layer update, layer input)",
    "attn_rel": "attention update ÷ input norm",
    "mlp_rel": "MLP update ÷ input norm",
    "update_rel": "layer update ÷ input norm",
    # gradients
    "mean_param_grad_norm": "mean over the layer's weights",
    "grad_norm": "all the layer's weights",
    "resid_grad_norm": "residual stream at the layer's output",
    # timelines
    "second_half_share": "second-half share of the output change (fraction)",
    "depth_score_normalized": "skip-effect depth score (÷ layers − 1)",
    "depth_score": "skip-effect depth score (layers)",
    # probes
    "score": "probe score (accuracy or R²)",
    "selectivity": "selectivity over shuffled labels",
}
"""Words for the keys of probekit's tables, used in legends, axis and colorbar titles."""


def words(key: str) -> str:
    """``key`` (a measure, component, ...) in words for a figure.

    Example:
        >>> words("cos_out_in"), words("some_new_measure")
        ('cos(layer output, layer input)', 'some new measure')
    """
    return WORDS.get(str(key), str(key).replace("_", " "))


def integer_axis(
    fig: go.Figure,
    axis: str = "x",
    n: int | None = None,
    row: int | None = None,
    col: int | None = None,
    **kwargs,
) -> go.Figure:
    """Integer ticks (layers, depths, positions): a tick at every integer up to ~12 ticks,
    every 2nd, 5th, ... beyond; never at 0.5.

    Example:
        >>> fig = integer_axis(go.Figure(go.Scatter(x=[0, 1], y=[1, 2])), "x", n=2)
        >>> fig.layout.xaxis.tickmode, fig.layout.xaxis.dtick
        ('linear', 1)
    """
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 10**9) if (n or 0) <= 12 * s)
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(tickmode="linear", tick0=0, dtick=step, row=row, col=col, **kwargs)
    return fig


def log_axis(
    fig: go.Figure,
    axis: str = "y",
    row: int | None = None,
    col: int | None = None,
    values: Sequence[float] | None = None,
) -> go.Figure:
    """A log axis with one labelled tick per power of ten (10⁻², 10⁻¹, ...), or, when
    ``values`` span less than a decade and a half, a few ticks written out (2.5·10⁻⁴ as
    0.00025) instead of bare digits."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    ticks: dict = {"dtick": 1}
    if values is not None:
        v = np.asarray(values, dtype=float)
        v = v[np.isfinite(v) & (v > 0)]
        if len(v) and np.log10(v.max() / v.min()) < 1.5:
            ticks = {"nticks": 6, "tickformat": ".2~g", "dtick": None}
    update(type="log", exponentformat="power", minor={"showgrid": True}, row=row, col=col, **ticks)
    return fig


def _legend_entries(fig: go.Figure) -> list[str]:
    """Names the legend shows (one per legend group)."""
    seen: dict[str, None] = {}
    for trace in fig.data:
        shown = trace.showlegend
        if shown is False or (shown is None and len(fig.data) < 2 and trace.type != "pie"):
            continue
        if getattr(trace, "type", "") == "heatmap" or not trace.name:
            continue
        seen.setdefault((trace.legendgroup, trace.name), None)
    return [name for _, name in seen]


def wrap(text: str, limit: int) -> str:
    """Break ``text`` at spaces into lines of at most ``limit`` characters (``<br>``)."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > limit:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "<br>".join([*lines, line])


def base_layout(
    fig: go.Figure,
    title: str,
    x: str = "",
    y: str = "",
    width: int | None = None,
    height: int | None = None,
) -> go.Figure:
    """Apply probekit's common layout to ``fig``: white template, a title wrapped to the
    width, the legend below the axes (never over a subplot title), at most
    :data:`MAX_WIDTH` pixels wide, powers of ten written as 10⁻³ (not µ)."""
    width = min(MAX_WIDTH, int(width or fig.layout.width or 1000))
    height = int(height or fig.layout.height or 500)
    text = wrap(title, max(40, width // 9))
    top = 50 + 22 * text.count("<br>") + (25 if fig.layout.annotations else 10)
    entries = _legend_entries(fig)
    per_row = max(1, (width - 140) // max(120, 8 * max((len(e) for e in entries), default=1) + 50))
    rows = -(-len(entries) // per_row)
    bottom = 70 + 24 * rows
    fig.update_layout(
        template=TEMPLATE,
        title={
            "text": text,
            "x": 0.02,
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": 12},
        },
        font={"size": 13},
        showlegend=bool(entries),
        legend={
            "orientation": "h",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
            "x": 0,
            "xanchor": "left",
            "entrywidth": (width - 140) // per_row - 4,
            "entrywidthmode": "pixels",
        },
        margin={"l": 70, "r": 30, "t": top, "b": bottom},
        width=width,
        height=height + 24 * rows,
    )
    if x:
        fig.update_layout(xaxis_title=x)
    if y:
        fig.update_layout(yaxis_title=y)
    fig.update_xaxes(exponentformat="power")
    fig.update_yaxes(exponentformat="power")
    return fig


def heatmap(
    matrix: np.ndarray,
    x: Sequence,
    y: Sequence,
    title: str,
    x_title: str = "",
    y_title: str = "",
    colorbar: str = "",
    signed: bool = False,
) -> go.Figure:
    """A matrix as a heatmap; ``signed`` centres a diverging scale on zero."""
    matrix = np.asarray(matrix, dtype=float)
    kwargs = {"colorscale": SEQUENTIAL}
    if signed:
        bound = float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0
        kwargs = {"colorscale": DIVERGING, "zmid": 0.0, "zmin": -bound, "zmax": bound}
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=list(x),
            y=list(y),
            colorbar={"title": {"text": wrap(colorbar, 16)}},
            hovertemplate=f"{x_title} %{{x}}<br>{y_title} %{{y}}<br>{colorbar} %{{z:.4g}}"
            "<extra></extra>",
            **kwargs,
        )
    )
    base_layout(fig, title, x_title, y_title)
    fig.update_yaxes(autorange="reversed")
    for axis, values in (("x", list(x)), ("y", list(y))):
        if values and all(isinstance(v, int | np.integer) for v in values):
            integer_axis(fig, axis, n=len(values))
    return fig


def _per_group(df: pd.DataFrame, color: str | None, make_trace) -> go.Figure:
    """One trace per value of ``color`` (or a single trace), in probekit's palette."""
    fig = go.Figure()
    groups = [(None, df)] if color is None else list(df.groupby(color, sort=False))
    for i, (name, part) in enumerate(groups):
        fig.add_trace(
            make_trace(part, None if name is None else words(name), PALETTE[i % len(PALETTE)])
        )
    return fig


def lines(
    df: pd.DataFrame,
    x: str,
    y: str,
    color: str | None,
    title: str,
    x_title: str = "",
    y_title: str = "",
    kind: str = "lines+markers",
) -> go.Figure:
    """One line per value of ``color`` (or a single line) of ``y`` over ``x``."""
    fig = _per_group(
        df,
        color,
        lambda part, name, c: go.Scatter(
            x=part[x], y=part[y], mode=kind, name=name or words(y), line={"color": c}
        ),
    )
    return base_layout(fig, title, x_title, y_title)


def bars(
    df: pd.DataFrame, x: str, y: str, color: str | None, title: str, x_title: str, y_title: str
) -> go.Figure:
    """Grouped bars of ``y`` over ``x``, one colour per value of ``color``."""
    fig = _per_group(
        df,
        color,
        lambda part, name, c: go.Bar(x=part[x], y=part[y], name=name or words(y), marker_color=c),
    )
    fig.update_layout(barmode="group")
    return base_layout(fig, title, x_title, y_title)


def shade_second_half(fig: go.Figure, n_layers: int) -> go.Figure:
    """Shade the second half of the network (layers >= n_layers / 2) behind a layer profile."""
    fig.add_vrect(
        x0=(n_layers + 1) // 2 - 0.5,
        x1=n_layers - 0.5,
        fillcolor="#888888",
        opacity=0.08,
        line_width=0,
        annotation_text="second half",
        annotation_position="top left",
    )
    return fig


def overlap_axis(fig: go.Figure) -> go.Figure:
    """The secondary y axis of a lens figure: the top-k overlap, a fraction from 0 to 1."""
    return fig.update_yaxes(
        title_text="top-k overlap (fraction)",
        range=[0, 1.05],
        tickmode="linear",
        tick0=0,
        dtick=0.2,
        showgrid=False,
        secondary_y=True,
    )
