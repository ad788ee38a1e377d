"""The depth-curse benchmark end to end with tiny settings (slow: trains three models)."""

from __future__ import annotations

import json
import math

import pytest
from safetensors.torch import load_file


@pytest.mark.slow
def test_quick_depth_curse(tmp_path):
    from benchmarks.depth_curse import main

    results = main(["--quick", "--out", str(tmp_path), "--threads", "1"])
    L = results["settings"]["layers"]
    for name in ("static", "lns", "midas"):
        r = results[name]
        assert 0 < r["second_half_share"] < 1
        assert r["val_loss"] < 5.6  # below the uniform-byte loss ln(259) = 5.56
        assert len(r["layer_share"]) == L and sum(r["layer_share"]) == pytest.approx(1, abs=1e-4)
        assert len(r["skip_matrix"]) == L and all(len(row) == L for row in r["skip_matrix"])
        assert r["permutable_blocks"][0][0] == 0 and r["permutable_blocks"][-1][1] == L
        for lens in ("logit", "tuned"):
            assert len(r[f"{lens}_lens_kl"]) == L + 1 and r[f"{lens}_lens_kl"][-1] < 1e-9
            assert 0 <= r[f"{lens}_lens_first_agreeing_depth"] <= L
            assert math.isfinite(r[f"{lens}_lens_mean_kl"])
        assert r["tuned_lens_overlap_sequences"] == 0  # fit on train, measured on validation
    assert results["midas"]["train_flops"] < results["static"]["train_flops"]
    assert results["lns"]["train_flops"] == results["static"]["train_flops"]  # same tokens
    assert results["lns"]["val_loss"] != results["static"]["val_loss"]  # another model
    folded = load_file(str(tmp_path / "lns" / "final" / "model.safetensors"))
    unscaled = load_file(str(tmp_path / "lns" / "final" / "layernorm_scaling.safetensors"))
    name = f"transformer.h.{L - 1}.ln_1.weight"
    ratio = (folded[name] / unscaled[name]).mean().item()
    assert ratio == pytest.approx(1 / math.sqrt(L), rel=1e-6)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["lns"]["second_half_share"] == pytest.approx(results["lns"]["second_half_share"])
    assert (tmp_path / "contributions.png").stat().st_size > 1000
    assert (tmp_path / "lens.png").stat().st_size > 1000
