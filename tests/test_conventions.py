"""convention='csordas2025', future mode and keep_first against a port of the reference code
(tests/reference.py, plain HF models and hand-written hooks, one prompt at a time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probekit
from probekit import interventions
from probekit.errors import InputError
from probekit.interventions import InterventionSetting
from probekit.model import Trace
from tests import reference as ref
from tests.conftest import HF_CLASSES, VOCAB, hf_config, twin

TOL = 1e-6
N_CTX = 40
EQUAL = (30, 30, 30)
VARIABLE = (30, 21, 13, 9)  # the last is too short for future mode


def _hf(arch: str, seed: int = 0, scale: float = 3.0):
    """A tiny model with a 40-token context (room for future-mode positions 8, 16, 24)."""
    torch.manual_seed(seed)
    config = hf_config(arch)
    setattr(config, "n_positions" if arch == "gpt2" else "max_position_embeddings", N_CTX)
    config._attn_implementation = "eager"
    model = HF_CLASSES[arch](config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "embed" not in name and "wte" not in name:
                p.mul_(scale)
    return model


def _data(lengths, seed: int = 3):
    """Right-padded tokens starting with the BOS id 0; the prompts without padding."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (len(lengths), max(lengths)), generator=g)
    tokens[:, 0] = 0
    mask = torch.zeros_like(tokens)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        tokens[i, n:] = 0
    return (tokens, mask), [tokens[i, :n] for i, n in enumerate(lengths)]


CSORDAS = InterventionSetting(convention="csordas2025")
FUTURE = InterventionSetting(mode="future")


def model_twin_and_prompts(arch, lengths):
    hf = _hf(arch)
    data, prompts = _data(lengths)
    return probekit.load(hf), twin(hf), data, prompts


def _matrix(res, n=4):
    return res.matrix().to_numpy(), res.output_effect().to_numpy()


@pytest.mark.parametrize("lengths", [EQUAL, VARIABLE], ids=["equal", "variable"])
@pytest.mark.parametrize("mode", ["current", "future"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_skip_effects_match_the_reference(arch, mode, lengths):
    model, plain, data, prompts = model_twin_and_prompts(arch, lengths)
    res = probekit.skip_effects(
        model, data, setting=InterventionSetting("csordas2025", mode), batch_size=3
    )
    per_prompt = ref.csordas_effects(plain, prompts, mode)
    d_max, out_max = ref.csordas_max_over_prompts(per_prompt)
    mat, out = _matrix(res)
    upper = np.triu(np.ones((4, 4), dtype=bool), 1)
    assert np.abs(mat[upper] - d_max.numpy()[upper]).max() < TOL
    assert np.abs(out - out_max.numpy()).max() < TOL
    if mode == "future":  # layers up to the skipped one are untouched at positions >= t
        assert float(d_max.numpy()[~upper].max()) < TOL
        assert res.summary["n_prompts_skipped"] == sum(p is None for p in per_prompt)
        layer_score, output_score = ref.csordas_depth_scores(d_max, out_max)
        assert res.summary["depth_score_layer"] == pytest.approx(layer_score, abs=TOL)
        assert res.summary["depth_score"] == pytest.approx(output_score, abs=TOL)
        kept = [p for p in per_prompt if p is not None]
        mean_d = torch.stack([p[0] for p in kept]).mean(0)
        mean_out = torch.stack([p[1] for p in kept]).mean(0)
        layer_mean, output_mean = ref.csordas_depth_scores(mean_d, mean_out)
        assert res.summary["depth_score_layer_prompt_mean"] == pytest.approx(layer_mean, abs=TOL)
        assert res.summary["depth_score_prompt_mean"] == pytest.approx(output_mean, abs=TOL)


def test_answer_start_matches_the_reference():
    model, plain, data, prompts = model_twin_and_prompts("llama", VARIABLE)
    starts = [20, 11, 5, 3]
    res = probekit.skip_effects(
        model, data, setting=InterventionSetting("csordas2025", "future", answer_start=starts)
    )
    d_max, out_max = ref.csordas_max_over_prompts(
        ref.csordas_effects(plain, prompts, "future", starts=starts)
    )
    mat, out = _matrix(res)
    upper = np.triu(np.ones((4, 4), dtype=bool), 1)
    assert np.abs(mat[upper] - d_max.numpy()[upper]).max() < TOL
    assert np.abs(out - out_max.numpy()).max() < TOL
    assert res.meta["future_t"] == [[t] for t in starts]


@pytest.mark.parametrize(
    ("arch", "mode", "lengths"),
    [("gpt2", "future", VARIABLE), ("llama", "current", EQUAL), ("llama", "future", VARIABLE)],
)
def test_contributions_match_the_reference(arch, mode, lengths):
    model, plain, data, prompts = model_twin_and_prompts(arch, lengths)
    res = probekit.contributions(model, data, setting=InterventionSetting("csordas2025", mode))
    for component, part in (("layer", "layer"), ("attn", "attention"), ("mlp", "mlp")):
        _, out_max = ref.csordas_max_over_prompts(ref.csordas_effects(plain, prompts, mode, part))
        got = res.profile("prob_l2", component).to_numpy()
        assert np.abs(got - out_max.numpy()).max() < TOL, component


@pytest.mark.parametrize("lengths", [EQUAL, VARIABLE], ids=["equal", "variable"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_logit_lens_averages_per_prompt(arch, lengths):
    model, plain, data, prompts = model_twin_and_prompts(arch, lengths)
    res = probekit.logit_lens(model, data, setting=CSORDAS, batch_size=2)
    kl, overlap = ref.csordas_logit_lens(plain, arch, prompts)
    got = res.df.pivot(index="depth", columns="measure", values="value")
    assert np.abs(got["kl"].to_numpy() - kl.numpy()).max() < TOL
    assert np.abs(got["topk_overlap"].to_numpy() - overlap.numpy()).max() < TOL
    pooled = probekit.logit_lens(model, data).df.value.to_numpy()
    same = np.allclose(res.df.value.to_numpy(), pooled, rtol=0, atol=1e-9)
    assert same == (lengths == EQUAL)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_residual_update_cosine_matches_plain_hooks(arch):
    model, plain, data, prompts = model_twin_and_prompts(arch, VARIABLE)
    res = probekit.residual_stats(model, data)
    want = ref.csordas_update_cosine(plain, prompts).numpy()
    got = res.table()["cos_update_in"].to_numpy()
    assert np.abs(got - want).max() < TOL
    other = probekit.residual_stats(model, data, setting=CSORDAS)
    assert np.allclose(other.df.value.to_numpy(), res.df.value.to_numpy(), rtol=1e-9, atol=0)


@pytest.mark.parametrize("embed_scale", [1.0, 1e-9], ids=["normal", "norms-below-1e-6"])
def test_residual_stats_match_the_reference(embed_scale):
    """Every measure of analyze_norms.py, also where the residual norms are below the
    reference's 1e-6 clamp (and below torch's cosine eps 1e-8), where 'probekit' differs."""
    hf = _hf("llama")
    with torch.no_grad():
        hf.model.embed_tokens.weight.mul_(embed_scale)
    data, prompts = _data(VARIABLE)
    model, plain = probekit.load(hf), twin(hf)
    h0 = ref.block_io(plain, prompts[0][None], torch.ones_like(prompts[0][None]))[0][0]
    assert (float(h0.norm(dim=-1).max()) < 1e-8) == (embed_scale < 1)
    res = probekit.residual_stats(model, data, setting=CSORDAS).table()
    want = ref.csordas_norm_stats(plain, "llama", prompts)
    for name, values in want.items():
        assert np.allclose(res[name].to_numpy(), values.numpy(), rtol=1e-6, atol=1e-9), name
    own = probekit.residual_stats(model, data).table()
    differs = not np.allclose(own["attn_rel"].to_numpy(), res["attn_rel"].to_numpy(), rtol=1e-3)
    assert differs == (embed_scale < 1)


def test_keep_first_leaves_position_zero_untouched(monkeypatch):
    model, _, data, _ = model_twin_and_prompts("llama", VARIABLE)
    [batch] = model.prepare(data)
    trace = model.trace(batch)
    mask = torch.ones_like(batch.tokens, dtype=torch.bool)
    mask[:, 0] = False
    for sub in ("attn", "mlp"):
        logits = trace.resume(2, fwd_hooks=interventions.masked_ablate_hooks(model, 2, sub, mask))
        assert torch.equal(logits[:, 0], trace.logits[:, 0])
        assert not torch.allclose(logits[:, 1:], trace.logits[:, 1:])
    entered = []
    original = Trace.resume

    def spy(self, start, residual=None, *args, **kwargs):
        entered.append((self, start, residual))
        return original(self, start, residual, *args, **kwargs)

    monkeypatch.setattr(Trace, "resume", spy)
    probekit.skip_effects(model, data, setting=InterventionSetting(keep_first=True))
    for tr, start, residual in entered:
        assert torch.equal(residual[:, 0], tr.residuals[start][:, 0])  # block output kept
        assert torch.equal(residual[:, 1:], tr.residuals[start - 1][:, 1:])  # skipped


def test_keep_first_default_follows_the_tokenizer():
    class Tok:
        bos_token_id = 1

        def __init__(self, adds: bool) -> None:
            self.adds = adds

        def __call__(self, text):
            return {"input_ids": ([1] if self.adds else []) + [5]}

    assert interventions.adds_bos(Tok(True)) and not interventions.adds_bos(Tok(False))
    assert not interventions.adds_bos(None)
    model, _, data, _ = model_twin_and_prompts("gpt2", EQUAL)
    assert model.tokenizer is None
    a = probekit.skip_effects(model, data).df.value.to_numpy()
    b = probekit.skip_effects(model, data, setting=InterventionSetting(keep_first=False))
    c = probekit.skip_effects(model, data, setting=InterventionSetting(keep_first=True))
    b, c = b.df.value.to_numpy(), c.df.value.to_numpy()
    assert np.array_equal(a, b) and not np.allclose(a, c)
    assert probekit.skip_effects(model, data, setting=CSORDAS).meta["keep_first"]


def test_short_prompts_are_counted_or_refused():
    model, _, _, _ = model_twin_and_prompts("gpt2", EQUAL)
    (tokens, mask), _ = _data((12, 9))
    with pytest.raises(InputError, match="long enough"):
        probekit.skip_effects(model, (tokens, mask), setting=FUTURE)
    (tokens, mask), _ = _data((13, 9))
    res = probekit.contributions(model, (tokens, mask), setting=FUTURE, components=["mlp"])
    assert res.summary["n_prompts"] == 2 and res.summary["n_prompts_skipped"] == 1
    assert res.meta["future_t"] == [[8], []]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"convention": "paper"},
        {"mode": "past"},
        {"keep_first": 1},
        {"n_future": 0},
        {"seed": "a"},
        {"mode": "future", "answer_start": [9.5, 9]},
        {"answer_start": [9, 9]},  # current mode
        {"mode": "future", "answer_start": [9]},  # one per prompt
        {"mode": "future", "answer_start": [9, 30]},  # beyond the prompt
    ],
)
def test_new_arguments_are_validated(kwargs):
    model, _, data, _ = model_twin_and_prompts("gpt2", (30, 20))
    with pytest.raises(InputError):
        probekit.skip_effects(model, data, setting=InterventionSetting(**kwargs))
    if set(kwargs) == {"convention"}:
        for fn in (probekit.logit_lens, probekit.residual_stats, probekit.contributions):
            with pytest.raises(InputError):
                fn(model, data, setting=InterventionSetting(**kwargs))


def test_future_mode_probekit_convention_is_seeded():
    model, _, data, _ = model_twin_and_prompts("gpt2", (30, 30, 25))
    setting = InterventionSetting(mode="future", seed=1)
    a = probekit.skip_effects(model, data, setting=setting)
    b = probekit.skip_effects(model, data, setting=setting, batch_size=1)
    assert np.allclose(a.df.value, b.df.value, rtol=1e-6, atol=1e-9)
    assert a.meta["future_t"] == b.meta["future_t"]
    assert all(len(ts) == 3 for ts in a.meta["future_t"][:2])


def test_future_ablations_restore_the_model_after_an_exception(monkeypatch):
    from tests.test_hygiene import assert_model_unchanged, fail_midway, model_snapshot

    model, _, (tokens, mask), _ = model_twin_and_prompts("gpt2", VARIABLE)
    before = model_snapshot(model, tokens, mask)
    fail_midway(monkeypatch, at=3)
    with pytest.raises(RuntimeError, match="injected failure"):
        probekit.contributions(  # fails inside a resumed forward with masked ablation hooks
            model,
            (tokens, mask),
            components=["mlp"],
            setting=InterventionSetting("csordas2025", "future"),
        )
    monkeypatch.undo()
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))
