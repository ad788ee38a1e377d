"""Depth growth: copied layers and optimizer moments, equivalence checks, schedules, errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import probekit
from probekit import interventions as iv
from probekit.errors import ConfigError
from probekit.training.growth import (
    grow_checkpoint,
    growth_plan,
    layer_map,
    prop_alpha_stages,
    training_flops,
)
from tests.conftest import make_hf, sample_tokens


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    hf = make_hf("gpt2", n_layers=4, scale=2.0)
    hf.save_pretrained(path)
    moments = {}
    for name, p in hf.named_parameters():
        moments["exp_avg." + name] = torch.randn_like(p)
        moments["exp_avg_sq." + name] = torch.rand_like(p)
    save_file({k: v.contiguous() for k, v in moments.items()}, str(path / "optimizer.safetensors"))
    (path / "run_config.json").write_text(json.dumps({"model": {"n_layers": 4}}))
    return path


@pytest.mark.parametrize(
    "method, new_layers",
    [("midas", [3, 4]), ("lidas", [2, 3]), ("append", [4, 5])],
)
def test_grown_layers_are_copies_and_skipping_them_restores_the_model(
    checkpoint, tmp_path, method, new_layers
):
    out = grow_checkpoint(checkpoint, tmp_path / "grown", method=method, block_size=2)
    mapping = layer_map(4, method, 2)
    old_w, new_w = (
        load_file(str(checkpoint / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    old_o, new_o = (
        load_file(str(checkpoint / "optimizer.safetensors")),
        load_file(str(out / "optimizer.safetensors")),
    )
    for new, src in enumerate(mapping):
        for key in old_w:
            if key.startswith(f"transformer.h.{src}."):
                twin = key.replace(f"transformer.h.{src}.", f"transformer.h.{new}.", 1)
                assert torch.equal(new_w[twin], old_w[key])
                for moment in ("exp_avg.", "exp_avg_sq."):
                    assert torch.equal(new_o[moment + twin], old_o[moment + key])
    assert json.loads((out / "config.json").read_text())["n_layer"] == 6
    assert json.loads((out / "run_config.json").read_text())["model"]["n_layers"] == 6
    original = probekit.load(checkpoint, device="cpu")
    grown = probekit.load(out, device="cpu")
    assert grown.n_layers == 6
    tokens, mask = sample_tokens()
    # the copy is a new layer: skipping exactly the inserted positions gives the original model
    inserted = json.loads((out / "growth.json").read_text())["inserted"]
    assert inserted == new_layers
    order_skip = [i for i in range(6) if i not in inserted]
    assert [mapping[i] for i in order_skip] == [0, 1, 2, 3]
    with iv.skip_layer(grown, inserted):
        skipped = grown.logits(tokens, mask)
    valid = mask.bool()
    assert torch.allclose(skipped[valid], original.logits(tokens, mask)[valid], atol=1e-5)
    assert not torch.allclose(grown.logits(tokens, mask)[valid], skipped[valid], atol=1e-4)


def test_schedules():
    assert prop_alpha_stages(1000, 3, 1.0) == [167, 333, 500]
    assert prop_alpha_stages(1000, 4, 0.5)[0] < prop_alpha_stages(1000, 4, 0.5)[-1]
    assert sum(prop_alpha_stages(997, 5, 2.0)) == 997
    plan = growth_plan(4, 8, 1200, method="midas", block_size=2, alpha=1.0)
    assert plan.depths == [4, 6, 8] and plan.boundaries == [200, 600]
    assert training_flops([10, 20], 100, [5, 5]) == 6 * 100 * 5 * 30


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: layer_map(4, "midas", 6), "larger than"),
        (lambda: layer_map(4, "lidas", 3), "even block"),
        (lambda: layer_map(4, "sideways", 2), "unknown growth method"),
        (lambda: prop_alpha_stages(100, 3, 0.0), "alpha"),
        (lambda: prop_alpha_stages(2, 3, 1.0), "cannot hold"),
        (lambda: growth_plan(4, 7, 100, block_size=2), "multiple of the block"),
        (lambda: growth_plan(1, 5, 100, block_size=2), "larger than"),
    ],
)
def test_impossible_schedules(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_refuses_non_gpt2(tmp_path):
    make_hf("llama").save_pretrained(tmp_path / "llama")
    with pytest.raises(ConfigError, match="cannot grow"):
        grow_checkpoint(tmp_path / "llama", tmp_path / "out")
    assert not (tmp_path / "out").exists()
