"""``gradient_norms`` never holds every block's weight gradients at once: each weight's norm is
taken the moment the last batch's backward has accumulated its gradient, which is then freed, so
with one batch at most one weight's gradient is alive at any time (a float32 load, and weights
kept in bf16 and computed in float32, whose gradients go to the stored tensors)."""

from __future__ import annotations

import pytest
import torch

import probekit
from probekit.analyses.depth import gradients
from probekit.toy import toy_hf_model, toy_model, toy_tokens

ARCHS = ("gpt2", "llama")


def _stored(arch: str, folder) -> probekit.Model:
    toy_hf_model(arch, n_layers=3, seed=1).to(torch.bfloat16).save_pretrained(folder)
    return probekit.load(folder, device="cpu", storage="stored")


def _alive_counts(model: probekit.Model, monkeypatch) -> list[int]:
    """The number of the model's parameters holding a gradient each time a weight's hook runs
    (before it frees that weight's gradient)."""
    counts: list[int] = []
    params = list(model.hf_model.parameters())
    hook = gradients.WeightNorms.hook

    def counting(self, layer: int, name: str):
        fn = hook(self, layer, name)

        def wrapped(param: torch.Tensor) -> None:
            counts.append(sum(p.grad is not None for p in params))
            fn(param)

        return wrapped

    monkeypatch.setattr(gradients.WeightNorms, "hook", counting)
    return counts


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("storage", ["float32", "stored"])
def test_at_most_one_weight_gradient_is_alive(arch, storage, tmp_path, monkeypatch):
    model = toy_model(arch, n_layers=3) if storage == "float32" else _stored(arch, tmp_path)
    counts = _alive_counts(model, monkeypatch)
    res = gradients.gradient_norms(model, toy_tokens(2, 6))
    # at least one hook per stored weight of every block (GPT-2's fused c_attn gets its
    # gradients through its q, k, v views)
    assert len(counts) >= 3 * len(model.layer_weights(0))
    assert max(counts) == 1  # the one whose hook runs: every other one is freed or not yet made
    assert (res.profile("grad_norm") > 0).all()
    assert all(p.grad is None for p in model.hf_model.parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_several_batches_take_the_norm_of_the_summed_gradient(arch):
    model = toy_model(arch, n_layers=2)
    tokens = toy_tokens(3, 6)
    whole = gradients.gradient_norms(model, tokens).df.value.to_numpy()
    split = gradients.gradient_norms(model, tokens, batch_size=1).df.value.to_numpy()
    assert split == pytest.approx(whole, rel=1e-5)
    assert all(p.grad is None for p in model.hf_model.parameters())


def test_one_backward_batch_when_it_holds_less_than_the_gradient_sums(monkeypatch):
    """Split batches hold every block's gradient sums (74 KB in this toy); a backward of 8
    tokens holds less (7 KB a token), so the gradients run them as one batch, while 32 tokens
    hold more and stay split; the norms are those of the split run."""
    from probekit.model import inputs

    model = toy_model("llama", n_layers=2)
    monkeypatch.setattr(inputs, "OUTPUT_BATCH_BYTES", 1)  # every forward batch: one sequence
    small, large = toy_tokens(2, 4), toy_tokens(4, 8)
    assert len(model.prepare(small)) == 2 and len(model.prepare(large)) == 4
    assert len(model.prepare(small, backward=True)) == 1
    assert len(model.prepare(large, backward=True)) == 4
    whole = probekit.gradient_norms(model, small).df.value.to_numpy()
    split = probekit.gradient_norms(model, small, batch_size=1).df.value.to_numpy()
    assert whole == pytest.approx(split, rel=1e-5)
