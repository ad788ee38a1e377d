"""Several checkpoints side by side: ``probekit compare`` and ``probekit timeline``.

Each checkpoint gets its own full report (:func:`probekit.cluster.diagnose_many`, so the
``"local"`` and ``"ray"`` executors of a sweep apply), all on the same data, and one page sets
them side by side: the headline table (second-half share, depth score, permutable blocks in
words, where the logit lens forms the prediction, the loss), each checkpoint's warnings (its
verdict's: at chance, untrained), the zero-ablation contribution profiles overlaid, the
logit-lens KL profiles overlaid, and for a timeline the headline numbers over the checkpoints'
steps, one panel each. Models of different depths are drawn over relative depth
((layer + ½) ÷ layers), so a 12- and a 24-layer model share one axis.

Example:
    >>> import tempfile
    >>> from probekit.toy import toy_hf_model, toy_tokens
    >>> root = tempfile.mkdtemp()
    >>> for n in (2, 3):
    ...     toy_hf_model("gpt2", n_layers=n).save_pretrained(f"{root}/L{n}")
    >>> page = compare({"L2": f"{root}/L2", "L3": f"{root}/L3"}, toy_tokens(), f"{root}/out",
    ...                n_bootstrap=0)
    >>> page.name, sorted(p.name for p in page.parent.iterdir())
    ('index.html', ['L2', 'L3', 'diagnoses.csv', 'index.html'])
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from probekit import figures
from probekit.cluster import DiagnosesResult, diagnose_many
from probekit.errors import InputError, ProbekitError
from probekit.io import atomic_write_text, read_json
from probekit.page import figure_section, html_page, sub
from probekit.result import Result, layer_ranges
from probekit.sources import N_SEQUENCES, SEQ_LEN, locate, resolve, steps_of
from probekit.verdict import warnings_in
from probekit.words import COMPARISON_HEADINGS, figure_words

HEADLINES = tuple(
    (key, COMPARISON_HEADINGS[key], fmt)
    for key, fmt in (
        ("second_half_share", "{:.1%}"),
        ("depth_score", "{:.2f}"),
        ("prediction_formed_at_depth", "{}"),
        ("clean_loss", "{:.3f}"),
        ("n_layers", "{}"),
    )
)
"""Headline numbers of the comparison table: key, words, format."""


def compare(
    checkpoints: Mapping[str, str | os.PathLike],
    data: Any,
    out_dir: str | os.PathLike,
    *,
    timeline: bool = False,
    title: str = "probekit comparison",
    data_label: str = "",
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool = False,
    **options: Any,
) -> Path:
    """Diagnose every ``{name: checkpoint folder}`` on ``data`` (``options`` go to
    :func:`probekit.report.diagnose`), write each one's report into ``out_dir/<name>/`` and
    the side-by-side page ``out_dir/index.html``; with ``timeline``, the checkpoints are one
    run's (in order) and the page adds the headline numbers over their steps. Returns the
    page. A checkpoint that fails is listed with its error; the others go on."""
    if len(checkpoints) < 2:
        raise InputError(
            f"{len(checkpoints)} checkpoint(s) to compare", fix="pass two or more checkpoints"
        )
    return _compared(
        checkpoints,
        data,
        Path(out_dir),
        timeline=timeline,
        title=title,
        data_label=data_label,
        executor=executor,
        ray_address=ray_address,
        progress=progress,
        **options,
    )[0]


def _compared(
    checkpoints: Mapping[str, str | os.PathLike],
    data: Any,
    out: Path,
    *,
    timeline: bool,
    title: str,
    data_label: str,
    **options: Any,
) -> tuple[Path, dict[str, str]]:
    """:func:`compare`'s work: the page, and ``{name: error}`` of the checkpoints that failed."""
    if data_label:
        options.setdefault("data_source", data_label)
    table = diagnose_many(checkpoints, data, out, resume=False, **options)
    results = {name: _read_results(out / name) for name in table.df["name"]}
    warned = {name: read_warnings(out / name) for name in table.df["name"]}
    steps = steps_of(list(checkpoints)) if timeline else None
    page = comparison_page(
        table, results, title=title, steps=steps, data_label=data_label, warnings=warned
    )
    return atomic_write_text(out / "index.html", page), dict(table.summary.get("failed", {}))


def compare_checkpoints(
    checkpoints: Mapping[str, str],
    out_dir: str | os.PathLike,
    *,
    timeline: bool = False,
    text: str | None = None,
    dataset: Any = None,
    random_tokens: bool = False,
    n_sequences: int = N_SEQUENCES,
    seq_len: int = SEQ_LEN,
    **options: Any,
) -> tuple[Path, dict[str, str]]:
    """``probekit compare``/``timeline``'s work: every checkpoint checked
    (:func:`check_checkpoints`), the data :func:`~probekit.sources.resolve` picks for the
    first checkpoint (``text``, ``dataset``, ``random_tokens``; they must share its
    vocabulary), then :func:`compare` on it at its positions (``options``: :func:`compare`'s;
    ``dtype`` and ``storage`` load each checkpoint, see :func:`probekit.load`). Returns the page and
    ``{name: error}`` of the checkpoints whose diagnosis failed (listed on the page too)."""
    check_checkpoints(checkpoints)
    first = resolve(
        *locate(next(iter(checkpoints.values()))),
        text=text,
        dataset=dataset,
        random=random_tokens,
        n_sequences=n_sequences,
        seq_len=seq_len,
        device="cpu",
        dtype=options.get("dtype") or "stored",
        storage=options.get("storage", "auto"),
    )
    title = "probekit timeline" if timeline else "probekit comparison"
    return _compared(
        checkpoints,
        first.data,
        Path(out_dir),
        timeline=timeline,
        title=title,
        data_label=first.description,
        positions=first.positions,
        **options,
    )


def check_checkpoints(checkpoints: Mapping[str, str | os.PathLike]) -> None:
    """Refuse, before any work, a checkpoint that :func:`probekit.load` would refuse before
    reading its weights (:func:`probekit.model.check_loadable`: a plain file, a missing or bad
    config.json, missing or truncated weights, an unsupported architecture), and checkpoints of
    different vocabularies."""
    from probekit.model import check_loadable

    for folder in checkpoints.values():
        check_loadable(folder)
    _check_vocabularies(checkpoints)


def _check_vocabularies(checkpoints: Mapping[str, str | os.PathLike]) -> None:
    """Refuse checkpoints whose config.json give different vocabulary sizes (the same tokens
    would mean different things)."""
    sizes = {}
    for name, folder in checkpoints.items():
        try:
            config = json.loads((Path(folder) / "config.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and isinstance(config.get("vocab_size"), int):
            sizes[name] = config["vocab_size"]
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} {size}" for name, size in sizes.items())
        raise InputError(
            f"the checkpoints have different vocabularies ({listed})",
            fix="compare checkpoints of one tokenizer, or diagnose each on its own",
        )


def _read_results(folder: Path) -> dict[str, Result]:
    """The contributions and logit lens a report in ``folder`` saved (none if it failed)."""
    found = {}
    for name in ("contributions", "logit_lens", "layer_swaps"):
        if (folder / f"{name}.json").is_file():
            found[name] = Result.load(folder / f"{name}.json")
    return found


def read_warnings(folder: Path) -> list[str]:
    """The warnings of the report in ``folder``: the verdict lines of its summary.json that
    warn (:func:`~probekit.verdict.warnings_in`: at chance, untrained); none without one."""
    try:  # as diagnose_many reads it: a pipe or a file too big is no report
        summary = read_json(folder / "summary.json", 2**26, "a report's summary.json")
    except (OSError, ProbekitError):
        return []
    verdict = summary.get("verdict") if isinstance(summary, dict) else None
    if not isinstance(verdict, list):
        return []
    return warnings_in([line for line in verdict if isinstance(line, str)])


def headline_table(table: DiagnosesResult) -> pd.DataFrame:
    """One row per checkpoint in words: the headline numbers, the permutable blocks as layer
    ranges, and a link to its report."""
    rows = []
    for _, row in table.df.iterrows():
        entry = {"checkpoint": row["name"]}
        if row["status"] != "ok":
            entry["status"] = row["status"]
            rows.append(entry)
            continue
        for key, words, fmt in HEADLINES:
            value = row.get(key)
            entry[words] = "n/a" if value is None or pd.isna(value) else fmt.format(value)
        rows.append(entry)
    return pd.DataFrame(rows)


def _headline_measure(result: Result) -> str:
    """The measure a contributions result leads with (its summary's), else its first."""
    return str(result.summary.get("measure") or result.df["measure"].iloc[0])


def _contribution_profile(result: Result) -> tuple[Any, Any, int, float]:
    """Whole-layer contributions of the headline measure: layers, values, layer count, and
    the offset of a layer's point on a relative-depth axis (its middle)."""
    df = result.df
    part = df[(df["component"] == "layer") & (df["measure"] == _headline_measure(result))]
    return part["layer"].to_numpy(), part["value"], part["layer"].nunique(), 0.5


def _lens_profile(result: Result) -> tuple[Any, Any, int, float]:
    """The logit lens's KL per depth: depths, values, layer count (the deepest depth), 0."""
    part = result.df[result.df["measure"] == "kl"].sort_values("depth")
    return part["depth"].to_numpy(), part["value"], max(int(part["depth"].max()), 1), 0.0


def _overlay(
    results: Mapping[str, Mapping[str, Result]],
    analysis: str,
    profile: Any,
    figure: str,
    y_title: str,
) -> go.Figure:
    """One line per checkpoint of ``profile(result)`` (index, values, layers, offset) of its
    ``analysis``; over relative depth ((index + offset) ÷ layers) when the checkpoints differ
    in depth, else over the index; in the words of ``figure`` in
    :data:`~probekit.words.FIGURES`."""
    profiles = {n: profile(found[analysis]) for n, found in results.items() if analysis in found}
    relative = len({profile[2] for profile in profiles.values()}) > 1
    fig = go.Figure()
    for i, (name, (x, y, n_layers, offset)) in enumerate(profiles.items()):
        x = (x + offset) / n_layers if relative else x
        color = figures.PALETTE[i % len(figures.PALETTE)]
        fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers", line={"color": color}))
    x_title = figure_words(figure, "x_relative" if relative else "x")
    figures.base_layout(fig, figure_words(figure), x_title, y_title)
    if not relative:
        most = max((profile[2] for profile in profiles.values()), default=1)
        figures.integer_axis(fig, "x", n=most)
    return fig


def contribution_overlay(results: Mapping[str, Mapping[str, Result]]) -> go.Figure:
    """Each checkpoint's zero-ablation contribution of whole layers, one line each."""
    measure = next(
        (_headline_measure(f["contributions"]) for f in results.values() if "contributions" in f),
        "value",
    )
    return _overlay(
        results,
        "contributions",
        _contribution_profile,
        "contribution_overlay",
        figures.words(measure),
    )


def lens_overlay(results: Mapping[str, Mapping[str, Result]]) -> go.Figure:
    """Each checkpoint's logit-lens KL from the final prediction per depth, one line each."""
    return _overlay(
        results,
        "logit_lens",
        _lens_profile,
        "lens_overlay",
        figure_words("lens_overlay", "y"),
    )


TIMELINE_PANELS: tuple[tuple[str, str, str, str, bool, bool], ...] = tuple(
    # key, panel title in words, y title in units, marker, ticks in percent, 0 in view
    (key, COMPARISON_HEADINGS[key], figure_words("depth_use_timeline", key), marker, pct, zero)
    for key, marker, pct, zero in (
        ("second_half_share", "circle", True, True),
        ("depth_score", "diamond", False, False),
    )
)
"""The timeline's panels, one measure each, top to bottom (the words of
:data:`~probekit.words.COMPARISON_HEADINGS`)."""


def timeline_figure(table: DiagnosesResult, steps: Sequence[int | None]) -> go.Figure:
    """The second-half share and the depth score over the checkpoints' steps (their order
    where a step cannot be read from the path), one panel each over a shared x axis: each
    measure titled in words, on its own y axis in its own units, with round ticks, so neither
    line hides the other."""
    from plotly.subplots import make_subplots

    ok = table.df["status"] == "ok"
    known = [int(s) for s in steps if s is not None]
    use_steps = len(known) == len(steps)
    x = known if use_steps else list(range(len(steps)))
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.16,
        subplot_titles=[panel[1] for panel in TIMELINE_PANELS],
    )
    for row, (key, words, y_title, marker, percent, from_zero) in enumerate(TIMELINE_PANELS, 1):
        values = table.df[key] if key in table.df else [None] * len(x)
        y = [v if good and pd.notna(v) else None for v, good in zip(values, ok, strict=True)]
        color = figures.PALETTE[row - 1]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                name=words,
                mode="lines+markers",
                line={"color": color},
                marker={"symbol": marker, "size": 9, "color": color},
                showlegend=False,
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=y_title, row=row, col=1)
        figures.round_axis(fig, y, row=row, col=1, percent=percent, from_zero=from_zero)
    figures.base_layout(fig, figure_words("depth_use_timeline"), height=560)
    span = max(x) - min(x) if x else 0
    figures.integer_axis(fig, "x", n=max(span, 1), tickformat=",d")
    x_title = figure_words("depth_use_timeline", "x" if use_steps else "x_order")
    fig.update_xaxes(title_text=x_title, row=2, col=1)
    return fig.update_annotations(x=0, xanchor="left")  # panel titles over the y axis


def comparison_page(
    table: DiagnosesResult,
    results: Mapping[str, Mapping[str, Result]],
    *,
    title: str,
    steps: Sequence[int | None] | None = None,
    data_label: str = "",
    warnings: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The side-by-side page: what data, the headline table with links, each checkpoint's
    ``warnings`` ({name: lines}, :func:`read_warnings`) counted in the table and listed under
    it, the overlays."""
    warnings = {n: list(w) for n, w in (warnings or {}).items() if w}
    words = headline_table(table)
    words["permutable blocks"] = [_blocks(results.get(n, {})) for n in table.df["name"]]
    if warnings:
        words["warnings"] = [_warning_count(n, warnings.get(n, [])) for n in table.df["name"]]
    words["report"] = [
        f"<a href='{html.escape(n)}/report.html'>report</a>" if s == "ok" else ""
        for n, s in zip(table.df["name"], table.df["status"], strict=True)
    ]
    figs = [contribution_overlay(results), lens_overlay(results)]
    if steps is not None:
        figs.insert(0, timeline_figure(table, steps))
    body = (
        (sub(f"Data: {data_label}") if data_label else "")
        + words.to_html(index=False, escape=False, border=0, na_rep="")
        + _warning_list(warnings)
        + "".join(figure_section(fig) for fig in figs)
    )
    return html_page(title, body)


def _warning_count(name: str, lines: Sequence[str]) -> str:
    """A table cell: how many warnings a checkpoint has, linked to them under the table."""
    if not lines:
        return "none"
    count = "1 warning" if len(lines) == 1 else f"{len(lines)} warnings"
    return f"<a href='#warnings-{html.escape(name)}'>{count}</a>"


def _warning_list(warnings: Mapping[str, Sequence[str]]) -> str:
    """Each checkpoint's warnings under the table, one item each (nothing without any)."""
    if not warnings:
        return ""
    items = "".join(
        f"<li id='warnings-{html.escape(name)}'><strong>{html.escape(name)}</strong>: "
        f"{html.escape(line)}</li>"
        for name, lines in warnings.items()
        for line in lines
    )
    return f"<div class='warnings'><strong>Warnings</strong><ul>{items}</ul></div>"


def _blocks(found: Mapping[str, Result]) -> str:
    """A checkpoint's permutable blocks as people write layer ranges."""
    swaps = found.get("layer_swaps")
    if swaps is None:
        return "n/a"
    return layer_ranges(swaps.summary["blocks"])


__all__ = [
    "check_checkpoints",
    "compare",
    "compare_checkpoints",
    "comparison_page",
    "headline_table",
    "read_warnings",
    "timeline_figure",
]
