"""Language-model training on the byte corpus, static and grown (MIDAS, MIDAS-plus)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import probekit
from probekit.errors import ConfigError
from probekit.lm import LMConfig, ResidualScale, train_lm
from probekit.training.growth import grow_checkpoint

TINY = dict(
    d_model=32,
    n_heads=4,
    seq_len=16,
    batch_size=2,
    eval_every=2,
    eval_sequences=4,
    corpus_max_files=30,
    warmup_steps=2,
)


def test_grown_run_checkpoints_and_flops(tmp_path):
    cfg = LMConfig(n_layers=4, initial_layers=2, growth="midas", block_size=2, steps=8, **TINY)
    run = train_lm(cfg, tmp_path / "grown", progress=False, device="cpu")
    assert [p.name for p in run.checkpoints] == ["stage1-before", "stage1-after"]
    before = json.loads((tmp_path / "grown/stage1-before/config.json").read_text())
    after = json.loads((tmp_path / "grown/stage1-after/config.json").read_text())
    assert (before["n_layer"], after["n_layer"]) == (2, 4)
    boundary = cfg.plan().boundaries[0]
    n_small = transformers.GPT2LMHeadModel(cfg.hf_config(2)).num_parameters()
    n_big = transformers.GPT2LMHeadModel(cfg.hf_config(4)).num_parameters()
    tokens = cfg.batch_size * cfg.seq_len
    want = 6 * tokens * (n_small * boundary + n_big * (cfg.steps - boundary))
    assert run.flops == pytest.approx(want)
    want_depths = [2 if s - 1 < boundary else 4 for s in run.metrics.step]
    assert list(run.metrics.depth) == want_depths and 2 in want_depths and 4 in want_depths
    model = probekit.load(run.final, device="cpu")
    assert model.n_layers == 4
    static = train_lm(
        LMConfig(n_layers=4, steps=8, **TINY), tmp_path / "static", progress=False, device="cpu"
    )
    assert run.flops < static.flops
    assert (tmp_path / "static/metrics.jsonl").is_file()


def test_residual_scale_zero_keeps_the_function(tmp_path):
    cfg = LMConfig(n_layers=4, initial_layers=2, **TINY)
    torch.manual_seed(0)
    small = transformers.GPT2LMHeadModel(cfg.hf_config(2)).eval()
    small.save_pretrained(tmp_path / "small")
    grown_dir = grow_checkpoint(tmp_path / "small", tmp_path / "big", "midas", 2)
    big = transformers.GPT2LMHeadModel.from_pretrained(grown_dir).eval()
    inserted = json.loads((grown_dir / "growth.json").read_text())["inserted"]
    tokens = torch.randint(0, 256, (2, 16))
    scaler = ResidualScale(big.transformer.h, inserted)
    scaler.scale = 0.0
    with torch.no_grad():
        assert torch.allclose(big(tokens).logits, small(tokens).logits, atol=1e-5)
        scaler.scale = 0.5
        assert not torch.allclose(big(tokens).logits, small(tokens).logits, atol=1e-4)
    scaler.close()
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in big.transformer.h)


def test_midas_plus_run(tmp_path):
    cfg = LMConfig(
        n_layers=4,
        initial_layers=2,
        growth="midas",
        steps=6,
        residual_scale_start=0.1,
        residual_scale_steps=2,
        **TINY,
    )
    run = train_lm(cfg, tmp_path / "plus", progress=False, device="cpu")
    assert torch.isfinite(torch.tensor(run.metrics.val_loss.to_numpy())).all()


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"growth": "sideways"}, "unknown growth"),
        ({"growth": "midas", "initial_layers": 2, "n_layers": 5}, "multiple of the block"),
        ({"growth": "midas", "steps": 1}, "cannot hold"),
        ({"growth": "midas", "alpha": 0.0}, "alpha"),
        ({"d_model": 30}, "divisible"),
    ],
)
def test_bad_configs_fail_before_training(overrides, match, tmp_path):
    cfg = LMConfig(**{**TINY, "n_layers": 4, "steps": 10, **overrides})
    with pytest.raises(ConfigError, match=match):
        train_lm(cfg, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()


def test_corpus_without_text_fails_before_training(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.py").write_text("")
    cfg = LMConfig(**{**TINY, "n_layers": 2, "steps": 4, "corpus_root": str(tmp_path / "texts")})
    with pytest.raises(ConfigError, match="no readable text"):
        train_lm(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


class Killed(Exception):
    """Stands for a kill of the training process."""


@pytest.mark.parametrize(
    "growth, kill_at",
    [("static", 5), ("midas", 3), ("midas", 5)],  # growth at step 3; kill at 5: scale ramping
)
def test_a_killed_run_resumes_bit_identical(tmp_path, monkeypatch, growth, kill_at):
    from safetensors.torch import load_file

    from probekit.lm import training as lm_training

    cfg = LMConfig(
        n_layers=4,
        initial_layers=2,
        growth=growth,
        steps=8,
        save_every=2,
        residual_scale_start=0.1 if growth != "static" else None,
        residual_scale_steps=3,
        **TINY,
    )
    ref = train_lm(cfg, tmp_path / "ref", progress=False, device="cpu")
    from probekit.run_folders import load_run

    run = load_run(tmp_path / "ref")
    assert (run.kind, run.path, run.lm, run.task) == ("lm", ref.final, cfg, None)

    def after_step(trainer):
        if trainer.step == kill_at:
            raise Killed

    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(lm_training.LMTrainer, "after_step", after_step)
        train_lm(cfg, tmp_path / "cut", progress=False, device="cpu")
    assert not (tmp_path / "cut" / "final").exists()
    resumed = train_lm(cfg, tmp_path / "cut", progress=False, device="cpu")
    for name in ("model.safetensors", "optimizer.safetensors"):
        x, y = load_file(str(ref.final / name)), load_file(str(resumed.final / name))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name
    cols = ["step", "depth", "lr", "train_loss", "val_loss", "flops"]
    assert resumed.metrics[cols].equals(ref.metrics[cols])
    assert resumed.flops == ref.flops
    assert [p.name for p in resumed.checkpoints] == [p.name for p in ref.checkpoints]
    again = train_lm(cfg, tmp_path / "cut", progress=False, device="cpu")  # finished: no training
    assert again.metrics[cols].equals(ref.metrics[cols])
    with pytest.raises(ConfigError, match="other settings"):
        train_lm(LMConfig(**{**cfg.__dict__, "lr": 2e-3}), tmp_path / "cut", progress=False)
