"""Condensation, spectra and timeline, checked against plain Hugging Face weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probekit
from probekit.analyses.common import cosine_matrix
from probekit.analyses.weights.condensation import condensation, condensation_timeline
from probekit.analyses.weights.spectra import spectra, stable_rank
from probekit.errors import InputError
from probekit.result import Result
from tests.conftest import make_hf, twin


def _plain_neurons(hf, arch: str, layer: int, name: str) -> np.ndarray:
    """Neurons' input weight vectors [n_neurons, d_model] read straight from the HF module."""
    if arch == "gpt2":
        block = hf.transformer.h[layer]
        d = hf.config.n_embd
        if name == "W_in":
            return block.mlp.c_fc.weight.detach().double().T.numpy()
        k = {"W_Q": 0, "W_K": 1, "W_V": 2}[name]
        return block.attn.c_attn.weight.detach().double()[:, k * d : (k + 1) * d].T.numpy()
    post_ln = arch == "post_ln_paper"  # an OPT: nn.Linear rows are neurons, fc1 is W_in
    block = hf.model.decoder.layers[layer] if post_ln else hf.model.layers[layer]
    module = {
        "W_Q": block.self_attn.q_proj,
        "W_K": block.self_attn.k_proj,
        "W_V": block.self_attn.v_proj,
        "W_in": block.fc1 if post_ln else block.mlp.up_proj,
    }[name]
    return module.weight.detach().double().numpy()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_condensation_matches_plain_weights(arch):
    hf = make_hf(arch, n_layers=2)
    ref = twin(hf)
    res = condensation(probekit.load(hf))
    for layer in range(2):
        for name in ("W_Q", "W_K", "W_V", "W_in"):
            plain = _plain_neurons(ref, arch, layer, name)
            cos = plain @ plain.T / np.outer(*(2 * [np.linalg.norm(plain, axis=1)]))
            got = res.matrix(layer, name)
            assert got.shape == cos.shape
            np.testing.assert_allclose(got, got.T, atol=1e-12)  # symmetric
            np.testing.assert_allclose(np.diag(got), 1.0, atol=1e-12)  # ones on the diagonal
            part = res.df[(res.df.layer == layer) & (res.df.matrix == name)]
            np.testing.assert_allclose(
                part.cosine, cos[part.neuron_i, part.neuron_j], atol=1e-10
            )  # a reordering of the plain cosine matrix
            off = ~np.eye(len(cos), dtype=bool)
            assert res.score(name, layer) == pytest.approx((cos[off] >= 0.7).mean())
    # random init: nearly nothing condenses
    assert res.summary["mean_score"] < 0.05


def test_condensed_weights_form_the_planted_groups():
    hf = make_hf("gpt2", n_layers=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        w = hf.transformer.h[0].mlp.c_fc.weight  # [d_model, d_mlp]: columns are neurons
        directions = torch.randn(2, w.shape[0], generator=g)
        scales = torch.rand(w.shape[1], generator=g) + 0.5
        which = torch.arange(w.shape[1]) % 4 == 0  # a quarter in group B, the rest in group A
        cols = torch.where(which[:, None], directions[1], directions[0]) * scales[:, None]
        w.copy_((cols + 0.01 * torch.randn(cols.shape, generator=g)).T)
    res = condensation(hf, matrices=["W_in"], threshold=0.7)
    assert res.groups("W_in", layer=0) == 2
    assert res.largest_share("W_in", layer=0) == pytest.approx(0.75)
    assert res.score("W_in", layer=0) == pytest.approx((96 * 95 + 32 * 31) / (128 * 127), abs=1e-9)
    # clustering puts each group in one contiguous block
    part = res.df[(res.df.i == 0)].sort_values("j")
    groups = part.group_j.to_numpy()
    assert (np.diff(groups) != 0).sum() == 1


def test_stable_rank_and_cosine_basics():
    assert stable_rank(np.outer([1.0, 2.0, 3.0], [4.0, -1.0, 0.5, 2.0])) == pytest.approx(1.0)
    assert stable_rank(np.eye(5)) == pytest.approx(5.0)
    assert stable_rank(np.diag([2.0, 1.0])) == pytest.approx(1.25)
    assert stable_rank(np.zeros((3, 3))) == 0.0
    cos = cosine_matrix(np.array([[1.0, 0.0], [-2.0, 0.0], [0.0, 0.0]]))
    assert cos.tolist() == [[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_spectra_match_plain_svd(arch):
    hf = make_hf(arch, n_layers=2)
    ref = twin(hf)
    res = spectra(hf, tokens=range(5, 45))
    for layer in range(2):
        plain = _plain_neurons(ref, arch, layer, "W_Q")
        s = np.linalg.svd(plain, compute_uv=False)
        got = res.df[(res.df.layer == layer) & (res.df.matrix == "W_Q")].sort_values("index")
        np.testing.assert_allclose(got.value, s, rtol=1e-9)
        assert res.stable_rank("W_Q", layer) == pytest.approx(((s / s[0]) ** 2).sum())
    emb = ref.get_input_embeddings().weight.detach().double().numpy()
    assert res.stable_rank("W_E") == pytest.approx(stable_rank(emb))
    eig = np.sort(np.linalg.eigvalsh(np.cov(emb[5:45], rowvar=False)))[::-1]
    got = res.df[res.df.matrix == "emb_cov"].sort_values("index").value.to_numpy()
    np.testing.assert_allclose(got, np.clip(eig, 0, None), atol=1e-10)
    gated = set(res.df.matrix) >= {"W_gate"}
    assert gated == (arch == "llama")
    ranks = res.stable_ranks()
    assert (ranks.stable_rank >= 1 - 1e-9).all()


def test_weight_matrices_shapes():
    w = probekit.load(make_hf("llama", n_layers=2)).weights()
    assert w[(0, "W_Q")].shape == (32, 32)
    assert w[(0, "W_K")].shape == (32, 16)  # 2 key-value heads of 8 dims
    assert w[(1, "W_O")].shape == (32, 32)
    assert w[(1, "W_in")].shape == (32, 64)
    assert w[(1, "W_out")].shape == (64, 32)


def test_timeline_finds_the_onset(tmp_path):
    plain = make_hf("gpt2", n_layers=1)
    condensed = make_hf("gpt2", n_layers=1)
    with torch.no_grad():
        for name in ("c_fc",):
            w = getattr(condensed.transformer.h[0].mlp, name).weight
            w.copy_(torch.ones_like(w) + 0.01 * torch.randn_like(w))
        w = condensed.transformer.h[0].attn.c_attn.weight
        w.copy_(torch.ones_like(w) + 0.01 * torch.randn_like(w))
    res = condensation_timeline([plain, condensed], steps=[100, 200])
    assert res.summary["onset_step"] == 200
    assert res.summary["last_mean_score"] > 0.9 > 0.05 > res.summary["first_mean_score"]
    sr = res.df[(res.df.quantity == "stable_rank") & (res.df.matrix == "W_in")]
    assert sr[sr.step == 200].value.iloc[0] < sr[sr.step == 100].value.iloc[0]
    res.figure()
    back = Result.load(res.save(tmp_path / "t.json"))
    assert back.summary == res.summary


def test_results_save_load_and_figures(tmp_path):
    model = probekit.load(make_hf("gpt2", n_layers=2))
    cond = condensation(model, layers=[1], matrices=["W_Q", "W_in"])
    assert set(cond.df.layer) == {1}
    fig = cond.figure()
    assert len(fig.data) == 2
    back = Result.load(cond.save(tmp_path / "c.json"))
    np.testing.assert_allclose(back.matrix(1, "W_Q"), cond.matrix(1, "W_Q"), atol=1e-9)
    spec = spectra(model)
    assert len(spec.figure().data) > 3
    back = Result.load(spec.save(tmp_path / "s.json"))
    assert back.summary == pytest.approx(spec.summary)


def test_bad_input_names_problem_and_fix():
    model = probekit.load(make_hf("gpt2", n_layers=2))
    with pytest.raises(InputError, match="outside the model's 2 layers"):
        condensation(model, layers=[2])
    with pytest.raises(InputError, match="unknown neuron matrices"):
        condensation(model, matrices=["W_X"])
    with pytest.raises(InputError, match="threshold"):
        condensation(model, threshold=1.5)
    with pytest.raises(InputError, match="outside the vocabulary"):
        spectra(model, tokens=[3, 99])
    with pytest.raises(InputError, match="steps for"):
        condensation_timeline([model], steps=[1, 2])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_weight_analyses_leave_model_untouched(arch):
    from tests.conftest import sample_tokens
    from tests.test_hygiene import assert_model_unchanged, model_snapshot

    model = probekit.load(make_hf(arch, n_layers=2))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    condensation(model)
    spectra(model)
    condensation_timeline([model, model])
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))
