"""Interventions against physical edits of plain Hugging Face copies of the same model."""

from __future__ import annotations

import pytest
import torch

import probekit
from probekit import interventions as iv
from probekit.errors import InputError, UnsupportedModelError
from tests import reference as ref
from tests.conftest import make_hf, sample_tokens, twin

ATOL = 1e-5


def _setup(arch, scale=1.0):
    hf = make_hf(arch, scale=scale)
    plain = twin(hf)
    return probekit.load(hf), plain, *sample_tokens()


def _close(a, b, mask):
    valid = mask.bool()
    return torch.allclose(a[valid], b[valid], atol=ATOL)


@pytest.mark.parametrize("layer", [0, 2, 3])
def test_skip_by_hooks_equals_deleting_the_layer(arch, layer):
    model, plain, tokens, mask = _setup(arch)
    with iv.skip_layer(model, layer):
        hooked = model.logits(tokens, mask)
    deleted = ref.logits(ref.without_layer(plain, layer), tokens, mask)
    assert _close(hooked, deleted, mask)
    assert not _close(hooked, ref.logits(plain, tokens, mask), mask)  # it did change something
    [batch] = model.prepare((tokens, mask))
    trace = model.trace(batch)
    assert _close(trace.resume(layer + 1, trace.residuals[layer]), deleted, mask)


@pytest.mark.parametrize("pair", [(0, 1), (1, 3)])
def test_swap_equals_model_with_swapped_weights(arch, pair):
    model, plain, tokens, mask = _setup(arch)
    i, j = pair
    order = list(range(4))
    order[i], order[j] = order[j], order[i]
    want = ref.logits(ref.with_order(plain, order), tokens, mask)
    with iv.swap_layers(model, i, j):
        got = model.logits(tokens, mask)
    assert _close(got, want, mask)
    [batch] = model.prepare((tokens, mask))
    trace = model.trace(batch)
    assert _close(trace.resume(i, order=order[i:]), want, mask)


def test_block_swap_equals_reordered_weights(arch):
    model, plain, tokens, mask = _setup(arch)
    order = iv.swapped_order(4, (0, 1), (2, 4))
    assert order == [2, 3, 1, 0]
    with iv.swap_blocks(model, (0, 1), (2, 4)):
        got = model.logits(tokens, mask)
    assert _close(got, ref.logits(ref.with_order(plain, order), tokens, mask), mask)


@pytest.mark.parametrize("sublayer", ["attn", "mlp"])
def test_zero_ablation_equals_plain_hook(arch, sublayer):
    model, plain, tokens, mask = _setup(arch)
    with iv.ablate(model, 1, sublayer):
        got = model.logits(tokens, mask)
    with ref.silenced(plain, arch, 1, sublayer):
        want = ref.logits(plain, tokens, mask)
    assert _close(got, want, mask)
    assert not _close(got, ref.logits(plain, tokens, mask), mask)


def test_mean_ablation_uses_the_mean_update():
    model, plain, tokens, mask = _setup("gpt2")
    means = iv.sublayer_means(model, (tokens, mask))
    outs = []
    handle = plain.transformer.h[2].mlp.register_forward_hook(lambda m, a, o: outs.append(o))
    ref.logits(plain, tokens, mask)
    handle.remove()
    valid = mask.bool()
    assert torch.allclose(means[(2, "mlp")], outs[0][valid].mean(0), atol=1e-5)
    with iv.ablate(model, 2, "mlp", mode="mean", data=(tokens, mask)):
        got = model.logits(tokens, mask)
    handle = plain.transformer.h[2].mlp.register_forward_hook(
        lambda m, a, o: means[(2, "mlp")].expand_as(o)
    )
    want = ref.logits(plain, tokens, mask)
    handle.remove()
    assert _close(got, want, mask)


def test_interventions_restore_even_after_an_exception(arch):
    model, plain, tokens, mask = _setup(arch)
    before = model.logits(tokens, mask)
    blocks_before = list(model.blocks)
    for make in (
        lambda: iv.skip_layer(model, [0, 2]),
        lambda: iv.ablate(model, 1, "attn"),
        lambda: iv.swap_layers(model, 0, 3),
        lambda: iv.swap_blocks(model, (0, 2), (2, 4)),
        *([lambda: iv.knock_out(model, 1, [(-1, 0)])] if model.supports_pattern_edits else []),
    ):
        with pytest.raises(RuntimeError, match="boom"):
            with make():
                model.logits(tokens, mask)
                raise RuntimeError("boom")
        assert list(model.blocks) == blocks_before
        assert torch.equal(model.logits(tokens, mask), before)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: iv.skip_layer(m, 7), "outside the model's 4 layers"),
        (lambda m: iv.ablate(m, 0, "ffn"), "unknown sublayer"),
        (lambda m: iv.ablate(m, 0, "mlp", mode="mean"), "needs data"),
        (lambda m: iv.swap_layers(m, 1, 1), "with itself"),
        (lambda m: iv.reorder_layers(m, [0, 0, 1, 2]), "not a permutation"),
        (lambda m: iv.swap_blocks(m, (0, 3), (2, 4)), "non-overlapping"),
        (lambda m: iv.knock_out(m, 4, [(-1, 0)]), "outside the model's 4 layers"),
        (lambda m: iv.knock_out(m, 0, [(-1, 0)], head=4), "outside the model's 4 heads"),
        (lambda m: iv.knock_out(m, 0, [(-1, 0)], mode="zero"), "unknown knockout mode"),
    ],
)
def test_bad_interventions(call, match):
    model = probekit.load(make_hf("gpt2"))
    with pytest.raises(InputError, match=match):
        with call(model):
            pass


def test_knock_out_refuses_models_that_discard_pattern_edits():
    model = probekit.load(make_hf("bert"))
    with pytest.raises(UnsupportedModelError, match="ignores edits of the attention pattern"):
        with iv.knock_out(model, 0, [(-1, 0)]):
            pass


def test_resume_from_a_cached_residual(arch):
    model, plain, tokens, mask = _setup(arch)
    [batch] = model.prepare((tokens, mask))
    trace = model.trace(batch)
    patched = trace.residuals[2] + 0.5 * torch.randn_like(trace.residuals[2])
    with iv.resume_from(model, 2, patched):
        got = model.logits(tokens, mask)
    assert _close(got, trace.resume(2, patched), mask)
    assert not _close(got, trace.logits, mask)
    assert torch.equal(model.logits(tokens, mask), trace.logits)  # restored
    with pytest.raises(InputError, match="cached residual has shape"):
        with iv.resume_from(model, 1, patched[:2]):
            model.logits(tokens, mask)


@pytest.mark.parametrize("sublayer", ["attn", "mlp"])
def test_ablation_at_chosen_positions_leaves_the_others(arch, sublayer):
    model, _, tokens, mask = _setup(arch)
    at = torch.zeros(tokens.shape, dtype=torch.bool)
    at[:, 2:] = True
    clean = model.logits(tokens, mask)
    with iv.ablate(model, 1, sublayer, at=at):
        got = model.logits(tokens, mask)
    with iv.ablate(model, 1, sublayer):
        everywhere = model.logits(tokens, mask)
    if model.is_causal:  # positions before the ablated ones see nothing of it
        assert torch.allclose(got[:, :2], clean[:, :2], atol=ATOL)
    assert not _close(got, clean, mask)
    at[:] = True
    with iv.ablate(model, 1, sublayer, at=at):
        assert _close(model.logits(tokens, mask), everywhere, mask)
    with pytest.raises(InputError, match="zero ablation"):
        with iv.ablate(model, 1, sublayer, mode="mean", data=(tokens, mask), at=at):
            pass


def test_the_intervention_setting_is_checked_when_made_and_resolved_per_model():
    setting = probekit.InterventionSetting(mode="future", answer_start=[torch.tensor(9), [4, 5]])
    assert setting.answer_start == ((9,), (4, 5))
    assert hash(setting) == hash(
        probekit.InterventionSetting("probekit", "future", None, 4, 123, ((9,), (4, 5)))
    )
    with pytest.raises(InputError, match="unknown convention"):
        probekit.InterventionSetting(convention="paper")
    model = probekit.load(make_hf("gpt2"))
    resolved = setting.resolved(model)
    assert (resolved.keep_first, resolved.component_positions) == (False, "shared")
    assert resolved.resolved(model) == resolved
    with pytest.raises(InputError, match="is not an InterventionSetting"):
        probekit.skip_effects(model, sample_tokens()[0], setting="csordas2025")
