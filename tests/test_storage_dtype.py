"""Weights kept in their stored dtype apart from the computation's (``load(storage=...)``,
``probekit diagnose --storage``): a bf16 checkpoint, sharded with its index, computed in float32
on the fly gives the numbers of a float32 load, keeps its weights in bf16, holds one module's
float32 weights at a time, and is chosen by itself when the float32 copy would not fit."""

from __future__ import annotations

import json
import logging
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

import probekit
import probekit.model.checkpoint as checkpoint_module
from probekit.errors import CheckpointError, InputError
from probekit.model import storage
from probekit.model.checkpoint import weights_bytes
from probekit.model.storage import storage_dtypes
from probekit.toy import toy_hf_model, toy_tokens

ARCHS = ("gpt2", "llama")

TOLERANCE = 1e-6
"""Largest difference between a stored-bf16 / float32-computed number and a float32 load's,
relative to max(1, |value|): bf16 -> float32 is exact and the same float32 operations run, so
the numbers are equal (measured: 0.0); the tolerance leaves room for a kernel's order."""


@pytest.fixture(scope="module", params=ARCHS)
def sharded(request, tmp_path_factory) -> Path:
    """A toy checkpoint of 3 layers saved in bf16 as several safetensors shards and their
    ``model.safetensors.index.json``, as the Hub ships large models."""
    folder = tmp_path_factory.mktemp(request.param) / "ckpt"
    hf = toy_hf_model(request.param, n_layers=3, seed=1).to(torch.bfloat16)
    hf.save_pretrained(folder, max_shard_size=20_000)
    return folder


def _differences(want, got) -> float:
    """The largest difference between two tables' values, relative to max(1, |value|)."""
    a, b = want.value.to_numpy(float), got.value.to_numpy(float)
    assert np.array_equal(np.isfinite(a), np.isfinite(b))
    ok = np.isfinite(a)
    return float((np.abs(a[ok] - b[ok]) / np.maximum(1, np.abs(a[ok]))).max(initial=0))


def test_a_sharded_bf16_checkpoint_loads(sharded):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((sharded / name).is_file() for name in shards)
    assert probekit.model.stored_dtype(sharded) == torch.bfloat16
    model = probekit.load(sharded, device="cpu")  # the default: bf16 as stored
    assert model.dtype == torch.bfloat16 and storage_dtypes(model.hf_model) is None
    kept = probekit.load(sharded, device="cpu", storage="stored")
    assert model.dtype == torch.bfloat16
    assert kept.dtype == torch.float32
    assert storage_dtypes(kept.hf_model) == (torch.bfloat16, torch.float32)
    assert {p.dtype for p in kept.hf_model.parameters()} == {torch.bfloat16}


def test_stored_bf16_computed_in_float32_equals_a_float32_load(sharded):
    want_model = probekit.load(sharded, device="cpu", dtype=torch.float32)
    model = probekit.load(sharded, device="cpu", dtype=torch.float32, storage="stored")
    stored = {id(p): (p.data_ptr(), p.dtype) for p in model.hf_model.parameters()}
    data = toy_tokens(4, 8)
    [batch] = model.prepare(data)
    assert torch.equal(model.forward(batch), want_model.forward(batch))
    for analyzer in (probekit.logit_lens, probekit.skip_effects, probekit.contributions):
        assert _differences(analyzer(want_model, data).df, analyzer(model, data).df) <= TOLERANCE
    want = probekit.diagnose(want_model, data, n_bootstrap=5)
    got = probekit.diagnose(model, data, n_bootstrap=5)
    for kind, result in want.results.items():
        if kind == "gradients":  # accumulated into the bf16 weights: see docs, "Storage"
            assert _differences(result.df, got.results[kind].df) <= 2e-3
            continue
        assert _differences(result.df, got.results[kind].df) <= TOLERANCE, kind
    assert (want.headline, want.verdict) == (got.headline, got.verdict)
    # nothing leaked: every weight is the same bf16 tensor as before the analyses
    assert {id(p): (p.data_ptr(), p.dtype) for p in model.hf_model.parameters()} == stored


def test_the_unembedding_by_vocabulary_slices_gives_a_float32_loads_numbers(sharded, monkeypatch):
    """Slices of 7 rows (the toy vocabulary is several times that): the logits of a forward,
    of the heads the analyses apply, and the gradient through the head are those of a float32
    load; the embedding table stays as stored, unparametrized."""
    monkeypatch.setattr(storage, "UNEMBED_SLICE", 7)
    want_model = probekit.load(sharded, device="cpu", dtype=torch.float32)
    model = probekit.load(sharded, device="cpu", dtype=torch.float32, storage="stored")
    assert model.d_vocab > 3 * storage.UNEMBED_SLICE
    embedding = model.hf_model.get_input_embeddings()
    assert embedding.weight.dtype == torch.bfloat16 and not hasattr(embedding, "parametrizations")
    data = toy_tokens(4, 8)
    [batch] = model.prepare(data)
    with torch.no_grad():
        assert (model.forward(batch) - want_model.forward(batch)).abs().max() <= TOLERANCE
    for analyzer in (probekit.logit_lens, probekit.contributions):
        assert _differences(analyzer(want_model, data).df, analyzer(model, data).df) <= TOLERANCE
    grads = probekit.gradient_norms(model, data).df
    want = probekit.gradient_norms(want_model, data).df
    resid = grads.measure == "resid_grad_norm"  # through the head: float32 in both
    assert _differences(want[resid], grads[resid]) <= TOLERANCE
    assert _differences(want, grads) <= 2e-3  # the weights' gradients summed in bf16


def test_probekits_readers_of_weights_see_float32(sharded):
    want = probekit.load(sharded, device="cpu", dtype=torch.float32)
    model = probekit.load(sharded, device="cpu", storage="stored")
    assert torch.equal(model.unembedding, want.unembedding)
    assert torch.equal(model.embedding, want.embedding)
    weights, want_weights = model.weights(), want.weights()
    assert weights.keys() == want_weights.keys()
    assert all(torch.equal(weights[k], want_weights[k]) for k in weights)
    norm = model.runtime.head.frozen_norm(model.architecture)
    assert torch.equal(norm.weight, want.runtime.head.frozen_norm(want.architecture).weight)
    assert model.bridge.W_U.dtype == torch.float32


def _live_float32_bytes(monkeypatch) -> list[int]:
    """Patch the upcast (and the backward's copy of a saved weight) so that each call records
    the bytes of float32 weight copies alive then."""
    alive: list[weakref.ref] = []
    peaks: list[int] = []
    upcast, unpack = storage.Upcast.forward, storage.unpack_saved

    def record(out):
        bases = {id(b): b.numel() * 4 for r in alive if (t := r()) is not None for b in [_base(t)]}
        peaks.append(sum(bases.values()))
        return out

    def recording(self, stored):
        out = upcast(self, stored)
        alive.append(weakref.ref(out))
        return record(out)

    def unpacking(packed):
        out = unpack(packed)
        if isinstance(packed, storage.StoredCopy):
            alive.append(weakref.ref(out))
        return record(out)

    monkeypatch.setattr(storage.Upcast, "forward", recording)
    monkeypatch.setattr(storage, "unpack_saved", unpacking)
    return peaks


def _base(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor._base is None else tensor._base


def test_one_modules_float32_weights_at_a_time_less_than_a_block(sharded, monkeypatch):
    model = probekit.load(sharded, device="cpu", storage="stored")
    [batch] = model.prepare(toy_tokens(2, 6))
    peaks = _live_float32_bytes(monkeypatch)
    with torch.no_grad():
        model.forward(batch)
        model.trace(batch).resume(0)
    probekit.gradient_norms(model, toy_tokens(2, 6))  # the backward holds no float32 copy
    block = sum(group[0].numel() * 4 for group in model.layer_weights(0))  # one block, float32
    largest = max(  # the float32 bytes of the largest module holding weights of its own
        sum(p.numel() * 4 for p in m.parametrizations.parameters())
        for m in model.hf_model.modules()
        if hasattr(m, "parametrizations")
    )
    assert peaks and max(peaks) <= largest < block


def test_an_exception_in_a_forward_leaves_the_model_as_it_was(sharded):
    model = probekit.load(sharded, device="cpu", storage="stored")
    [batch] = model.prepare(toy_tokens(2, 6))
    with torch.no_grad():
        want = model.forward(batch)

    def fail(tensor, hook):
        raise RuntimeError("a hook failed")

    hooks = [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules()]
    with pytest.raises(RuntimeError, match="a hook failed"), torch.no_grad():
        model.forward(batch, [(model.hook_name(1, "resid_in"), fail)])
    assert [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.bridge.modules()] == (
        hooks
    )
    assert {p.dtype for p in model.hf_model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert torch.equal(model.forward(batch), want)
    assert model.block_path == "hf"  # the pure HF block copies compute in float32 too


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_float32_that_does_not_fit_keeps_the_stored_weights(sharded, monkeypatch, caplog):
    config = _config(sharded)
    full = weights_bytes(config, torch.float32)
    apart = weights_bytes(config, torch.float32, stored=torch.bfloat16)
    assert apart < full
    free = (full + apart) // 2
    monkeypatch.setattr(checkpoint_module, "available_memory", lambda device: free)
    with caplog.at_level(logging.WARNING, logger="probekit.model.checkpoint"):
        model = probekit.load(sharded, device="cpu", dtype=torch.float32)
    assert storage_dtypes(model.hf_model) == (torch.bfloat16, torch.float32)
    [line] = [r.getMessage() for r in caplog.records if "does not fit" in r.getMessage()]
    assert "keeping them in their stored bfloat16" in line and "float32" in line
    assert probekit.load(sharded, device="cpu").dtype == torch.bfloat16  # bf16 fits: as today
    with pytest.raises(CheckpointError, match="GiB are available"):  # asked not to: refused
        probekit.load(sharded, device="cpu", dtype=torch.float32, storage="dtype")


def test_a_model_that_fits_neither_way_says_what_to_do(sharded, monkeypatch):
    apart = weights_bytes(_config(sharded), torch.float32, stored=torch.bfloat16)
    monkeypatch.setattr(checkpoint_module, "available_memory", lambda device: apart - 1)
    with pytest.raises(CheckpointError, match="weights kept in bfloat16") as err:
        probekit.load(sharded, device="cpu", dtype=torch.float32)
    assert "--dtype bfloat16" in str(err.value) and "--device-map auto" in str(err.value)
    assert "fewer sequences" in str(err.value)


def test_float32_that_fits_is_cast_as_today(sharded):
    model = probekit.load(sharded, device="cpu", dtype=torch.float32)
    assert storage_dtypes(model.hf_model) is None
    assert {p.dtype for p in model.hf_model.parameters()} == {torch.float32}


def test_an_in_memory_model_keeps_its_dtype_apart_too():
    hf = toy_hf_model("llama", n_layers=2).to(torch.float16)
    data = toy_tokens(2, 6)
    want = probekit.logit_lens(probekit.load(hf, dtype=torch.float32), data).df
    model = probekit.load(hf, storage="stored")
    assert storage_dtypes(model.hf_model) == (torch.float16, torch.float32)
    assert _differences(want, probekit.logit_lens(model, data).df) <= TOLERANCE
    assert next(hf.parameters()).dtype == torch.float16  # the caller's model is untouched
    # weights already in the computation's dtype: nothing to keep apart
    assert storage_dtypes(probekit.load(hf, dtype=torch.float16, storage="stored").hf_model) is None


def test_bad_storage_is_refused_before_loading(sharded):
    with pytest.raises(InputError, match="storage='bf16' is none of"):
        probekit.load(sharded, storage="bf16")
    with pytest.raises(InputError, match="device_map were both given"):
        probekit.load(sharded, storage="stored", device_map="auto")


def test_diagnose_storage_flag_gives_the_float32_numbers(sharded, tmp_path):
    from probekit.cli import main

    argv = ["diagnose", str(sharded), "--random-tokens", "--n-sequences", "2", "--seq-len", "6"]
    argv += ["--bootstrap", "2", "--no-images", "--quiet", "--device", "cpu"]
    assert main([*argv, "--dtype", "float32", "--out", str(tmp_path / "cast")]) == 0
    assert main([*argv, "--storage", "stored", "--out", str(tmp_path / "kept")]) == 0
    for name in ("logit_lens.csv", "contributions.csv", "skip_effects.csv"):
        want = np.loadtxt(tmp_path / "cast" / name, delimiter=",", dtype=str)
        got = np.loadtxt(tmp_path / "kept" / name, delimiter=",", dtype=str)
        assert (want == got).all(), name
    with pytest.raises(SystemExit):
        main([*argv[:2], "--storage", "bf16"])


def test_a_tuned_lens_is_the_same_on_weights_kept_as_stored(sharded, tmp_path):
    from probekit.analyses.depth.tuned_lens import TunedLens

    want_model = probekit.load(sharded, device="cpu", dtype=torch.float32)
    model = probekit.load(sharded, device="cpu", storage="stored")
    data = toy_tokens(4, 8)
    lens = TunedLens.fit(want_model, data, steps=3)
    lens.save(tmp_path / "lens")
    TunedLens.load(tmp_path / "lens", model)  # the same model: its fingerprint matches
    got = TunedLens.fit(model, data, steps=3)
    for want, have in zip(lens.translators, got.translators, strict=True):
        assert torch.allclose(want.weight, have.weight, rtol=0, atol=TOLERANCE)


@pytest.mark.slow  # two diagnoses of two checkpoints per architecture: about 6 s
def test_compare_storage_flag_gives_the_float32_numbers(sharded, tmp_path):
    from probekit.cli import main

    other = tmp_path / "other"
    arch = "gpt2" if _config(sharded)["architectures"] == ["GPT2LMHeadModel"] else "llama"
    hf = toy_hf_model(arch, n_layers=3, seed=2).to(torch.bfloat16)
    hf.save_pretrained(other, max_shard_size=20_000)
    argv = ["compare", str(sharded), str(other), "--random-tokens", "--n-sequences", "2"]
    argv += ["--seq-len", "6", "--bootstrap", "2", "--quiet"]
    assert main([*argv, "--dtype", "float32", "--out", str(tmp_path / "cast")]) == 0
    assert main([*argv, "--storage", "stored", "--out", str(tmp_path / "kept")]) == 0
    want = (tmp_path / "cast" / "diagnoses.csv").read_text().replace("/cast/", "/")
    assert (tmp_path / "kept" / "diagnoses.csv").read_text().replace("/kept/", "/") == want
    summary = json.loads((tmp_path / "kept" / "ckpt" / "summary.json").read_text())
    assert "dtype=torch.float32" in summary["model"]
