"""Every architecture family TransformerLens 4 and transformers 5 both support, built offline
from a tiny config (3 layers, d_model 32, vocabulary 64, 8 tokens), checked against independent
plain Hugging Face references (tests/reference.py: layers physically deleted / reordered /
truncated, sublayers silenced with torch hooks). The docs' architecture table states what
these tests show; families probekit cannot read correctly must be refused at load.
"""

from __future__ import annotations

import warnings
from functools import cache

import numpy as np
import pytest
import torch

import probekit
from probekit.errors import UnsupportedModelError
from tests import reference as ref
from tests.conftest import FAMILIES, REFUSED, family_tokens, make_family, twin

RTOL, ATOL = 1e-4, 1e-6
N_LAYERS = 3

STRUCTURE = {name: ("sum", False) for name in FAMILIES}
STRUCTURE.update(
    {name: ("sum", True) for name in ("gpt_neox", "gptj", "phi", "falcon", "cohere")},
    gemma2=("sandwich", False),
    gemma3=("sandwich", False),
    olmo2=("sandwich", False),
    bert=("stream", False),
    roberta=("stream", False),
    bloom=("stream", False),
    opt_post_norm=("post_ln", False),
    post_ln_paper=("post_ln", False),
)
"""Expected :attr:`probekit.Model.structure` (kind, parallel) per family."""

NO_PATTERN_EDITS = (
    "gptj",
    "opt",
    "bert",
    "roberta",
    "gpt_neo",
    "olmo",
    "olmo2",
    "opt_post_norm",
    "post_ln_paper",
)
"""Families whose bridge only observes the attention pattern (knockout refused)."""


@cache
def _setup(name: str, scale: float = 1.0):
    hf = make_family(name, N_LAYERS, scale=scale)
    plain = twin(hf)
    tokens, mask = family_tokens()
    labels = ref.labels_for(name, tokens, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = probekit.load(hf, copy_model=False)
    return model, plain, tokens, mask, labels


def _value(df, **where):
    sel = np.ones(len(df), dtype=bool)
    for key, val in where.items():
        sel &= (df[key] == val).to_numpy()
    [value] = df.loc[sel, "value"].to_numpy()
    return value


def _close(got, want):
    got, want = got.double(), want.double()
    return bool((got - want).abs().max() <= 1e-5 * max(1.0, float(want.abs().max())))


SLOW = (
    "gpt_neox_sequential",
    "gemma3",
    "gpt_neo",
    "bloom",
    "stablelm",
    "olmo",
    "olmo2",
    "gpt_bigcode",
    "starcoder2",
    "cohere",
    "mixtral",
)
"""Families beyond the required ones run with ``-m slow`` (the default run stays < 1 min)."""

families = pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in FAMILIES]
)


@families
def test_loads_and_reads_the_block_structure(name):
    model, plain, tokens, mask, _ = _setup(name)
    valid = mask.bool()
    assert _close(model.logits(tokens, mask)[valid], ref.logits(plain, tokens, mask)[valid])
    assert (model.structure.kind, model.parallel_blocks) == STRUCTURE[name]
    assert model.supports_pattern_edits == (name not in NO_PATTERN_EDITS)
    assert model.is_causal == (name not in ("bert", "roberta"))
    want = ref.updates(plain, name, tokens, mask)
    got = {}
    hooks = [
        h
        for layer in range(N_LAYERS)
        for h in model.update_hooks(layer, lambda *t, layer=layer: got.__setitem__(layer, t))
    ]
    [batch] = model.prepare((tokens, mask))
    with torch.no_grad():
        model.forward(batch, hooks)
    for layer in range(N_LAYERS):
        h_in, a, m, h_out = (t.double() for t in got[layer])
        assert _close(h_in + a + m, h_out), layer  # h_{l+1} = h_l + a_l + m_l
        for mine, theirs in zip((h_in, a, m, h_out), want[layer], strict=True):
            assert _close(mine[valid], theirs[valid]), layer


@families
def test_contributions_match_deleted_layers_and_silenced_sublayers(name):
    model, plain, tokens, mask, labels = _setup(name)
    res = probekit.contributions(model, (tokens, mask))
    clean = ref.logits(plain, tokens, mask)
    valid = mask.bool()
    has_target = valid & (labels != -100)
    for layer in range(N_LAYERS):
        variants = {"layer": ref.logits(ref.without_layer(plain, layer), tokens, mask)}
        for sub in ("attn", "mlp"):
            with ref.silenced(plain, name, layer, sub):
                variants[sub] = ref.logits(plain, tokens, mask)
        for component, changed in variants.items():
            for measure, values in ref.measures(clean, changed, labels).items():
                want = ref.mean_over(values, has_target if measure == "loss_delta" else valid)
                got = _value(res.df, layer=layer, component=component, measure=measure)
                assert got == pytest.approx(want, rel=RTOL, abs=ATOL), (component, layer, measure)


@families
def test_skip_effects_match_deleted_layers(name):
    model, plain, tokens, mask, labels = _setup(name, scale=2.0)
    res = probekit.skip_effects(model, (tokens, mask))
    valid = mask.bool()
    ins, outs, clean = ref.block_io(plain, tokens, mask)
    for s in range(N_LAYERS):
        d_ins, d_outs, changed = ref.block_io(ref.without_layer(plain, s), tokens, mask)
        for layer in range(s + 1, N_LAYERS):
            update = outs[layer] - ins[layer]
            new = d_outs[layer - 1] - d_ins[layer - 1]
            ratio = (update - new).double().norm(dim=-1) / update.double().norm(dim=-1)
            got = _value(res.df, skipped_layer=s, target_layer=layer)
            assert got == pytest.approx(ref.mean_over(ratio, valid), rel=RTOL, abs=ATOL)
        prob = ref.measures(clean, changed, labels)["prob_l2"]
        got = _value(res.df, skipped_layer=s, target="output")
        assert got == pytest.approx(ref.mean_over(prob, valid), rel=RTOL, abs=ATOL)


def _cos(x, y):
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))


@families
def test_residual_stats_match_plain_sublayer_outputs(name):
    model, plain, tokens, mask, _ = _setup(name)
    res = probekit.residual_stats(model, (tokens, mask))
    valid = mask.bool()
    for layer, (h, a, m, out) in enumerate(ref.updates(plain, name, tokens, mask)):
        want = {
            "cos_out_in": _cos(out, h),
            "cos_attn_in": _cos(a, h),
            "cos_mlp_mid": _cos(m, h + a),
            "attn_rel": a.norm(dim=-1) / h.norm(dim=-1),
            "mlp_rel": m.norm(dim=-1) / (h + a).norm(dim=-1),
            "update_rel": (a + m).norm(dim=-1) / h.norm(dim=-1),
        }
        for measure, values in want.items():
            got = _value(res.df, layer=layer, measure=measure)
            assert got == pytest.approx(ref.mean_over(values, valid), rel=RTOL, abs=ATOL), measure


@families
def test_logit_lens_matches_truncated_models(name):
    model, plain, tokens, mask, _ = _setup(name)
    res = probekit.logit_lens(model, (tokens, mask), k=5)
    valid = mask.bool()
    p_final = torch.softmax(ref.logits(plain, tokens, mask).double(), -1)
    for depth in range(N_LAYERS + 1):
        p = torch.softmax(ref.truncated_logits(plain, depth, tokens, mask).double(), -1)
        kl = (p * (p.log() - p_final.log())).sum(-1)
        got = _value(res.df, depth=depth, measure="kl")
        assert got == pytest.approx(ref.mean_over(kl, valid), rel=RTOL, abs=1e-7), depth


@families
def test_layer_swaps_match_reordered_layers(name):
    model, plain, tokens, mask, labels = _setup(name, scale=2.0)
    res = probekit.layer_swaps(
        model, (tokens, mask), pairs="all", blocks=[(0, 1), (1, 3)], n_bootstrap=5
    )
    has_target = mask.bool() & (labels != -100)

    def mean_loss(z):
        flat = torch.nn.functional.cross_entropy(
            z.double().reshape(-1, z.shape[-1]), labels.reshape(-1), reduction="none"
        )
        return ref.mean_over(flat.reshape(labels.shape), has_target)

    clean_loss = mean_loss(ref.logits(plain, tokens, mask))
    assert res.summary["clean_loss"] == pytest.approx(clean_loss, rel=1e-6)
    mat = res.matrix()
    for i in range(N_LAYERS):
        for j in range(i + 1, N_LAYERS):
            order = list(range(N_LAYERS))
            order[i], order[j] = j, i
            want = mean_loss(ref.logits(ref.with_order(plain, order), tokens, mask)) - clean_loss
            assert mat.iloc[i, j] == pytest.approx(want, rel=RTOL, abs=1e-6), (i, j)
    [block_row] = res.df[res.df.kind == "block_swap"].itertuples()
    want = mean_loss(ref.logits(ref.with_order(plain, [1, 2, 0]), tokens, mask)) - clean_loss
    assert block_row.value == pytest.approx(want, rel=RTOL, abs=1e-6)


@families
def test_probes_and_knockout_run(name):
    model = _setup(name)[0]
    tokens, mask = family_tokens(batch=24, seed=2)
    labels = {"first": (tokens[:, 0] % 2).numpy()}
    res = probekit.linear_probes(
        model, (tokens, mask), labels=labels, positions=[0], probe="ridge", max_iter=50
    )
    assert len(res.df) and np.isfinite(res.df.select_dtypes("number").to_numpy()).all()
    if model.supports_pattern_edits:
        out = probekit.attention_knockout(model, (tokens, mask))
        assert len(out.df)
    else:
        with pytest.raises(UnsupportedModelError):
            probekit.attention_knockout(model, (tokens, mask))


REFUSED_BECAUSE = {
    "codegen": "cannot run a CodeGenForCausalLM forward .*embed_positions",
    "mamba": "lacks the hook points",
    "openai_gpt": "does not pass through every block",
    "mpt": "do not write to the residual stream",
    "falcon_new_decoder": "could not attach",
    "opt_projected": "cannot run a OPTForCausalLM forward .*ln_final",
    "granite_multipliers": "do not write to the residual stream",
}
"""Why each family is refused (the docs' architecture table)."""


@pytest.mark.parametrize("name", list(REFUSED))
def test_unreadable_families_are_refused_at_load(name):
    hf = make_family(name, N_LAYERS)
    match = f"{REFUSED_BECAUSE[name]}.*Fix: "
    with pytest.raises(UnsupportedModelError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probekit.load(hf, copy_model=False)
