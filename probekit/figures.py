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


def base_layout(fig: go.Figure, title: str, x: str = "", y: str = "") -> go.Figure:
    """Apply probekit's common layout to ``fig``."""
    fig.update_layout(
        template=TEMPLATE,
        title={"text": title, "x": 0.02, "xanchor": "left"},
        xaxis_title=x,
        yaxis_title=y,
        font={"size": 13},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 1, "xanchor": "right"},
        margin={"l": 60, "r": 30, "t": 80, "b": 50},
    )
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
            colorbar={"title": {"text": colorbar}},
            hovertemplate=f"{x_title} %{{x}}<br>{y_title} %{{y}}<br>{colorbar} %{{z:.4g}}"
            "<extra></extra>",
            **kwargs,
        )
    )
    base_layout(fig, title, x_title, y_title)
    fig.update_yaxes(autorange="reversed")
    return fig


def _per_group(df: pd.DataFrame, color: str | None, make_trace) -> go.Figure:
    """One trace per value of ``color`` (or a single trace), in probekit's palette."""
    fig = go.Figure()
    groups = [(None, df)] if color is None else list(df.groupby(color, sort=False))
    for i, (name, part) in enumerate(groups):
        fig.add_trace(
            make_trace(part, None if name is None else str(name), PALETTE[i % len(PALETTE)])
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
            x=part[x], y=part[y], mode=kind, name=name or y, line={"color": c}
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
        lambda part, name, c: go.Bar(x=part[x], y=part[y], name=name or y, marker_color=c),
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
