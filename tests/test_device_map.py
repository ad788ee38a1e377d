"""Models spread over devices and the disk with a device_map (issue 9): on CPU, a small
max_memory offloads some layers to disk, and every number equals the model loaded whole."""

from __future__ import annotations

import pytest
import torch
import transformers

import probekit
from probekit.analyses import contributions, skip_effects
from probekit.errors import InputError
from probekit.toy import toy_hf_model, toy_tokens


def _spread(path, tmp_path, memory: int):
    return probekit.load(
        path,
        device_map="auto",
        max_memory={"cpu": memory},
        offload_folder=tmp_path / "offload",
    )


def _placed(model) -> set:
    placed = model.hf_model.hf_device_map if hasattr(model.hf_model, "hf_device_map") else {}
    if not placed:
        placed = model.hf_model.base_model.hf_device_map
    return set(placed.values())


def _check_equal(whole, spread):
    tokens = toy_tokens(3, 8)
    # hook-free resumes of the spread model keep the bridge (accelerate moves each block)
    assert whole.block_path == "hf"
    assert spread.block_path == "bridge (accelerate device_map / offload hooks on the model)"
    for analysis in (contributions, skip_effects):
        a, b = analysis(whole, tokens), analysis(spread, tokens)
        assert a.df["value"].to_numpy() == pytest.approx(b.df["value"].to_numpy(), abs=1e-6)
    [batch] = whole.prepare(tokens)
    trace = spread.trace(spread.prepare(tokens)[0])
    assert torch.allclose(trace.resume(1), whole.forward(batch), atol=1e-5)


def test_offloaded_layers_give_the_numbers_of_the_whole_model(tmp_path):
    folder = tmp_path / "llama"
    toy_hf_model("llama", n_layers=4, d_model=64).save_pretrained(folder)
    whole = probekit.load(folder, device="cpu")
    spread = _spread(folder, tmp_path, 300_000)
    assert _placed(spread) == {"cpu", "disk"}  # some layers in memory, some on disk
    assert spread.device == torch.device("cpu")
    _check_equal(whole, spread)


def test_offloaded_base_model_without_a_head(tmp_path):
    folder = tmp_path / "gpt2"
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=64, n_layer=4, n_head=4)
    torch.manual_seed(0)
    transformers.GPT2Model(config).save_pretrained(folder)
    whole = probekit.load(folder, device="cpu")
    spread = _spread(folder, tmp_path, 250_000)
    assert spread.output_kind == "hidden" and "disk" in _placed(spread)
    _check_equal(whole, spread)


def test_bad_placements_are_refused_before_loading(tmp_path):
    with pytest.raises(InputError, match="in memory"):
        probekit.load(toy_hf_model(), device_map="auto")
    with pytest.raises(InputError, match="only apply with a device_map"):
        probekit.load(tmp_path, max_memory={"cpu": 10})
    with pytest.raises(InputError, match="both given"):
        probekit.load(tmp_path, device="cpu", device_map="auto")
    with pytest.raises(InputError, match="device_map="):
        probekit.load(tmp_path, device_map="everywhere")


def test_cli_device_map_flag(tmp_path, capsys):
    from probekit.cli import build_parser, main

    folder = tmp_path / "llama"
    toy_hf_model("llama", n_layers=2).save_pretrained(folder)
    args = build_parser().parse_args(
        ["diagnose", str(folder), "--out", "r", "--device-map", "auto"]
    )
    assert args.device_map == "auto"
    out = tmp_path / "report"
    argv = ["diagnose", str(folder), "--out", str(out), "--device-map", "auto", "--device", "cpu"]
    assert main(argv) == 2
    assert "--device and --device-map" in capsys.readouterr().err
    assert not out.exists()
