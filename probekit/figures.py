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

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from probekit.errors import InputError, ProbekitError
from probekit.words import AXES
from probekit.words import WORDS as WORDS  # re-exported: figures.WORDS, figures.words
from probekit.words import words as words

TEMPLATE = "plotly_white"
SEQUENTIAL = "Viridis"
DIVERGING = "RdBu_r"
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")


MAX_WIDTH = 1200
"""Every figure fits a page of this many pixels (reports, papers)."""


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
    step = next(s for s in _ONE_TWO_FIVE if (n or 0) <= 12 * s)
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(tickmode="linear", tick0=0, dtick=step, row=row, col=col, **kwargs)
    return fig


_ONE_TWO_FIVE = tuple(m * 10**k for k in range(16) for m in (1, 2, 5))
"""Tick steps of integer axes: 1, 2, 5, 10, 20, 50, ... (training steps run to millions)."""


def round_step(span: float, n: int = 5) -> float:
    """The step of 1, 2 or 5 × 10ᵏ that splits ``span`` into at most about ``n`` parts.

    Example:
        >>> round_step(1.0), round_step(0.12), round_step(0.013)
        (0.2, 0.05, 0.005)
    """
    raw = span / n
    power = 10.0 ** math.floor(math.log10(raw))
    return next(round(m * power, 15) for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))


def round_axis(
    fig: go.Figure,
    values: Sequence[float | None],
    axis: str = "y",
    row: int | None = None,
    col: int | None = None,
    percent: bool = False,
    from_zero: bool = False,
    decimals: int = 0,
) -> go.Figure:
    """Ticks at round values (:func:`round_step` apart, about five) over ``values`` with room
    either side, labelled with the decimals the step needs and at least ``decimals`` (as a
    percent with ``percent``: 0.125 is 12.5%), so no two ticks read alike and none reads
    1.46423; ``from_zero`` keeps 0 in view (a share). No finite value: left as it is.

    Example:
        >>> fig = round_axis(go.Figure(), [0.11, 0.14], percent=True, from_zero=True)
        >>> fig.layout.yaxis.dtick, fig.layout.yaxis.tickformat
        (0.05, '.0%')
    """
    found = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not found:
        return fig
    low, high = min(found), max(found)
    if from_zero:
        low, high = min(low, 0.0), max(high, 0.0)
    if high == low:  # one value: a band around it
        half = abs(high) * 0.1 or 0.5
        low, high = low - half, high + half
    span = high - low
    step = round_step(span)
    shown = step * 100 if percent else step
    places = max(decimals, -math.floor(math.log10(shown) + 1e-9), 0)
    pad = 0.08 * span
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(
        range=[low - pad, high + pad],
        tickmode="linear",
        tick0=0,
        dtick=step,
        tickformat=f".{places}{'%' if percent else 'f'}",
        row=row,
        col=col,
    )
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
            chosen = narrow_log_ticks(float(v.min()), float(v.max()))
            text = [_short(t) for t in chosen]
            ticks = {"tickmode": "array", "tickvals": chosen, "ticktext": text, "dtick": None}
            ticks["tickformat"] = ".2~g"  # the labels above, written out the same way
    update(type="log", exponentformat="power", minor={"showgrid": True}, row=row, col=col, **ticks)
    return fig


def _short(value: float) -> str:
    """A tick label of two significant digits, written out (0.00025, 1.5, 120)."""
    return np.format_float_positional(float(f"{value:.2g}"), trim="-")


def narrow_log_ticks(low: float, high: float, n: int = 5) -> list[float]:
    """About ``n`` ticks of two significant digits spread evenly in log space over
    ``[low, high]`` (a range of less than a decade and a half, where plotly's own ticks crowd
    their labels).

    Example:
        >>> narrow_log_ticks(0.7, 1.0)
        [0.7, 0.77, 0.84, 0.91, 1.0]
    """
    spread = np.logspace(np.log10(low), np.log10(high), n)
    return sorted({float(f"{t:.2g}") for t in spread})


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


TOOLBAR_BAND = 30
"""Pixels at the top of a figure that plotly's toolbar (the mode bar) covers in a browser; the
title starts below them, so the toolbar never hides a word of it."""

TITLE_LINE = 22
"""Pixels of one line of a title."""


def _title_lines(title: str, width: int) -> str:
    """``title`` wrapped for a figure ``width`` pixels wide (about 8 px a character at the
    title's font, with room on both sides)."""
    return wrap(title, max(24, width // 9))


def _title_pad(text: str) -> int:
    """Pixels from the figure's top to the title's first line: below the toolbar band. Plotly
    draws a title of several lines about 13 px higher than a one-line title at the same pad
    (measured in Chromium), so those get 13 px more."""
    return TOOLBAR_BAND + 4 + (13 if "<br>" in text else 0)


def _top_margin(text: str, fig: go.Figure) -> int:
    """The top margin that holds the toolbar band, the wrapped title and any annotations."""
    lines = 1 + text.count("<br>")
    return TOOLBAR_BAND + 28 + TITLE_LINE * (lines - 1) + (25 if fig.layout.annotations else 10)


def _legend_rows(fig: go.Figure, width: int) -> tuple[list[str], int, int]:
    """The legend's entries, how many fit on a row of ``width`` pixels, and the rows needed."""
    entries = _legend_entries(fig)
    longest = max((len(e) for e in entries), default=1)
    per_row = max(1, (width - 140) // max(120, 8 * longest + 50))
    return entries, per_row, -(-len(entries) // per_row)


def base_layout(
    fig: go.Figure,
    title: str,
    x: str = "",
    y: str = "",
    width: int | None = None,
    height: int | None = None,
) -> go.Figure:
    """Apply probekit's common layout to ``fig``: white template, a title wrapped to the
    width below the toolbar band (:data:`TOOLBAR_BAND`), the legend below the axes (never
    over a subplot title), at most :data:`MAX_WIDTH` pixels wide, powers of ten written as
    10⁻³ (not µ). :func:`resize` lays the same figure out again for another width."""
    width = min(MAX_WIDTH, int(width or fig.layout.width or 1000))
    height = int(height or fig.layout.height or 500)
    text = _title_lines(title, width)
    entries, per_row, rows = _legend_rows(fig, width)
    fig.update_layout(
        template=TEMPLATE,
        title={
            "text": text,
            "x": 0.02,
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"t": _title_pad(text)},
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
            "entrywidth": max(40, (width - 140) // per_row - 4),
            "entrywidthmode": "pixels",
        },
        margin={"l": 70, "r": 30, "t": _top_margin(text, fig), "b": 70 + 24 * rows},
        width=width,
        height=height + 24 * rows,
        meta={"probekit_height": height},
    )
    if x:
        fig.update_layout(xaxis_title=x)
    if y:
        fig.update_layout(yaxis_title=y)
    fig.update_xaxes(exponentformat="power")
    fig.update_yaxes(exponentformat="power")
    fig.update_traces(colorbar_exponentformat="power", selector={"type": "heatmap"})
    return fig


def fit_top(fig: go.Figure) -> go.Figure:
    """Recompute the top margin after annotations were added above the plot area."""
    return fig.update_layout(margin_t=_top_margin(fig.layout.title.text or "", fig))


def resize(
    fig: go.Figure, width: int, height: int | None = None, aspect: float | None = None
) -> go.Figure:
    """Lay ``fig`` out again for ``width`` pixels: the title re-wrapped, the top margin and the
    legend's entries fitted, so nothing is clipped at the new size. The height stays the
    figure's own, or is ``height``, or, with ``aspect``, is sized to the content: a plot area
    ``aspect`` times as high as it is wide, plus the title, axis titles and legend.

    Example:
        >>> fig = base_layout(go.Figure(go.Scatter(x=[0], y=[0])), "a long title " * 8)
        >>> resize(fig, 340).layout.title.text.count("<br>") > 0
        True
    """
    title = (fig.layout.title.text or "").replace("<br>", " ")
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    text = _title_lines(title, width)
    _, per_row, rows = _legend_rows(fig, width)
    top, bottom = _top_margin(text, fig), 70 + 24 * rows
    if aspect is not None:
        margin = fig.layout.margin
        plot_width = width - int(margin.l or 70) - int(margin.r or 30) - _colorbar_width(fig)
        height = top + 70 + round(aspect * plot_width)
    kept = int(height or meta.get("probekit_height") or fig.layout.height or 500)
    fig.update_layout(
        title_text=text,
        title_pad_t=_title_pad(text),
        margin_t=top,
        margin_b=bottom,
        legend_entrywidth=max(40, (width - 140) // per_row - 4),
        width=int(width),
        height=kept + 24 * rows,
        meta={"probekit_height": kept},
    )
    return fig


def _colorbar_width(fig: go.Figure) -> int:
    """Pixels a heatmap's colour bar takes beside the plot area (0 without one)."""
    return 110 if any(trace.type == "heatmap" for trace in fig.data) else 0


PAPER_WIDTHS = {"one-column": 3.5, "two-column": 7.0}
"""Figure widths of a paper, in inches: one column and the full text width of a two-column
layout (NeurIPS/ICML/ACL are all within a few hundredths of these)."""

CSS_DPI = 96
"""Plotly lays figures out in CSS pixels, 96 to the inch."""

PAPER_ZOOM = 1.45
"""Layout pixels per printed CSS pixel of a paper figure: the 13 px text prints at about
6.7 pt (13 / 1.45 px at 0.75 pt a px), the size of a paper's figure labels."""

PAPER_ASPECT = 0.62
"""Height / width of a paper figure's plot area."""


def paper_size(preset: str) -> tuple[int, float]:
    """The layout width in pixels of a paper ``preset`` (see :data:`PAPER_WIDTHS`) and the
    pixels per inch it is laid out at.

    Example:
        >>> paper_size("two-column")
        (974, 139.2)
    """
    if preset not in PAPER_WIDTHS:
        raise InputError(
            f"unknown paper preset {preset!r}", fix=f"use one of {', '.join(PAPER_WIDTHS)}"
        )
    per_inch = CSS_DPI * PAPER_ZOOM
    return round(PAPER_WIDTHS[preset] * per_inch), per_inch


def write_image(
    fig: go.Figure,
    path: str | os.PathLike,
    preset: str | None = None,
    dpi: int = 300,
) -> Path:
    """Write ``fig`` as PNG/SVG/PDF (by the suffix) with nothing clipped: at its own size, or
    laid out again (:func:`resize`) for a paper ``preset`` (``"one-column"``: 3.5 in,
    ``"two-column"``: 7 in wide) and rendered at ``dpi`` dots per inch, the height sized to
    the content. Needs kaleido and a Chrome/Chromium; :func:`write_images` writes several in
    one browser session.

    Before anything is rendered, ``dpi`` must be a number in [:data:`MIN_DPI`,
    :data:`MAX_DPI`] and ``path`` a file name with one of the suffixes of
    :data:`IMAGE_SUFFIXES` in a writable folder that exists; otherwise :class:`InputError`
    names the problem. Without kaleido or a Chrome/Chromium the error says which is missing
    and how to install it (as ``probekit diagnose`` does).

    Example:
        >>> write_image(go.Figure(), "fig.png", dpi=0)
        Traceback (most recent call last):
        ...
        probekit.errors.InputError: dpi 0 is not a number of dots per inch in [50, 1200]. \
Fix: pass e.g. dpi=300.
    """
    return write_images([fig], [path], preset=preset, dpi=dpi)[0]


MIN_DPI, MAX_DPI = 50, 1200
"""The dots per inch :func:`write_image` takes (a print figure is 300; 1200 at 7 in is an
8400-pixel-wide image)."""

IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp")
"""The image formats the export writes, named by the file's suffix."""


def check_dpi(dpi: object) -> None:
    """Refuse a ``dpi`` that is not a finite number in [:data:`MIN_DPI`, :data:`MAX_DPI`]
    (a bool or a string such as ``"300"`` included)."""
    ok = isinstance(dpi, int | float | np.integer | np.floating) and not isinstance(
        dpi, bool | np.bool_
    )
    if not ok or not (np.isfinite(dpi) and MIN_DPI <= dpi <= MAX_DPI):
        raise InputError(
            f"dpi {dpi!r} is not a number of dots per inch in [{MIN_DPI}, {MAX_DPI}]",
            fix="pass e.g. dpi=300",
        )


def check_image_path(path: object) -> Path:
    """``path`` as a :class:`~pathlib.Path` once it names a new or existing file (not a
    folder) with a suffix of :data:`IMAGE_SUFFIXES` in a writable folder that exists;
    :class:`InputError` naming the problem otherwise."""
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise InputError(
            f"image path {path!r} is not a file name", fix='pass a path such as "fig.png"'
        )
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{target} is a folder", fix="pass a file name inside it")
    if target.suffix.lower() not in IMAGE_SUFFIXES:
        raise InputError(
            f"{target} has no image suffix, so its format is unknown",
            fix=f"end the file name with one of {', '.join(IMAGE_SUFFIXES)}",
        )
    folder = target.parent
    if not folder.is_dir():
        problem = "is not a folder" if folder.exists() else "does not exist"
        raise InputError(
            f"the folder of {target} ({folder}) {problem}",
            fix="create the folder first or choose another path",
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(
            f"the folder {folder} is not writable, so {target.name} cannot be written there",
            fix="choose a folder you can write to",
        )
    return target


def check_image_export() -> None:
    """Refuse when the kaleido package is not installed, naming the install command."""
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        raise ProbekitError(
            "no PNG/SVG/PDF images: missing the kaleido package",
            fix='pip install -e ".[png]", or pip install kaleido',
        )


def _browser_missing(err: Exception) -> bool:
    """Whether kaleido's error says it found no Chrome/Chromium to render with."""
    words = str(err)
    return type(err).__name__ == "ChromeNotFoundError" or (
        isinstance(err, RuntimeError) and "requires" in words and "Chrome" in words
    )


def _export(pio, copies, temps, sizes, missing: list[int]) -> None:
    """One kaleido export of the figures ``missing`` into their temporary files; a missing
    Chrome/Chromium is said as ``probekit diagnose`` says it."""
    widths, heights, scales = sizes
    try:
        pio.write_images(
            [copies[i] for i in missing],
            [str(temps[i]) for i in missing],
            width=[widths[i] for i in missing],
            height=[heights[i] for i in missing],
            scale=[scales[i] for i in missing],
        )
    except Exception as err:  # kaleido's error classes are private to it
        if _browser_missing(err):
            raise ProbekitError(
                "no PNG/SVG/PDF images: missing a Chrome/Chromium browser",
                fix="install one (e.g. apt-get install chromium, or run plotly_get_chrome)",
            ) from err
        raise


def write_images(
    figs: Sequence[go.Figure],
    paths: Sequence[str | os.PathLike],
    preset: str | None = None,
    dpi: int = 300,
) -> list[Path]:
    """:func:`write_image` of each figure to its path, all in one browser session (the
    caller's figures keep their sizes)."""
    import plotly.io as pio

    check_dpi(dpi)
    targets = [check_image_path(p) for p in paths]  # before anything is rendered
    if len(targets) != len(figs):
        raise InputError(
            f"{len(figs)} figures but {len(targets)} paths", fix="pass one path per figure"
        )
    if preset is not None:
        paper_size(preset)
    check_image_export()
    copies, widths, heights, scales = [], [], [], []
    for fig in figs:
        fig = go.Figure(fig)
        scale = 1.0
        if preset is not None:
            width, _ = paper_size(preset)
            resize(fig, width, aspect=PAPER_ASPECT)
            # exactly inches x dpi pixels wide (a quarter pixel over: the renderer rounds down)
            scale = (PAPER_WIDTHS[preset] * dpi + 0.25) / width
        copies.append(fig)
        widths.append(int(fig.layout.width or 1000))
        heights.append(int(fig.layout.height or 600))
        scales.append(scale)
    temps = [t.with_name(f".{t.stem}.{os.getpid()}.tmp{t.suffix}") for t in targets]
    try:
        missing = list(range(len(targets)))
        for attempt in range(KALEIDO_TRIES):
            try:
                _export(pio, copies, temps, (widths, heights, scales), missing)
            except Exception as err:
                if "kaleido_scopes" not in str(err) or attempt == KALEIDO_TRIES - 1:
                    raise
            missing = [i for i in missing if not _written(temps[i])]
            if not missing:
                break
        if missing:
            raise ProbekitError(
                f"the image export wrote no {', '.join(str(targets[i]) for i in missing)} "
                f"in {KALEIDO_TRIES} attempts (kaleido reports a figure it could not render "
                "by leaving it out)",
                fix="check that Chromium starts headless (plotly_get_chrome, or apt-get "
                "install chromium) and try again",
            )
        for temp, target in zip(temps, targets, strict=True):
            os.replace(temp, target)  # whole images only: a failed export leaves the old ones
    except OSError as err:
        raise InputError(
            f"could not write {', '.join(map(str, targets))} ({err.strerror or err})",
            fix="choose a folder you can write to, with free space",
        ) from err
    finally:
        for temp in temps:
            try:
                temp.unlink(missing_ok=True)
            except OSError:  # a clean-up that cannot run must not hide the error above
                pass
    return targets


KALEIDO_TRIES = 3
"""Attempts of one image export: kaleido's browser page can be asked to render before its
scripts have loaded on a loaded machine ("kaleido_scopes is not defined"), a start-up race
that a fresh attempt does not meet; and plotly's export returns without an error when kaleido
could not render a figure, leaving its file out, so a missing file is tried again too."""


def _written(path: Path) -> bool:
    """Whether the export left a non-empty file at ``path``."""
    return path.is_file() and path.stat().st_size > 0


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


def readable_labels(
    x: Sequence[float], y: Sequence[float], labels: Sequence[str], gap: float = 0.04
) -> list[str]:
    """``labels`` thinned so that no two shown ones overlap: a label is kept (in the given
    order) only when no kept label lies within ``gap`` of the plot's width and height of it;
    the others are ``""`` (the point stays, its hover still names it).

    Example:
        >>> readable_labels([0.0, 0.001, 1.0], [0.0, 0.0, 1.0], ["a", "b", "c"])
        ['a', '', 'c']
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    span_x = float(np.ptp(xs)) or 1.0
    span_y = float(np.ptp(ys)) or 1.0
    kept: list[tuple[float, float]] = []
    shown = []
    for px, py, label in zip(xs / span_x, ys / span_y, labels, strict=True):
        free = all(abs(px - qx) > gap or abs(py - qy) > 1.25 * gap for qx, qy in kept)
        shown.append(str(label) if free else "")
        if free:
            kept.append((px, py))
    return shown


def shade_second_half(fig: go.Figure, n_layers: int) -> go.Figure:
    """Shade the second half of the network (layers >= n_layers / 2) behind a layer profile."""
    fig.add_vrect(
        x0=(n_layers + 1) // 2 - 0.5,
        x1=n_layers - 0.5,
        fillcolor="#888888",
        opacity=0.08,
        line_width=0,
        annotation_text=AXES["second_half"],
        annotation_position="top left",
    )
    return fig


def overlap_axis(fig: go.Figure) -> go.Figure:
    """The secondary y axis of a lens figure: the top-k overlap, a fraction from 0 to 1."""
    return fig.update_yaxes(
        title_text=AXES["topk_overlap"],
        range=[0, 1.05],
        tickmode="linear",
        tick0=0,
        dtick=0.2,
        showgrid=False,
        secondary_y=True,
    )
