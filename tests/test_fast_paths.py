"""The fast paths of issue 16: chunked float32 output measures against the float64 formulas,
the per-diagnosis cache (no variant twice, same numbers), stacked variants against one at a
time, autocast, and the all-pairs swap estimate."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import probekit
from probekit.analyses import common
from probekit.analyses.depth import swaps as swaps_module
from probekit.analyses.depth.shared import Shared
from probekit.errors import InputError
from probekit.report import diagnose
from tests import reference as ref
from tests.conftest import make_family, make_hf, sample_tokens


def _logits(vocab: int, scale: float, eps: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randn(3, 70, vocab, generator=g) * scale  # 210 tokens: two chunks of 128
    changed = clean + torch.randn(clean.shape, generator=g) * eps
    labels = torch.randint(0, vocab, (3, 70), generator=g)
    labels[0, -5:] = -100
    return clean, changed, labels


@pytest.mark.parametrize("eps", [1.0, 0.3, 1e-3])
def test_chunked_measures_match_the_float64_formulas(eps):
    clean, changed, labels = _logits(4000, 5.0, eps)
    want = ref.measures(clean, changed, labels)
    want["loss_delta"] = torch.where(labels != -100, want["loss_delta"], 0.0)
    side = common.clean_side(clean, labels)
    got = common.output_change(side, changed, labels)
    for name, values in got.items():
        assert values.dtype == torch.float64
        err = float((values - want[name]).abs().max())
        scale = float(want[name].abs().max())
        # float32 logits carry ~1e-7 relative error; the measures keep it there
        assert err <= 1e-6 * max(scale, 1e-3), (name, err, scale)
    direct = common.output_change(clean, changed, labels)  # its clean side built inside
    assert all(torch.equal(got[name], direct[name]) for name in got)


def test_a_subset_of_measures_equals_the_full_computation():
    clean, changed, labels = _logits(600, 4.0, 0.5)
    side = common.clean_side(clean, labels)
    full = common.output_change(side, changed, labels)
    for subset in (("loss_delta",), ("kl", "prob_l2"), ("logit_l2",)):
        got = common.output_change(side, changed, labels, measures=subset)
        assert sorted(got) == sorted(subset)
        assert all(torch.equal(got[name], full[name]) for name in subset)
    with pytest.raises(ValueError, match="unknown"):
        common.output_change(side, changed, labels, measures=("entropy",))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_all_finite_agrees_with_the_elementwise_test(dtype):
    from probekit.numerics import all_finite

    huge = 1e308 if dtype == torch.float64 else 3e38
    big = torch.full((300, 500), huge, dtype=dtype)
    cases = [torch.randn(300, 500).to(dtype), big]  # finite; finite whose sum overflows
    for bad in (float("nan"), float("inf"), -float("inf")):
        spoiled = torch.randn(300, 500).to(dtype)
        spoiled[123, 45] = bad
        cases.append(spoiled)
    mixed = torch.zeros(10).to(dtype)
    mixed[0], mixed[1] = float("inf"), -float("inf")  # their sum is NaN, so is the verdict
    cases.append(mixed)
    for tensor in cases:
        assert all_finite(tensor) == bool(torch.isfinite(tensor).all())


def test_the_head_writes_into_out_bit_identically_and_yields_to_hooks():
    model = _model("gpt2")
    [batch] = model.prepare(sample_tokens())
    trace = model.trace(batch)
    residual = trace.residuals[-1]
    out = torch.full((*residual.shape[:-1], model.d_vocab), float("nan"))
    with torch.no_grad():
        plain = model.bridge.unembed(model.bridge.ln_final(residual))
        fast = model.head(residual, out)
    assert fast.data_ptr() == out.data_ptr() and torch.equal(fast, plain)
    assert torch.allclose(fast, trace.logits, rtol=1e-6, atol=1e-7)

    def shift(tensor, hook):
        return tensor + 1.0

    out.fill_(float("nan"))
    with torch.no_grad(), model.hooks([("unembed.hook_out", shift)]):
        hooked = model.head(residual, out)
    assert hooked.data_ptr() != out.data_ptr() and torch.equal(hooked, plain + 1.0)
    wrong_shape = torch.empty(1, model.d_vocab)
    with torch.no_grad():
        assert torch.equal(model.head(residual, wrong_shape), plain)
    with torch.enable_grad():
        with_grad = model.head(residual.clone().requires_grad_(True), out)
    assert with_grad.requires_grad and with_grad.data_ptr() != out.data_ptr()


def test_measures_reuse_their_work_tensors_without_carrying_anything_over():
    clean, changed, labels = _logits(300, 4.0, 0.5)
    side = common.clean_side(clean, labels)
    other = changed.flip(0)
    first = common.output_change(side, changed, labels)
    second = common.output_change(side, other, labels)  # the same work tensors again
    assert len(side.work_buffers) == 1
    for got, fresh in ((first, changed), (second, other)):
        want = common.output_change(common.clean_side(clean, labels), fresh, labels)
        for name in want:
            assert torch.equal(got[name], want[name]), name
    few = common.clean_side(clean[:, :3], labels[:, :3])  # fewer tokens than a chunk
    assert few.work(common.CHUNK_TOKENS).shape[1] == few.logits.shape[0]


def test_identical_outputs_measure_exactly_zero():
    clean, _, labels = _logits(300, 4.0, 0.0)
    side = common.clean_side(clean, labels)
    for name, values in common.output_change(side, clean.clone(), labels).items():
        assert float(values.abs().max()) == 0.0, name


def test_huge_logit_changes_take_the_float64_path_and_stay_exact():
    clean, changed, labels = _logits(200, 300.0, 40.0)  # e^d overflows float32
    want = common.output_change_float64(
        clean.reshape(-1, 200), changed.reshape(-1, 200), labels.reshape(-1)
    )
    got = common.output_change(clean, changed, labels)
    for name, values in got.items():
        assert torch.isfinite(values).all(), name
        assert torch.allclose(values.reshape(-1), want[name], rtol=1e-6, atol=1e-6), name


def test_lens_measures_match_the_float64_formulas():
    from probekit.analyses.depth.lens import lens_measures

    layer, final, _ = _logits(500, 3.0, 2.0)
    got = lens_measures(layer, final, 5)
    logp, logq = layer.double().log_softmax(-1), final.double().log_softmax(-1)
    want = (logp.exp() * (logp - logq)).sum(-1)
    assert torch.allclose(got["kl"], want, rtol=1e-6, atol=1e-7)


def _model(arch: str = "gpt2", n_layers: int = 4):
    if arch == "bloom":  # ALiBi: a [batch * heads, 1, T] argument to repeat per variant
        return probekit.load(make_family(arch, n_layers=n_layers))
    return probekit.load(make_hf(arch, n_layers=n_layers))


def _values(res) -> np.ndarray:
    return res.df["value"].to_numpy(float)


def test_a_shared_cache_runs_each_skip_once_and_changes_no_number():
    model = _model()
    data = sample_tokens()
    alone = [probekit.contributions(model, data), probekit.skip_effects(model, data)]
    cache = Shared(model)
    shared = [
        probekit.contributions(model, data, cache=cache),
        probekit.skip_effects(model, data, cache=cache),
    ]
    assert cache.runs == {"traces": 1, "skips": model.n_layers, "swaps": 0}
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_allclose(_values(a), _values(b), rtol=0, atol=1e-12)


def test_a_shared_cache_traces_no_batch_again_for_variants_it_holds():
    model, data = _model(), sample_tokens()
    alone = [
        probekit.skip_effects(model, data, batch_size=2),
        probekit.layer_swaps(model, data, batch_size=2, n_bootstrap=0),
    ]
    cache = Shared(model)
    probekit.contributions(model, data, batch_size=2, cache=cache)
    probekit.layer_swaps(model, data, batch_size=2, n_bootstrap=0, cache=cache)
    assert cache.runs["traces"] == 6  # 3 batches of 2, each traced once per analysis
    shared = [
        probekit.skip_effects(model, data, batch_size=2, cache=cache),
        probekit.layer_swaps(model, data, batch_size=2, n_bootstrap=0, cache=cache),
    ]
    assert cache.runs["traces"] == 6  # skips, swaps, clean costs and norms all held
    for a, b in zip(alone, shared, strict=True):
        np.testing.assert_allclose(_values(a), _values(b), rtol=0, atol=1e-12)


def test_a_cache_belongs_to_one_model():
    cache = Shared(_model())
    with pytest.raises(InputError, match="another model"):
        probekit.skip_effects(_model(), sample_tokens(), cache=cache)
    with pytest.raises(InputError, match="variants_per_pass"):
        Shared(_model(), variants_per_pass=0)
    with pytest.raises(InputError, match="autocast"):
        Shared(_model(), autocast="fp8")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bloom"])
def test_stacked_variants_equal_one_at_a_time(arch):
    model = _model(arch)
    data = sample_tokens(pad=False)
    results = {}
    future_at_4 = probekit.InterventionSetting(mode="future", answer_start=[4] * 6)
    for per_pass in (1, 3):
        cache = Shared(model, variants_per_pass=per_pass)
        results[per_pass] = [
            probekit.contributions(model, data, cache=cache, components=["layer"]),
            probekit.skip_effects(model, data, cache=cache, setting=future_at_4),
            probekit.layer_swaps(model, data, pairs="all", n_bootstrap=0, cache=cache),
        ]
    for a, b in zip(results[1], results[3], strict=True):
        np.testing.assert_allclose(_values(a), _values(b), rtol=1e-6, atol=1e-6)


def test_stacked_resume_equals_resume_per_variant():
    model = _model("llama")
    [batch] = model.prepare(sample_tokens())
    trace = model.trace(batch)
    order = [0, 2, 1, 3]
    finals = trace.resume_stacked([1, 0, 2], [trace.residuals[0], None, None], [None, order, None])
    want = [trace.resume(1, trace.residuals[0]), trace.resume(0, order=order), trace.logits]
    for final, logits in zip(finals, want, strict=True):
        assert torch.allclose(model.head(final), logits, atol=1e-5)
    with pytest.raises(InputError, match="remaining positions"):
        trace.resume_stacked([1], orders=[[1, 2]])


def test_autocast_runs_on_cpu_with_float32_measures():
    model = _model()
    data = sample_tokens()
    exact = probekit.contributions(model, data, components=["layer"])
    cache = Shared(model, autocast="bf16")
    half = probekit.contributions(model, data, components=["layer"], cache=cache)
    assert cache.trace(model.prepare(data)[0]).logits.dtype == torch.bfloat16
    values = _values(half)
    assert np.isfinite(values).all()
    np.testing.assert_allclose(values, _values(exact), rtol=0.1, atol=0.05)


def test_all_pairs_swaps_print_an_estimate_first(monkeypatch, capsys):
    monkeypatch.setattr(swaps_module, "ESTIMATE_ABOVE", 3)  # all: 6, adjacent: 3
    model = _model()
    probekit.layer_swaps(model, sample_tokens(), pairs="all", n_bootstrap=0)
    err = capsys.readouterr().err
    assert "6 swap variants" in err and "block passes" in err
    probekit.layer_swaps(model, sample_tokens(), pairs="adjacent", n_bootstrap=0)
    assert capsys.readouterr().err == ""


def test_diagnose_stacks_variants_when_asked():
    model = _model()
    data = sample_tokens()
    a = diagnose(model, data, n_bootstrap=2)
    b = diagnose(model, data, n_bootstrap=2, variants_per_pass=4)
    for name in ("contributions", "skip_effects", "layer_swaps", "logit_lens"):
        np.testing.assert_allclose(
            _values(a.results[name]), _values(b.results[name]), rtol=1e-6, atol=1e-6
        )


def test_default_batches_bound_the_output_and_keep_the_numbers(monkeypatch):
    """Without batch_size a batch is split so that one batch's float32 output stays within
    OUTPUT_BATCH_BYTES (here lowered to two sequences' worth of a toy model's logits), and
    every number equals the one-batch diagnosis."""
    from probekit.model import inputs as model_module
    from probekit.toy import TOY_VOCAB, toy_model, toy_tokens

    model = toy_model(n_layers=3)
    tokens = toy_tokens(7, 12)
    monkeypatch.setattr(model_module, "OUTPUT_BATCH_BYTES", 2 * 12 * TOY_VOCAB * 4)
    batches = model.prepare(tokens)
    assert [b.tokens.shape[0] for b in batches] == [2, 2, 2, 1]
    assert len(model.prepare(tokens, batch_size=7)) == 1  # a given batch_size is kept
    split = diagnose(model, tokens, n_bootstrap=0)
    whole = diagnose(model, tokens, n_bootstrap=0, batch_size=7)
    assert split.meta["sequences_per_batch"] == 2 and whole.meta["sequences_per_batch"] == 7
    for name, result in whole.results.items():
        a, b = result.df, split.results[name].df
        assert list(a.columns) == list(b.columns) and len(a) == len(b), name
        for column in a.columns:
            if pd.api.types.is_float_dtype(a[column]):
                np.testing.assert_allclose(
                    b[column], a[column], rtol=1e-5, atol=1e-7, err_msg=f"{name} {column}"
                )
            else:
                assert a[column].equals(b[column]), f"{name} {column}"


def test_prob_l2_stays_within_its_stated_bound_on_peaky_outputs():
    """A GPT-2 whose unembedding is scaled up so that its top token takes nearly all the
    probability (as a trained LM's does): skipping each layer raises some logits by up to
    EXP_SAFE on the float32 path, and prob_l2 stays within prob_l2_error_bound of the
    float64 formula on the same logits."""
    import transformers

    vocab = 8192
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=4, n_head=4, n_positions=64, bos_token_id=0,
        eos_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(200.0)
    model = probekit.load(hf)
    tokens = torch.randint(0, vocab, (2, 64), generator=torch.Generator().manual_seed(1))
    [batch] = model.prepare(tokens)
    trace = model.trace(batch)
    clean = trace.logits.float()
    assert float(clean.softmax(-1).amax(-1).median()) > 0.99  # peaky
    worst, rises = 0.0, []
    for layer in range(model.n_layers):
        changed = trace.resume(layer + 1, trace.residuals[layer]).float()
        got = common.output_change(clean, changed, batch.labels, measures=("prob_l2",))
        want = common.output_change_float64(
            clean.reshape(-1, vocab), changed.reshape(-1, vocab), batch.labels.reshape(-1)
        )["prob_l2"]
        worst = max(worst, float((got["prob_l2"].reshape(-1) - want).abs().max()))
        rise = (changed - clean).amax(-1).reshape(-1)
        rises.append(rise[rise <= common.EXP_SAFE])
    assert float(torch.cat(rises).max()) > 40  # the float32 path met large rises
    assert 0 < worst <= common.prob_l2_error_bound(vocab)
    assert worst <= 1e-6  # the typical size the docs give (measured here: 2e-7)
