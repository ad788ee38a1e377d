"""Hook-free resumes through pure Hugging Face copies of the blocks (issue 16, item 6).

:attr:`probekit.model.Model.block_path` is ``"hf"`` when hook-free block runs of a Trace call
a copy of the Hugging Face block that shares the bridge block's weights; these tests check that
the copies give the bridge's numbers (within 1e-6), share its tensors, leave hooked blocks to
the bridge, and are refused when they differ or accelerate hooks sit on the model."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import probekit
from probekit.interventions import reorder_layers
from probekit.model.hf_blocks import RAW_BLOCKS_ENV, HFBlocks
from tests.conftest import family_tokens, hf_config, make_family

CASES = ("gpt2", "llama", "bert", "bloom", "gpt2-headless", "bert-headless")
"""Learned positions, rotary, an encoder, ALiBi, and base models without a head."""


def _load(case: str, n_layers: int = 3) -> probekit.Model:
    family, _, headless = case.partition("-")
    if not headless:
        return probekit.load(make_family(family, n_layers))
    config = hf_config(family, n_layers)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return probekit.load(transformers.AutoModel.from_config(config).eval())


def _trace(model: probekit.Model) -> probekit.model.Trace:
    tokens, mask = family_tokens(length=8)
    [batch] = model.prepare((tokens % 50, mask))
    return model.trace(batch)


def _within(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-6) -> bool:
    got, want = got.double(), want.double()
    return bool((got - want).abs().max() <= tol * max(1.0, float(want.abs().max())))


class _Counter:
    """Counts the calls of every HF copy of ``model`` (a hook on the copy, not the bridge)."""

    def __init__(self, model: probekit.Model) -> None:
        self.calls: dict[int, int] = {}
        hf = model.hf_blocks
        assert hf is not None
        self.handles = [
            hf.copies[id(block)].register_forward_pre_hook(self._count(layer))
            for layer, block in enumerate(model.blocks)
        ]

    def _count(self, layer: int):
        def hook(module, args):
            self.calls[layer] = self.calls.get(layer, 0) + 1

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _variants(trace):
    """Resumes of every kind: from each start with a changed residual, and a swap order."""
    n = trace.runtime.n_layers
    starts = list(range(n))
    residuals = [0.5 * trace.residuals[s] + 0.1 for s in starts]
    single = [trace.resume(s, r) for s, r in zip(starts, residuals, strict=True)]
    single.append(trace.resume(0, order=[1, 0, *range(2, n)]))
    stacked = trace.resume_stacked(starts, residuals)
    stacked += trace.resume_stacked([0, 1], orders=[[1, 0, *range(2, n)], None])
    return single + stacked


@pytest.mark.parametrize("case", CASES)
def test_hf_blocks_give_the_bridge_numbers(case):
    model = _load(case)
    assert model.block_path == "hf"
    trace = _trace(model)
    counter = _Counter(model)
    try:
        fast = _variants(trace)
    finally:
        counter.remove()
    assert all(counter.calls.get(layer, 0) > 0 for layer in range(model.n_layers))
    model.raw_blocks = False
    assert model.block_path == "bridge (Model.raw_blocks is False)"
    slow = _variants(trace)
    assert all(_within(a, b) for a, b in zip(fast, slow, strict=True))
    assert not all(torch.equal(a, fast[0]) for a in fast)  # the variants differ


@pytest.mark.parametrize("case", ["gpt2", "llama"])
def test_copies_share_the_weights(case):
    model = _load(case)
    model.block_path  # noqa: B018  (builds the copies)
    hf = model.hf_blocks
    params = {id(p) for p in model.hf_model.parameters()}
    pointers = {p.data_ptr() for p in model.hf_model.parameters()}
    for block in model.blocks:
        copy = hf.copies[id(block)]
        assert copy is not block.original_component
        assert not any(isinstance(m, type(block)) for m in copy.modules())  # no bridge in it
        own = list(copy.parameters())
        assert own and all(id(p) in params for p in own)  # the same Parameter objects
        assert {p.data_ptr() for p in own} <= pointers
        for name, buffer in copy.named_buffers():
            assert buffer.data_ptr() == block.original_component.get_buffer(name).data_ptr()


def test_hooked_blocks_run_through_the_bridge():
    model = _load("gpt2")
    trace = _trace(model)
    seen = []
    zero = lambda t, hook: torch.zeros_like(t)  # noqa: E731
    hooks = [
        ("blocks.1.attn.hook_out", zero),
        ("blocks.2.hook_out", lambda t, hook: seen.append(2)),
    ]
    counter = _Counter(model)
    try:
        got = trace.resume(0, fwd_hooks=hooks)
    finally:
        counter.remove()
    assert seen == [2]  # the hook in the resumed part fired
    assert counter.calls == {0: 1}  # only the hook-free block ran as an HF copy
    assert torch.allclose(got, model.forward(trace.batch, hooks), atol=1e-5)
    model.raw_blocks = False
    assert _within(got, trace.resume(0, fwd_hooks=hooks))
    model.raw_blocks = True
    # a plain torch hook on a Hugging Face module inside the bridge block is honoured too
    handle = model.blocks[0].original_component.mlp.register_forward_hook(lambda m, i, o: o * 0)
    try:
        assert model.raw_block(model.blocks[0]) is None
        assert model.raw_block(model.blocks[1]) is not None
        edited = trace.resume(0)
    finally:
        handle.remove()
    assert not torch.allclose(edited, trace.logits, atol=1e-3)
    model.hf_model.train()
    try:
        assert model.raw_block(model.blocks[1]) is None  # dropout would differ
    finally:
        model.hf_model.eval()
    assert model.raw_block(model.blocks[1]) is not None


class _Shifted(nn.Module):
    """An HF block copy whose output is moved by ``shift`` (a copy that is not exact)."""

    def __init__(self, inner: nn.Module, shift: float) -> None:
        super().__init__()
        self.inner, self.shift = inner, shift

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        return (out[0] + self.shift, *out[1:]) if isinstance(out, tuple) else out + self.shift


def test_a_copy_that_differs_falls_back_to_the_bridge():
    model = _load("llama")
    hf = HFBlocks.build(model.runtime)
    block = model.blocks[1]
    hf.copies[id(block)] = _Shifted(hf.copies[id(block)], 1e-4)
    model.hf_blocks = hf
    assert model.block_path.startswith("bridge (the Hugging Face copy of block 1 differs")
    trace = _trace(model)
    fast = trace.resume(0, 0.5 * trace.residuals[0])
    model.raw_blocks = False
    assert torch.equal(fast, trace.resume(0, 0.5 * trace.residuals[0]))


def test_accelerate_hooks_and_the_switch_keep_the_bridge(monkeypatch):
    from accelerate.hooks import ModelHook, add_hook_to_module

    model = _load("gpt2")
    model.hf_blocks = None
    add_hook_to_module(model.hf_model.lm_head, ModelHook())
    assert model.block_path == "bridge (accelerate device_map / offload hooks on the model)"
    monkeypatch.setenv(RAW_BLOCKS_ENV, "0")
    assert _load("gpt2").block_path == "bridge (Model.raw_blocks is False)"


def test_reordered_blocks_keep_their_own_copies():
    model = _load("llama", n_layers=4)
    trace = _trace(model)
    with reorder_layers(model, [2, 0, 3, 1]):
        fast = trace.resume(0)
        model.raw_blocks = False
        slow = trace.resume(0)
        model.raw_blocks = True
    assert _within(fast, slow)
    assert not torch.allclose(fast, trace.logits, atol=1e-3)
