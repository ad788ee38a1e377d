"""Every figure probekit draws, for a 2-layer and a 12-layer model, checked for what a reader
needs: a title, every axis titled, layer axes on integer ticks, legends and colour bars in
words, the legend below the axes (never over a subplot title), readable log axes, at most
1200 pixels wide. To look at the figures themselves: ``python -m tests.figure_gallery --out
DIR`` (PNGs); the docs' images: ``python -m tests.make_assets``.
"""

from __future__ import annotations

import re

import plotly.graph_objects as go
import pytest
import torch

from probekit import figures
from tests.figure_gallery import results

torch.set_num_threads(1)

SNAKE = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")
"""A bare table key such as ``cos_out_in``: not words."""
LAYER_AXIS = re.compile(r"^(?!.*depth score).*\b(layers?|depth)\b", re.IGNORECASE)
"""An axis of layer indices or depths; not a depth score (a centre of mass in layers)."""


@pytest.fixture(scope="module", params=[2, 12], ids=["2-layer", "12-layer"])
def drawn(request, tmp_path_factory) -> dict[str, go.Figure]:
    tmp = tmp_path_factory.mktemp(f"gallery{request.param}")
    return {name: draw() for name, draw in results(request.param, tmp).items()}


def _axes(fig: go.Figure) -> list[tuple[str, object]]:
    """(layout name, axis) of every axis some trace draws on."""
    used = set()
    for trace in fig.data:
        for key in ("xaxis", "yaxis"):
            ref = getattr(trace, key, None)
            if ref:
                used.add(f"{key[0]}axis{ref[1:]}")
    return [(name, fig.layout[name]) for name in sorted(used)]


def _title(axis) -> str:
    return (axis.title.text or "") if axis.title else ""


def _is_integer_axis(axis, fig: go.Figure, name: str) -> bool:
    if axis.tickmode == "linear":
        return float(axis.dtick).is_integer() and float(axis.tick0 or 0).is_integer()
    if axis.tickvals is not None:
        return all(float(v).is_integer() for v in axis.tickvals)
    return axis.type == "category"


def test_every_figure_titled_sized_and_in_words(drawn):
    assert len(drawn) >= 20
    for name, fig in drawn.items():
        assert fig.layout.title.text, name
        assert fig.layout.width and fig.layout.width <= figures.MAX_WIDTH, name
        axes = _axes(fig)
        for axis_name, axis in axes:
            if axis.visible is False:
                continue
            title = _title(axis) or _shared_title(axes, axis_name, axis)
            assert title, f"{name}: {axis_name} has no title"
            assert not SNAKE.match(title), f"{name}: {axis_name} title {title!r}"


def _shared_title(axes: list, name: str, axis) -> str:
    """The title of an axis in the same row (y) or column (x) of a subplot grid: one title
    on the left (or bottom) of a row of panels serves them all."""
    domain = tuple(axis.domain or (0, 1))
    return next(
        (
            _title(other)
            for other_name, other in axes
            if other_name[0] == name[0]
            and tuple(other.domain or (0, 1)) == domain
            and _title(other)
        ),
        "",
    )


def test_layer_axes_have_integer_ticks(drawn):
    checked = 0
    for name, fig in drawn.items():
        for axis_name, axis in _axes(fig):
            if LAYER_AXIS.search(_title(axis)):
                assert _is_integer_axis(axis, fig, axis_name), (name, axis_name, _title(axis))
                checked += 1
    assert checked >= 10  # contributions, skips, swaps, gradients, lenses, residual, ...


def test_legends_in_words_below_the_axes(drawn):
    for name, fig in drawn.items():
        shown = [t for t in fig.data if t.showlegend is not False and t.name]
        if fig.layout.showlegend is False or not shown:
            continue
        for trace in shown:
            assert not SNAKE.match(trace.name), f"{name}: legend entry {trace.name!r}"
        legend = fig.layout.legend
        # below the plot area, inside the bottom margin: no subplot title can be under it
        assert legend.yref == "container" and legend.yanchor == "bottom", name
        assert legend.y <= 0.05 and fig.layout.margin.b >= 90, name
        entries = len({(t.legendgroup, t.name) for t in shown})
        assert entries <= 24, f"{name}: {entries} legend entries"


def test_colorbars_titled_in_words_and_log_axes_readable(drawn):
    for name, fig in drawn.items():
        for trace in fig.data:
            bar = None
            if trace.type == "heatmap" and trace.showscale is not False:
                bar = trace.colorbar
            elif trace.type == "scatter" and trace.marker and trace.marker.colorbar.title.text:
                bar = trace.marker.colorbar
            if bar is not None:
                text = bar.title.text or ""
                assert text and not SNAKE.match(text), f"{name}: colour bar {text!r}"
        for axis_name, axis in _axes(fig):
            if axis.type == "log":
                readable = axis.dtick == 1 or axis.tickformat  # decades, or numbers written out
                assert readable and axis.exponentformat == "power", (name, axis_name)


def test_probe_first_depth_panel_has_its_own_scale_and_no_nan(drawn):
    fig = drawn["probes"]
    first = [t for t in fig.data if t.type == "heatmap" and t.colorscale != fig.data[0].colorscale]
    assert len(first) == 1 and "first" in first[0].colorbar.title.text
    assert first[0].showscale is not False
    texts = [str(v) for row in first[0].text for v in row]
    assert not any("nan" in t.lower() for t in texts)
    titles = [a.text for a in fig.layout.annotations]
    assert not any("None" in t for t in titles)


def test_solution_panel_shows_the_symmetric_bar_and_seen_pairs_as_correct(drawn):
    fig = drawn["solutions"]
    diff_axis = fig.layout.xaxis2
    low, high = diff_axis.range
    assert low < 0 < 4 < high and 4 in list(diff_axis.tickvals)  # (4,3): symmetric = +4
    assert any("symmetric" in (a.text or "") for a in fig.layout.annotations)
    seen = [t for t in fig.data if t.legendgroup == "seen pairs" and "correct" in t.name]
    other = [t for t in fig.data if t.legendgroup == "held-out pairs" and t.name == "other"]
    assert seen and other and seen[0].marker.color != other[0].marker.color
