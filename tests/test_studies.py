"""The two studies as runs (probekit.studies.depth_vs_width, .transition, .runner): dry runs and
validation without training, tiny end-to-end studies, resume after a member fails, a changed
config refused, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from probekit.cli import main
from probekit.errors import ConfigError, ProbekitError
from probekit.lm import training as lm_training
from probekit.studies import depth_width, width_transition
from probekit.studies.depth_vs_width import COLUMNS as DW_COLUMNS
from probekit.studies.transition import COLUMNS as TR_COLUMNS
from probekit.tasks.compositions import CompositionTask

TASK = CompositionTask(max_number=99, max_letters=4, n_train=200, n_test=40)
TINY = dict(budgets=[30_000], depths=[1, 2, 3], seeds=[0], steps=20, finetune_steps=20)


def tiny_depth_width(out: Path, **kw):
    return depth_width(out, **{**TINY, "task": TASK, "progress": False, **kw})


def tiny_transition(out: Path, **kw):
    args = dict(depths=[1, 2, 3], widths=[16, 32], seeds=[0], steps=20, progress=False)
    return width_transition(out, **{**args, **kw})


# ---- dry runs and validation: no training -------------------------------------------------------
def test_the_cpu_dry_run_prints_the_members_and_the_cost(tmp_path: Path, capsys) -> None:
    study = depth_width(tmp_path / "s", scale="cpu", dry_run=True)
    printed = capsys.readouterr().out
    assert "b300000-L8-s2" in printed and "training FLOPs: about" in printed
    assert not (tmp_path / "s").exists()  # nothing written
    assert study.members.empty and list(study.members.columns) == DW_COLUMNS
    # parameter-matched within 1%, the width shrinking with depth
    assert (abs(study.plan.n_params / study.plan.budget - 1) < 0.01).all()
    widths = study.plan.drop_duplicates("depth").d_model.tolist()
    assert widths == sorted(widths, reverse=True)


def test_the_paper_dry_runs_give_gpu_hours(capsys) -> None:
    depth_width("unused", scale="paper", dry_run=True)
    width_transition("unused", scale="paper", dry_run=True)
    printed = capsys.readouterr().out
    assert printed.count("GPU-hours") == 2
    assert "b374000000-L36-s2" in printed and "L48-w2048-s0" in printed
    # the standard library is far too little text for 20 tokens per parameter: said, not run
    assert printed.count("note: a real run would be refused") == 2 and "--dataset" in printed


def test_the_model_counts_are_the_trainers(tmp_path: Path) -> None:
    """The planned parameter counts are the trained models' own (the FLOPs use them)."""
    import transformers

    from probekit.lm import LMConfig

    plan = tiny_transition(tmp_path, dry_run=True).plan
    for row in plan.itertuples():
        cfg = LMConfig(
            n_layers=row.depth, d_model=row.width, d_mlp=row.d_mlp, n_heads=row.n_heads, seq_len=64
        )
        model = transformers.GPT2LMHeadModel(cfg.hf_config(row.depth))
        assert model.num_parameters() == row.n_params


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(depths=[1, 2]), "at least 3"),
        (dict(budgets=[1_000]), "exceeds the budget"),
        (dict(budgets=[3_000], depths=[1, 2, 40]), "rounds to 0"),
        (dict(budgets=[0]), "positive integers"),
        (dict(seeds=[]), "seeds"),
        (dict(scale="gpu"), "unknown scale"),
        (dict(task="anchors"), "unknown task"),
    ],
)
def test_bad_studies_are_one_error_before_any_work(tmp_path: Path, kw, words) -> None:
    with pytest.raises(ConfigError, match=words):
        tiny_depth_width(tmp_path / "s", **kw)
    assert not (tmp_path / "s").exists()


def test_a_bad_grid_is_one_error_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least|3\\+"):
        tiny_transition(tmp_path / "t", depths=[1, 2])
    with pytest.raises(ConfigError, match="multiple of the head width"):
        tiny_transition(tmp_path / "t", widths=[24])
    assert not (tmp_path / "t").exists()


# ---- the cost estimate and the paper preset on a CPU --------------------------------------------
# the measured times of the CPU presets (docs/results.md, runs/*-cpu/members.csv: the sum of
# the members' seconds, 2-core machine)
MEASURED_CPU_MINUTES = {"depth-width": 20.7, "transition": 22.9}


def test_the_cpu_estimate_is_its_formula() -> None:
    from probekit.studies import runner

    plan = pd.DataFrame({"flops": [6e12, 1.2e13], "depth": [1, 4], "n_params": [1e6, 2e6]})
    tokens = plan.flops / (6 * plan.n_params)  # 1e6 each
    expected = (
        runner.MEMBER_SECONDS
        + plan.flops / runner.CPU_FLOPS_PER_SECOND
        + runner.CPU_SECONDS_PER_LAYER_TOKEN * plan.depth * tokens
    )
    pd.testing.assert_series_equal(runner.cpu_seconds(plan), expected, check_names=False)
    # deeper at the same FLOPs costs more (the per-layer work FLOPs leave out)
    assert runner.cpu_seconds(plan.assign(flops=6e12, n_params=1e6)).is_monotonic_increasing
    # scaled by the finished members' measured time over their estimate
    seconds = float(expected.sum())
    assert f"about {seconds * 3 / 60:.0f} min" in runner.plan_cost(plan, speed=3.0)


@pytest.mark.parametrize("kind", ["depth-width", "transition"])
def test_the_cpu_preset_estimates_are_within_30_percent_of_the_measured(kind) -> None:
    from probekit.studies import runner

    study = (depth_width if kind == "depth-width" else width_transition)(
        "unused", scale="cpu", dry_run=True, progress=False
    )
    minutes = float(runner.cpu_seconds(study.plan).sum()) / 60
    assert abs(minutes / MEASURED_CPU_MINUTES[kind] - 1) < 0.3, minutes


def test_the_clock_scales_the_estimate_by_the_finished_members() -> None:
    from probekit.studies.runner import StudyClock, cpu_seconds

    plan = pd.DataFrame(
        {"name": ["a", "b"], "flops": [7e11, 7e11], "depth": [1, 1], "n_params": [1e9, 1e9]}
    )
    estimate = float(cpu_seconds(plan).iloc[0])
    clock = StudyClock(plan, {"a": {"seconds": 2 * estimate}}, say=False)
    assert clock.speed() == pytest.approx(2.0)


def test_the_paper_preset_is_refused_on_a_cpu_before_any_work(tmp_path: Path, capsys) -> None:
    for study in (depth_width, width_transition):
        with pytest.raises(ConfigError, match="paper-scale .* years .*--dry-run"):
            study(tmp_path / "s", scale="paper", device="cpu", progress=False)
    assert not (tmp_path / "s").exists()
    out = tmp_path / "c"
    argv = ["study", "depth-width", "--scale", "paper", "--device", "cpu", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "GPU" in err and "--executor ray" in err
    assert not out.exists()
    # the dry run says the same estimate
    assert main(["study", "depth-width", "--scale", "paper", "--out", str(out), "--dry-run"]) == 0
    assert "on this CPU" in capsys.readouterr().out or _has_cuda()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_the_paper_preset_runs_on_a_gpu_a_cluster_or_when_shrunk(monkeypatch) -> None:
    import torch

    from probekit.studies.runner import check_cpu_time

    plan = depth_width("unused", scale="paper", dry_run=True, progress=False).plan
    check_cpu_time(plan, "paper", "cpu", "ray")  # a cluster's members may have GPUs
    check_cpu_time(plan, "cpu", "cpu", "local")  # only the paper preset is checked
    check_cpu_time(plan.head(0), "paper", "cpu", "local")  # small enough
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_cpu_time(plan, "paper", "auto", "local")  # auto finds a GPU
    with pytest.raises(ConfigError, match="limit is 24 h"):
        check_cpu_time(plan, "paper", "cpu", "local")


# ---- tiny runs ----------------------------------------------------------------------------------
def _count_trainings(monkeypatch, fail_at: int | None = None) -> list[str]:
    """Count train_lm calls (and raise inside the ``fail_at``-th)."""
    calls: list[str] = []
    real = lm_training.train_lm

    def counted(cfg, out, *args, **kwargs):
        calls.append(str(out))
        if fail_at is not None and len(calls) == fail_at:
            raise RuntimeError("killed inside a member")
        return real(cfg, out, *args, **kwargs)

    monkeypatch.setattr(lm_training, "train_lm", counted)
    return calls


@pytest.mark.slow
def test_a_tiny_depth_width_study_resumes_without_retraining(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "s"
    calls = _count_trainings(monkeypatch, fail_at=2)
    with pytest.raises(ProbekitError, match="1 member"):
        tiny_depth_width(out)
    assert (out / "members" / "b30000-L1-s0" / "member.json").is_file()
    assert not (out / "members" / "b30000-L2-s0" / "member.json").exists()
    assert (out / "members" / "b30000-L3-s0" / "member.json").is_file()  # the others go on
    monkeypatch.undo()
    calls = _count_trainings(monkeypatch)  # no failure now
    study = tiny_depth_width(out)
    # only the failed member is trained again; the finished ones are not
    assert [Path(c).parent.name for c in calls] == ["b30000-L2-s0"]
    table = pd.read_csv(out / "members.csv")
    assert list(table.columns) == DW_COLUMNS and len(table) == 3
    assert table.depth.tolist() == [1, 2, 3]
    assert (table.acc_seen.between(0, 1)).all() and (table.lm_val_loss > 0).all()
    assert (table.pretrain_flops > 0).all() and (table.finetune_flops > 0).all()
    pd.testing.assert_frame_equal(study.members, table, check_dtype=False)
    assert type(study.result).__name__ == "DepthWidthResult" and study.page == out / "index.html"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_members"] == 3 and summary["sentences"]
    assert json.loads((out / "study.json").read_text())["study"] == "depth-width"
    # a changed config in the same folder is refused, before any training
    calls.clear()
    with pytest.raises(ConfigError, match="other settings.*seeds"):
        tiny_depth_width(out, seeds=[0, 1])
    assert calls == []


@pytest.mark.slow
def test_a_tiny_transition_grid_runs_and_is_not_retrained(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "t"
    tiny_transition(out)
    table = pd.read_csv(out / "members.csv")
    assert list(table.columns) == TR_COLUMNS and len(table) == 6
    assert (table.lm_val_loss > 0).all() and (table.d_mlp == 4 * table.width).all()
    # the result's summary, page and tables follow the members'
    for name in ("summary.json", "index.html", "depth_summary.csv", "transitions.csv"):
        assert (out / name).is_file(), name
    calls = _count_trainings(monkeypatch)
    again = tiny_transition(out)
    assert calls == [] and len(again.members) == 6
    with pytest.raises(ConfigError, match="other settings"):
        tiny_transition(out, steps=21)


def test_from_scratch_skips_pretraining(tmp_path: Path, monkeypatch) -> None:
    calls = _count_trainings(monkeypatch)
    study = tiny_depth_width(
        tmp_path / "s", budgets=[20_000], steps=2, finetune_steps=2, from_scratch=True
    )
    assert calls == []
    assert study.members.lm_val_loss.isna().all() and (study.members.pretrain_flops == 0).all()
    assert (study.members.finetune_flops > 0).all()


def test_the_anchor_task_trains_each_member_from_scratch(tmp_path: Path, monkeypatch) -> None:
    from probekit.anchor import AnchorTask

    calls = _count_trainings(monkeypatch)
    task = AnchorTask(n_train=256, n_test=64)
    study = tiny_depth_width(tmp_path / "s", task=task, finetune_steps=4)
    assert calls == []  # no byte-level pretraining
    table = pd.read_csv(tmp_path / "s" / "members.csv")
    assert list(table.columns) == DW_COLUMNS and table.depth.tolist() == [1, 2, 3]
    assert table.lm_val_loss.isna().all() and (table.pretrain_flops == 0).all()
    assert table.acc_seen.between(0, 1).all() and table.acc_heldout.between(0, 1).all()
    # parameter-matched with the anchor model's own count (vocabulary 201, untied)
    assert (abs(study.plan.n_params / 30_000 - 1) < 0.01).all()
    assert (tmp_path / "s" / "members" / "b30000-L2-s0" / "anchor").is_dir()


# ---- the command line ---------------------------------------------------------------------------
def test_threads_go_before_or_after_the_study_name() -> None:
    from probekit.cli import build_parser

    parser = build_parser("study")
    after = ["study", "transition", "--out", "t", "--threads", "2"]
    before = ["study", "--threads", "3", "transition", "--out", "t"]
    assert parser.parse_args(after).threads == 2 and parser.parse_args(before).threads == 3
    assert parser.parse_args(["study", "transition", "--out", "t"]).threads is None


def test_the_cli_dry_run(capsys) -> None:
    assert main(["study", "depth-width", "--out", "s", "--scale", "paper", "--dry-run"]) == 0
    assert "GPU-hours" in capsys.readouterr().out
    assert main(["study", "transition", "--out", "t", "--scale", "cpu", "--dry-run"]) == 0
    assert "L6-w128-s1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["depth-width", "--depths", "1,2"], "at least 3"),
        (["depth-width", "--budgets", "1000"], "exceeds the budget"),
        (["transition", "--widths", "24"], "multiple of the head width"),
        (["transition", "--address", "1.2.3.4:6379"], "--executor ray"),
        (["transition", "--device", "tpu"], "tpu"),
    ],
)
def test_the_cli_refuses_bad_studies_in_one_line(tmp_path: Path, capsys, argv, words) -> None:
    out = tmp_path / "s"
    assert main(["study", *argv, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_the_cli_runs_a_tiny_transition(tmp_path: Path, capsys) -> None:
    out = tmp_path / "t"
    argv = ["study", "transition", "--out", str(out), "--depths", "1,2,3", "--widths", "16"]
    assert main([*argv, "--steps", "3", "--quiet"]) == 0
    assert len(pd.read_csv(out / "members.csv")) == 3
    assert "members.csv" in capsys.readouterr().out


# ---- Ray ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_study_on_ray_equals_the_local_executor(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each Ray task runs (one CPU each)
    try:
        local = tiny_transition(tmp_path / "local", widths=[16], steps=10)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            remote = tiny_transition(tmp_path / "ray", widths=[16], steps=10, executor="ray")
        finally:
            ray.shutdown()
    finally:
        torch.set_num_threads(threads)
    same = ["depth", "width", "n_params", "seed", "lm_val_loss", "pretrain_flops"]
    pd.testing.assert_frame_equal(local.members[same], remote.members[same], check_exact=True)
    assert (tmp_path / "ray" / "members" / "L3-w16-s0" / "member.json").is_file()


@pytest.mark.slow
def test_a_sigkilled_study_resumes_without_retraining(tmp_path: Path) -> None:
    """A real kill (SIGKILL) after the first member: the rerun keeps its member.json and
    trains the rest."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "t"
    argv = [sys.executable, "-m", "probekit", "study", "transition", "--out", str(out)]
    argv += ["--depths", "1,2,3", "--widths", "16", "--steps", "300", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    first = out / "members" / "L1-w16-s0" / "member.json"
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not first.is_file() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert first.is_file() and proc.poll() is None, "the study ended before the kill"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    written = first.stat().st_mtime_ns
    assert not (out / "members.csv").exists()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert first.stat().st_mtime_ns == written  # the finished member was not trained again
    assert len(pd.read_csv(out / "members.csv")) == 3
