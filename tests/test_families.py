"""Depth/width families: exact parameter counts and the 1% budget."""

from __future__ import annotations

import pytest
import torch
import transformers

from probekit.errors import ConfigError
from probekit.training.families import depth_family, gpt2_parameter_count


def hf_count(cfg) -> int:
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg.to_hf_config())
    return model.num_parameters()


@pytest.mark.parametrize("tie", [False, True])
def test_count_matches_hugging_face(tie):
    from probekit.training.models import ModelConfig

    cfg = ModelConfig(n_layers=3, d_model=48, n_heads=4, d_mlp=100, tie_embeddings=tie)
    want = hf_count(cfg)
    assert gpt2_parameter_count(3, 48, 100, 201, 9, tie_embeddings=tie) == want


@pytest.mark.parametrize("style", ["mlp", "width"])
def test_family_members_stay_within_one_percent(style):
    fam = depth_family(2_000_000, [2, 4, 6, 8, 12], style=style, d_model=128, n_heads=4)
    assert list(fam.df.depth) == [2, 4, 6, 8, 12]
    for cfg, row in zip(fam.model_configs(gamma=0.8), fam.df.itertuples(), strict=True):
        count = hf_count(cfg)
        assert count == row.params
        assert abs(count - 2_000_000) / 2_000_000 <= 0.01
        assert cfg.gamma == 0.8 and cfg.n_layers == row.depth
    if style == "mlp":
        assert fam.df.d_model.nunique() == 1 and fam.df.d_mlp.is_monotonic_decreasing
    else:
        assert fam.df.d_model.is_monotonic_decreasing and fam.df.d_model.nunique() > 1
        assert ((fam.df.d_mlp / fam.df.d_model) > 2).all()  # near the 4x ratio
    assert fam.figure().data
    assert fam.summary["max_abs_budget_error"] <= 0.01


def test_impossible_families_raise():
    with pytest.raises(ConfigError, match="exceeds the budget"):
        depth_family(200_000, [2, 64], style="mlp", d_model=128)
    with pytest.raises(ConfigError, match="unknown family style"):
        depth_family(10**6, [2], style="tall")
    with pytest.raises(ConfigError, match="positive integers"):
        depth_family(10**6, [0, 2])


def test_sweep_accepts_a_family(tmp_path):
    from probekit.anchor import AnchorTask, TrainConfig
    from probekit.anchor.sweep import SweepConfig, run_sweep

    task = AnchorTask(n_train=64, n_test=16)
    base = TrainConfig(task=task, steps=2, batch_size=8, eval_every=2, warmup_steps=1)
    fam = depth_family(200_000, [2, 3], style="width", n_heads=4)
    sweep = SweepConfig(base, gammas=[0.5], family=fam)
    runs = sweep.runs()
    assert [r.model.n_layers for r in runs] == [2, 3]
    for run, row in zip(runs, fam.df.itertuples(), strict=True):
        assert (run.model.d_model, run.model.d_mlp) == (row.d_model, row.d_mlp)
        assert hf_count(run.model) == row.params
    res = run_sweep(sweep, tmp_path / "sweep", progress=False)
    assert len(res.df) == 2 and res.meta["family"][0]["depth"] == 2
    with pytest.raises(ConfigError, match="sized for vocab_size"):
        SweepConfig(base, family=depth_family(200_000, [2], vocab_size=300))
    with pytest.raises(ConfigError, match="not all in the family"):
        SweepConfig(base, depths=[4], family=fam)
