"""Activation patching and direct logit attribution equal plain references on the Hugging Face
models (one forward per patched variant, torch hooks on the HF modules; the attribution written
out by hand), with padding on either side, positions='last', refusals before any work, and no
hook left behind."""

from __future__ import annotations

import pytest
import torch

import probekit
from probekit.analyses.mechanisms import patching
from probekit.errors import InputError, UnsupportedModelError
from probekit.model.sites import hook_registries
from probekit.toy import TOY_VOCAB, toy_hf_model
from tests import reference as ref

ARCHS = ["gpt2", "llama"]
SITES = ref.PATCH_SITES


def _runs(seed: int = 0):
    """Clean and corrupted tokens (one shorter row, right padded), the mask, answer pairs."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, TOY_VOCAB, (3, 5), generator=g)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 7) % (TOY_VOCAB - 1) + 1
    corrupted[:, 3] = (clean[:, 3] + 3) % (TOY_VOCAB - 1) + 1
    mask = torch.ones_like(clean)
    mask[1, 4:] = 0
    answers = torch.tensor([[3, 4], [5, 6], [7, 8]])
    return clean, corrupted, mask, answers


def _left(tokens, mask):
    """The same rows padded on the left."""
    out_t, out_m = torch.zeros_like(tokens), torch.zeros_like(mask)
    for b in range(len(tokens)):
        n = int(mask[b].sum())
        out_t[b, tokens.shape[1] - n :] = tokens[b, :n]
        out_m[b, tokens.shape[1] - n :] = 1
    return out_t, out_m


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    hf = toy_hf_model(request.param, n_layers=2)
    return request.param, hf, probekit.load(hf)


def _metric(name, logits_last, answers, clean_last):
    z = logits_last.double()
    rows = torch.arange(len(z))
    if name == "logit_diff":
        return z[rows, answers[:, 0]] - z[rows, answers[:, 1]]
    logq = z.log_softmax(-1)
    if name == "target_prob":
        return logq[rows, answers].exp()
    logp = clean_last.double().log_softmax(-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def _reference_cell(hf, arch, base, source, mask, site, layer, p, answers, metric, clean_last):
    """Mean metric over the sequences that have real position ``p`` (-1: each last token)."""
    acts = ref.site_activations(hf, arch, source, mask)[(site, layer)]
    length = mask.sum(-1)
    cells = [(b, int(length[b]) - 1 if p == -1 else p) for b in range(len(base))]
    cells = [(b, q) for b, q in cells if q < length[b]]
    z = ref.patched_logits(hf, arch, base, mask, site, layer, cells, acts)
    last = z[torch.arange(len(base)), length - 1]
    values = _metric(metric, last, answers, clean_last)
    rows = [b for b, _ in cells]
    return float(values[rows].mean()), len(rows)


def _close(a, b, scale=1.0):
    return abs(a - b) <= 1e-4 * max(1.0, abs(scale))


@pytest.mark.parametrize("direction", patching.DIRECTIONS)
def test_every_cell_equals_the_plain_reference(setup, direction):
    arch, hf, model = setup
    clean, corrupted, mask, answers = _runs()
    res = probekit.activation_patching(
        model, (clean, mask), (corrupted, mask), sites=SITES, answers=answers, direction=direction
    )
    base, source = (clean, corrupted) if direction.startswith("corrupted") else (corrupted, clean)
    length = mask.sum(-1)
    clean_last = ref.logits(hf, clean, mask)[torch.arange(3), length - 1]
    assert len(res.df) == len(SITES) * model.n_layers * clean.shape[1]
    for row in res.df.itertuples():
        want, n = _reference_cell(
            hf, arch, base, source, mask, row.site, row.layer, row.position, answers,
            "logit_diff", clean_last,
        )  # fmt: skip
        assert row.n == n
        assert _close(row.value, want, want), (row.site, row.layer, row.position)
    # the unpatched runs, and the normalised score's ends
    corr_last = ref.logits(hf, corrupted, mask)[torch.arange(3), length - 1]
    clean_m = _metric("logit_diff", clean_last, answers, clean_last).mean()
    corr_m = _metric("logit_diff", corr_last, answers, clean_last).mean()
    assert _close(res.summary["clean_metric"], float(clean_m), clean_m)
    assert _close(res.summary["corrupted_metric"], float(corr_m), corr_m)
    start = res.df[(res.df.site == "resid_in") & (res.df.layer == 0)].set_index("position")
    # patching every... the embedding of a position that does not differ changes nothing
    unchanged = start.loc[0]
    want_end = 1.0 if direction.startswith("corrupted") else 0.0
    assert abs(unchanged.normalized - want_end) < 1e-6


@pytest.mark.parametrize("metric", ["target_prob", "kl"])
def test_positions_last_and_the_other_metrics_equal_the_reference(setup, metric):
    arch, hf, model = setup
    clean, corrupted, mask, answers = _runs(1)
    targets = answers[:, 0]
    res = probekit.activation_patching(
        model,
        (clean, mask),
        (corrupted, mask),
        sites=("resid_mid", "attn_out"),
        positions="last",
        metric=metric,
        answers=targets if metric == "target_prob" else None,
    )
    assert set(res.df.position) == {-1}
    clean_last = ref.logits(hf, clean, mask)[torch.arange(3), mask.sum(-1) - 1]
    for row in res.df.itertuples():
        want, n = _reference_cell(
            hf, arch, clean, corrupted, mask, row.site, row.layer, -1, targets, metric,
            clean_last,
        )  # fmt: skip
        assert n == row.n == 3
        assert _close(row.value, want, want), (row.site, row.layer)


def test_left_padding_gives_the_numbers_of_right_padding(setup):
    _, _, model = setup
    clean, corrupted, mask, answers = _runs()
    kwargs = dict(sites=("resid_in", "mlp_out"), answers=answers, direction="both")
    right = probekit.activation_patching(model, (clean, mask), (corrupted, mask), **kwargs)
    left_clean, left_mask = _left(clean, mask)
    left_corrupted, _ = _left(corrupted, mask)
    left = probekit.activation_patching(
        model, (left_clean, left_mask), (left_corrupted, left_mask), **kwargs
    )
    cols = ["value", "clean", "corrupted"]
    assert right.df.drop(columns=cols).equals(left.df.drop(columns=cols))
    assert (right.df[cols] - left.df[cols]).abs().to_numpy().max() < 1e-5


def test_batches_change_no_number(setup):
    _, _, model = setup
    clean, corrupted, mask, answers = _runs()
    one = probekit.activation_patching(model, (clean, mask), (corrupted, mask), answers=answers)
    split = probekit.activation_patching(
        model, (clean, mask), (corrupted, mask), answers=answers, batch_size=1
    )
    assert (one.df.value - split.df.value).abs().max() < 1e-6


@pytest.mark.parametrize("positions", ["last", "all"])
def test_direct_logit_attribution_equals_a_manual_split_and_sums_to_the_logit(setup, positions):
    arch, hf, model = setup
    clean, _, mask, answers = _runs()
    targets = answers[:, 0]
    res = probekit.direct_logit_attribution(
        model, (clean, mask), targets=targets, positions=positions
    )
    length = mask.sum(-1)
    spots = [-1] if positions == "last" else list(range(clean.shape[1]))
    z = ref.logits(hf, clean, mask)
    for p in spots:
        rows = torch.tensor([b for b in range(3) if p == -1 or p < length[b]])
        at = length[rows] - 1 if p == -1 else torch.full((len(rows),), p)
        one_hot = torch.nn.functional.one_hot(targets[rows], TOY_VOCAB)
        want = ref.direct_logit_terms(hf, arch, clean, mask, rows, at, one_hot)
        got = res.df[res.df.position == p].set_index(["component", "layer"]).value
        for key, values in want.items():
            assert _close(got[key], float(values.mean()), values.abs().max()), (key, p)
        logit = z[rows, at, targets[rows]].double().mean()
        assert _close(got[("logit", -1)], float(logit), logit)
        assert _close(float(got.drop(index="logit", level="component").sum()), float(logit))


def test_attribution_of_a_difference_is_the_difference_of_attributions(setup):
    _, _, model = setup
    clean, _, mask, answers = _runs()
    pair = probekit.direct_logit_attribution(model, (clean, mask), targets=answers)
    first = probekit.direct_logit_attribution(model, (clean, mask), targets=answers[:, 0])
    second = probekit.direct_logit_attribution(model, (clean, mask), targets=answers[:, 1])
    assert pair.meta["target_kind"] == "difference"
    assert ((pair.df.value - (first.df.value - second.df.value)).abs() < 1e-6).all()
    assert abs(pair.summary["sum_of_terms"] - pair.summary["logit"]) < 1e-4
    one = probekit.direct_logit_attribution(model, (clean, mask), targets=[[3, 4]])
    assert one.meta["target_kind"] == "difference"


def test_results_save_load_and_draw(tmp_path):
    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    clean, corrupted, mask, answers = _runs()
    res = probekit.activation_patching(
        model, (clean, mask), (corrupted, mask), sites=("resid_out", "attn_out"), answers=answers
    )
    res.save(tmp_path / "p.json")
    back = probekit.Result.load(tmp_path / "p.json")
    assert back.df.equals(res.df) and back.figure().data
    assert res.grid("attn_out").shape == (2, 5)
    dla = probekit.direct_logit_attribution(model, (clean, mask), targets=answers[:, 0])
    dla.save(tmp_path / "d.json")
    assert probekit.Result.load(tmp_path / "d.json").figure().data


def _no_work(model, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a forward ran before the input was checked")

    monkeypatch.setattr(model, "trace", refuse)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(corrupted="short"), "shape"),
        (dict(corrupted="mask"), "masks differ"),
        (dict(answers=[[3, TOY_VOCAB]]), "outside the vocabulary"),
        (dict(answers=[[3, 4, 5]]), "shape"),
        (dict(answers=None), "needs answers"),
        (dict(metric="accuracy"), "unknown metric"),
        (dict(sites=("resid_post",)), "unknown patching site"),
        (dict(direction="sideways"), "unknown direction"),
        (dict(positions="first"), "unknown positions"),
        (dict(positions=[1.5]), "integer positions"),
    ],
)
def test_bad_input_is_refused_before_any_work(monkeypatch, change, match):
    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    clean, corrupted, mask, answers = _runs()
    args = dict(answers=answers)
    other = change.pop("corrupted", None)
    args.update(change)
    corr_mask = mask.clone()
    if other == "mask":
        corr_mask[0, 4] = 0
    if other == "short":
        corrupted = corrupted[:, :4]
        corr_mask = corr_mask[:, :4]
    _no_work(model, monkeypatch)
    with pytest.raises(InputError, match=match):
        probekit.activation_patching(model, (clean, mask), (corrupted, corr_mask), **args)


@pytest.mark.parametrize(
    "targets, match",
    [([1, 2], "shape"), ([[1, 2, 3]], "shape"), ([-1, 2, 3], "outside"), (1.5, "dtype")],
)
def test_bad_attribution_targets_are_refused_before_any_work(monkeypatch, targets, match):
    model = probekit.load(toy_hf_model("llama", n_layers=2))
    clean, _, mask, _ = _runs()
    _no_work(model, monkeypatch)
    with pytest.raises(InputError, match=match):
        probekit.direct_logit_attribution(model, (clean, mask), targets=targets)


def test_post_norm_and_headless_models_are_refused_with_the_reason():
    from tests.test_headless import base_model, padded_tokens

    bert = probekit.load(toy_hf_model("bert", n_layers=2))
    tokens = torch.randint(1, TOY_VOCAB, (2, 5))
    with pytest.raises(UnsupportedModelError, match="post-norm"):
        probekit.direct_logit_attribution(bert, tokens, targets=[1, 2])
    headless = probekit.load(base_model("gpt2"))
    with pytest.raises(UnsupportedModelError, match="without an LM head"):
        probekit.direct_logit_attribution(headless, padded_tokens(), targets=1)
    with pytest.raises(UnsupportedModelError, match="without an LM head"):
        probekit.activation_patching(headless, padded_tokens(), padded_tokens(), answers=[1, 2])


def _hook_count(model) -> int:
    """Torch hooks on the model's modules, and TransformerLens hooks on its hook points."""
    points = [m for m in model.bridge.modules() if hasattr(m, "fwd_hooks")]
    return sum(len(r) for r in hook_registries(model.bridge)) + sum(
        len(p.fwd_hooks) + len(getattr(p, "bwd_hooks", [])) for p in points
    )


def test_no_hook_is_left_after_an_exception_inside(monkeypatch):
    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    clean, corrupted, mask, answers = _runs()
    before = model.logits(clean, mask)
    hooks_before = _hook_count(model)
    calls = {"n": 0}
    real = model.head  # the output head, which every patched forward ends with

    def fail_later(*args):
        calls["n"] += 1
        if calls["n"] > 4:  # inside a patched forward, its hooks installed
            raise RuntimeError("boom")
        return real(*args)

    monkeypatch.setattr(model, "head", fail_later)
    with pytest.raises(RuntimeError, match="boom"):
        probekit.activation_patching(
            model, (clean, mask), (corrupted, mask), sites=("attn_out",), answers=answers
        )
    assert calls["n"] > 4
    assert _hook_count(model) == hooks_before
    assert torch.equal(model.logits(clean, mask), before)
