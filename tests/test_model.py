"""The model handle: loading from disk, memory and bridges; validation; bad input."""

from __future__ import annotations

import json

import pytest
import torch

import probekit
from probekit.errors import (
    CheckpointError,
    InputError,
    NumericalError,
    ProbekitError,
    UnsupportedModelError,
)
from tests import reference as ref
from tests.conftest import VOCAB, make_hf, sample_tokens, twin


def test_load_in_memory_matches_plain_hf(arch):
    hf = make_hf(arch)
    plain = twin(hf)
    model = probekit.load(hf)
    tokens, mask = sample_tokens()
    got = model.logits(tokens, mask)
    want = ref.logits(plain, tokens, mask)
    valid = mask.bool()
    assert torch.allclose(got[valid], want[valid], atol=1e-5)
    assert model.n_layers == 4 and model.d_model == 32 and model.d_vocab == VOCAB
    assert model.is_causal == (arch != "bert")
    assert model.device.type == "cpu" and model.dtype == torch.float32


def test_load_from_disk(arch, tmp_path):
    hf = make_hf(arch)
    hf.save_pretrained(tmp_path / "ckpt")
    model = probekit.load(tmp_path / "ckpt", device="cpu")
    tokens, mask = sample_tokens()
    valid = mask.bool()
    assert torch.allclose(
        model.logits(tokens, mask)[valid], ref.logits(hf, tokens, mask)[valid], atol=1e-5
    )
    assert model.source == str(tmp_path / "ckpt")


def test_load_bridge_and_handle_pass_through():
    model = probekit.load(make_hf("gpt2"))
    again = probekit.load(model.bridge)
    assert again.bridge is model.bridge
    assert probekit.load(model) is model


def test_trace_resume_reproduces_the_forward(arch):
    model = probekit.load(make_hf(arch))
    [batch] = model.prepare(sample_tokens())
    trace = model.trace(batch)
    assert len(trace.residuals) == model.n_layers + 1
    for start in range(model.n_layers + 1):
        assert torch.allclose(trace.resume(start), trace.logits, atol=1e-5)


def test_default_labels_padding_and_positions():
    model = probekit.load(make_hf("gpt2"))
    tokens, mask = sample_tokens()
    [batch] = model.prepare((tokens, mask))
    assert torch.equal(batch.labels, ref.labels_for("gpt2", tokens, mask))
    bert = probekit.load(make_hf("bert"))
    [batch] = bert.prepare((tokens, mask))
    assert torch.equal(batch.labels, ref.labels_for("bert", tokens, mask))


# ---- bad input ------------------------------------------------------------------------------


def test_nonexistent_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        probekit.load(tmp_path / "nope")


def test_directory_without_config(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        probekit.load(tmp_path / "ckpt")


def test_corrupt_safetensors(tmp_path):
    make_hf("gpt2").save_pretrained(tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt safetensors"):
        probekit.load(tmp_path / "ckpt")
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="corrupt safetensors"):
        probekit.load(tmp_path / "ckpt")


def test_pickled_weights_are_refused(tmp_path):
    make_hf("gpt2").save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").rename(tmp_path / "ckpt" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="never unpickles"):
        probekit.load(tmp_path / "ckpt")


def test_unsupported_architecture(tmp_path):
    make_hf("gpt2").save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["architectures"] = ["FancyNetForCausalLM"]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="FancyNetForCausalLM"):
        probekit.load(tmp_path / "ckpt")


def test_nan_weights_are_refused():
    hf = make_hf("gpt2")
    with torch.no_grad():
        hf.transformer.h[1].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(NumericalError, match="NaN"):
        probekit.load(hf)


def test_nan_outputs_raise():
    model = probekit.load(make_hf("gpt2"))
    with torch.no_grad():
        model.hf_model.transformer.h[2].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(NumericalError, match="NaN"):
        probekit.contributions(model, sample_tokens(pad=False)[0])


@pytest.mark.parametrize(
    "data, match",
    [
        (torch.full((2, 5), VOCAB), "outside the vocabulary"),
        (torch.full((2, 5), -1), "outside the vocabulary"),
        (torch.ones(2, 40, dtype=torch.long), "more than the model's context"),
        (torch.zeros(0, 5, dtype=torch.long), "empty"),
        ([], "empty"),
        (torch.ones(2, 5), "dtype"),
        ((torch.ones(2, 5, dtype=torch.long), torch.ones(2, 4)), "attention_mask has shape"),
        ((torch.ones(2, 5, dtype=torch.long), torch.zeros(2, 5)), "no token as real"),
        ("hello", "cannot read data"),
    ],
)
def test_bad_data(data, match):
    model = probekit.load(make_hf("gpt2"))
    with pytest.raises(InputError, match=match):
        probekit.contributions(model, data)


def test_every_error_names_a_fix():
    err = InputError("token id 300 outside", fix="tokenize with this model's vocabulary")
    assert isinstance(err, ProbekitError) and "Fix:" in str(err)


def test_load_rejects_other_objects():
    with pytest.raises(InputError, match="cannot load a model"):
        probekit.load(42)
