"""Half precision: checkpoints load in their stored dtype, measures accumulate in float64 and
agree with the float32 copy within the docs' stated tolerance, nothing overflows to NaN."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import probekit
from probekit.errors import UnsupportedModelError
from tests.conftest import family_tokens, make_family

HALF = (torch.bfloat16, torch.float16)
TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}
"""Largest difference to the float32 copy, as a fraction of the measure's largest value over
layers, or for loss differences of 1% of the clean loss where that is larger (docs, "Half
precision"); post-norm models (BERT) get twice as much."""


def _load(hf, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return probekit.load(hf, **kwargs)


@pytest.mark.parametrize("dtype", HALF)
def test_checkpoints_load_in_their_stored_dtype(tmp_path, dtype):
    make_family("llama").to(dtype).save_pretrained(tmp_path / "ckpt")
    model = probekit.load(tmp_path / "ckpt", device="cpu")
    assert model.dtype == dtype
    assert probekit.load(tmp_path / "ckpt", device="cpu", dtype=torch.float32).dtype == (
        torch.float32
    )
    make_family("llama").save_pretrained(tmp_path / "f32")
    assert probekit.load(tmp_path / "f32", device="cpu").dtype == torch.float32


def test_stored_dtype_falls_back_to_the_config(tmp_path):
    from probekit.model import stored_dtype

    assert stored_dtype(tmp_path, {"torch_dtype": "bfloat16"}) == torch.bfloat16
    assert stored_dtype(tmp_path, {"dtype": "float16"}) == torch.float16
    assert stored_dtype(tmp_path, {"dtype": "int8"}) == torch.float32
    assert stored_dtype(tmp_path, {}) == torch.float32


def _measures(model, data) -> tuple[float, dict]:
    res = probekit.layer_swaps(model, data, n_bootstrap=5)
    swaps = res.df
    return res.summary["clean_loss"], {
        "contributions": probekit.contributions(model, data).df,
        "residual": probekit.residual_stats(model, data).df,
        "skips": probekit.skip_effects(model, data).df.pipe(lambda d: d.assign(measure=d.target)),
        "lens": probekit.logit_lens(model, data).df,
        "swaps": swaps[swaps.kind == "layer_swap"].assign(measure="loss_delta"),
    }


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["gpt2", "llama", "gemma2", "bert"])
def test_half_precision_numbers_agree_with_float32(name, dtype):
    hf = make_family(name, scale=3.0)
    data = family_tokens(batch=8, seed=3)
    clean_loss, want = _measures(_load(hf), data)
    model = _load(hf, dtype=dtype)
    assert model.dtype == dtype
    _, got = _measures(model, data)
    tol = TOLERANCE[dtype] * (2 if name == "bert" else 1)
    for analysis, df in want.items():
        other = got[analysis]
        for measure, part in df.groupby("measure"):
            a = part.value.to_numpy(float)
            b = other.loc[part.index, "value"].to_numpy(float)
            assert np.isfinite(b[np.isfinite(a)]).all(), (analysis, measure)
            ok = np.isfinite(a)
            if measure == "topk_overlap":  # a count: one token of the top 10 may swap places
                assert np.abs(a[ok] - b[ok]).max() <= 0.1 + 1e-9
                continue
            floor = 0.01 * clean_loss if measure == "loss_delta" else 1e-6
            scale = max(np.abs(a[ok]).max(), floor)
            assert np.abs(a[ok] - b[ok]).max() <= tol * scale, (analysis, measure)


def test_large_logits_in_float16_give_finite_measures():
    hf = make_family("llama")
    with torch.no_grad():  # logits of several thousand: exp() overflows float16 (and bfloat16
        hf.lm_head.weight.mul_(3000.0)  # would lose them) unless measures leave half precision
    model = _load(hf, dtype=torch.float16)
    data = family_tokens()
    [batch] = model.prepare(data)
    assert model.forward(batch).abs().max() > 1000
    for res in (
        probekit.contributions(model, data),
        probekit.logit_lens(model, data),
        probekit.skip_effects(model, data),
        probekit.layer_swaps(model, data, n_bootstrap=5),
        probekit.residual_stats(model, data),
    ):
        values = res.df.value.to_numpy(float)
        assert np.isfinite(values).all(), res.kind


def test_a_dtype_the_device_cannot_run_is_refused(monkeypatch):
    linear = torch.nn.functional.linear

    def cpu_without_half(x, *args, **kwargs):
        if x.dtype == torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return linear(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", cpu_without_half)
    with pytest.raises(UnsupportedModelError, match="cannot run this model in torch.float16"):
        _load(make_family("llama"), dtype=torch.float16)
    assert _load(make_family("llama"), dtype=torch.float32).dtype == torch.float32
