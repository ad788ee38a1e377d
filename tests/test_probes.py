"""Linear probes: planted decodable variables, control tasks, causality, plain activations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probekit
from probekit.analyses.activations import gather
from probekit.analyses.mechanisms.probes import fit_probe, linear_probes
from probekit.anchor import AnchorTask
from probekit.errors import InputError
from probekit.result import Result
from tests.conftest import VOCAB, make_hf, twin
from tests.test_hygiene import assert_model_unchanged, model_snapshot


def _tokens(n=240, length=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (n, length), generator=g)


@pytest.fixture(scope="module")
def gpt2():
    return probekit.load(make_hf("gpt2", n_layers=2))


def test_planted_variable_is_decodable_and_shuffled_labels_are_not(gpt2):
    tokens = _tokens()
    planted = (tokens[:, 3] < VOCAB // 2).long()  # the token identity at position 3
    noise = torch.from_numpy(np.random.default_rng(0).integers(0, 2, len(tokens)))
    res = linear_probes(
        gpt2, tokens, labels={"planted": planted, "noise": noise}, sites=["resid"], positions=[2, 3]
    )
    acc = res.map("planted")
    assert acc.loc[0, 3] >= 0.95  # depth 0 = embeddings: the token itself
    assert res.map("planted", "control").loc[0, 3] < 0.75  # control task ~ chance
    assert res.map("planted", "selectivity").loc[0, 3] > 0.25
    assert acc[2].max() < 0.75  # a decoder cannot see a later token
    assert res.map("noise").to_numpy().max() < 0.75  # nothing to decode in random labels
    assert res.first_layer("planted") == 0
    assert res.first_layer("noise") is None
    assert res.first_layers().loc["planted", 3] == 0
    assert set(res.df.layer) == {0, 1, 2}


def test_value_probe_recovers_a_linear_readout_and_matches_plain_activations(gpt2):
    tokens = _tokens()
    ref = twin(make_hf("gpt2", n_layers=2))
    with torch.no_grad():
        hidden = ref(input_ids=tokens, output_hidden_states=True).hidden_states
    u = torch.randn(32, generator=torch.Generator().manual_seed(1))
    value = (hidden[1][:, 4] @ u).double()  # linear in the input of layer 1 at position 4
    res = linear_probes(gpt2, tokens, labels={"v": value.numpy()}, sites=["resid"], positions=[4])
    assert res.meta["kinds"] == {"v": "value"}
    assert res.map("v").loc[1, 4] > 0.95
    assert res.map("v", "control").loc[1, 4] < 0.2
    batches = gpt2.prepare(tokens, 100)
    for layer in range(2):
        acts, valid = gather(gpt2, batches, gpt2.hook_name(layer, "resid_in"))
        assert valid.all() and acts.shape == (240, 6, 32)
        np.testing.assert_allclose(acts, hidden[layer].numpy(), atol=1e-5)


def test_sublayer_sites_and_padding(gpt2):
    tokens = _tokens(n=60)
    mask = torch.ones_like(tokens)
    mask[:20, 4:] = 0
    res = linear_probes(
        gpt2, (tokens * mask, mask), labels={"t": tokens[:, 0] % 2}, probe="ridge", positions=[0, 5]
    )
    assert set(res.df.site) == {"resid", "attn_out", "mlp_out"}
    assert set(res.df[res.df.site == "attn_out"].layer) == {0, 1}
    at5 = res.df[res.df.position == 5]
    assert (at5.n_train + at5.n_test == 40).all()  # padded rows leave the probe
    at0 = res.df[res.df.position == 0]
    assert (at0.n_train + at0.n_test == 60).all()


def test_fit_probe_basics():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8))
    y = x[:, :4].argmax(1)  # 4 classes, linear boundaries
    assert fit_probe(x[:200], y[:200], x[200:], y[200:]) > 0.8
    assert fit_probe(x[:200], rng.permutation(y[:200]), x[200:], y[200:]) < 0.5
    assert fit_probe(x[:200], y[:200], x[200:], y[200:], probe="ridge") > 0.8
    v = x @ np.arange(8.0)
    assert fit_probe(x[:200], v[:200], x[200:], v[200:], kind="value") > 0.99


def test_anchor_variables_from_the_task_data():
    task = AnchorTask(n_train=16, n_test=30)
    data = task.dataset("test_data")
    v = data.variables()
    assert list(v) == ["key", "a1", "a2", "g1", "target"]
    shifts = np.array([task.anchors[int(a)] for a in v["a1"]])
    np.testing.assert_array_equal(v["g1"], v["key"] + shifts)


def test_anchor_defaults_on_an_anchor_sized_model(tmp_path):
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=201,
        n_positions=9,
        n_embd=32,
        n_layer=1,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = probekit.load(transformers.GPT2LMHeadModel(cfg).eval())
    task = AnchorTask(n_train=16, n_test=120)
    data = task.dataset("test_data")
    res = linear_probes(model, data, sites=["resid"], positions="roles", probe="ridge")
    assert set(res.df.variable) == {"key", "a1", "a2", "g1", "target"}
    assert list(res.first_layers().columns) == ["key", "anchor1", "anchor2", "last"]
    assert list(res.map("a1").columns) == ["key", "anchor1", "anchor2", "last"]
    # at depth 0 (embeddings) each role's own token is decodable at its own position
    assert res.map("a1").loc[0, "anchor1"] > 0.95
    assert res.map("a2").loc[0, "anchor2"] > 0.95
    assert res.map("a1").loc[0, "key"] < 0.5
    res.figure()
    back = Result.load(res.save(tmp_path / "p.json"))
    assert back.summary == res.summary
    back.figure()


def test_bad_input_names_problem_and_fix(gpt2):
    tokens = _tokens(n=40)
    with pytest.raises(InputError, match="have shape"):
        linear_probes(gpt2, tokens, labels={"x": np.zeros(39)})
    with pytest.raises(InputError, match="too few"):
        linear_probes(gpt2, tokens[:10], labels={"x": np.zeros(10)})
    with pytest.raises(InputError, match="no labels"):
        linear_probes(gpt2, tokens)
    with pytest.raises(InputError, match="unknown probe sites"):
        linear_probes(gpt2, tokens, labels={"x": np.zeros(40)}, sites=["resid_mid"])
    with pytest.raises(InputError, match="unknown kind"):
        linear_probes(gpt2, tokens, labels={"x": np.zeros(40)}, kinds={"x": "ordinal"})
    with pytest.raises(InputError, match="outside the 6 positions"):
        linear_probes(gpt2, tokens, labels={"x": np.zeros(40)}, positions=[6])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_probes_leave_model_untouched(arch):
    model = probekit.load(make_hf(arch, n_layers=2))
    tokens = _tokens(n=40)
    before = model_snapshot(model, tokens, None)
    linear_probes(model, tokens, labels={"x": tokens[:, 0] % 2}, positions="last", probe="ridge")
    assert_model_unchanged(before, model_snapshot(model, tokens, None))


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_probe_fits_run_on_one_blas_thread_and_the_limit_is_lifted_after(gpt2, monkeypatch):
    """OpenBLAS's spinning worker threads made the probes 10x slower on a shared machine."""
    from probekit.analyses.mechanisms import probes

    before, seen = _blas_threads(), []

    def recording_fit(*args, **kwargs):
        seen.append(_blas_threads())
        return fit_probe(*args, **kwargs)

    monkeypatch.setattr(probes, "fit_probe", recording_fit)
    tokens = torch.randint(0, VOCAB, (24, 4))
    linear_probes(gpt2, tokens, labels={"first": tokens[:, 0] % 2}, positions=[0], probe="ridge")
    assert seen and all(threads == {1} for threads in seen)
    assert _blas_threads() == before
