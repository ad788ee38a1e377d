"""A shortened static-versus-MIDAS comparison, end to end (slow: trains two models)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_quick_growth_comparison(tmp_path):
    from benchmarks.growth_comparison import main

    results = main(["--quick", "--out", str(tmp_path), "--threads", "1"])
    for name in ("static", "midas"):
        r = results[name]
        assert 0 < r["second_half_share"] < 1
        assert r["val_loss"] < 5.6  # below the uniform-byte loss ln(259) = 5.56
        assert r["permutable_blocks"][0][0] == 0 and r["permutable_blocks"][-1][1] == 4
    assert results["midas"]["train_flops"] < results["static"]["train_flops"]
    assert 0 < results["flops_saving"] < 1
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["static"]["val_loss"] == pytest.approx(results["static"]["val_loss"])
    assert (tmp_path / "timeline.html").is_file()
