"""Every analyzer against an independent slow reference on plain Hugging Face copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probekit
from tests import reference as ref
from tests.conftest import hf_blocks, make_hf, sample_tokens, twin

RTOL, ATOL = 1e-4, 1e-6


def _setup(arch, scale=1.0):
    hf = make_hf(arch, scale=scale)
    plain = twin(hf)
    tokens, mask = sample_tokens()
    labels = ref.labels_for(arch, tokens, mask)
    return probekit.load(hf), plain, tokens, mask, labels


def _value(df, **where):
    sel = np.ones(len(df), dtype=bool)
    for key, val in where.items():
        sel &= (df[key] == val).to_numpy()
    [value] = df.loc[sel, "value"].to_numpy()
    return value


def test_contributions_match_deleted_layers_and_silenced_sublayers(arch):
    model, plain, tokens, mask, labels = _setup(arch)
    res = probekit.contributions(model, (tokens, mask))
    clean = ref.logits(plain, tokens, mask)
    valid = mask.bool()
    has_target = valid & (labels != -100)
    for layer in range(4):
        variants = {"layer": ref.logits(ref.without_layer(plain, layer), tokens, mask)}
        for sub in ("attn", "mlp"):
            with ref.silenced(plain, arch, layer, sub):
                variants[sub] = ref.logits(plain, tokens, mask)
        for component, changed in variants.items():
            for name, values in ref.measures(clean, changed, labels).items():
                want = ref.mean_over(values, has_target if name == "loss_delta" else valid)
                got = _value(res.df, layer=layer, component=component, measure=name)
                assert got == pytest.approx(want, rel=RTOL, abs=ATOL), (component, layer, name)
    shares = res.df[(res.df.component == "layer") & (res.df.measure == "prob_l2")]
    assert shares.share.sum() == pytest.approx(1.0)
    assert res.summary["second_half_share"] == pytest.approx(shares[shares.layer >= 2].share.sum())
    assert 0 < res.summary["second_half_share"] < 1


def test_padding_never_enters_the_averages():
    model = probekit.load(make_hf("gpt2"))
    tokens, mask = sample_tokens()
    garbage = tokens.clone()
    garbage[~mask.bool()] = 7  # different pad content must not matter
    separate = [tokens[i : i + 1, : int(mask[i].sum())] for i in range(tokens.shape[0])]
    a = probekit.contributions(model, (tokens, mask)).df
    b = probekit.contributions(model, (garbage, mask)).df
    c = probekit.contributions(model, separate).df
    assert np.allclose(a.value, b.value, rtol=1e-6, atol=1e-9)
    assert np.allclose(a.value, c.value, rtol=1e-4, atol=1e-7)
    d = probekit.residual_stats(model, (tokens, mask)).df
    e = probekit.residual_stats(model, separate).df
    assert np.allclose(d.value, e.value, rtol=1e-4, atol=1e-7)


def test_batch_size_does_not_change_results():
    model = probekit.load(make_hf("llama"))
    data = sample_tokens()
    a = probekit.skip_effects(model, data).df
    b = probekit.skip_effects(model, data, batch_size=2).df
    assert np.allclose(a.value, b.value, rtol=1e-5, atol=1e-8)


def test_skip_effects_match_deleted_layers(arch):
    model, plain, tokens, mask, labels = _setup(arch, scale=3.0)
    res = probekit.skip_effects(model, (tokens, mask))
    valid = mask.bool()
    ins, outs, clean = ref.block_io(plain, tokens, mask)
    for s in range(4):
        d_ins, d_outs, changed = ref.block_io(ref.without_layer(plain, s), tokens, mask)
        for layer in range(s + 1, 4):
            update = outs[layer] - ins[layer]
            new = d_outs[layer - 1] - d_ins[layer - 1]
            ratio = (update - new).double().norm(dim=-1) / update.double().norm(dim=-1)
            got = _value(res.df, skipped_layer=s, target_layer=layer)
            assert got == pytest.approx(ref.mean_over(ratio, valid), rel=RTOL, abs=ATOL)
        prob = ref.measures(clean, changed, labels)["prob_l2"]
        got = _value(res.df, skipped_layer=s, target="output")
        assert got == pytest.approx(ref.mean_over(prob, valid), rel=RTOL, abs=ATOL)
    out = res.output_effect()
    assert res.summary["depth_score"] == pytest.approx((out.index * out).sum() / out.sum())
    assert res.matrix().shape == (4, 4) and np.isnan(res.matrix().iloc[2, 1])


def _cos(x, y):
    x, y = x.double(), y.double()
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))


def test_residual_stats_match_plain_hooks(arch):
    model, plain, tokens, mask, _ = _setup(arch)
    res = probekit.residual_stats(model, (tokens, mask))
    subs = {}
    handles = []
    for i, block in enumerate(hf_blocks(plain)):
        if arch == "bert":
            parts = {"mid": block.attention}
        elif arch in ref.POST_LN:  # the mid-block stream is the first LayerNorm's output
            parts = {"mid": block.self_attn_layer_norm}
        else:
            parts = {"attn": getattr(block, "attn", None) or block.self_attn, "mlp": block.mlp}
        for key, module in parts.items():
            handles.append(
                module.register_forward_hook(
                    lambda m, a, o, key=key, i=i: subs.__setitem__(
                        (i, key), (o[0] if isinstance(o, tuple) else o).detach()
                    )
                )
            )
    ins, outs, _ = ref.block_io(plain, tokens, mask)
    for h in handles:
        h.remove()
    valid = mask.bool()
    for i in range(4):
        h, out = ins[i].double(), outs[i].double()
        if arch == "bert" or arch in ref.POST_LN:
            a = subs[(i, "mid")].double() - h
            m = out - subs[(i, "mid")].double()
        else:
            a, m = subs[(i, "attn")].double(), subs[(i, "mlp")].double()
            assert torch.allclose(h + a + m, out, atol=1e-4)
        want = {
            "cos_out_in": _cos(out, h),
            "cos_attn_in": _cos(a, h),
            "cos_mlp_mid": _cos(m, h + a),
            "attn_rel": a.norm(dim=-1) / h.norm(dim=-1),
            "mlp_rel": m.norm(dim=-1) / (h + a).norm(dim=-1),
            "update_rel": (a + m).norm(dim=-1) / h.norm(dim=-1),
        }
        for name, values in want.items():
            got = _value(res.df, layer=i, measure=name)
            assert got == pytest.approx(ref.mean_over(values, valid), rel=RTOL, abs=ATOL), name


def test_gradient_norms_match_plain_autograd(arch):
    model, plain, tokens, mask, labels = _setup(arch)
    res = probekit.gradient_norms(model, (tokens, mask))
    inputs = {}

    def keep(i):
        def pre(mod, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            x.retain_grad()
            inputs[i] = x

        return pre

    handles = [
        b.register_forward_pre_hook(keep(i), with_kwargs=True)
        for i, b in enumerate(hf_blocks(plain))
    ]
    logits = plain(input_ids=tokens, attention_mask=mask, use_cache=False).logits
    for h in handles:
        h.remove()
    loss = torch.nn.functional.cross_entropy(
        logits.double().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
    )
    loss.backward()
    valid = mask.bool()
    assert res.summary["loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    for i, block in enumerate(hf_blocks(plain)):
        norms = [float(p.grad.double().norm()) for p in block.parameters()]
        assert _value(res.df, layer=i, measure="mean_param_grad_norm") == pytest.approx(
            np.mean(norms), rel=RTOL
        )
        assert _value(res.df, layer=i, measure="grad_norm") == pytest.approx(
            np.sqrt(np.sum(np.square(norms))), rel=RTOL
        )
        resid = inputs[i].grad.double().norm(dim=-1)
        assert _value(res.df, layer=i, measure="resid_grad_norm") == pytest.approx(
            ref.mean_over(resid, valid), rel=RTOL, abs=1e-9
        )
    # the model's own gradients are left as they were (none)
    assert all(p.grad is None for p in model.hf_model.parameters())


def test_logit_lens_matches_plain_head(arch):
    model, plain, tokens, mask, _ = _setup(arch)
    res = probekit.logit_lens(model, (tokens, mask), k=5)
    ins, outs, final = ref.block_io(plain, tokens, mask)
    valid = mask.bool()
    p_final = torch.softmax(final.double(), -1)
    top_final = final.topk(5, -1).indices
    for depth in range(5):
        residual = ins[0] if depth == 0 else outs[depth - 1]
        z = ref.final_head(plain, arch, residual)
        p = torch.softmax(z.double(), -1)
        kl = (p * (p.log() - p_final.log())).sum(-1)
        top = z.topk(5, -1).indices
        overlap = torch.tensor(
            [
                [
                    len(set(top[b, t].tolist()) & set(top_final[b, t].tolist())) / 5
                    for t in range(top.shape[1])
                ]
                for b in range(top.shape[0])
            ]
        )
        assert _value(res.df, depth=depth, measure="kl") == pytest.approx(
            ref.mean_over(kl, valid), rel=RTOL, abs=1e-7
        )
        assert _value(res.df, depth=depth, measure="topk_overlap") == pytest.approx(
            ref.mean_over(overlap, valid), abs=1e-6
        )
    assert _value(res.df, depth=4, measure="kl") == pytest.approx(0.0, abs=1e-6)


def test_layer_swaps_match_swapped_weights(arch):
    model, plain, tokens, mask, labels = _setup(arch, scale=3.0)
    res = probekit.layer_swaps(
        model, (tokens, mask), pairs="all", blocks=[(0, 2), (2, 4)], n_bootstrap=20
    )
    has_target = mask.bool() & (labels != -100)
    clean = ref.logits(plain, tokens, mask)
    base = ref.mean_over(ref.measures(clean, clean, labels)["loss_delta"] * 0, has_target)
    ce = torch.nn.functional.cross_entropy

    def mean_loss(z):
        flat = ce(
            z.double().reshape(-1, z.shape[-1]),
            labels.reshape(-1),
            ignore_index=-100,
            reduction="none",
        ).reshape(labels.shape)
        return ref.mean_over(flat, has_target)

    clean_loss = mean_loss(clean)
    assert res.summary["clean_loss"] == pytest.approx(clean_loss, rel=1e-6)
    mat = res.matrix()
    for i in range(4):
        for j in range(i + 1, 4):
            order = list(range(4))
            order[i], order[j] = j, i
            want = mean_loss(ref.logits(ref.with_order(plain, order), tokens, mask)) - clean_loss
            assert mat.iloc[i, j] == pytest.approx(want, rel=RTOL, abs=1e-6) and base == 0
    [block_row] = res.df[res.df.kind == "block_swap"].itertuples()
    want = mean_loss(ref.logits(ref.with_order(plain, [2, 3, 0, 1]), tokens, mask)) - clean_loss
    assert block_row.value == pytest.approx(want, rel=RTOL, abs=1e-6)
    swaps = res.df[res.df.kind == "layer_swap"]
    assert ((swaps.ci_low <= swaps.value + 1e-12) & (swaps.value <= swaps.ci_high + 1e-12)).all()
    conf = res.boundary_confidence()
    assert list(conf.index) == [1, 2, 3] and ((conf >= 0) & (conf <= 1)).all()


def test_contiguous_blocks_respect_contiguity():
    # layers 0 and 3 look alike, 1 and 2 look alike: contiguity forbids grouping {0, 3}
    d = np.array([[0, 9, 9, 0.1], [9, 0, 0.1, 9], [9, 0.1, 0, 9], [0.1, 9, 9, 0]])
    from probekit.analyses.depth.swaps import contiguous_blocks

    blocks = contiguous_blocks(d, n_blocks=3)
    assert blocks == [(0, 1), (1, 3), (3, 4)]

    easy = np.array(
        [
            [0, 0.1, 5, 5, 5],
            [0.1, 0, 5, 5, 5],
            [5, 5, 0, 0.2, 0.1],
            [5, 5, 0.2, 0, 0.1],
            [5, 5, 0.1, 0.1, 0],
        ]
    )
    assert contiguous_blocks(easy, tolerance=1.0) == [(0, 2), (2, 5)]
    assert contiguous_blocks(easy, n_blocks=1) == [(0, 5)]


def test_swap_bootstrap_is_seeded_and_adjacent_mode_works():
    model = probekit.load(make_hf("gpt2", scale=3.0))
    data = sample_tokens(batch=8)
    a = probekit.layer_swaps(model, data, pairs="adjacent", n_bootstrap=30, seed=3)
    b = probekit.layer_swaps(model, data, pairs="adjacent", n_bootstrap=30, seed=3)
    assert a.df.equals(b.df)
    assert len(a.df[a.df.kind == "layer_swap"]) == 3
    assert np.isnan(a.matrix().iloc[0, 2])
    blocks = a.summary["blocks"]
    assert blocks[0][0] == 0 and blocks[-1][1] == 4
    assert all(x[1] == y[0] for x, y in zip(blocks, blocks[1:], strict=False))
