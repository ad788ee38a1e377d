"""The tuned lens: zero translators are the logit lens, silent layers are read exactly, a plain
torch reference trains the same translators, a fitted lens beats the logit lens on held-out text
of a trained byte-corpus LM, save/load, and bad arguments."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import probekit
from probekit.analyses.depth.tuned_lens import (
    TunedLens,
    TunedLensResult,
    check_head,
    compare_lenses,
    tuned_lens,
)
from probekit.errors import CheckpointError, InputError, UnsupportedModelError
from probekit.result import Result, json_ready
from probekit.toy import toy_model
from tests import reference as ref
from tests.conftest import make_hf, sample_tokens, twin


def _gpt2(n_layers: int = 4, seed: int = 0) -> probekit.Model:
    return probekit.load(make_hf("gpt2", n_layers=n_layers, seed=seed))


def _batches(tokens, mask, size: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(tokens[i : i + size], mask[i : i + size]) for i in range(0, len(tokens), size)]


def test_zero_translators_give_exactly_the_logit_lens():
    model = _gpt2()
    data = sample_tokens()
    plain = probekit.logit_lens(model, data, k=5)
    zero = tuned_lens(model, data, lens=TunedLens.zeros(model), k=5)
    for measure in ("kl", "topk_overlap"):
        assert zero.profile(measure).tolist() == (
            plain.df[plain.df.measure == measure].set_index("depth")["value"].tolist()
        )
    for key, value in plain.summary.items():
        assert zero.summary[key] == value or (math.isnan(value) and math.isnan(zero.summary[key]))
    assert isinstance(zero, type(plain)) and zero.kind == "tuned_lens"


def _silence_last_layers(hf, layers) -> None:
    with torch.no_grad():
        for i in layers:
            block = hf.transformer.h[i]
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                proj.bias.zero_()


def test_layers_that_write_nothing_are_read_exactly_both_ways():
    hf = make_hf("gpt2", n_layers=4, scale=2.0)
    _silence_last_layers(hf, [2, 3])
    model = probekit.load(hf)
    tokens, mask = sample_tokens()
    lens = TunedLens.fit(model, _batches(tokens, mask), steps=6, progress=False)
    res = tuned_lens(model, (tokens, mask), lens=lens)
    for depth in (2, 3, 4):
        assert res.kl_per_layer("lens_first")[depth] < 1e-6
        assert res.kl_per_layer("final_first")[depth] < 1e-6
    for depth in (2, 3):  # their objective is at its minimum from the start: they stay put
        assert float(lens.translators[depth].weight.detach().abs().max()) < 1e-6
    assert float(lens.translators[0].weight.detach().abs().max()) > 1e-4  # the others did train


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_fit_matches_a_plain_torch_reference(arch):
    hf = make_hf(arch, n_layers=2, scale=2.0)
    plain = twin(hf)
    model = probekit.load(hf)
    tokens, mask = sample_tokens()
    batches = _batches(tokens, mask)
    lens = TunedLens.fit(model, batches, steps=5, lr=0.5, seed=3, progress=False)
    expected, history = ref.tuned_lens_fit(plain, arch, batches, steps=5, lr=0.5, seed=3)
    for translator, (a, b) in zip(lens.translators, expected, strict=True):
        assert float(a.abs().max()) > 1e-4  # it moved
        torch.testing.assert_close(translator.weight.detach(), a, rtol=0, atol=1e-6)
        torch.testing.assert_close(translator.bias.detach(), b, rtol=0, atol=1e-6)
    # The summed KL of a step is computed in float32 by both sides in a different order. Each
    # KL(p || q) = sum_v p_v (log p_v - log q_v) is a small difference of log-probabilities of
    # size |log p|, each rounded to float32, so its error is about eps32 * E_p|log p| = eps32 *
    # H(p) however small the KL is: over the L depths, L * eps32 * H in absolute terms (about
    # 9e-7 here, where the KLs are ~5e-3 and a relative bound would fail on reordering alone).
    entropy = max(_final_entropy(plain, t, m) for t, m in batches)
    bound = len(lens.translators) * torch.finfo(torch.float32).eps * entropy
    assert lens.fit_info["loss_history"] == pytest.approx(history, rel=0, abs=bound)


def _final_entropy(hf, tokens, mask) -> float:
    """The mean entropy (nats) of the plain model's final next-token distributions."""
    with torch.no_grad():
        _, _, final = ref.block_io(hf, tokens, mask)
    logp = final[mask.bool()].double().log_softmax(-1)
    return float(-(logp.exp() * logp).sum(-1).mean())


def test_fit_leaves_the_model_unchanged_and_is_deterministic():
    model = _gpt2()
    params = list(model.hf_model.parameters())
    params[0].requires_grad_(False)
    params[1].grad = torch.ones_like(params[1])
    before = [p.detach().clone() for p in params]
    flags = [p.requires_grad for p in params]
    data = _batches(*sample_tokens())
    first = TunedLens.fit(model, data, steps=4, seed=1, progress=False)
    assert [p.requires_grad for p in params] == flags
    assert all(p.grad is None for i, p in enumerate(params) if i != 1)
    assert torch.equal(params[1].grad, torch.ones_like(params[1]))
    assert all(torch.equal(p, q) for p, q in zip(params, before, strict=True))
    again = TunedLens.fit(model, data, steps=4, seed=1, progress=False)
    other = TunedLens.fit(model, data, steps=4, seed=2, progress=False, optimizer="adam")
    for a, b in zip(first.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.translators[0].weight, other.translators[0].weight)


def test_token_budget_and_fit_versus_evaluation_data():
    model = _gpt2(n_layers=2)
    tokens, mask = sample_tokens()  # 6 sequences, 52 real tokens
    lens = TunedLens.fit(model, _batches(tokens, mask, 3), tokens=60, progress=False)
    assert lens.fit_info["settings"]["steps"] == 3  # 2 batches of about 26 tokens, then one more
    assert lens.fit_info["data"]["n_sequences"] == 6
    seen = tuned_lens(model, (tokens, mask), lens=lens, data_label="train")
    held_out = tuned_lens(model, sample_tokens(seed=7), lens=lens, data_label="validation")
    assert seen.meta["overlap_sequences"] == 6 and held_out.meta["overlap_sequences"] == 0
    assert seen.meta["eval_data"]["fingerprint"] == lens.fit_info["data"]["fingerprint"]
    assert held_out.meta["eval_data"]["label"] == "validation"


def test_save_load_round_trip_and_mismatch_refusal(tmp_path):
    model = _gpt2()
    data = sample_tokens()
    lens = TunedLens.fit(model, _batches(*data), steps=3, progress=False, data_label="train")
    lens.save(tmp_path / "lens")
    assert sorted(p.name for p in (tmp_path / "lens").iterdir()) == [
        "config.json",
        "lens.safetensors",
    ]
    back = TunedLens.load(tmp_path / "lens", model)
    for a, b in zip(lens.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert back.fit_info == json.loads(json.dumps(lens.fit_info))
    assert torch.equal(back.fit_sequences, lens.fit_sequences)
    direct = tuned_lens(model, data, lens=lens)
    from_dir = tuned_lens(model, data, lens=tmp_path / "lens")
    assert direct.df.equals(from_dir.df) and from_dir.meta["fit_data"]["label"] == "train"
    for other in (_gpt2(n_layers=3), toy_model(n_layers=4, d_model=16)):
        with pytest.raises(InputError, match="n_layers=4, d_model=32"):
            TunedLens.load(tmp_path / "lens", other)
        with pytest.raises(InputError, match="fit on a model"):
            tuned_lens(other, data, lens=lens)


def test_unreadable_lens_folders_are_refused(tmp_path):
    model = _gpt2(n_layers=2)
    TunedLens.zeros(model).save(tmp_path / "lens")
    (tmp_path / "lens" / "lens.safetensors").write_bytes(b"\x80\x04 not safetensors")
    with pytest.raises(CheckpointError, match="cannot read a tuned lens"):
        TunedLens.load(tmp_path / "lens")
    with pytest.raises(CheckpointError, match="cannot read a tuned lens"):
        TunedLens.load(tmp_path / "missing")
    TunedLens.zeros(model).save(tmp_path / "lens")
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    (tmp_path / "lens" / "config.json").write_text(json.dumps({**config, "n_layers": 3}))
    with pytest.raises(CheckpointError, match="translators"):
        TunedLens.load(tmp_path / "lens")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": 0},
        {"steps": -2},
        {"steps": 1.5},
        {"lr": 0.0},
        {"lr": -1.0},
        {"lr": float("nan")},
        {"lr": float("inf")},
        {"batch_size": 0},
        {"grad_clip": 0.0},
        {"optimizer": "lbfgs"},
        {"momentum": 1.0},
        {"steps": 3, "warmup_steps": 3},
        {"steps": 3, "tokens": 10},
        {"tokens": 0},
    ],
)
def test_bad_arguments_are_refused_before_any_work(kwargs, monkeypatch):
    model = _gpt2(n_layers=2)

    def no_work(*args, **kw):
        raise AssertionError("work was done before the arguments were checked")

    monkeypatch.setattr(model, "prepare", no_work)
    with pytest.raises(InputError):
        TunedLens.fit(model, sample_tokens(), progress=False, **{"steps": 2, **kwargs})


def test_numpy_numbers_are_accepted_and_recorded_as_plain_numbers(tmp_path):
    import numpy as np

    model = _gpt2(n_layers=2)
    lens = TunedLens.fit(
        model,
        sample_tokens(),
        steps=np.int64(2),
        lr=np.float32(0.1),
        seed=np.int32(1),
        progress=False,
    )
    assert (
        lens.fit_info["settings"]["steps"] == 2 and type(lens.fit_info["settings"]["seed"]) is int
    )
    lens.save(tmp_path / "lens")  # the config is plain JSON


def test_bad_evaluation_arguments_and_headless_models():
    model = _gpt2(n_layers=2)
    with pytest.raises(InputError, match="not a TunedLens"):
        tuned_lens(model, sample_tokens(), lens=b"nowhere")
    with pytest.raises(InputError, match="k=0"):
        tuned_lens(model, sample_tokens(), lens=TunedLens.zeros(model), k=0)

    class Headless:
        d_model, d_vocab, device, dtype, architecture = 32, 50, "cpu", torch.float32, "X"

        def head(self, residual):
            raise AttributeError("the bridge has no unembed")

    with pytest.raises(UnsupportedModelError, match="no unembedding"):
        check_head(Headless())


def test_result_round_trip_and_overlay_figure(tmp_path):
    model = _gpt2(n_layers=2)
    res = tuned_lens(model, sample_tokens(), lens=TunedLens.zeros(model))
    back = Result.load(res.save(tmp_path / "r.json"))
    assert isinstance(back, TunedLensResult) and back.summary == json_ready(res.summary)
    assert back.figure().layout.title.text == "Tuned lens"
    fig = compare_lenses(probekit.logit_lens(model, sample_tokens()), back)
    assert len(fig.data) == 4
    assert probekit.TunedLens is TunedLens and probekit.tuned_lens is tuned_lens


# ---- a trained byte-corpus LM -----------------------------------------------------------------
LM_FAST = dict(n_layers=3, d_model=32, n_heads=2, steps=60, batch_size=8, seq_len=24)
LM_SLOW = dict(n_layers=4, d_model=32, n_heads=2, steps=300, batch_size=16, seq_len=32)


def _trained_lm(settings: dict, out: Path) -> probekit.Model:
    from probekit.lm import LMConfig, train_lm

    cfg = LMConfig(
        **settings,
        lr=3e-3,
        warmup_steps=10,
        eval_every=settings["steps"],
        eval_sequences=4,
        corpus_max_files=30,
    )
    return probekit.load(train_lm(cfg, out, progress=False, device="cpu").final)


def _check_beats_logit_lens(model: probekit.Model, seq_len: int, fit_steps: int) -> None:
    from probekit.lm import ByteCorpus

    corpus = ByteCorpus(max_files=30)
    train = corpus.sequences("train", seq_len, 96)
    held_out = corpus.sequences("validation", seq_len, 32)
    lens = TunedLens.fit(model, train, batch_size=16, steps=fit_steps, progress=False)
    tuned = tuned_lens(model, held_out, lens=lens, data_label="validation")
    plain = tuned_lens(model, held_out, lens=TunedLens.zeros(model))
    assert tuned.meta["overlap_sequences"] == 0
    for direction in ("final_first", "lens_first"):
        better = tuned.kl_per_layer(direction) < plain.kl_per_layer(direction)
        assert better[: model.n_layers].all(), (direction, tuned.df, plain.df)
    assert tuned.summary["mean_kl"] < plain.summary["mean_kl"]


def test_fitted_lens_beats_the_logit_lens_on_held_out_text_of_a_trained_lm(tmp_path):
    model = _trained_lm(LM_FAST, tmp_path / "lm")
    _check_beats_logit_lens(model, LM_FAST["seq_len"], fit_steps=30)


@pytest.mark.slow
def test_fitted_lens_beats_the_logit_lens_on_a_longer_trained_lm(tmp_path):
    model = _trained_lm(LM_SLOW, tmp_path / "lm")
    _check_beats_logit_lens(model, LM_SLOW["seq_len"], fit_steps=100)


# ---- hook hygiene (as tests/test_hygiene.py checks the other analyzers) -------------------------
def _fit_and_read(model, data):
    lens = TunedLens.fit(model, data, steps=2, progress=False)
    return tuned_lens(model, data, lens=lens)


def test_fit_and_read_leave_the_model_untouched(arch):
    from tests.test_hygiene import assert_model_unchanged, model_snapshot

    model = probekit.load(make_hf(arch))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    _fit_and_read(model, (tokens, mask))
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))


@pytest.mark.parametrize("where", ["fit", "read"])
def test_the_model_is_untouched_after_a_failure_midway(where, monkeypatch):
    from probekit.analyses.depth import tuned_lens as module
    from tests.test_hygiene import assert_model_unchanged, fail_midway, model_snapshot

    model = probekit.load(make_hf("gpt2"))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    lens = TunedLens.zeros(model)
    if where == "fit":
        calls = {"n": 0}
        original = module.translator_loss

        def failing(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected failure")
            return original(*args, **kwargs)

        monkeypatch.setattr(module, "translator_loss", failing)
    else:
        fail_midway(monkeypatch, at=3)
    with pytest.raises(RuntimeError, match="injected failure"):
        if where == "fit":
            TunedLens.fit(model, (tokens, mask), steps=2, progress=False)
        else:
            tuned_lens(model, (tokens, mask), lens=lens)
    monkeypatch.undo()
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))
