"""Embedding and hidden-state maps and pair cosines, against plain Hugging Face states."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

import probekit
from probekit.analyses.mechanisms.maps import hidden_state_map, pair_cosines
from probekit.analyses.projection import reduce
from probekit.analyses.weights.embeddings import embedding_map, neighbour_ratio
from probekit.anchor import AnchorTask
from probekit.errors import InputError
from probekit.result import Result
from tests.conftest import make_hf, sample_tokens, twin
from tests.test_hygiene import assert_model_unchanged, model_snapshot


def _anchor_hf(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=201,
        n_positions=9,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    cfg._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_embedding_map_pca_and_the_arithmetic_line():
    hf = _anchor_hf()
    emb = hf.transformer.wte.weight.detach().double().numpy()[20:100]
    res = embedding_map(hf, tokens=range(20, 100))
    centred = emb - emb.mean(0)
    s = np.linalg.svd(centred, compute_uv=False)
    share = s**2 / (s**2).sum()
    assert res.summary["explained_variance_1"] == pytest.approx(share[0], rel=1e-6)
    assert res.summary["explained_variance_2"] == pytest.approx(share[1], rel=1e-6)
    assert 0.8 < res.summary["neighbour_ratio"] < 1.2  # random embedding: no order
    # plant an arithmetic line of item tokens: the map and the numbers must show it
    hf2 = _anchor_hf()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        direction = torch.randn(32, generator=g)
        line = torch.arange(20, 100, dtype=torch.float32)[:, None] * direction / 40
        hf2.transformer.wte.weight[20:100] = line + 0.01 * torch.randn(80, 32, generator=g)
    lined = embedding_map(hf2, tokens=range(20, 100))
    assert lined.summary["neighbour_ratio"] < 0.1
    assert lined.summary["order_corr"] > 0.99
    assert lined.summary["explained_variance_1"] > 0.95
    assert len(lined.figure().data) == 1


def test_neighbour_ratio_and_reduce_basics():
    line = np.arange(10.0)[:, None] * np.ones((1, 3))
    assert neighbour_ratio(line, np.arange(10)) == pytest.approx(3 / 11)
    xy, info = reduce(np.random.default_rng(0).normal(size=(40, 6)), "tsne")
    assert xy.shape == (40, 2) and info["perplexity"] > 1
    with pytest.raises(InputError, match="too few"):
        reduce(np.zeros((3, 4)))


def test_hidden_state_map_states_marks_and_mirror_ratio(tmp_path):
    task = AnchorTask(n_train=16, n_test=60)
    seen, held = task.dataset("test_data"), task.dataset("test_task")
    hf = _anchor_hf()
    ref = twin(hf)
    res = hidden_state_map(hf, [seen, held], sites=("resid_out", "mlp_out"))
    assert set(res.df.site) == {"resid_out", "mlp_out"} and set(res.df.layer) == {0, 1}
    marked = set(res.df[res.df.marked].group)
    assert "(4,3)" in marked and marked <= {"(4,3)", "(3,4)"}
    # PCA of the plain HF last-token state after layer 0 has the same spread
    tokens = torch.cat([seen.tokens, held.tokens])
    with torch.no_grad():
        plain = ref(input_ids=tokens, output_hidden_states=True).hidden_states[1][:, -1].numpy()
    part = res.df[(res.df.site == "resid_out") & (res.df.layer == 0)].sort_values("sample")
    xy, _ = reduce(plain.astype(np.float64))
    np.testing.assert_allclose(np.abs(part[["x", "y"]].to_numpy()), np.abs(xy), atol=1e-4)
    assert len(res.figure().data) == len(set(res.df.group)) * 2
    back = Result.load(res.save(tmp_path / "h.json"))
    assert back.summary == pytest.approx(res.summary)
    # identical inputs labelled as a pair and its mirror: their centroids coincide
    tokens = sample_tokens(pad=False)[0]
    tokens = torch.cat([tokens, tokens, tokens[:2] % 40 + 1])
    groups = ["(4,3)"] * 6 + ["(3,4)"] * 6 + ["(1,1)", "(2,2)"]
    same = hidden_state_map(
        make_hf("gpt2", n_layers=2), tokens, groups=groups, mirrors=[("(4,3)", "(3,4)")], layers=[1]
    )
    assert same.mirror_ratio("resid_out", 1) == pytest.approx(0.0, abs=1e-9)


def test_pair_cosines_symmetric_with_unit_diagonal_and_plain_reference(tmp_path):
    task = AnchorTask(n_train=16, n_test=200)
    data = task.dataset("test_data")
    hf = _anchor_hf()
    ref = twin(hf)
    res = pair_cosines(hf, data)
    for layer in (0, 1):
        m = res.matrix(layer)
        assert m.shape == (15, 15)  # 15 seen pairs
        np.testing.assert_allclose(m.to_numpy(), m.to_numpy().T, atol=1e-12)
        np.testing.assert_allclose(np.diag(m.to_numpy()), 1.0)
    # one entry by hand: (1,1) vs (2,2) after layer 0 at equal composite targets
    with torch.no_grad():
        h = ref(input_ids=data.tokens, output_hidden_states=True).hidden_states[1][:, -1]
    cos = []
    for t in sorted(set(data.composite.tolist())):
        a = (data.pairs == torch.tensor([1, 1])).all(-1) & (data.composite == t)
        b = (data.pairs == torch.tensor([2, 2])).all(-1) & (data.composite == t)
        if a.any() and b.any():
            x, y = h[a].double().mean(0), h[b].double().mean(0)
            cos.append(float(x @ y / (x.norm() * y.norm())))
    assert res.matrix(0).loc["(1,1)", "(2,2)"] == pytest.approx(np.mean(cos), abs=1e-5)
    assert len(res.figure().data) == 2
    back = Result.load(res.save(tmp_path / "c.json"))
    np.testing.assert_allclose(back.matrix(1).to_numpy(), res.matrix(1).to_numpy(), atol=1e-9)


def test_pair_cosines_take_the_anchor_tasks_answer_by_default():
    """The anchor task's reference answer is its inferential one (the first category): the
    default and ``answer="inferential"`` agree; an answer the data do not name is an error."""
    task = AnchorTask(n_train=16, n_test=60)
    model = probekit.load(_anchor_hf())
    data = task.dataset("test_data")
    default = pair_cosines(model, data, layers=[1])
    named = pair_cosines(model, data, layers=[1], answer="inferential")
    assert default.meta["answer"] == "inferential"
    pd.testing.assert_frame_equal(default.df, named.df)
    title = default.figure().layout.title.text.replace("<br>", " ")
    assert "between pairs at equal inferential answers" in title
    symmetric = pair_cosines(model, data, layers=[1], answer="symmetric")
    assert symmetric.meta["answer"] == "symmetric"
    with pytest.raises(InputError, match="no answer named 'composite'"):
        pair_cosines(model, data, answer="composite")


@pytest.mark.slow
def test_umap_maps():
    res = embedding_map(make_hf("gpt2", n_layers=1), method="umap")
    assert res.df.shape[0] == 49 and np.isfinite(res.df[["x", "y"]].to_numpy()).all()


def test_bad_input_names_problem_and_fix():
    model = probekit.load(make_hf("gpt2", n_layers=2))
    tokens, mask = sample_tokens()
    with pytest.raises(InputError, match="unknown map method"):
        embedding_map(model, method="mds")
    with pytest.raises(InputError, match="outside the vocabulary"):
        embedding_map(model, tokens=[1, 50])
    with pytest.raises(InputError, match="outside the model's 2 layers"):
        hidden_state_map(model, (tokens, mask), layers=[5])
    with pytest.raises(InputError, match="group labels for 6 sequences"):
        hidden_state_map(model, (tokens, mask), groups=["a"] * 5)
    with pytest.raises(InputError, match="unknown sites"):
        hidden_state_map(model, (tokens, mask), sites=["resid_mid"])
    with pytest.raises(InputError, match="need anchor-task data"):
        pair_cosines(model, tokens)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_maps_leave_model_untouched(arch):
    model = probekit.load(make_hf(arch, n_layers=2))
    tokens, mask = sample_tokens()
    before = model_snapshot(model, tokens, mask)
    hidden_state_map(model, (tokens, mask), sites=("resid_out", "attn_out"))
    embedding_map(model)
    assert_model_unchanged(before, model_snapshot(model, tokens, mask))
