"""`probekit demo --quick`: the whole pipeline end to end on tiny settings."""

from __future__ import annotations

import json

import probekit.demo as demo
from probekit.cli import main
from tests.browser import figure_problems, open_page


def test_quick_demo_writes_every_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo, "QUICK_STEPS", 20)  # the documented quick run trains longer
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--no-images"]) == 0
    captured = capsys.readouterr()
    for phase in ("training", "symmetric: probes", "inferential: depth diagnosis", " s)"):
        assert phase in captured.err, phase
    assert "data = accuracy on seen anchor pairs" in captured.err
    assert "symmetric model:" in captured.out and "- Solution:" in captured.out
    index = (out / "index.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "Smoke run" in index and "class='cards'" in index
    assert index.count("plotly-graph-div") == 2 and (out / "plotly.min.js").is_file()
    for name in ("symmetric", "inferential"):
        assert f"href='{name}/report.html'" in index
        assert summary[name]["solution"] in ("inferential", "symmetric", "other", "memorizing")
        assert 0 <= summary[name]["second_half_share"] <= 1
        page = (out / name / "report.html").read_text()
        assert "Solution:" in page and "second half of the network" in page
        assert "Smoke run" in page and 'src="../plotly.min.js"' in page
        assert "plotly.js v" not in page  # the library is read from the demo's one copy
        measured = json.loads((out / name / "summary.json").read_text())["measured"]
        assert measured["checkpoint"].startswith("runs") and measured["n_bootstrap"] == 10
        for analysis in (
            "solutions",
            "attention_knockout",
            "probes",
            "condensation",
            "embedding_map",
            "contributions",
            "layer_swaps",
        ):
            assert (out / name / f"{analysis}.json").is_file(), analysis
    # the same pages in a real browser: no console error, every figure drawn, no title clipped
    for page in (out / "index.html", out / "symmetric" / "report.html"):
        figures, errors = open_page(page)
        assert errors == [], page
        assert len(figures) == (2 if page.name == "index.html" else 12), page  # + similarity
        assert figure_problems(figures) == [], page


def test_analyse_reads_the_run_folder_once(tmp_path, monkeypatch):
    """The demo's analysis of one checkpoint reads its run once (the task, the data and its
    positions from one :func:`probekit.sources.resolve`), and diagnoses the data the run's
    task gives, at the answer position."""
    from probekit.sources import default_data
    from tests.runs import anchor_run, count_run_reads

    run, task = anchor_run(tmp_path)
    reads = count_run_reads(monkeypatch)
    checkpoint = run / "checkpoint"
    done = demo.analyse(checkpoint, tmp_path / "report", "a run", n_bootstrap=0)
    assert [str(path) for path in reads] == [str(checkpoint)]
    expected, positions = default_data(checkpoint)
    measured = done["diagnosis"].meta
    assert (measured["positions"], measured["n_sequences"]) == (positions, task.n_test)
    assert measured["n_sequences"] == len(expected["input_ids"])
