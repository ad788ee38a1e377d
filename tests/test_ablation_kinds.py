"""Mean and resample ablation (issue 34, item 3) against plain references on Hugging Face
copies: each variant is one forward of the plain model with an ordinary torch hook that puts
the mean update (over the real tokens) or another sequence's update in place of the removed
one (tests/reference.py, no probekit code)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

import probekit
from probekit.analyses.depth.shared import Shared
from probekit.errors import InputError
from probekit.interventions import InterventionSetting
from tests import reference as ref
from tests.conftest import hf_blocks, hf_config, make_hf, sample_tokens, twin

RTOL, ATOL = 1e-4, 1e-6
KINDS = ("mean", "resample")


def _setup(arch: str):
    hf = make_hf(arch)
    plain = twin(hf)
    tokens, mask = sample_tokens()  # right padding in rows 1 and 3
    return probekit.load(hf), plain, tokens, mask


def _value(df, **where) -> float:
    sel = np.ones(len(df), dtype=bool)
    for key, val in where.items():
        sel &= (df[key] == val).to_numpy()
    [value] = df.loc[sel, "value"].to_numpy()
    return float(value)


def _table(kind: str, plain, arch: str, tokens, mask, seed: int = 123):
    """The reference's replacement source: the mean updates, or the clean updates and rows."""
    if kind == "mean":
        return ref.ablation_means(plain, arch, tokens, mask), None
    [rows] = ref.resample_donors([mask], seed)
    return ref.clean_update_table(plain, arch, tokens, mask), rows


def _last(mask) -> torch.Tensor:
    out = torch.zeros_like(mask, dtype=torch.bool)
    for b in range(mask.shape[0]):
        out[b, int(mask[b].sum()) - 1] = True
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_contributions_match_the_reference(arch, kind):
    model, plain, tokens, mask = _setup(arch)
    got = {
        p: probekit.contributions(model, (tokens, mask), positions=p, ablation=kind).df
        for p in ("all", "last")
    }
    labels = ref.labels_for(arch, tokens, mask)
    table, rows = _table(kind, plain, arch, tokens, mask)
    clean = ref.logits(plain, tokens, mask)
    blocks = hf_blocks(plain)
    for layer in range(4):
        value = ref.replacement_value(kind, table, (layer, "layer"), rows)
        with ref.block_replaced(blocks, layer, value):
            variants = {"layer": ref.logits(plain, tokens, mask)}
        for sub in ("attn", "mlp"):
            value = ref.replacement_value(kind, table, (layer, sub), rows)
            with ref.sublayer_replaced(plain, arch, layer, sub, value):
                variants[sub] = ref.logits(plain, tokens, mask)
        for component, changed in variants.items():
            for name, values in ref.measures(clean, changed, labels).items():
                for positions, where in (("all", mask.bool()), ("last", _last(mask))):
                    if name == "loss_delta":
                        where = where & (labels != -100)
                    if not where.any():
                        continue
                    want = ref.mean_over(values, where)
                    have = _value(got[positions], layer=layer, component=component, measure=name)
                    assert have == pytest.approx(want, rel=RTOL, abs=ATOL), (
                        component,
                        layer,
                        name,
                        positions,
                    )


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
@pytest.mark.parametrize("kind", KINDS)
def test_skip_effects_match_the_reference(arch, kind):
    model, plain, tokens, mask = _setup(arch)
    res = probekit.skip_effects(model, (tokens, mask), ablation=kind)
    assert res.summary["ablation"] == kind and res.meta["ablation"] == kind
    table, rows = _table(kind, plain, arch, tokens, mask)
    blocks = hf_blocks(plain)
    ins, outs, clean = ref.block_io(plain, tokens, mask)
    valid = mask.bool()
    for s in range(4):
        value = ref.replacement_value(kind, table, (s, "layer"), rows)
        with ref.block_replaced(blocks, s, value):
            ins2, outs2, changed = ref.block_io(plain, tokens, mask)
        for layer in range(s + 1, 4):
            d, d2 = (outs[layer] - ins[layer]).double(), (outs2[layer] - ins2[layer]).double()
            change = (d2 - d).norm(dim=-1) / (d.norm(dim=-1) + 1e-12)
            want = ref.mean_over(change, valid)
            have = _value(res.df, skipped_layer=s, target="layer", target_layer=layer)
            assert have == pytest.approx(want, rel=RTOL, abs=ATOL), (s, layer)
        out_change = ref.measures(clean, changed, ref.labels_for(arch, tokens, mask))["prob_l2"]
        have = _value(res.df, skipped_layer=s, target="output")
        assert have == pytest.approx(ref.mean_over(out_change, valid), rel=RTOL, abs=ATOL)


@pytest.mark.parametrize("kind", KINDS)
def test_future_mode_replaces_before_t_only(kind):
    arch = "gpt2"
    model, plain, tokens, mask = _setup(arch)
    starts = [4, 3, 6, 2, 5, 4]
    setting = InterventionSetting(mode="future", answer_start=starts, ablation=kind)
    res = probekit.contributions(model, (tokens, mask), setting=setting)
    table, rows = _table(kind, plain, arch, tokens, mask)
    pos = torch.arange(tokens.shape[1])
    at = torch.stack([pos < t for t in starts])
    measure = torch.stack([pos >= t for t in starts]) & mask.bool()
    clean = ref.logits(plain, tokens, mask)
    labels = ref.labels_for(arch, tokens, mask)
    for layer in (0, 3):
        value = ref.replacement_value(kind, table, (layer, "layer"), rows)
        with ref.block_replaced(hf_blocks(plain), layer, value, at):
            whole = ref.logits(plain, tokens, mask)
        value = ref.replacement_value(kind, table, (layer, "mlp"), rows)
        with ref.sublayer_replaced(plain, arch, layer, "mlp", value, at):
            mlp = ref.logits(plain, tokens, mask)
        for component, changed in (("layer", whole), ("mlp", mlp)):
            want = ref.mean_over(ref.measures(clean, changed, labels)["kl"], measure)
            have = _value(res.df, layer=layer, component=component, measure="kl")
            assert have == pytest.approx(want, rel=RTOL, abs=ATOL), (component, layer)


def _left_padded(tokens, mask):
    """The same sequences with their padding moved to the left."""
    left_tokens, left_mask = torch.zeros_like(tokens), torch.zeros_like(mask)
    for b in range(tokens.shape[0]):
        n = int(mask[b].sum())
        left_tokens[b, tokens.shape[1] - n :] = tokens[b, :n]
        left_mask[b, tokens.shape[1] - n :] = 1
    return left_tokens, left_mask


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
@pytest.mark.parametrize("kind", KINDS)
def test_left_padding_gives_the_numbers_of_right_padding(arch, kind):
    model = probekit.load(make_hf(arch, n_layers=3))
    tokens, mask = sample_tokens()
    left = _left_padded(tokens, mask)
    for analyzer in (probekit.contributions, probekit.skip_effects):
        a = analyzer(model, (tokens, mask), ablation=kind).df
        b = analyzer(model, left, ablation=kind).df
        assert np.allclose(a.value, b.value, rtol=1e-5, atol=1e-8), analyzer.__name__
    garbage = tokens.clone()
    garbage[~mask.bool()] = 7  # what the pads hold never enters a mean or a resample
    a = probekit.contributions(model, (tokens, mask), ablation=kind).df
    b = probekit.contributions(model, (garbage, mask), ablation=kind).df
    assert np.allclose(a.value, b.value, rtol=1e-6, atol=1e-9)


def test_resample_never_takes_a_pad_and_never_the_own_sequence():
    _, mask = sample_tokens()
    valid = mask.bool()
    for seed in range(20):
        [rows] = ref.resample_donors([mask], seed)
        got = probekit.interventions.resample_rows(valid, torch.Generator().manual_seed(seed))
        assert torch.equal(got, rows)
        own = torch.arange(valid.shape[0])[:, None].expand_as(valid)
        assert (got != own)[valid].all()
        cols = torch.arange(valid.shape[1]).expand_as(valid)
        assert valid[got, cols][valid].all()  # the donor is real where it is read


def test_resample_is_reproducible_by_seed_and_differs_across_seeds():
    model, _, tokens, mask = _setup("gpt2")

    def run(seed):
        setting = InterventionSetting(seed=seed, ablation="resample")
        return probekit.contributions(model, (tokens, mask), setting=setting).df.value

    a, b, c = run(1), run(1), run(2)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)
    zero = probekit.contributions(model, (tokens, mask)).df.value
    assert not np.allclose(a, zero)


def test_zero_is_the_default_and_the_same_numbers():
    model, _, tokens, mask = _setup("gpt2")
    default = probekit.contributions(model, (tokens, mask))
    zero = probekit.contributions(model, (tokens, mask), ablation="zero")
    assert default.df.equals(zero.df)
    assert default.summary["ablation"] == "zero" and default.meta["ablation"] == "zero"


def test_the_mean_is_computed_once_per_cache():
    model, _, tokens, mask = _setup("gpt2")
    shared = Shared(model)
    calls = []
    forward = model.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    model.forward = counted  # type: ignore[method-assign]
    try:
        probekit.contributions(model, (tokens, mask), ablation="mean", cache=shared)
        first = len(calls)
        probekit.skip_effects(model, (tokens, mask), ablation="mean", cache=shared)
    finally:
        del model.forward
    assert len(calls) == first  # skip_effects reuses the means and the skips


@pytest.mark.parametrize("kind", KINDS)
def test_a_headless_model_is_measured_in_hidden_space(kind):
    config = hf_config("gpt2", 3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    base = transformers.AutoModel.from_config(config).eval()
    plain = twin(base)
    tokens, mask = sample_tokens()
    res = probekit.contributions(probekit.load(base), (tokens, mask), ablation=kind)
    assert res.summary["measure"] == "rel_l2" and res.summary["ablation"] == kind
    valid = mask.bool()
    outs, ins = {}, {}
    handles = []
    for i, block in enumerate(plain.h):
        handles.append(
            block.register_forward_pre_hook(
                lambda m, a, k, i=i: ins.__setitem__(
                    i, (a[0] if a else k["hidden_states"]).double()
                ),
                with_kwargs=True,
            )
        )
        handles.append(
            block.register_forward_hook(
                lambda m, a, o, i=i: outs.__setitem__(
                    i, (o[0] if isinstance(o, tuple) else o).double()
                )
            )
        )
    clean = ref.last_hidden(plain, tokens, mask)
    for h in handles:
        h.remove()
    table = {(i, "layer"): outs[i] - ins[i] for i in range(3)}
    rows = None
    if kind == "mean":
        table = {key: update[valid].mean(0) for key, update in table.items()}
    else:
        [rows] = ref.resample_donors([mask], 123)
    for layer in range(3):
        value = ref.replacement_value(kind, table, (layer, "layer"), rows)
        with ref.block_replaced(plain.h, layer, value):
            changed = ref.last_hidden(plain, tokens, mask)
        want = ref.mean_over(ref.relative_changes(clean, changed), valid)
        got = _value(res.df, layer=layer, component="layer", measure="rel_l2")
        assert got == pytest.approx(want, rel=RTOL, abs=ATOL), layer


def _unique_longest():
    """Rows of 10, 7 and 5 real tokens: no other row is real at the longest one's end."""
    tokens, mask = sample_tokens()
    return tokens[[0, 1, 3]], mask[[0, 1, 3]]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m, d: probekit.contributions(m, d, ablation="shuffle"), "unknown ablation"),
        (lambda m, d: probekit.skip_effects(m, d, ablation=0), "unknown ablation"),
        (lambda m, d: InterventionSetting(ablation="Mean"), "unknown ablation"),
        (lambda m, d: probekit.contributions(m, d[0][:1], ablation="resample"), "one sequence"),
        (
            lambda m, d: probekit.skip_effects(m, d, ablation="resample", batch_size=1),
            "one sequence",
        ),
        (
            lambda m, d: probekit.contributions(m, _unique_longest(), ablation="resample"),
            "every other at most",
        ),
        (
            lambda m, d: probekit.contributions(
                m, d, ablation="mean", setting=InterventionSetting(ablation="resample")
            ),
            "give the ablation kind once",
        ),
    ],
)
def test_bad_input_is_refused_before_any_forward(call, match):
    model = probekit.load(make_hf("gpt2"))
    data = sample_tokens(pad=False)
    calls = []
    forward = model.forward
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)  # type: ignore[method-assign]
    try:
        with pytest.raises(InputError, match=match) as info:
            call(model, data)
    finally:
        del model.forward
    assert "Fix:" in str(info.value)
    assert not calls


def test_a_section_says_which_ablation_it_used():
    from probekit.report_text import explanation, heading

    model, _, tokens, mask = _setup("gpt2")
    result = probekit.contributions(model, (tokens, mask), ablation="mean", components=["layer"])
    assert heading("contributions", result) == "Mean-ablation contributions"
    assert explanation("contributions", result).endswith(
        "Ablation: mean (a removed update is replaced by its mean over the data's real tokens)."
    )
    assert result.figure().layout.title.text.startswith("Mean-ablation contribution per layer")
    zero = probekit.contributions(model, (tokens, mask), components=["layer"])
    assert heading("contributions", zero) == "Zero-ablation contributions"


@pytest.mark.slow
def test_a_diagnosis_says_which_ablation_it_used(tmp_path):
    from probekit.report import diagnose, write_report

    model = probekit.load(make_hf("gpt2", n_layers=2))
    setting = InterventionSetting(ablation="resample", seed=5)
    diagnosis = diagnose(model, sample_tokens(), n_bootstrap=2, setting=setting)
    for name in ("contributions", "skip_effects"):
        result = diagnosis.results[name]
        assert result.meta["ablation"] == "resample" and result.meta["seed"] == 5
        assert result.summary["ablation"] == "resample"
    assert diagnosis.headline["ablation"] == "resample"
    assert any("under resample ablation" in line for line in diagnosis.verdict)
    page = write_report(diagnosis, tmp_path).read_text()
    assert "Resample-ablation contributions" in page and "Ablation: resample" in page
    assert "Zero-ablation contributions" not in page
    title = diagnosis.results["contributions"].figure().layout.title.text
    assert title.startswith("Resample-ablation contribution per layer")


def test_the_ablation_flag_reaches_the_diagnosis(tmp_path):
    from probekit.cli import build_parser, main

    args = build_parser().parse_args(["diagnose", "x", "--out", "y"])
    assert args.ablation == "zero"
    checkpoint = tmp_path / "gpt2"
    make_hf("gpt2", n_layers=2).save_pretrained(checkpoint)
    out = tmp_path / "report"
    argv = ["diagnose", str(checkpoint), "--out", str(out), "--n-sequences", "4"]
    argv += ["--seq-len", "8", "--bootstrap", "0", "--device", "cpu", "--no-images"]
    assert main([*argv, "--quiet", "--ablation", "mean"]) == 0
    saved = json.loads((out / "contributions.json").read_text())
    assert saved["meta"]["ablation"] == "mean" and saved["summary"]["ablation"] == "mean"
    assert json.loads((out / "summary.json").read_text())["headline"]["ablation"] == "mean"
