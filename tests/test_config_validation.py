"""Issue 14, training side: every bad setting is one ConfigError (exit 2) before any work."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.anchor.sweep import SweepConfig, run_sweep
from probekit.cli import main
from probekit.errors import ConfigError
from probekit.lm import LMConfig, train_lm
from probekit.training import ModelConfig
from probekit.training import memory as memory_mod
from probekit.training.growth import growth_plan, prop_alpha_stages, training_flops
from tests.conftest import TINY_LM

torch.set_num_threads(1)

TASK = AnchorTask(n_train=64, n_test=16)
NAN, INF = float("nan"), float("inf")


def tiny(**kw) -> TrainConfig:
    base = dict(
        model=ModelConfig(d_model=16, n_heads=2),
        task=TASK,
        steps=2,
        batch_size=8,
        eval_every=2,
        device="cpu",
    )
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "field, value",
    [
        ("steps", True),
        ("steps", 2.0),
        ("steps", 0),
        ("steps", -3),
        ("steps", "10"),
        ("batch_size", 0),
        ("batch_size", False),
        ("eval_every", 1.5),
        ("checkpoint_every", 0),
        ("seed", -1),
        ("seed", 2**32),
        ("seed", 1.0),
        ("warmup_steps", -1),
        ("lr", NAN),
        ("lr", INF),
        ("lr", 0.0),
        ("lr", "0.1"),
        ("lr", True),
        ("weight_decay", NAN),
        ("weight_decay", INF),
        ("weight_decay", -0.1),
        ("grad_clip", NAN),
        ("grad_clip", INF),
        ("grad_clip", -INF),
        ("eps", NAN),
        ("eps", INF),
        ("eps", 0.0),
        ("beta1", NAN),
        ("beta2", 1.0),
        ("min_lr_ratio", NAN),
        ("device", "tpu"),
        ("device", "cuda:x"),
        ("device", 0),
        ("eval_at_start", "yes"),
        ("name", ""),
        ("name", 5),
    ],
)
def test_bad_train_settings_are_one_config_error(field: str, value) -> None:
    with pytest.raises(ConfigError) as info:
        tiny(**{field: value})
    assert info.value.fix and (
        field in str(info.value)
        or "AdamW" in str(info.value)
        or "device" in str(info.value)
        or "name" in str(info.value)
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("layer_norm_eps", NAN),
        ("layer_norm_eps", INF),
        ("layer_norm_eps", 0.0),
        ("gamma", True),
        ("gamma", INF),
        ("gamma_qk", NAN),
        ("n_layers", True),
        ("d_model", 16.0),
        ("vocab_size", 2**31),
        ("tie_embeddings", "no"),
        ("activation", 3),
    ],
)
def test_bad_model_settings(field: str, value) -> None:
    with pytest.raises(ConfigError, match=field if field != "activation" else "activation"):
        ModelConfig(**{"d_model": 16, "n_heads": 2, field: value})


@pytest.mark.parametrize(
    "field, value",
    [
        ("seq_len", 0),
        ("seq_len", 2.0),
        ("batch_size", 0),
        ("batch_size", True),
        ("steps", -1),
        ("seed", -1),
        ("seed", 2**32),
        ("lr", NAN),
        ("lr", INF),
        ("weight_decay", NAN),
        ("grad_clip", INF),
        ("min_lr_ratio", NAN),
        ("block_size", 0),
        ("alpha", INF),
        ("alpha", NAN),
        ("residual_scale_steps", 0),
        ("residual_scale_start", NAN),
        ("residual_scale_start", "0.1"),
        ("save_every", 0),
        ("corpus_max_files", 0),
        ("d_mlp", 0),
        ("warmup_steps", -1),
        ("growth", 3),
        ("corpus_root", 5),
    ],
)
def test_bad_lm_settings_fail_before_anything_is_written(tmp_path: Path, field, value) -> None:
    cfg = LMConfig(**{**TINY_LM, field: value})
    with pytest.raises(ConfigError, match=field.split("_")[0]):
        cfg.validate()
    with pytest.raises(ConfigError):
        train_lm(cfg, tmp_path / "x", progress=False, device="cpu")
    assert not (tmp_path / "x").exists()


def test_lm_growth_alpha_huge_is_a_config_error_not_an_overflow() -> None:
    cfg = LMConfig(
        **{**TINY_LM, "n_layers": 6, "growth": "midas", "initial_layers": 2, "alpha": 1e308}
    )
    with pytest.raises(ConfigError, match="alpha"):
        cfg.validate()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: prop_alpha_stages(100, 3, INF), "alpha"),
        (lambda: prop_alpha_stages(100, 3, NAN), "alpha"),
        (lambda: prop_alpha_stages(100, 3, 1e308), "alpha"),
        (lambda: prop_alpha_stages(100, 3, 5000.0), "alpha"),
        (lambda: prop_alpha_stages(100, 0, 1.0), "stages"),
        (lambda: prop_alpha_stages(100, 2.0, 1.0), "stages"),
        (lambda: prop_alpha_stages(100, 3, True), "alpha"),
        (lambda: growth_plan(2, 4, 100, block_size=0), "block_size"),
        (lambda: growth_plan(2, 4.0, 100, block_size=2), "final_layers"),
        (lambda: training_flops([], 10, []), "stage"),
        (lambda: training_flops([1, 2], 10, [5]), "stage"),
    ],
)
def test_bad_growth_schedules(call, match) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"depths": [0]}, "depth"),
        ({"depths": [1.5]}, "depth"),
        ({"gammas": [NAN]}, "gamma"),
        ({"gammas": [INF]}, "gamma"),
        ({"gammas": ["0.3"]}, "gamma"),
        ({"weight_decays": [NAN]}, "weight decay"),
        ({"seeds": [-1]}, "seed"),
        ({"gammas": 0.3}, "list"),
        ({"max_stack": 1.5}, "max_stack"),
    ],
)
def test_bad_sweeps(kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        SweepConfig(tiny(), **kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"anchors": {1: 5}}, "at least two"),
        ({"anchors": {1: 5, "01": 3, 2: 1, 3: -2, 4: -8}}, "twice"),
        ({"anchors": [1, 2]}, "mapping"),
        ({"anchors": {1: "x", 2: 1, 3: -2, 4: -8}}, "integer"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"seed": 0.5}, "seed"),
        ({"item_low": 20, "item_high": 21}, "one value"),
        ({"vocab_size": 2**31}, "vocab_size"),
        ({"n_train": 1.5}, "n_train"),
        ({"n_test": True}, "n_test"),
        ({"seq_len": "9"}, "seq_len"),
        ({"heldout_pairs": "43"}, "held-out"),
        ({"heldout_pairs": [(4, "x")]}, "integer"),
        ({"special_targets": [[3, 4]]}, "special target"),
        ({"special_targets": [[3, 4, -6], [3, 4, -5]]}, "twice"),
    ],
)
def test_bad_anchor_tasks(kw, match) -> None:
    with pytest.raises(ConfigError, match=match):
        AnchorTask(**kw)


def test_anchor_task_from_dict_refuses_non_objects() -> None:
    for bad in ([], "x", None, 3):
        with pytest.raises(ConfigError, match="object"):
            AnchorTask.from_dict(bad)
    with pytest.raises(ConfigError, match="unknown task"):
        AnchorTask.from_dict({"n_trian": 5})


@settings(max_examples=40, deadline=None)
@given(
    field=st.sampled_from(["steps", "batch_size", "eval_every", "checkpoint_every"]),
    value=st.one_of(st.integers(max_value=0), st.booleans(), st.floats(), st.text(max_size=3)),
)
def test_property_non_positive_or_non_integer_counts_are_refused(field, value) -> None:
    with pytest.raises(ConfigError):
        tiny(**{field: value})


@settings(max_examples=40, deadline=None)
@given(
    field=st.sampled_from(["lr", "weight_decay", "grad_clip", "eps"]),
    value=st.sampled_from([NAN, INF, -INF]),
)
def test_property_non_finite_reals_are_refused_in_both_trainers(field, value) -> None:
    with pytest.raises(ConfigError):
        tiny(**{field: value})
    if field != "eps":
        with pytest.raises(ConfigError):
            LMConfig(**{**TINY_LM, field: value}).validate()


@settings(max_examples=30, deadline=None)
@given(seed=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)))
def test_property_seeds_out_of_range(seed) -> None:
    with pytest.raises(ConfigError, match="seed"):
        tiny(seed=seed)
    with pytest.raises(ConfigError, match="seed"):
        AnchorTask(seed=seed)


# ----------------------------------------------------------------------------- memory
def _little_memory(monkeypatch) -> None:
    monkeypatch.setattr(memory_mod, "available_memory", lambda device: 2 * 2**30)


@pytest.mark.parametrize(
    "model, task",
    [
        ({"n_layers": 4096, "d_model": 256}, {}),  # deeper is refused by the depth bound
        ({"d_model": 10**6, "n_heads": 2}, {}),
        ({"n_positions": 10**12}, {}),
        ({"n_layers": 4000, "d_model": 64}, {}),
        ({}, {"n_train": 10**9}),
    ],
)
def test_runs_that_cannot_fit_are_refused_before_building(tmp_path, monkeypatch, model, task):
    _little_memory(monkeypatch)
    cfg = tiny(
        model=ModelConfig(**{"d_model": 16, "n_heads": 2, **model}),
        task=AnchorTask(**{"n_train": 64, "n_test": 16, **task}),
    )
    with pytest.raises(ConfigError, match="needs about .* available"):
        train(cfg, tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="needs about"):
        run_sweep(SweepConfig(cfg, gammas=[0.5]), tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "field, value",
    [("d_model", 10**6), ("seq_len", 10**9), ("batch_size", 10**9)],
)
def test_lm_runs_that_cannot_fit_are_refused(tmp_path, monkeypatch, field, value) -> None:
    _little_memory(monkeypatch)
    with pytest.raises(ConfigError, match="needs about"):
        train_lm(
            LMConfig(**{**TINY_LM, field: value}), tmp_path / "x", progress=False, device="cpu"
        )
    assert not (tmp_path / "x").exists()


def test_the_estimate_matches_the_model() -> None:
    for kw in ({}, {"tie_embeddings": True}, {"n_layers": 3, "d_mlp": 40}):
        cfg = ModelConfig(d_model=16, n_heads=2, **kw)
        assert cfg.n_params() == sum(math.prod(s) for s in cfg.param_shapes().values())
    assert memory_mod.available_memory(torch.device("cpu")) > 0


# ----------------------------------------------------------------------------- devices, CLI
def test_cuda_without_cuda_is_refused_before_anything_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        train(tiny(device="cuda"), tmp_path / "x", progress=False)
    assert not (tmp_path / "x").exists()


def _train_argv(tmp_path: Path, *flags: str) -> list[str]:
    return [
        "train",
        "--out",
        str(tmp_path / "run"),
        "--d-model",
        "16",
        "--n-heads",
        "2",
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--n-train",
        "64",
        "--n-test",
        "16",
        "--eval-every",
        "2",
        "--no-progress",
        "--device",
        "cpu",
        *flags,
    ]


@pytest.mark.parametrize(
    "flags",
    [
        ["--seq-len", "0"],
        ["--seq-len", "-4"],
        ["--batch-size", "0"],
        ["--steps", "0"],
        ["--n-train", "0"],
        ["--n-test", "0"],
        ["--seed", "-1"],
        ["--seed", str(2**32)],
        ["--task-seed", "-1"],
        ["--device", "tpu"],
        ["--lr", "nan"],
        ["--lr", "inf"],
        ["--weight-decay", "nan"],
        ["--grad-clip", "inf"],
        ["--gamma", "nan"],
        ["--vocab-size", str(2**31)],
        ["--item-range", "20,21"],
        ["--anchors", "1:5"],
        ["--n-layers", "0"],
        ["--min-lr-ratio", "nan"],
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(tmp_path, capsys, flags) -> None:
    assert main(_train_argv(tmp_path, *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probekit: error:") and "\n" not in err and "Fix:" in err
    assert not (tmp_path / "run").exists()


def test_cli_repeated_anchor_ids_are_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(_train_argv(tmp_path, "--anchors", "1:5,1:3,2:1,3:-2,4:-8"))
    assert info.value.code == 2 and "twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, match",
    [
        ("[]", "not an object"),
        ('"steps"', "not an object"),
        ("null", "not an object"),
        ("[1, 2]", "not an object"),
        ('{"stpes": 3}', "unknown training"),
        ('{"warmup_steps": "3"}', "warmup_steps"),
        ('{"warmup_steps": 2.5}', "warmup"),
        ('{"lr": "fast"}', "lr"),
        ('{"model": 5}', "model settings"),
        ('{"task": "x"}', "task settings"),
        ('{"model": {"d_modle": 3}}', "unknown model"),
        ('{"task": {"item_low": 1.5}}', "item_low"),
        ('{"lr": 3, "lr": 4}', "twice"),
        ('{"model": {"n_positions": "x"}}', "n_positions"),
        ("{not json", "cannot read"),
    ],
)
def test_cli_bad_config_files(tmp_path, capsys, text, match) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(text)
    assert main(_train_argv(tmp_path, "--config", str(path))) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_cli_config_of_a_stack_still_reads(tmp_path, capsys) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps([tiny(steps=2).to_dict()]))
    assert main(_train_argv(tmp_path, "--config", str(path))) == 0


# ----------------------------------------------------------------------------- issue 31 item 15
@pytest.mark.parametrize(
    "lr, weight_decay", [(1e300, 0.01), (1e-3, 1e300), (1e300, 1e300), (10.0, 0.1), (1.0, 1.0)]
)
def test_a_weight_decay_step_of_one_or_more_is_refused_in_both_trainers(lr, weight_decay):
    with pytest.raises(ConfigError, match="lr .* x weight_decay .* is not below 1"):
        tiny(lr=lr, weight_decay=weight_decay)
    with pytest.raises(ConfigError, match="is not below 1"):
        LMConfig(**{**TINY_LM, "lr": lr, "weight_decay": weight_decay}).validate()


@pytest.mark.parametrize(
    "flags",
    [
        ["--lr", "1e300"],
        ["--weight-decay", "1e300"],
        ["--lr", "1e300", "--weight-decay", "0"],  # refused inside training: files removed
    ],
)
def test_train_with_a_runaway_lr_or_weight_decay_writes_nothing(flags, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--steps", "4", "--batch-size", "8", "--quiet"]
    assert main([*argv, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("probekit: error:")
    assert not out.exists(), sorted(p.name for p in out.iterdir())
