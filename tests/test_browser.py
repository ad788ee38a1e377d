"""The HTML reports in a real browser (headless Chromium): no console error, every figure
rendered, no figure title clipped, covered by the toolbar or run into its plot, no figure
wider than its section or the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from probekit.cli import main
from probekit.toy import toy_hf_model
from tests.browser import figure_problems, open_page

OFFLINE_SITE_ERRORS = ("fonts.googleapis.com", "search/search_index.js")


@pytest.fixture(scope="module")
def gpt2_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    toy_hf_model("gpt2", n_layers=4).save_pretrained(root / "ckpt")
    assert main(["diagnose", str(root / "ckpt"), "--out", str(root / "report"), "--quiet"]) == 0
    return root / "report" / "report.html"


def test_a_diagnosis_report_renders_cleanly(gpt2_report):
    figures, errors = open_page(gpt2_report)
    assert errors == []
    assert len(figures) == 7  # contributions, skip effects, swaps, residual, lens, gradients,
    # layer similarity
    assert figure_problems(figures) == []


def test_the_checker_sees_a_covered_and_a_clipped_title(tmp_path):
    import plotly.graph_objects as go

    long = "a title long enough to run under the toolbar " * 3
    pages = []
    for name, title in (
        ("covered", {"text": long, "x": 0.02, "y": 0.99, "yanchor": "top"}),
        ("clipped", {"text": long + long, "x": 0.02, "y": 1.0, "yanchor": "bottom"}),
    ):
        fig = go.Figure(go.Bar(x=[0, 1], y=[1, 2]))
        fig.update_layout(title=title, width=600, margin_t=40)
        fig.write_html(tmp_path / f"{name}.html", include_plotlyjs=True)
        pages.append(" ".join(figure_problems(open_page(tmp_path / f"{name}.html")[0])))
    assert "the toolbar covers the title" in pages[0]
    assert "the title is clipped" in pages[1]


def test_the_checker_sees_a_figure_wider_than_its_box_or_the_page(tmp_path):
    import plotly.graph_objects as go

    found = []
    for name, width in (("box", 900), ("page", 1700)):
        fig = go.Figure(go.Bar(x=[0, 1], y=[1, 2]))
        fig.update_layout(title="short", width=width, height=300, margin_t=80)
        plot = fig.to_html(full_html=False, include_plotlyjs=True)
        page = f"<html><body><section style='width: 600px'>{plot}</section></body></html>"
        (tmp_path / f"{name}.html").write_text(page)
        found.append(" ".join(figure_problems(open_page(tmp_path / f"{name}.html")[0])))
    assert "runs out of its box" in found[0] and "wider than the page" not in found[0]
    assert "wider than the page" in found[1]


@pytest.mark.parametrize("preset", ["one-column", "two-column"])
def test_paper_presets_fit_every_title(gpt2_report, tmp_path, preset):
    import struct

    from probekit import figures
    from probekit.result import Result

    folder = gpt2_report.parent
    paper_width, _ = figures.paper_size(preset)
    parts = []
    names = ("contributions", "skip_effects", "layer_swaps", "residual", "logit_lens")
    loaded = [Result.load(folder / f"{name}.json").figure() for name in names]
    pngs = figures.write_images(loaded, [tmp_path / f"{n}.png" for n in names], preset, dpi=300)
    for fig, png in zip(loaded, pngs, strict=True):
        width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the PNG header
        assert width == round(figures.PAPER_WIDTHS[preset] * 300)
        assert width * figures.PAPER_ASPECT / 2 < height < width * 1.6
        figures.resize(fig, paper_width, aspect=figures.PAPER_ASPECT)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=not parts))
    (tmp_path / "figures.html").write_text("<html><body>" + "".join(parts) + "</body></html>")
    figs, errors = open_page(tmp_path / "figures.html")
    assert errors == [] and len(figs) == 5
    assert figure_problems(figs) == []


def test_an_export_retries_kaleidos_start_up_race_and_a_left_out_image(monkeypatch, tmp_path):
    """kaleido's start-up race raises; a figure it could not render is silently left out by
    plotly's export: both are tried again, any other error is not, and images are swapped in
    whole (a failed export keeps the old file)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from probekit import figures
    from probekit.errors import ProbekitError

    calls = []

    def export(behaviour):
        def fake(figs, files, **kwargs):
            calls.append(list(files))
            outcome = behaviour(len(calls))
            if isinstance(outcome, Exception):
                raise outcome
            for file in files[:outcome]:
                Path(file).write_bytes(b"png")

        monkeypatch.setattr(pio, "write_images", fake)

    bar = go.Figure(go.Bar(x=[0], y=[1]))
    export(lambda n: RuntimeError("ReferenceError: kaleido_scopes is not defined") if n == 1 else 9)
    figures.write_image(bar, tmp_path / "a.png")
    assert len(calls) == 2 and (tmp_path / "a.png").read_bytes() == b"png"

    calls.clear()
    export(lambda n: 1)  # each call renders only its first figure: the second is tried again
    figures.write_images([bar, bar], [tmp_path / "b.png", tmp_path / "c.png"])
    assert len(calls) == 2 and calls[1] == [calls[0][1]]
    assert (tmp_path / "c.png").is_file()

    calls.clear()
    (tmp_path / "d.png").write_bytes(b"old")
    export(lambda n: 0)  # never rendered: one ProbekitError, the old image kept, no leftovers
    with pytest.raises(ProbekitError, match="wrote no"):
        figures.write_image(bar, tmp_path / "d.png")
    assert len(calls) == figures.KALEIDO_TRIES and (tmp_path / "d.png").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png", "c.png", "d.png"]

    export(lambda n: ValueError("another problem"))
    with pytest.raises(ValueError, match="another problem"):
        figures.write_image(bar, tmp_path / "e.png")


def test_a_tutorial_page_of_the_docs_site_draws_its_figures(tmp_path):
    """The docs site, built as CI builds it, shows a tutorial's committed figures, drawn by the
    plotly.js that docs/hooks.py adds (no network: nothing is fetched from a CDN)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    figures, errors = open_page(tmp_path / "notebooks" / "03_diagnose_a_checkpoint" / "index.html")
    # offline from a file:// URL: the theme's web fonts and its search index do not load
    errors = [e for e in errors if not any(s in e["message"] for s in OFFLINE_SITE_ERRORS)]
    assert errors == []
    assert len(figures) == 8  # seven analyses of a GPT-2 model (the token lens too), one encoder
    assert figure_problems(figures) == []  # each drawn, fitting the text column
