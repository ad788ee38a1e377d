"""Layer similarity (issue 34, item 4) against a plain reference: linear CKA from n x n Gram
matrices, the mean cosine of centred states and numpy's least squares on Hugging Face's hidden
states, within one model and across two, with left padding, positions="last", headless models;
CKA's invariances; bad input refused before any forward."""

from __future__ import annotations

import pytest
import torch
import transformers

import probekit
from probekit.analyses.depth.similarity import hsic, linear_cka, similar_blocks
from probekit.errors import InputError
from probekit.result import Result
from probekit.toy import toy_hf_model
from tests import reference as ref
from tests.conftest import hf_config
from tests.test_left_padding import padded_texts

TOL = 1e-6


def _data(batch: int = 8, length: int = 12, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 50, (batch, length), generator=g)
    mask = torch.ones_like(tokens)
    mask[1 % batch, 9:] = 0
    mask[4 % batch, 5:] = 0
    return tokens, mask


def _want(hf, tokens, mask, measure, *, other=None, last=False, train=None, test=None):
    xs, _ = ref.selected(ref.residual_states(hf, tokens, mask), mask, last)
    ys = (
        xs
        if other is None
        else ref.selected(ref.residual_states(other, tokens, mask), mask, last)[0]
    )
    return ref.similarity_matrix(xs, ys, measure, train=train, test=test)


def _split_of(res, tokens, mask, last=False):
    """The train / held-out token masks of the sequences the result says it held out."""
    _, chosen = ref.selected([tokens], mask, last)
    rows = torch.arange(tokens.shape[0]).unsqueeze(1).expand_as(tokens)[chosen]
    test = torch.isin(rows, torch.tensor(res.meta["heldout_sequences"]))
    return ~test, test


def _got(res) -> torch.Tensor:
    return torch.tensor(res.matrix().to_numpy(), dtype=torch.float64)


def _check(got, want):
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
@pytest.mark.parametrize("measure", ["cka", "cosine", "linear_map"])
def test_the_matrix_equals_the_reference(arch, measure):
    hf = toy_hf_model(arch, n_layers=2, d_model=16)
    tokens, mask = _data()
    res = probekit.layer_similarity(probekit.load(hf), (tokens, mask), measure=measure)
    assert res.matrix().index.tolist() == [-1, 0, 1]
    split = _split_of(res, tokens, mask) if measure == "linear_map" else (None, None)
    _check(_got(res), _want(hf, tokens, mask, measure, train=split[0], test=split[1]))


def test_biased_cka_equals_the_reference():
    hf = toy_hf_model("gpt2", n_layers=2, d_model=16)
    tokens, mask = _data()
    res = probekit.layer_similarity(probekit.load(hf), (tokens, mask), debiased=False)
    xs, _ = ref.selected(ref.residual_states(hf, tokens, mask), mask)
    _check(_got(res), ref.similarity_matrix(xs, xs, "cka", debiased=False))
    assert res.summary["debiased"] is False


@pytest.mark.parametrize("measure", ["cka", "linear_map"])
def test_two_models_of_one_vocabulary_give_the_cross_matrix(measure):
    a, b = toy_hf_model("gpt2", n_layers=2, d_model=16), toy_hf_model("llama", n_layers=3)
    tokens, mask = _data()
    res = probekit.layer_similarity(
        probekit.load(a), (tokens, mask), other=probekit.load(b), measure=measure
    )
    assert res.matrix().shape == (3, 4) and res.summary["n_layers_other"] == 3
    split = _split_of(res, tokens, mask) if measure == "linear_map" else (None, None)
    want = _want(a, tokens, mask, measure, other=b, train=split[0], test=split[1])
    _check(_got(res), want)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_left_padding_gives_the_numbers_of_right_padding(arch):
    model = probekit.load(toy_hf_model(arch, n_layers=2, d_model=16))
    left, right = padded_texts("left"), padded_texts("right")
    assert not torch.equal(left["attention_mask"], right["attention_mask"])
    for measure in ("cka", "cosine"):
        a = probekit.layer_similarity(model, left, measure=measure)
        b = probekit.layer_similarity(model, right, measure=measure)
        assert a.df.equals(b.df), measure


def test_positions_last_compares_the_last_real_tokens():
    hf = toy_hf_model("llama", n_layers=2, d_model=16)
    tokens, mask = _data()
    res = probekit.layer_similarity(probekit.load(hf), (tokens, mask), positions="last")
    assert res.summary["n_tokens"] == 8  # fewer tokens than features: the Gram-matrix path
    _check(_got(res), _want(hf, tokens, mask, "cka", last=True))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_headless_model_needs_no_unembedding(family):
    config = hf_config(family, n_layers=2)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    base = transformers.AutoModel.from_config(config).eval()
    tokens, mask = _data()
    res = probekit.layer_similarity(probekit.load(base), (tokens, mask))
    _check(_got(res), _want(base, tokens, mask, "cka"))


def test_cka_is_one_for_an_orthogonal_and_scaled_copy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 8, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    for debiased in (True, False):
        assert linear_cka(x, 2.5 * x @ q, debiased) == pytest.approx(1.0, abs=1e-12)
        assert ref.cka_textbook(x, 2.5 * x @ q, debiased) == pytest.approx(1.0, abs=1e-12)
        shifted = linear_cka(x, x + 7.0, debiased)
        assert shifted == pytest.approx(1.0, abs=1e-12)
    y = torch.randn(60, 5, generator=g, dtype=torch.float64)
    assert hsic(x, y) == pytest.approx(ref.hsic_textbook(x, y, True), rel=1e-9)
    assert hsic(x, y, False) == pytest.approx(ref.hsic_textbook(x, y, False), rel=1e-9)


def test_blocks_are_runs_whose_every_pair_is_alike():
    m = torch.tensor([[1, 0.95, 0.85], [0.95, 1, 0.95], [0.85, 0.95, 1]]).numpy()
    assert similar_blocks(m, [-1, 0, 1], 0.9) == [[-1, 1], [1, 2]]  # not [-1, 2]: 0.85 < 0.9
    assert similar_blocks(m, [-1, 0, 1], 0.8) == [[-1, 2]]


def test_the_result_saves_loads_and_draws(tmp_path):
    model = probekit.load(toy_hf_model("gpt2", n_layers=2, d_model=16))
    res = probekit.layer_similarity(model, _data(), sites=("resid_out", "mlp_out"))
    assert set(res.df.site) == {"resid_out", "mlp_out"}
    assert res.matrix("mlp_out").index.tolist() == [0, 1]
    loaded = Result.load(res.save(tmp_path / "sim.json"))
    assert loaded.df.equals(res.df) and loaded.summary == res.summary
    fig = loaded.figure()
    assert fig.data[0].zmin == 0.0 and fig.data[0].zmax == 1.0
    assert "CKA" in fig.layout.title.text and fig.layout.xaxis.tickmode == "linear"
    matrix = loaded.matrix().to_numpy()
    alike = [k for k in range(2) if min(matrix[k, k + 1], matrix[k + 1, k]) >= 0.9]
    assert sum(b - a for a, b in loaded.summary["near_identity_layers"]) == len(alike)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"measure": "svcca"}, "unknown measure"),
        ({"sites": ("resid_mid_typo",)}, "unknown site"),
        ({"block_threshold": float("nan")}, "block_threshold"),
        ({"holdout": 1.5}, "holdout"),
        ({"positions": "first"}, "positions"),
    ],
)
def test_bad_options_are_refused_before_any_forward(monkeypatch, kwargs, words):
    model = probekit.load(toy_hf_model("gpt2", n_layers=2, d_model=16))
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("ran a forward"))
    with pytest.raises(InputError, match=words):
        probekit.layer_similarity(model, _data(), **kwargs)


def test_mismatched_models_and_too_few_tokens_are_refused_before_any_forward(monkeypatch):
    model = probekit.load(toy_hf_model("gpt2", n_layers=2, d_model=16))
    monkeypatch.setattr(model, "forward", lambda *a, **k: pytest.fail("ran a forward"))
    other_vocab = probekit.load(toy_hf_model("gpt2", n_layers=2, vocab_size=60))
    with pytest.raises(InputError, match="vocabularies of 50 and 60"):
        probekit.layer_similarity(model, _data(), other=other_vocab)
    wider = probekit.load(toy_hf_model("gpt2", n_layers=2, d_model=32))
    with pytest.raises(InputError, match="one width"):
        probekit.layer_similarity(model, _data(), other=wider, measure="cosine")
    with pytest.raises(InputError, match="at least 4"):
        probekit.layer_similarity(model, _data(batch=2), positions="last")
    with pytest.raises(InputError, match="held-out sequences"):
        probekit.layer_similarity(model, _data(batch=1), measure="linear_map")


def test_diagnose_sets_the_near_identity_layers_beside_the_swap_blocks(tmp_path):
    from probekit.report import diagnose, write_report

    model = probekit.load(toy_hf_model("gpt2", n_layers=3, d_model=16))
    data = _data()
    with_it = diagnose(model, data, n_bootstrap=2)
    without = diagnose(model, data, n_bootstrap=2, similarity=False)
    assert "layer_similarity" not in without.results
    for name, result in without.results.items():  # the other numbers are unchanged
        assert result.df.equals(with_it.results[name].df), name
    similar = with_it.results["layer_similarity"]
    assert similar.summary["swap_blocks"] == with_it.results["layer_swaps"].summary["blocks"]
    page = write_report(with_it, tmp_path / "r").read_text()
    assert "Layer similarity" in page and "Near-identity layers" in page
    assert (tmp_path / "r" / "layer_similarity.json").exists()


def test_no_similarity_flag_reaches_the_settings():
    from probekit.cli import build_parser
    from probekit.cli.diagnose import diagnosis_settings

    parser = build_parser("diagnose")
    args = parser.parse_args(["diagnose", "ckpt", "--out", "r", "--no-similarity"])
    assert diagnosis_settings(args).similarity is False
    default = parser.parse_args(["diagnose", "ckpt", "--out", "r"])
    assert diagnosis_settings(default).similarity is True


def test_a_headless_diagnosis_has_the_similarity_section():
    from probekit.report import diagnose

    config = hf_config("gpt2", n_layers=2)
    torch.manual_seed(0)
    base = transformers.AutoModel.from_config(config).eval()
    diagnosis = diagnose(probekit.load(base), _data(), n_bootstrap=0)
    assert diagnosis.results["layer_similarity"].matrix().shape == (3, 3)
