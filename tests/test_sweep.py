"""Tests of sweeps: stacked runs equal runs trained alone, the table and the phase diagrams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probekit.anchor import AnchorTask, TrainConfig
from probekit.anchor.sweep import SweepConfig, SweepResult, run_sweep
from probekit.errors import ConfigError
from probekit.result import Result
from probekit.training import ModelConfig

torch.set_num_threads(1)

TASK = AnchorTask(n_train=256, n_test=64, seed=2)
BASE = TrainConfig(
    model=ModelConfig(n_layers=2, d_model=16, n_heads=2),
    task=TASK,
    steps=12,
    batch_size=32,
    lr=5e-3,
    warmup_steps=2,
    eval_every=4,
    checkpoint_every=4,
    eval_train_samples=64,
    device="cpu",
)


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> tuple[SweepResult, SweepResult, Path]:
    root = tmp_path_factory.mktemp("sweep")
    grid = dict(gammas=[0.3, 0.8], weight_decays=[0.0, 0.5], depths=[1, 2], seeds=[0])
    stacked = run_sweep(SweepConfig(BASE, **grid), root / "stacked", progress=False)
    alone = run_sweep(SweepConfig(BASE, stack=False, **grid), root / "alone", progress=False)
    return stacked, alone, root


def test_stacked_runs_equal_runs_trained_alone(both) -> None:
    stacked, alone, root = both
    assert len(stacked.df) == len(alone.df) == 8
    by_run = alone.df.set_index("run")
    for _, row in stacked.df.iterrows():
        other = by_run.loc[row["run"]]
        # each stacked run is its own Hugging Face checkpoint ...
        ck = Path(row["checkpoint"])
        assert (ck / "config.json").is_file() and ck.parent.parent.parent.name == "stacks"
        w1 = load_file(str(ck / "model.safetensors"))
        w2 = load_file(str(Path(other["checkpoint"]) / "model.safetensors"))
        # ... with the weights of the run trained alone, within float tolerance. The key bias
        # is skipped: its gradient is zero in exact arithmetic (softmax ignores a constant
        # shift), so Adam turns float noise there into +-lr steps that change no output.
        for k in w1:
            a, b = w1[k], w2[k]
            if k.endswith("attn.c_attn.bias"):
                a, b = torch.cat([a[:16], a[32:]]), torch.cat([b[:16], b[32:]])
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=k)
        assert row["final_test_data_loss"] == pytest.approx(other["final_test_data_loss"], rel=1e-4)
        for col in ("final_train_acc", "final_test_data_acc", "final_test_task_inferential"):
            assert row[col] == pytest.approx(other[col], abs=1 / 64 + 1e-9), col
    # runs differ from each other (the stack does not mix them up)
    w = [
        load_file(str(Path(c) / "model.safetensors"))["transformer.wte.weight"]
        for c in stacked.df["checkpoint"]
    ]
    assert not torch.equal(w[0], w[1])


def test_stacks_group_by_shape(both) -> None:
    stacked, _, root = both
    groups = sorted(p.name for p in (root / "stacked" / "stacks").iterdir())
    assert groups == ["L1", "L2"]
    ckpts = sorted(p.name for p in (root / "stacked" / "stacks" / "L2" / "checkpoint").iterdir())
    assert ckpts == sorted(r for r in stacked.df["run"] if r.startswith("L2_"))
    cfg = json.loads(
        (root / "stacked" / "stacks" / "L2" / "checkpoint" / ckpts[0] / "config.json").read_text()
    )
    assert cfg["n_layer"] == 2


def test_table_figures_and_files(both) -> None:
    stacked, _, root = both
    out = root / "stacked"
    for name in ("results.csv", "sweep.json", "phase_diagrams.html"):
        assert (out / name).is_file()
    df = stacked.df
    for col in (
        "final_test_task_inferential",
        "best_test_task_symmetric",
        "final_train_acc",
        "best_test_data_acc",
        "solution",
    ):
        assert col in df.columns
    assert (df["best_test_data_acc"] >= df["final_test_data_acc"]).all()
    assert set(df["solution"]) <= {"inferential", "symmetric", "other", "memorizing"}
    back = Result.load(out / "sweep.json")
    assert isinstance(back, SweepResult)
    fig = back.figure()
    assert len(fig.data) == 4
    # gamma x depth heatmap = mean over seeds and weight decays
    z = fig.data[0].z
    expect = df[(df["depth"] == 1) & (df["gamma"] == 0.3)]["final_test_task_inferential"].mean()
    assert z[0][0] == pytest.approx(expect)
    assert list(fig.data[2].y) == ["0", "0.5"]
    single = back.phase_diagram("test_task_symmetric", "gamma", "weight_decay", which="best")
    assert single.data[0].z.shape == (2, 2)
    with pytest.raises(ConfigError):
        back.phase_diagram("nonsense")


def test_sweep_resume_is_a_no_op_when_done(both) -> None:
    stacked, _, root = both
    again = run_sweep(
        SweepConfig(BASE, gammas=[0.3, 0.8], weight_decays=[0.0, 0.5], depths=[1, 2]),
        root / "stacked",
        progress=False,
    )
    cols = [c for c in stacked.df.columns]
    assert again.df[cols].equals(stacked.df[cols])


def test_bad_sweeps() -> None:
    with pytest.raises(ConfigError, match="empty"):
        SweepConfig(BASE, gammas=[])
    with pytest.raises(ConfigError, match="repeat"):
        SweepConfig(BASE, seeds=[0, 0])
    with pytest.raises(ConfigError, match="max_stack"):
        SweepConfig(BASE, max_stack=0)


def test_max_stack_splits_groups() -> None:
    s = SweepConfig(BASE, gammas=[0.3, 0.5, 0.8], seeds=[0, 1], max_stack=4)
    groups = s.groups()
    assert [g for g, _ in groups] == ["L2-0", "L2-1"]
    assert [len(r) for _, r in groups] == [4, 2]
    assert len({r.name for _, runs in groups for r in runs}) == 6


def test_a_nan_run_in_a_stack_is_frozen_and_the_others_go_on(tmp_path: Path, monkeypatch) -> None:
    from probekit.anchor import training as trainer_mod
    from probekit.anchor.training import train, train_stack

    real = trainer_mod.stacked_forward
    calls = {"n": 0}

    def poisoned(params, tokens, cfg, last_only=True):
        out = real(params, tokens, cfg, last_only)
        if torch.is_grad_enabled() and out.shape[0] == 2:
            calls["n"] += 1
            if calls["n"] >= 5:  # run 1 diverges at its 5th step
                out = torch.cat([out[:1], out[1:] * float("nan")])
        return out

    runs = SweepConfig(BASE, gammas=[0.3, 0.8]).runs()
    monkeypatch.setattr(trainer_mod, "stacked_forward", poisoned)
    outs = train_stack(runs, tmp_path / "stack", progress=False)
    monkeypatch.setattr(trainer_mod, "stacked_forward", real)
    assert [o.status for o in outs] == ["ok", "nan at step 5"]
    alone = train(runs[0], tmp_path / "alone", progress=False)
    w1 = load_file(str(outs[0].checkpoint / "model.safetensors"))
    w2 = load_file(str(alone.checkpoint / "model.safetensors"))
    torch.testing.assert_close(
        w1["transformer.wte.weight"], w2["transformer.wte.weight"], atol=2e-5, rtol=1e-4
    )
    frozen = load_file(str(outs[1].checkpoint / "model.safetensors"))
    assert all(bool(torch.isfinite(v).all()) for v in frozen.values())
