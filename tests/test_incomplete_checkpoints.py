"""Checkpoints whose tensors do not match their config are refused, never filled at random.

Hugging Face initialises missing weights at random and drops unexpected ones; numbers computed
on such a model would not be the checkpoint's, so probekit refuses to load it.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

import probekit
from probekit.cli import main
from probekit.errors import CheckpointError
from tests import reference as ref
from tests.conftest import make_hf, sample_tokens


def _saved(tmp_path, arch: str = "gpt2"):
    path = tmp_path / arch
    make_hf(arch).save_pretrained(path)
    return path, safetensors.torch.load_file(path / "model.safetensors")


def _rewrite(path, tensors: dict) -> None:
    safetensors.torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_a_missing_tensor_is_named(tmp_path):
    path, tensors = _saved(tmp_path)
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"1 missing tensor\(s\): transformer.h.1.mlp.c_fc"):
        probekit.load(path, device="cpu")


def test_unexpected_tensors_are_named(tmp_path):
    path, tensors = _saved(tmp_path)
    tensors["transformer.h.7.mlp.c_fc.weight"] = torch.zeros(3, 3)
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\): transformer.h.7"):
        probekit.load(path, device="cpu")


def test_a_weights_file_with_no_tensors(tmp_path):
    path, _ = _saved(tmp_path)
    _rewrite(path, {})
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\)"):
        probekit.load(path, device="cpu")


def test_a_config_with_more_layers_than_the_weights(tmp_path):
    path, _ = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["n_layer"] += 2
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\): transformer.h.4"):
        probekit.load(path, device="cpu")


def test_a_config_with_fewer_layers_than_the_weights(tmp_path):
    path, _ = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["n_layer"] -= 1
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"unexpected tensor\(s\): transformer.h.3"):
        probekit.load(path, device="cpu")


def test_another_architecture_over_these_weights(tmp_path):
    path, _ = _saved(tmp_path, "llama")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    config["model_type"] = "gpt2"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError):
        probekit.load(path, device="cpu")


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert"])
def test_complete_checkpoints_load_with_tied_weights_absent(arch, tmp_path):
    """GPT-2 and BERT tie the unembedding to the embedding and do not store it twice."""
    hf = make_hf(arch)
    hf.save_pretrained(tmp_path / arch)
    stored = safetensors.torch.load_file(tmp_path / arch / "model.safetensors")
    if arch == "gpt2":
        assert "lm_head.weight" not in stored
    model = probekit.load(tmp_path / arch, device="cpu")
    tokens, mask = sample_tokens()
    valid = mask.bool()
    want = ref.logits(hf, tokens, mask)
    assert torch.allclose(model.logits(tokens, mask)[valid], want[valid], atol=1e-5)


def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path, capsys):
    path, tensors = _saved(tmp_path)
    del tensors["transformer.h.0.attn.c_attn.weight"]
    _rewrite(path, tensors)
    capsys.readouterr()
    out = tmp_path / "report"
    argv = ["diagnose", str(path), "--out", str(out), "--device", "cpu", "--no-images"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probekit: error:") and "\n" not in err
    assert "transformer.h.0.attn.c_attn.weight" in err
    assert not out.exists()
