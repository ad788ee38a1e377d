"""The output measures are exact over the whole float range (issue 31, item 1): a logit rise
of 44 to 60 used to square past the float32 limit inside the ``prob_l2`` norm and return an
infinite change, which turned contributions' second-half share into 0 and skip_effects'
depth score into NaN."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import transformers
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import probekit
from probekit.analyses import common
from tests import reference as ref
from tests.conftest import VOCAB, hf_config, sample_tokens

F32 = {"width": 32, "allow_nan": False, "allow_infinity": False}


def _tolerance(name: str, vocab: int, d: torch.Tensor) -> float:
    """Allowed absolute error of the float32 path: ``prob_l2`` within its documented bound;
    the others within a few float32 roundings of the largest logit difference."""
    if name == "prob_l2":
        return common.prob_l2_error_bound(vocab)
    return 1e-5 * (1.0 + float(d.double().abs().max()))


@st.composite
def logit_pairs(draw):
    """Clean logits ``[1, n, V]`` and changed = clean + d, d per entry in [-1e4, 1e4] (often
    sparse: most entries 0, a few large, the shape of a single token's rise)."""
    vocab = draw(st.integers(2, 40))
    n = draw(st.integers(1, 3))
    clean = draw(st.lists(st.floats(-30, 30, **F32), min_size=n * vocab, max_size=n * vocab))
    big = st.floats(-1e4, 1e4, **F32)
    entry = st.one_of(st.just(0.0), big, st.floats(-70, 70, **F32))
    d = draw(st.lists(entry, min_size=n * vocab, max_size=n * vocab))
    labels = draw(st.lists(st.integers(-1, vocab - 1), min_size=n, max_size=n))
    z = torch.tensor(clean, dtype=torch.float32).view(1, n, vocab)
    zq = z + torch.tensor(d, dtype=torch.float32).view(1, n, vocab)
    y = torch.tensor([[v if v >= 0 else -100 for v in labels]])
    return z, zq, y


def _one_rise(rise: float, vocab: int = 4):
    z = torch.zeros(1, 1, vocab)
    zq = z.clone()
    zq[..., -1] = rise
    return z, zq, torch.tensor([[0]])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logit_pairs())
@example(_one_rise(50.0))
@example(_one_rise(44.5))
@example(_one_rise(59.9))
@example(_one_rise(1e4))
@example(_one_rise(-1e4))
def test_output_measures_match_a_float64_reference_from_minus_to_plus_1e4(pair):
    clean, changed, labels = pair
    want = ref.measures_log_space(clean, changed, labels)
    got = common.output_change(clean, changed, labels)
    d = changed - clean
    for name, values in got.items():
        assert torch.isfinite(values).all(), name
        err = float((values - want[name]).abs().max())
        assert err <= _tolerance(name, clean.shape[-1], d), (name, err)


@pytest.mark.parametrize("rise", [40.0, 45.0, 50.0, 55.0, 59.0, 60.0, 61.0])
def test_the_issue_example_measures_0_866(rise):
    # softmax(0, 0, 0, 0) against softmax(0, 0, 0, rise): |(1/4, 1/4, 1/4, -3/4)| = sqrt(3)/2
    out = common.output_change(
        torch.zeros(1, 1, 4), torch.tensor([[[0.0, 0.0, 0.0, rise]]]), torch.full((1, 1), -100)
    )
    assert float(out["prob_l2"]) == pytest.approx(3**0.5 / 2, abs=1e-6)


def test_non_finite_logits_are_a_numerical_error_not_an_infinite_measure():
    changed = torch.tensor([[[0.0, float("inf"), 0.0, 1.0]]])
    with pytest.raises(probekit.NumericalError, match="Fix:"):
        common.output_change(torch.zeros(1, 1, 4), changed, torch.tensor([[1]]))


def _one_direction_gpt2(scale: float = 100.0) -> transformers.GPT2LMHeadModel:
    """A tiny random GPT-2 whose (untied) unembedding rows all lie along one direction, scaled
    from -scale to +scale: skipping a layer moves every logit together, by up to ~60."""
    torch.manual_seed(0)
    config = hf_config("gpt2")
    config.tie_word_embeddings = False
    config._attn_implementation = "eager"
    hf = transformers.GPT2LMHeadModel(config).eval()
    g = torch.Generator().manual_seed(0)
    u = torch.randn(config.n_embd, generator=g)
    with torch.no_grad():
        hf.lm_head.weight.copy_(torch.linspace(-scale, scale, VOCAB)[:, None] * (u / u.norm()))
    return hf


def test_contributions_of_a_one_direction_unembedding_are_finite_and_right():
    hf = _one_direction_gpt2()
    tokens, mask = sample_tokens()
    labels = ref.labels_for("gpt2", tokens, mask)
    clean = ref.logits(hf, tokens, mask)
    want = []
    for layer in range(4):
        changed = ref.logits(ref.without_layer(hf, layer), tokens, mask)
        per_token = ref.measures_log_space(clean, changed, labels)["prob_l2"]
        want.append(ref.mean_over(per_token, mask.bool()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy "invalid value" warning either
        res = probekit.contributions(probekit.load(hf), (tokens, mask), components=("layer",))
    got = res.df[res.df.measure == "prob_l2"].sort_values("layer")["value"].to_numpy()
    assert np.isfinite(got).all()
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert res.summary["second_half_share"] == pytest.approx(sum(want[2:]) / sum(want), rel=1e-4)
    assert 0.3 < res.summary["second_half_share"] < 0.7


def test_skip_effects_of_a_one_direction_unembedding_have_a_finite_depth_score():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = probekit.skip_effects(probekit.load(_one_direction_gpt2()), sample_tokens())
    output = res.df[res.df.target == "output"]["value"].to_numpy()
    assert np.isfinite(output).all() and (output > 0).all()
    assert 0 <= res.summary["depth_score"] <= 3
    assert np.isfinite(res.summary["depth_score_normalized"])
