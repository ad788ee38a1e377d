"""Tests of the GPT-2 builder, the init rate and the trainer (checkpoints, resume, NaN)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.anchor import training as trainer_mod
from probekit.errors import CheckpointError, ConfigError, NumericalError
from probekit.training import ModelConfig, init_params
from probekit.training import models as models_mod
from probekit.training.models import init_stacked_params, stacked_forward, to_hf_model
from tests.conftest import TINY_ANCHOR_TASK, tiny_anchor

torch.set_num_threads(1)

TINY_TASK = TINY_ANCHOR_TASK
tiny = tiny_anchor


# ----------------------------------------------------------------------------- models
def test_gamma_sets_the_std_of_every_weight_matrix() -> None:
    cfg = ModelConfig(n_layers=2, d_model=128, n_heads=4, gamma=0.6, gamma_qk=0.9)
    p = init_params(cfg, seed=0)
    d, f = 128, 512
    expect = {
        "transformer.wte.weight": d**-0.6,
        "transformer.wpe.weight": d**-0.6,
        "lm_head.weight": d**-0.6,
        "transformer.h.1.attn.c_proj.weight": d**-0.6,
        "transformer.h.0.mlp.c_fc.weight": d**-0.6,
        "transformer.h.0.mlp.c_proj.weight": f**-0.6,
    }
    for name, std in expect.items():
        assert float(p[name].std()) == pytest.approx(std, rel=0.1), name
    qkv = p["transformer.h.0.attn.c_attn.weight"]
    assert float(qkv[:, : 2 * d].std()) == pytest.approx(d**-0.9, rel=0.1)
    assert float(qkv[:, 2 * d :].std()) == pytest.approx(d**-0.6, rel=0.1)
    assert float(p["transformer.h.0.ln_1.weight"].min()) == 1.0
    assert float(p["transformer.h.0.attn.c_attn.bias"].abs().max()) == 0.0
    # larger gamma = smaller init; same seed = same weights
    small = init_params(ModelConfig(n_layers=2, d_model=128, n_heads=4, gamma=0.9), seed=0)
    assert float(small["transformer.wte.weight"].std()) < float(p["transformer.wte.weight"].std())
    again = init_params(cfg, seed=0)
    assert all(torch.equal(again[k], p[k]) for k in p)
    other = init_params(cfg, seed=1)
    assert not torch.equal(other["transformer.wte.weight"], p["transformer.wte.weight"])


@pytest.mark.parametrize("activation", ["gelu_new", "relu"])
def test_stacked_forward_matches_hugging_face(activation: str) -> None:
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, gamma=0.3, activation=activation)
    params = init_stacked_params(cfg, seeds=[0, 1])
    tokens = torch.randint(0, 201, (2, 5, 9))
    last = stacked_forward(params, tokens, cfg)
    full = stacked_forward(params, tokens, cfg, last_only=False)
    for m in range(2):
        ref = to_hf_model(cfg, params, m)(tokens[m]).logits
        torch.testing.assert_close(full[m], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(last[m], ref[:, -1], atol=1e-4, rtol=1e-4)


def test_model_config_validation() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="activation"):
        ModelConfig(activation="swishy")
    with pytest.raises(ConfigError, match="finite"):
        ModelConfig(gamma=float("nan"))
    with pytest.raises(ConfigError, match="positive"):
        ModelConfig(n_layers=0)


# ----------------------------------------------------------------------------- trainer
def test_schedule_warmup_then_cosine() -> None:
    c = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [c.lr_at(s) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)


def test_train_writes_a_hugging_face_checkpoint_and_metrics(tmp_path: Path) -> None:
    from transformers import GPT2LMHeadModel

    out = train(tiny(), tmp_path / "run", progress=False)
    ck = out.checkpoint
    for name in (
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
        "run_config.json",
    ):
        assert (ck / name).is_file(), name
    assert json.loads((ck / "trainer_state.json").read_text())["step"] == 8
    hf = GPT2LMHeadModel.from_pretrained(ck).eval()
    cfg, params = models_mod.from_hf_model(hf)
    tokens = TINY_TASK.dataset("test_data").tokens[:16]
    ours = stacked_forward(params, tokens[None], cfg)[0]
    torch.testing.assert_close(hf(tokens).logits[:, -1], ours, atol=1e-4, rtol=1e-4)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4, 6, 8]
    for key in ("train_acc", "test_data_acc", "test_task_inferential", "test_task_symmetric"):
        assert all(0.0 <= r[key] <= 1.0 for r in rows), key
    assert rows[0]["batch_loss"] is None  # no training batch before step 0
    assert rows[-1]["batch_loss"] < rows[1]["batch_loss"]  # it learns
    assert list(out.metrics["step"]) == [0, 2, 4, 6, 8]
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "run").iterdir())


def test_loss_is_on_the_last_token_only(tmp_path: Path) -> None:
    cfg = tiny(steps=1, eval_every=1, warmup_steps=1)
    out = train(cfg, tmp_path / "r", progress=False)
    stack = trainer_mod.AnchorStack([cfg], tmp_path / "unused", single=True)
    idx = stack.run_batch(0, 0)
    params = init_stacked_params(cfg.model, [cfg.seed])
    hf = to_hf_model(cfg.model, params, 0)
    data = TINY_TASK.dataset("train")
    logits = hf(data.tokens[idx]).logits
    last = F.cross_entropy(logits[:, -1], data.targets[idx]).item()
    assert out.metrics["batch_loss"].iloc[-1] == pytest.approx(last, rel=1e-5)
    every = F.cross_entropy(logits[:, :-1].reshape(-1, 201), data.targets[idx].repeat_interleave(8))
    assert abs(every.item() - last) > 1e-4  # the other positions would give another loss


def test_same_seed_same_run_other_seed_other_run(tmp_path: Path) -> None:
    a = load_file(
        str(train(tiny(), tmp_path / "a", progress=False).checkpoint / "model.safetensors")
    )
    b = load_file(
        str(train(tiny(), tmp_path / "b", progress=False).checkpoint / "model.safetensors")
    )
    c = load_file(
        str(train(tiny(seed=1), tmp_path / "c", progress=False).checkpoint / "model.safetensors")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["transformer.wte.weight"], c["transformer.wte.weight"])


class Killed(Exception):
    """Stands for a kill of the training process."""


def kill_at(monkeypatch, trainer, step: int) -> None:
    """Make the per-step hook of the ``trainer`` class raise :class:`Killed` once ``step``
    updates are done."""

    def after_step(state) -> None:
        if state.step == step:
            raise Killed(step)

    monkeypatch.setattr(trainer, "after_step", after_step)


@pytest.mark.parametrize("interrupt_at", [3, 4, 7])
def test_resume_is_bit_identical(tmp_path: Path, interrupt_at: int, monkeypatch) -> None:
    cfg = tiny(steps=8, checkpoint_every=2, eval_every=3)
    ref = train(cfg, tmp_path / "ref", progress=False)
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_at(patch, trainer_mod.AnchorStack, interrupt_at)
        train(cfg, tmp_path / "cut", progress=False)
    state = json.loads((tmp_path / "cut" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == ((interrupt_at - 1) // 2) * 2  # the last checkpoint before the kill
    resumed = train(cfg, tmp_path / "cut", progress=False)
    for name in ("model.safetensors", "optimizer.safetensors"):
        x = load_file(str(ref.checkpoint / name))
        y = load_file(str(resumed.checkpoint / name))
        assert x.keys() == y.keys()
        # rng.* is the process's global RNG state, saved and restored but not the run's own
        assert all(torch.equal(x[k], y[k]) for k in x if not k.startswith("rng.")), name
    cols = [c for c in ref.metrics.columns if c != "elapsed_s"]
    assert ref.metrics[cols].equals(resumed.metrics[cols])


def test_resume_refuses_other_settings(tmp_path: Path) -> None:
    train(tiny(steps=2), tmp_path / "r", progress=False)
    with pytest.raises(ConfigError, match="other settings"):
        train(tiny(steps=2, lr=1e-2), tmp_path / "r", progress=False)
    (tmp_path / "r" / "checkpoint" / "optimizer.safetensors").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        train(tiny(steps=2), tmp_path / "r", progress=False)
    fresh = train(tiny(steps=2, lr=1e-2), tmp_path / "r", resume=False, progress=False)
    assert fresh.metrics["step"].tolist() == [0, 2]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path: Path, monkeypatch) -> None:
    real = trainer_mod.stacked_forward
    calls = {"n": 0}

    def poisoned(params, tokens, cfg, last_only=True):
        out = real(params, tokens, cfg, last_only)
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 6:  # the 6th training step
                return out * float("nan")
        return out

    monkeypatch.setattr(trainer_mod, "stacked_forward", poisoned)
    with pytest.raises(NumericalError) as info:
        train(tiny(steps=8, checkpoint_every=2), tmp_path / "r", progress=False)
    msg = str(info.value)
    assert "NaN" in msg and "step 6" in msg and "Fix:" in msg
    ck = tmp_path / "r" / "checkpoint"
    assert json.loads((ck / "trainer_state.json").read_text())["step"] == 4
    weights = load_file(str(ck / "model.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"batch_size": 1000}, "exceeds"),
        ({"lr": -1.0}, "lr"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"model": ModelConfig(vocab_size=300)}, "vocabulary"),
        ({"model": ModelConfig(n_positions=4)}, "n_positions"),
        ({"name": "a/b"}, "folder name"),
        ({"device": "tpu"}, "device"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bad_training_settings(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        tiny(**kwargs)


def test_config_round_trip() -> None:
    c = tiny(weight_decay=0.3, model=ModelConfig(d_model=16, n_heads=2, gamma_vo=0.7))
    again = TrainConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.to_dict() == c.to_dict()
    assert math.isclose(again.model.gammas()["vo"], 0.7)


_KILL_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {root!r})
from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.training import ModelConfig
import json
cfg = TrainConfig.from_dict(json.loads(open({cfg!r}).read()))
train(cfg, {out!r}, progress=False)
"""


def test_resume_after_a_real_kill_is_bit_identical(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tiny(steps=100, checkpoint_every=4, eval_every=25, warmup_steps=10)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    root = str(Path(__file__).resolve().parent.parent)
    script = _KILL_SCRIPT.format(
        root=root, cfg=str(tmp_path / "cfg.json"), out=str(tmp_path / "killed")
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    state = tmp_path / "killed" / "checkpoint" / "trainer_state.json"
    deadline = time.time() + 120
    step = 0
    while time.time() < deadline and proc.poll() is None:
        if state.exists():
            try:
                step = json.loads(state.read_text())["step"]
            except (OSError, ValueError):
                step = 0
            if step >= 8:
                break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)  # at an arbitrary point of the loop
    assert proc.wait() == -signal.SIGKILL and 8 <= step < 100
    resumed = train(cfg, tmp_path / "killed", progress=False)
    ref = train(cfg, tmp_path / "ref", progress=False)
    for name in ("model.safetensors", "optimizer.safetensors"):
        x = load_file(str(ref.checkpoint / name))
        y = load_file(str(resumed.checkpoint / name))
        assert all(torch.equal(x[k], y[k]) for k in x if not k.startswith("rng.")), name
    assert not [p for p in (tmp_path / "killed").iterdir() if p.name.startswith(".")]


def test_resume_recovers_a_checkpoint_swap_cut_short(tmp_path: Path, monkeypatch) -> None:
    """A kill between the two renames of the atomic swap leaves only the moved-aside copy."""
    import os

    cfg = tiny(steps=8, checkpoint_every=2, eval_every=4)
    ref = train(cfg, tmp_path / "ref", progress=False)
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_at(patch, trainer_mod.AnchorStack, 5)
        train(cfg, tmp_path / "cut", progress=False)
    run = tmp_path / "cut"
    (run / ".checkpoint.abc.old").mkdir()
    os.replace(run / "checkpoint", run / ".checkpoint.abc.old" / "old")
    (run / ".checkpoint.def.tmp").mkdir()  # the half-written new checkpoint
    resumed = train(cfg, run, progress=False)
    x = load_file(str(ref.checkpoint / "model.safetensors"))
    y = load_file(str(resumed.checkpoint / "model.safetensors"))
    assert all(torch.equal(x[k], y[k]) for k in x)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint", "config.json", "metrics.jsonl"]
    cols = [c for c in ref.metrics.columns if c != "elapsed_s"]
    assert ref.metrics[cols].equals(resumed.metrics[cols])


def _cli():
    import argparse

    from probekit.cli.sweep import add_sweep_parser
    from probekit.cli.train import add_train_parser

    parser = argparse.ArgumentParser(prog="probekit")
    sub = parser.add_subparsers(dest="command")
    return parser, add_train_parser(sub), add_sweep_parser(sub)


def test_cli_flags_build_the_config_and_every_flag_is_explained() -> None:
    from probekit.cli.train_flags import build_train_config

    parser, train_p, sweep_p = _cli()
    for p in (train_p, sweep_p):
        for action in p._actions:
            assert action.help and len(action.help) > 10, action.dest
    args = parser.parse_args(
        [
            "train",
            "--out",
            "o",
            "--gamma",
            "0.8",
            "--gamma-qk",
            "0.9",
            "--n-layers",
            "3",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--heldout",
            "4,3;2,1",
            "--special-targets",
            "3,4:4;1,2:3",
            "--anchors",
            "1:5,2:1,3:-2,4:-8",
            "--weight-decay",
            "0.3",
            "--steps",
            "50",
            "--warmup-steps",
            "5",
            "--seed",
            "4",
            "--n-train",
            "600",
        ]
    )
    cfg = build_train_config(args)
    assert cfg.model.gamma == 0.8 and cfg.model.gammas()["qk"] == 0.9
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads) == (3, 32, 2)
    assert cfg.task.heldout_pairs == [(4, 3), (2, 1)] and cfg.task.n_train == 600
    # special targets are offsets from the composite: (1, 2) -> x + 6 + 3
    assert cfg.task.trained_target(50, (1, 2)) == 59 and cfg.task.symmetric_shift((2, 1)) == 9
    assert (cfg.weight_decay, cfg.steps, cfg.seed) == (0.3, 50, 4)
    assert callable(args.func)
    sweep_args = parser.parse_args(
        ["sweep", "--out", "s", "--gammas", "0.3,0.8", "--depths", "2,3", "--seeds", "0,1"]
    )
    assert sweep_args.gammas == [0.3, 0.8] and sweep_args.depths == [2, 3]
    with pytest.raises(SystemExit):
        parser.parse_args(["sweep", "--out", "s", "--gammas", "a,b"])


def test_cli_train_runs_and_resumes(tmp_path: Path, capsys) -> None:
    parser, _, _ = _cli()
    argv = [
        "train",
        "--out",
        str(tmp_path / "r"),
        "--d-model",
        "16",
        "--n-heads",
        "2",
        "--steps",
        "4",
        "--warmup-steps",
        "1",
        "--batch-size",
        "16",
        "--n-train",
        "64",
        "--n-test",
        "16",
        "--eval-every",
        "2",
        "--no-progress",
        "--device",
        "cpu",
    ]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "checkpoint:" in capsys.readouterr().out
    assert (tmp_path / "r" / "checkpoint" / "model.safetensors").is_file()
    args = parser.parse_args(argv[:-2] + ["--lr", "0.5"])
    with pytest.raises(ConfigError, match="other settings"):
        args.func(args)


# ----------------------------------------------------------------------------- run folders
def test_load_run_reads_anchor_and_lm_runs_new_and_old(tmp_path: Path) -> None:
    from probekit.lm import LMConfig
    from probekit.run_folders import load_run

    out = train(tiny(steps=2), tmp_path / "a", progress=False)
    stored = json.loads((out.checkpoint / "run_config.json").read_text())
    assert stored["kind"] == "anchor"
    for where in (out.out_dir, out.checkpoint):
        run = load_run(where)
        assert (run.kind, run.path, run.lm) == ("anchor", out.checkpoint, None)
        assert run.task == TINY_TASK and TrainConfig.from_dict(run.config) == tiny(steps=2)
    # the format written before the kind field
    del stored["kind"]
    (out.checkpoint / "run_config.json").write_text(json.dumps(stored))
    assert load_run(out.out_dir).task == TINY_TASK
    old_lm = tmp_path / "lm"
    old_lm.mkdir()
    (old_lm / "run_config.json").write_text(json.dumps({"lm": {"steps": 3, "d_model": 32}}))
    run = load_run(old_lm)
    assert (run.kind, run.task, run.lm) == ("lm", None, LMConfig(steps=3, d_model=32))
    assert load_run(tmp_path / "nothing") is None
    (old_lm / "run_config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_run(old_lm)
    (old_lm / "run_config.json").write_text(json.dumps({"kind": "vision"}))
    with pytest.raises(ConfigError, match="unknown run kind"):
        load_run(old_lm)
    (old_lm / "run_config.json").write_text(json.dumps({"lm": {"stepz": 3}}))
    with pytest.raises(ConfigError, match="stepz"):
        load_run(old_lm)


# ----------------------------------------------------------------------------- seeds, init scheme
def test_task_seed_follows_the_run_seed_unless_set() -> None:
    from dataclasses import replace

    from probekit.anchor.sweep import SweepConfig

    base = TrainConfig(task=AnchorTask(n_train=64, n_test=16), batch_size=8, seed=2)
    assert base.task.seed == 2 and base.task_seed is None
    moved = replace(base, seed=7)  # what a sweep does: the data follow the new seed
    assert moved.task.seed == 7
    assert not torch.equal(moved.task.dataset("train").tokens, base.task.dataset("train").tokens)
    fixed = replace(base, task_seed=0)
    assert replace(fixed, seed=9).task.seed == 0
    assert (
        TrainConfig(task=AnchorTask(n_train=64, n_test=16, seed=5), batch_size=8, seed=1).task.seed
        == 5
    )  # an explicitly seeded task keeps its data
    # saved and read back: the same data
    assert TrainConfig.from_dict(moved.to_dict()).task == moved.task
    # a sweep's seeds: one stack (and folder) per data seed
    sweep = SweepConfig(base, gammas=[0.3, 0.8], seeds=[0, 1])
    names = [name for name, _ in sweep.groups()]
    assert names == ["L2_data0", "L2_data1"]
    assert all(len({r.task.seed for r in runs}) == 1 for _, runs in sweep.groups())
    shared = SweepConfig(replace(base, task_seed=3), gammas=[0.3, 0.8], seeds=[0, 1])
    assert [(n, len(r)) for n, r in shared.groups()] == [("L2", 4)]


def test_run_config_saved_before_task_seed_keeps_its_data(tmp_path: Path) -> None:
    """A run folder written before task_seed / key_split / special_form loads with its data."""
    from probekit.run_folders import load_run

    out = train(tiny(steps=2), tmp_path / "a", progress=False)
    stored = json.loads((out.checkpoint / "run_config.json").read_text())
    stored.pop("task_seed")
    for key in ("key_split", "special_form"):
        stored["task"].pop(key)
    stored["task"]["special_targets"] = [[3, 4, -6]]  # the old absolute form
    stored["task"]["seed"], stored["seed"] = 0, 3
    (out.checkpoint / "run_config.json").write_text(json.dumps(stored))
    task = load_run(out.out_dir).task
    assert (task.seed, task.key_split, task.special_form) == (0, "probekit_v1", "shift")
    assert task.trained_target(50, (3, 4)) == 44 and task.modulus == 7


def test_init_scheme_official_and_recorded(tmp_path: Path) -> None:
    L, d = 3, 32
    fan = init_params(ModelConfig(n_layers=L, d_model=d, n_heads=2, gamma=0.5), 0)
    off = init_params(
        ModelConfig(n_layers=L, d_model=d, n_heads=2, gamma=0.5, init_scheme="official"), 0
    )
    for name in ("attn.c_proj.weight", "mlp.c_proj.weight"):
        key = f"transformer.h.1.{name}"
        want = d**-0.5 / (2 * L) ** 0.5  # d_model fan-in, extra 1/sqrt(2L)
        assert float(off[key].std()) == pytest.approx(want, rel=0.1)
    assert float(fan["transformer.h.1.mlp.c_proj.weight"].std()) == pytest.approx(
        (4 * d) ** -0.5, rel=0.1
    )
    fc = "transformer.h.1.mlp.c_fc.weight"
    assert torch.equal(fan[fc], off[fc])
    with pytest.raises(ConfigError, match="init_scheme"):
        ModelConfig(init_scheme="xavier")
    assert ModelConfig.from_dict({"d_model": 16, "n_heads": 2}).init_scheme == "fan_in"
    cfg = tiny(
        steps=2, model=ModelConfig(n_layers=2, d_model=16, n_heads=2, init_scheme="official")
    )
    out = train(cfg, tmp_path / "o", progress=False)
    saved = json.loads((out.out_dir / "config.json").read_text())
    assert saved["model"]["init_scheme"] == "official"
    assert (
        json.loads((out.checkpoint / "run_config.json").read_text())["model"]["init_scheme"]
        == "official"
    )
