"""Token masking, attention-edge knockout and information flow, against plain references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probekit
from probekit.analyses.mechanisms.flow import information_flow
from probekit.analyses.mechanisms.knockout import attention_knockout
from probekit.analyses.mechanisms.masking import mask_tokens, token_masking
from probekit.anchor import AnchorTask
from probekit.errors import InputError, UnsupportedModelError
from probekit.interventions import knock_out
from probekit.result import Result
from tests.conftest import anchor_gpt2, hf_blocks, make_hf, sample_tokens, twin
from tests.test_hygiene import assert_model_unchanged, fail_midway, model_snapshot

DECODERS = ("gpt2", "llama")


def _plain_attention_out_replaced(ref, arch, layer, tokens, pos, value_fn):
    """Plain HF logits with the attention module's output at ``pos`` replaced."""
    block = hf_blocks(ref)[layer]
    attn = getattr(block, "attn", None) or block.self_attn

    def hook(mod, args, kwargs, out):
        o = out[0].clone()
        o[:, pos] = value_fn(attn, o[:, pos])
        return (o,) + tuple(out[1:])

    handle = attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            return ref(input_ids=tokens, use_cache=False).logits
    finally:
        handle.remove()


def _bias(attn, like):
    proj = getattr(attn, "c_proj", None) or attn.o_proj
    return torch.zeros_like(like) if proj.bias is None else proj.bias.expand_as(like)


@pytest.mark.parametrize("arch", DECODERS)
def test_blocking_every_source_removes_the_attention_update(arch):
    """Knocking out all edges into the last token at layer l == that layer's attention output
    at the last position reduced to its bias (zero in bias-free Llama), in a plain HF model."""
    hf = make_hf(arch, n_layers=3, scale=3.0)
    ref = twin(hf)
    model = probekit.load(hf)
    tokens, _ = sample_tokens(pad=False)
    t = tokens.shape[1]
    clean = model.logits(tokens)
    for layer in range(3):
        with knock_out(model, layer, [(-1, s) for s in range(t)]):
            got = model.logits(tokens)
        want = _plain_attention_out_replaced(ref, arch, layer, tokens, -1, _bias)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        assert (got - clean).abs().max() > 1e-3  # the edit did something
        torch.testing.assert_close(got[:, :-1], clean[:, :-1])  # earlier positions untouched
    # the analyzer's 'all' column reports the same effect on the target's probability
    res = attention_knockout(model, tokens, targets=tokens[:, 0])
    p0 = clean[:, -1].double().softmax(-1)
    for layer in range(3):
        want = _plain_attention_out_replaced(ref, arch, layer, tokens, -1, _bias)
        p1 = want[:, -1].double().softmax(-1)
        delta = (p1 - p0).gather(-1, tokens[:, :1]).mean().item()
        row = res.df[(res.df.layer == layer) & (res.df.source == "all") & (res.df.group == "all")]
        assert row[row.measure == "p_target_delta"].value.item() == pytest.approx(delta, abs=1e-6)


@pytest.mark.parametrize("arch", DECODERS)
def test_single_edges_add_up_to_all_edges_and_heads_are_separate(arch):
    """Pattern mode removes A[q,s] v_s W_O per edge: the removals sum to the all-edge removal;
    a one-head knockout changes only that head's output."""
    model = probekit.load(make_hf(arch, n_layers=2))
    tokens, _ = sample_tokens(pad=False)
    t = tokens.shape[1]
    layer = 1
    seen = {}

    def keep(name):
        def fn(tensor, hook):
            seen[name] = tensor.detach().clone()

        return fn

    hooks = [
        (f"blocks.{layer}.attn.hook_out", keep("out")),
        (f"blocks.{layer}.attn.hook_z", keep("z")),
    ]
    [batch] = model.prepare(tokens)
    model.forward(batch, hooks)
    clean_out, clean_z = seen["out"], seen["z"]
    removed = torch.zeros_like(clean_out[:, -1])
    for s in range(t):
        with knock_out(model, layer, [(-1, s)]):
            model.forward(batch, hooks)
        removed += clean_out[:, -1] - seen["out"][:, -1]
    with knock_out(model, layer, [(-1, s) for s in range(t)]):
        model.forward(batch, hooks)
    torch.testing.assert_close(removed, clean_out[:, -1] - seen["out"][:, -1], atol=1e-5, rtol=0)
    with knock_out(model, layer, [(-1, 2)], head=1):
        model.forward(batch, hooks)
    changed = (seen["z"][:, -1] - clean_z[:, -1]).abs().amax(dim=(0, 2))  # per head
    assert changed[1] > 0
    assert changed[[0, 2, 3]].max() == 0


@pytest.mark.parametrize("arch", DECODERS)
def test_scores_mode_renormalises(arch):
    model = probekit.load(make_hf(arch, n_layers=2))
    tokens, _ = sample_tokens(pad=False)
    [batch] = model.prepare(tokens)
    seen = {}

    def keep(tensor, hook):
        seen["p"] = tensor.detach().clone()

    model.forward(batch, [("blocks.0.attn.hook_pattern", keep)])
    clean = seen["p"][:, :, -1]
    with knock_out(model, 0, [(-1, 3)], mode="scores"):
        model.forward(batch, [("blocks.0.attn.hook_pattern", keep)])
    want = clean.clone()
    want[..., 3] = 0
    want = want / want.sum(-1, keepdim=True)
    torch.testing.assert_close(seen["p"][:, :, -1], want, atol=1e-6, rtol=1e-5)
    with pytest.raises(InputError, match="mode='pattern'"):
        with knock_out(model, 0, [(0, 0)], mode="scores"):
            model.forward(batch)
    assert torch.equal(model.forward(batch), model.forward(batch))  # no hook left behind


def test_knockout_refuses_models_that_discard_pattern_edits():
    with pytest.raises(UnsupportedModelError, match="ignores edits of the attention pattern"):
        attention_knockout(make_hf("bert", n_layers=2), sample_tokens(pad=False)[0])


@pytest.mark.parametrize("arch", DECODERS)
def test_token_masking_matches_plain_substitution(arch):
    hf = make_hf(arch, n_layers=2, scale=3.0)
    ref = twin(hf)
    tokens, mask = sample_tokens()
    targets = torch.arange(6) + 3
    res = token_masking(hf, (tokens, mask), mode="mask", mask_token=7, targets=targets)
    with torch.no_grad():
        clean = ref(input_ids=tokens, attention_mask=mask).logits
    last = mask.cumsum(-1).argmax(-1)
    rows = torch.arange(6)
    p0 = clean[rows, last].double().softmax(-1)[rows, targets]
    for pos in (0, 3, 6):
        masked = tokens.clone()
        masked[:, pos] = 7
        with torch.no_grad():
            out = ref(input_ids=masked, attention_mask=mask).logits
        p1 = out[rows, last].double().softmax(-1)[rows, targets]
        keep = pos < last  # only positions before the query are masked
        want = (p1 - p0)[keep].mean().item()
        got = res.df[(res.df.unit == str(pos)) & (res.df.measure == "p_target_delta")]
        assert got.value.item() == pytest.approx(want, abs=1e-6)
        assert got.n.item() == int(keep.sum())
    assert set(res.df.unit) == {str(i) for i in range(9)}  # the last position is never masked


def test_roles_groups_and_role_knockout_on_anchor_data():
    task = AnchorTask(n_train=32, n_test=48)
    data = task.dataset("test_task")
    hf = anchor_gpt2()
    ref = twin(hf)
    model = probekit.load(hf)
    clean = model.logits(data.tokens)[:, -1]
    pred = clean.argmax(-1)
    # plant solution types: half the rows 'inferential', a quarter 'symmetric'
    rows = torch.arange(48)
    data.composite = torch.where(rows < 24, pred, torch.full_like(pred, -5))
    data.symmetric = torch.where((rows >= 24) & (rows < 36), pred, torch.full_like(pred, -1))
    res = token_masking(model, data, by="role")
    assert res.summary["n_inferential"] == 24
    assert res.summary["n_symmetric"] == 12
    assert res.summary["n_other"] == 12
    assert set(res.df.unit) == {"key", "anchor1", "anchor2", "noise"}
    # 'key' masking equals padding the key position by hand
    masked = data.tokens.clone()
    masked[torch.arange(48), data.positions] = 0
    with torch.no_grad():
        p0 = ref(input_ids=data.tokens).logits[:, -1].double().softmax(-1)
        p1 = ref(input_ids=masked).logits[:, -1].double().softmax(-1)
    idx = data.targets[:, None]
    want = (p1.gather(-1, idx) - p0.gather(-1, idx))[:24].mean().item()
    got = res.df[
        (res.df.unit == "key")
        & (res.df.group == "inferential")
        & (res.df.measure == "p_target_delta")
    ]
    assert got.value.item() == pytest.approx(want, abs=1e-6)
    ko = attention_knockout(model, data, by="role")
    assert list(ko.map().columns) == ["key", "anchor1", "anchor2", "noise", "self", "all"]
    assert ko.map().shape == (2, 6)
    assert len(ko.summary["strongest_edges"]) == 3
    # role knockout of the key == position knockout of each row's key position
    sub = task.generate("test_task", 8, seed=5)
    sub.positions[:] = 2
    sub.tokens[:, 2], sub.tokens[:, 3], sub.tokens[:, 4] = sub.keys, 4, 3
    by_role = attention_knockout(model, sub, by="role").map()
    by_pos = attention_knockout(model, sub.tokens, targets=sub.targets).map()
    np.testing.assert_allclose(by_role["key"], by_pos["2"], atol=1e-9)


def test_information_flow_rows_and_mean():
    task = AnchorTask(n_train=32, n_test=64)
    model = probekit.load(anchor_gpt2())
    held = task.dataset("test_task")
    one = held.tokens[:1].clone()
    one[0, held.positions[0]] = 99  # the first held-out input with key 99
    same = (held.positions == held.positions[0]) & (held.pairs == held.pairs[0]).all(-1)
    res = information_flow(model, held.tokens[same], single=one, label="key 99, pair (4, 3)")
    single = res.df[res.df.scope == "single"]
    sums = single.groupby(["layer", "query"]).weight.sum()
    np.testing.assert_allclose(sums, 1.0, atol=1e-6)  # causal attention rows sum to one
    assert 99 in single.token.tolist()  # the default input has key 99
    tokens = task.dataset("test_task").tokens[:5]
    res2 = information_flow(model, tokens, index=2)
    seen = {}

    def keep(tensor, hook):
        seen["p"] = tensor.detach().double().mean(1)

    [batch] = model.prepare(tokens)
    model.forward(batch, [("blocks.1.attn.hook_pattern", keep)])
    mean = res2.df[(res2.df.scope == "mean") & (res2.df.layer == 1)]
    np.testing.assert_allclose(
        mean.weight,
        seen["p"].mean(0).numpy()[mean["query"].to_numpy(), mean.source.to_numpy()],
        atol=1e-9,
    )
    one = res2.df[(res2.df.scope == "single") & (res2.df.layer == 1)]
    np.testing.assert_allclose(
        one.weight, seen["p"][2].numpy()[one["query"].to_numpy(), one.source.to_numpy()]
    )
    fig = res.figure()
    assert len(fig.data) > 10
    assert res.summary["n_mean"] >= 1


def test_save_load_and_figures(tmp_path):
    model = probekit.load(make_hf("gpt2", n_layers=2))
    tokens, mask = sample_tokens()
    for res in (
        token_masking(model, (tokens, mask), mode="resample"),
        attention_knockout(model, (tokens, mask), head=0),
        information_flow(model, sample_tokens(pad=False)[0]),
    ):
        res.figure()
        back = Result.load(res.save(tmp_path / f"{res.kind}.json"))
        assert type(back) is type(res)
        back.figure()


def test_mask_tokens_leaves_input_untouched():
    tokens = torch.tensor([[5, 6, 7]])
    where = torch.tensor([[True, False, True]])
    g = torch.Generator().manual_seed(0)
    out = mask_tokens(tokens, where, "resample", low=20, high=30, generator=g)
    assert tokens.tolist() == [[5, 6, 7]]
    assert out[0, 1] == 6 and 20 <= out[0, 0] < 30 and 20 <= out[0, 2] < 30


def test_bad_input_names_problem_and_fix():
    model = probekit.load(make_hf("gpt2", n_layers=2))
    tokens, mask = sample_tokens()
    with pytest.raises(InputError, match="by='position' or 'role'"):
        token_masking(model, tokens, by="roles")
    with pytest.raises(InputError, match="needs anchor-task data"):
        token_masking(model, tokens, by="role")
    with pytest.raises(InputError, match="needs a mask token"):
        token_masking(model, tokens, mode="mask")
    with pytest.raises(InputError, match="5 targets for 6 sequences"):
        token_masking(model, tokens, targets=torch.zeros(5))
    with pytest.raises(InputError, match="outside the model's 2 layers"):
        attention_knockout(model, tokens, layers=[2])
    with pytest.raises(InputError, match="outside the model's 4 heads"):
        attention_knockout(model, tokens, head=4)
    with pytest.raises(InputError, match="unknown knockout mode"):
        attention_knockout(model, tokens, mode="zero")
    with pytest.raises(InputError, match="outside the 10 positions"):
        with knock_out(model, 0, [(-1, 10)]):
            model.logits(tokens)
    with pytest.raises(InputError, match="unpadded"):
        information_flow(model, (tokens, mask))


ANALYZERS = {
    "token_masking": lambda m, d: token_masking(m, d),
    "attention_knockout": lambda m, d: attention_knockout(m, d),
    "information_flow": lambda m, d: information_flow(m, d[0]),
}


@pytest.mark.parametrize("name", sorted(ANALYZERS))
@pytest.mark.parametrize("arch", DECODERS)
def test_analyzer_leaves_model_untouched(name, arch):
    model = probekit.load(make_hf(arch, n_layers=2))
    tokens, mask = sample_tokens(pad=name != "information_flow")
    before = model_snapshot(model, tokens, mask)
    ANALYZERS[name](model, (tokens, mask))
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))


@pytest.mark.parametrize("name", ["token_masking", "attention_knockout"])
def test_analyzer_restores_model_after_exception(name, monkeypatch):
    model = probekit.load(make_hf("gpt2", n_layers=2))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    fail_midway(monkeypatch, at=15)  # inside the knockout hooks
    with pytest.raises(RuntimeError, match="injected failure"):
        ANALYZERS[name](model, (tokens, mask))
    monkeypatch.undo()
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))
