"""The token-resolved lens against a plain-PyTorch reference on the Hugging Face model (GPT-2 and
Llama toys), at both sites, through the logit lens and a tuned lens; left padding, the last
position, targets, prediction depth, the refusals and the figure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

import probekit
from probekit.analyses.depth.shared import Shared
from probekit.analyses.depth.token_lens import TokenLensResult, prediction_depths
from probekit.analyses.depth.tuned_lens import TunedLens
from probekit.errors import InputError, UnsupportedModelError
from probekit.result import Result
from tests import reference as ref
from tests.conftest import hf_config, make_hf, sample_tokens, twin
from tests.test_left_padding import padded_texts

RTOL, ATOL = 1e-4, 1e-6
COLUMNS = ("top_prob", "entropy", "cross_entropy", "kl_final")


def _setup(arch: str, n_layers: int = 3):
    hf = make_hf(arch, n_layers=n_layers, scale=2.0)
    plain = twin(hf)
    tokens, mask = sample_tokens()
    return probekit.load(hf), plain, tokens, mask


def _compare(res, want, site, tokens, mask, targets=()):
    rows = res.df[res.df.site == site]
    valid = mask.bool()
    assert len(rows) == int(valid.sum()) * len(want)
    for depth, expected in enumerate(want):
        at = rows[rows.depth == depth].sort_values(["sequence", "position"])
        b, t = at.sequence.to_numpy().copy(), at.position.to_numpy().copy()
        assert valid[b, t].all()
        np.testing.assert_array_equal(at.token_id.to_numpy(), tokens[b, t].numpy())
        np.testing.assert_array_equal(at.top_id.to_numpy(), expected["top_id"][b, t].numpy())
        np.testing.assert_array_equal(at.final_id.to_numpy(), expected["final_id"][b, t].numpy())
        for name in COLUMNS + tuple(f"logp_{n}" for n in targets):
            np.testing.assert_allclose(
                at[name].to_numpy(),
                expected[name][b, t].numpy(),
                rtol=RTOL,
                atol=ATOL,
                err_msg=f"{site} depth {depth} {name}",
            )


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
@pytest.mark.parametrize("site", ["resid_out", "resid_mid"])
def test_logit_lens_rows_equal_the_plain_reference(arch, site):
    model, plain, tokens, mask = _setup(arch)
    targets = {"a": [3, 4, 5, 6, 7, 8], "b": 11}
    res = probekit.token_lens(model, (tokens, mask), sites=(site,), targets=targets)
    wanted = {"a": targets["a"], "b": [11] * 6}
    want = ref.token_lens_reference(plain, arch, tokens, mask, site, targets=wanted)
    assert len(want) == (4 if site == "resid_out" else 3)
    _compare(res, want, site, tokens, mask, targets=("a", "b"))
    # prediction depth: the plain loop over depths
    depths = res.prediction_depths().set_index(["sequence", "position"]).prediction_depth
    for (b, t), got in depths.items():
        tops = [int(w["top_id"][b, t]) for w in want]
        expected = ref.prediction_depth_reference(tops, int(want[0]["final_id"][b, t]))
        assert (math.isnan(got) and expected is None) or got == expected, (b, t)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_tuned_lens_rows_equal_the_plain_reference_at_both_sites(arch):
    model, plain, tokens, mask = _setup(arch)
    lens = TunedLens.zeros(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for translator in lens.translators:
            translator.weight.copy_(0.1 * torch.randn(translator.weight.shape, generator=g))
            translator.bias.copy_(0.1 * torch.randn(translator.bias.shape, generator=g))
    translators = [(t.weight.detach().clone(), t.bias.detach().clone()) for t in lens.translators]
    res = probekit.token_lens(model, (tokens, mask), lens=lens, sites=("resid_out", "resid_mid"))
    assert res.meta["lens"] == "tuned lens" and res.meta["resid_mid_translator"]
    for site in ("resid_out", "resid_mid"):
        want = ref.token_lens_reference(plain, arch, tokens, mask, site, translators=translators)
        _compare(res, want, site, tokens, mask)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_left_padding_gives_the_rows_of_right_padding(arch):
    left, right = padded_texts("left"), padded_texts("right")
    model = probekit.load(make_hf(arch, n_layers=2))
    sites = ("resid_out", "resid_mid")
    a = probekit.token_lens(model, left, sites=sites)
    b = probekit.token_lens(model, right, sites=sites)
    assert len(a.df) == int(right["attention_mask"].sum()) * (3 + 2)
    assert a.df.equals(b.df) and a.summary == b.summary


def test_last_position_rows_are_the_all_rows_at_each_last_real_token():
    model, _, tokens, mask = _setup("gpt2", n_layers=2)
    every = probekit.token_lens(model, (tokens, mask), targets={"t": 5})
    last = probekit.token_lens(model, (tokens, mask), positions="last", targets={"t": 5})
    ends = mask.sum(-1) - 1
    keep = every.df.position == ends[every.df.sequence].numpy()
    expected = every.df[keep].reset_index(drop=True)
    got = last.df.sort_values(["sequence", "depth"]).reset_index(drop=True)
    expected = expected.sort_values(["sequence", "depth"]).reset_index(drop=True)
    cols = ["sequence", "position", "depth", "top_id", "final_id", "logp_t", *COLUMNS]
    np.testing.assert_allclose(got[cols].to_numpy(float), expected[cols].to_numpy(float), 1e-6)
    assert last.summary["n_tokens"] == tokens.shape[0]
    assert last.figure().data[0].z.shape == (3, tokens.shape[0])  # sequences side by side


def test_the_output_depth_always_settles_and_a_shared_cache_adds_no_trace():
    model, _, tokens, mask = _setup("llama", n_layers=2)
    shared = Shared(model)
    probekit.logit_lens(model, (tokens, mask), cache=shared)
    runs = dict(shared.runs)
    res = probekit.token_lens(model, (tokens, mask), cache=shared)
    assert shared.runs == runs  # the clean traces of the logit lens, reused
    assert res.summary["n_never_settled_resid_out"] == 0
    final = res.df[res.df.depth == model.n_layers]
    assert final.matches_final.all() and np.allclose(final.kl_final, 0, atol=1e-9)


def test_prediction_depth_never_settled_is_nan():
    import pandas as pd

    df = pd.DataFrame(
        {
            "sequence": 0,
            "position": [0, 0, 0, 1, 1, 1],
            "site": "resid_mid",
            "depth": [0, 1, 2, 0, 1, 2],
            "matches_final": [True, True, False, False, True, True],
        }
    )
    got = prediction_depths(df).prediction_depth.tolist()
    assert math.isnan(got[0]) and got[1] == 1.0


def test_a_model_without_a_head_is_refused_with_the_reason():
    config = hf_config("gpt2", 2)
    base = transformers.AutoModel.from_config(config).eval()
    model = probekit.load(base)
    with pytest.raises(UnsupportedModelError, match="without an LM head"):
        probekit.token_lens(model, sample_tokens())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sites": ("resid_pre",)}, "unknown"),
        ({"sites": ()}, "sites"),
        ({"sites": ("resid_out", "resid_out")}, "distinct"),
        ({"positions": "first"}, "positions"),
        ({"lens": "tuned"}, "neither 'logit'"),
        ({"lens": 3}, "neither 'logit'"),
        ({"targets": [1, 2]}, "not a dict"),
        ({"targets": {"a": [1, 2]}}, "6 sequences"),
        ({"targets": {"a": 1.5}}, "one token id"),
        ({"targets": {"a": "x"}}, "one token id"),
        ({"targets": {"a": 10_000}}, "outside the vocabulary"),
        ({"targets": {"": 1}}, "non-empty"),
        ({"decode": "bytes"}, "not callable"),
    ],
)
def test_bad_input_is_refused_before_any_forward(kwargs, match, monkeypatch):
    model = probekit.load(make_hf("gpt2", n_layers=2))

    def no_forward(*args, **kw):
        raise AssertionError("a forward ran before the input was checked")

    monkeypatch.setattr(model.runtime, "forward", no_forward)
    with pytest.raises(InputError, match=match) as info:
        probekit.token_lens(model, sample_tokens(), **kwargs)
    assert "Fix:" in str(info.value)


def test_figure_save_load_and_the_chosen_sequence(tmp_path):
    model, _, tokens, mask = _setup("gpt2", n_layers=2)
    res = probekit.token_lens(
        model, (tokens, mask), targets={"x": 4}, sites=("resid_out", "resid_mid")
    )
    fig = res.figure(sequence=3, site="resid_mid", colour="entropy")
    heat = fig.data[0]
    assert heat.z.shape == (2, int(mask[3].sum())) and heat.text.shape == heat.z.shape
    assert len(fig.data) == 3  # the heatmap, the target's own and mean curves
    assert "entropy" in fig.layout.title.text and fig.layout.yaxis.dtick == 1
    loaded = Result.load(res.save(tmp_path / "token_lens.json"))
    assert isinstance(loaded, TokenLensResult) and loaded.df.equals(res.df)
    assert loaded.summary == res.summary
    assert loaded.figure(sequence=3).data[0].text.tolist() == res.figure(3).data[0].text.tolist()
    with pytest.raises(InputError, match="sequence 99"):
        res.figure(sequence=99)
    with pytest.raises(InputError, match="colour"):
        res.figure(colour="loss")


def test_tokens_are_decoded_through_the_tokenizer():
    from tests.test_left_padding import padded_tokenizer

    model = probekit.load(make_hf("gpt2", n_layers=2))
    model.bridge.tokenizer = padded_tokenizer("right")
    res = probekit.token_lens(model, padded_texts("right"), positions="last")
    assert set(res.df.token) <= {"w2", "w3", "w8"}  # each text's last word
    assert res.df.top_token.map(lambda s: isinstance(s, str) and s != "").all()


def test_unpadded_rows_equal_the_plain_reference():
    """Every token selected: the read-out takes the clean side's rows as slices."""
    hf = make_hf("llama", n_layers=2, scale=2.0)
    plain = twin(hf)
    tokens, mask = sample_tokens(pad=False)
    res = probekit.token_lens(probekit.load(hf), (tokens, mask), targets={"t": 9})
    want = ref.token_lens_reference(
        plain, "llama", tokens, mask, "resid_out", targets={"t": [9] * 6}
    )
    _compare(res, want, "resid_out", tokens, mask, targets=("t",))


def test_hooks_are_removed_even_when_the_mid_block_read_fails(monkeypatch):
    model = probekit.load(make_hf("gpt2", n_layers=2))
    tokens, mask = sample_tokens()
    before = model.logits(tokens, mask)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules())
    update_hooks = model.update_hooks

    def failing(layer, on_layer):
        def fail(*args):
            raise RuntimeError("injected failure")

        return update_hooks(layer, fail if layer == 1 else on_layer)

    monkeypatch.setattr(model, "update_hooks", failing)
    with pytest.raises(RuntimeError, match="injected failure"):
        probekit.token_lens(model, (tokens, mask), sites=("resid_mid",))
    monkeypatch.undo()
    after = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules())
    assert after == hooks and torch.equal(model.logits(tokens, mask), before)


def test_a_diagnosis_adds_the_token_lens_only_when_asked_and_keeps_its_numbers(tmp_path):
    from probekit.cli import build_parser
    from probekit.report import ANALYSES, diagnose, write_report

    model = probekit.load(make_hf("gpt2", n_layers=2))
    tokens = sample_tokens()
    plain = diagnose(model, tokens, n_bootstrap=2)
    with_lens = diagnose(model, tokens, n_bootstrap=2, token_lens=True)
    assert list(plain.results) == list(ANALYSES)
    names = list(with_lens.results)
    assert names.index("token_lens") == names.index("logit_lens") + 1
    for name in ANALYSES:
        assert with_lens.results[name].df.equals(plain.results[name].df), name
    assert with_lens.headline == plain.headline and with_lens.verdict == plain.verdict
    page = write_report(with_lens, tmp_path).read_text()
    assert "Token-resolved logit lens" in page and "prediction depth" in page
    assert (tmp_path / "token_lens.json").is_file() and (tmp_path / "token_lens.csv").is_file()
    args = build_parser().parse_args(["diagnose", "ckpt", "--out", "o", "--token-lens"])
    assert (
        args.token_lens
        and not build_parser().parse_args(["diagnose", "c", "--out", "o"]).token_lens
    )
