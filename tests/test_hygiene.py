"""Hook hygiene: after any analyzer, even one that raised midway, the model is untouched."""

from __future__ import annotations

import pytest
import torch

import probekit
from probekit.analyses import common
from probekit.model import Trace
from tests.conftest import make_hf, sample_tokens

ANALYZERS = {
    "contributions": lambda m, d: probekit.contributions(m, d),
    "skip_effects": lambda m, d: probekit.skip_effects(m, d),
    "residual_stats": lambda m, d: probekit.residual_stats(m, d),
    "gradient_norms": lambda m, d: probekit.gradient_norms(m, d),
    "logit_lens": lambda m, d: probekit.logit_lens(m, d),
    "layer_swaps": lambda m, d: probekit.layer_swaps(m, d, n_bootstrap=5),
}


def _hook_count(model) -> int:
    total = 0
    for module in model.bridge.modules():
        total += len(module._forward_hooks) + len(module._forward_pre_hooks)
        total += len(module._backward_hooks) + len(getattr(module, "_backward_pre_hooks", {}))
    return total


def model_snapshot(model, tokens, mask):
    logits = model.logits(tokens, mask)  # first: the bridge wires its own permanent hooks lazily
    return {
        "hooks": _hook_count(model),
        "order": [id(b) for b in model.blocks],
        "weights": {k: v.clone() for k, v in model.hf_model.state_dict().items()},
        "grads": [p.grad for p in model.hf_model.parameters()],
        "requires_grad": [p.requires_grad for p in model.hf_model.parameters()],
        "training": model.hf_model.training,
        "logits": logits,
    }


def fail_midway(monkeypatch, at: int) -> None:
    """Make the ``at``-th call of TokenMeans.add or Trace.run_module (together) raise: a
    failure inside an analysis's hooks and resumed forwards (``Trace.run_module`` runs every
    resumed block, one variant or stacked ones, through the bridge or the Hugging Face copies)."""
    calls = {"n": 0}
    original_add = common.TokenMeans.add
    original_call = Trace.run_module

    def tick() -> None:
        calls["n"] += 1
        if calls["n"] == at:
            raise RuntimeError("injected failure")

    def failing_add(self, *args, **kwargs):
        tick()
        return original_add(self, *args, **kwargs)

    def failing_call(self, *args, **kwargs):
        tick()
        return original_call(self, *args, **kwargs)

    monkeypatch.setattr(common.TokenMeans, "add", failing_add)
    monkeypatch.setattr(Trace, "run_module", failing_call)


def assert_model_unchanged(before, after):
    assert after["hooks"] == before["hooks"]
    assert after["order"] == before["order"]
    assert after["grads"] == before["grads"]
    assert after["requires_grad"] == before["requires_grad"]
    assert after["training"] == before["training"]
    for key, value in before["weights"].items():
        assert torch.equal(after["weights"][key], value), key
    assert torch.equal(after["logits"], before["logits"])  # bit-identical


@pytest.mark.parametrize("name", sorted(ANALYZERS))
def test_analyzer_leaves_model_untouched(name, arch):
    model = probekit.load(make_hf(arch))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    ANALYZERS[name](model, (tokens, mask))
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))


@pytest.mark.parametrize("name", sorted(ANALYZERS))
def test_analyzer_restores_model_after_exception(name, monkeypatch):
    """Inject a failure in the middle of the analysis (inside hooks and resumed forwards)."""
    model = probekit.load(make_hf("gpt2"))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    fail_midway(monkeypatch, at=3)
    with pytest.raises(RuntimeError, match="injected failure"):
        ANALYZERS[name](model, (tokens, mask))
    monkeypatch.undo()
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))
