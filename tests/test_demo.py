"""`probekit demo --quick`: the whole pipeline end to end on tiny settings."""

from __future__ import annotations

import json

from probekit.cli import main


def test_quick_demo_writes_every_report(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out), "--quiet", "--no-images"]) == 0
    index = (out / "index.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    for name in ("symmetric", "inferential"):
        assert f'href="{name}/report.html"' in index
        assert summary[name]["solution"] in ("inferential", "symmetric", "other", "memorizing")
        assert 0 <= summary[name]["second_half_share"] <= 1
        page = (out / name / "report.html").read_text()
        assert "Solution:" in page and "second half of the network" in page
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
