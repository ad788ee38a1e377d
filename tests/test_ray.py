"""Issue 15: sweeps, timelines and diagnoses as Ray tasks, equal to the local executor, and
surviving a killed worker and a killed driver.

One local Ray (2 CPUs, no dashboard) is started once for the module. The default suite runs
one Ray test (a 4-run sweep equal to the local executor); the fault tests are slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file

from probekit import executor as executor_mod
from probekit.anchor import AnchorTask, TrainConfig
from probekit.anchor.sweep import SweepConfig, run_sweep
from probekit.errors import ConfigError
from probekit.training import ModelConfig
from probekit.training.lock import LOCK_NAME, lock_holder

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent

TASK = AnchorTask(n_train=128, n_test=32, seed=4)


def base(**kw) -> TrainConfig:
    settings = dict(
        model=ModelConfig(n_layers=1, d_model=16, n_heads=2),
        task=TASK,
        steps=8,
        batch_size=16,
        lr=4e-3,
        warmup_steps=2,
        eval_every=4,
        checkpoint_every=4,
        eval_train_samples=32,
        device="cpu",
    )
    return TrainConfig(**{**settings, **kw})


def fault_sweep() -> SweepConfig:
    """Long enough (tiny model, many steps) that a kill lands in the middle of training."""
    return SweepConfig(
        base(steps=600, eval_every=100, checkpoint_every=25),
        gammas=[0.3, 0.8],
        seeds=[0, 1],
        max_stack=1,
    )


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(checkpoint) / "model.safetensors"))


def assert_same_weights(a: str | Path, b: str | Path) -> None:
    x, y = weights(a), weights(b)
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k], y[k]), k


NUMBERS = (
    ["run", "status", "solution", "steps"]
    + [
        f"{w}_{m}"
        for w in ("final", "best")
        for m in ("train_acc", "test_data_acc", "test_task_inferential", "test_task_symmetric")
    ]
    + ["final_test_data_loss"]
)


def assert_same_sweep(a, b) -> None:
    """Same rows, same numbers (exactly), and bit-identical final weights run by run."""
    assert a.df[NUMBERS].equals(b.df[NUMBERS])
    for ca, cb in zip(a.df["checkpoint"], b.df["checkpoint"], strict=True):
        assert_same_weights(ca, cb)
    assert a.figure().to_dict()["data"] == b.figure().to_dict()["data"]


# ----------------------------------------------------------------- default suite (one Ray test)
def test_a_sweep_on_ray_equals_the_local_executor(cluster, tmp_path: Path) -> None:
    sweep = SweepConfig(base(), gammas=[0.3, 0.8], seeds=[0, 1], max_stack=2)
    local = run_sweep(sweep, tmp_path / "local", progress=False)
    remote = run_sweep(sweep, tmp_path / "ray", executor="ray", progress=False)
    assert len(remote.df) == 4 and set(remote.meta["groups"]) == {"L1-0", "L1-1"}
    assert_same_sweep(local, remote)
    assert remote.meta["executor"] == "ray"
    for name in ("results.csv", "sweep.json", "phase_diagrams.html"):
        assert (tmp_path / "ray" / name).is_file()
    # metrics streamed to the stack folders, one row per run and evaluation
    rows = [
        json.loads(line)
        for line in (tmp_path / "ray" / "stacks" / "L1-0" / "metrics.jsonl")
        .read_text()
        .splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 0, 4, 4, 8, 8]
    # run again: every stack finished, so none is trained again
    again = run_sweep(sweep, tmp_path / "ray", executor="ray", progress=False)
    assert all(g == {"skipped": True} for g in again.meta["groups"].values())
    assert_same_sweep(remote, again)


# ------------------------------------------------------------------------- no cluster needed
def test_ray_refuses_a_relative_output_folder() -> None:
    with pytest.raises(ConfigError, match="relative path.*differs between nodes"):
        run_sweep(SweepConfig(base()), "relative/sweep", executor="ray", progress=False)
    assert not Path("relative").exists()
    with pytest.raises(ConfigError, match="unknown executor"):
        run_sweep(SweepConfig(base()), "/tmp/x", executor="dask", progress=False)


def test_without_ray_installed_one_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[ray\]"'):
        executor_mod.check_executor("ray", "/abs/out")


def test_a_failing_stack_is_recorded_and_the_others_go_on(tmp_path: Path, monkeypatch) -> None:
    """stack=False: a run whose loss becomes NaN raises; it is recorded as failed."""
    from probekit.anchor import training as trainer_mod

    real = trainer_mod.stacked_forward

    def poisoned(params, tokens, cfg, last_only=True):
        out = real(params, tokens, cfg, last_only)
        return out * float("nan") if torch.is_grad_enabled() and cfg.gamma == 0.3 else out

    monkeypatch.setattr(trainer_mod, "stacked_forward", poisoned)
    res = run_sweep(
        SweepConfig(base(), gammas=[0.3, 0.8], stack=False), tmp_path / "s", progress=False
    )
    by_run = res.df.set_index("run")
    bad, good = by_run.loc["L1_g0.3_wd0.01_s0"], by_run.loc["L1_g0.8_wd0.01_s0"]
    assert bad["solution"] == "failed" and "NumericalError" in bad["status"]
    assert "NaN" in res.summary["failed"]["L1_g0.3_wd0.01_s0"]
    assert good["status"] == "ok" and good["final_train_acc"] == good["final_train_acc"]
    assert not (tmp_path / "s" / "runs" / "L1_g0.3_wd0.01_s0" / "result.json").exists()
    z = res.figure().data[0].z  # the failed run's cell has no colour
    assert z[0][0] != z[0][0] and z[0][1] == z[0][1]


# ------------------------------------------------------------------------------ fault tests
def _wait_for(predicate, timeout: float = 120.0, every: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("timed out waiting")


def _training_pid(folder: Path, run: str, steps: int) -> tuple[int, int] | None:
    """(pid of the worker training in ``folder``, its checkpoint's step) mid-training."""
    try:
        state = folder / "checkpoint" / run / "trainer_state.json"
        step = json.loads(state.read_text())["step"]
        holder = lock_holder(folder)
    except (OSError, ValueError, KeyError):
        return None
    return (holder.pid, step) if holder is not None and 0 < step < steps else None


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_resumes_bit_identically(cluster, tmp_path: Path) -> None:
    sweep = fault_sweep()
    ref = run_sweep(sweep, tmp_path / "local", progress=False)
    box: dict = {}
    driver = threading.Thread(
        target=lambda: box.update(
            res=run_sweep(sweep, tmp_path / "ray", executor="ray", progress=False)
        )
    )
    driver.start()
    folder = tmp_path / "ray" / "stacks" / "L1-0"
    run = sweep.groups()[0][1][0].name
    pid, step = _wait_for(lambda: _training_pid(folder, run, sweep.base.steps))
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    driver.join(timeout=300)
    res = box["res"]
    assert (res.df["status"] == "ok").all()
    resumed = res.meta["groups"]["L1-0"]["resumed_from"]
    assert resumed is not None and step <= resumed < sweep.base.steps  # not started over
    assert_same_sweep(ref, res)


DRIVER = """
import sys
sys.path.insert(0, {root!r})
from tests.test_ray import fault_sweep
from probekit.anchor.sweep import run_sweep
run_sweep(fault_sweep(), {out!r}, executor="ray", ray_address={address!r}, progress=False)
"""


@pytest.mark.slow
def test_a_killed_driver_started_again_skips_finished_runs_and_resumes(cluster, tmp_path):
    sweep = fault_sweep()
    out = tmp_path / "ray"
    code = DRIVER.format(root=str(ROOT), out=str(out), address=cluster)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ})
    try:

        def some_done():
            done = [p for p in out.glob("stacks/*/result.json")]
            return 1 <= len(done) < 4

        _wait_for(some_done, timeout=240, every=0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ref = run_sweep(sweep, tmp_path / "local", progress=False)
    res = run_sweep(sweep, out, executor="ray", progress=False)
    groups = res.meta["groups"]
    assert any(g == {"skipped": True} for g in groups.values())
    assert all("failed" not in g for g in groups.values())
    assert_same_sweep(ref, res)
    assert not list(out.glob("stacks/*/" + LOCK_NAME))


@pytest.mark.slow
def test_timeline_and_diagnoses_on_ray_equal_local(cluster, tmp_path: Path) -> None:
    from probekit.analyses.across_checkpoints import depth_timeline as local_timeline
    from probekit.cluster import diagnose_many, distributed_depth_timeline
    from probekit.toy import toy_hf_model, toy_tokens

    paths = {}
    for seed in (1, 2):
        paths[f"s{seed}"] = tmp_path / f"model{seed}"
        toy_hf_model(seed=seed).save_pretrained(paths[f"s{seed}"])
    data = toy_tokens()
    series = [("toy", i, str(p)) for i, p in enumerate(paths.values())]
    series.append(("toy", 9, str(tmp_path / "missing")))
    tl = distributed_depth_timeline(series, data, executor="ray")
    want = local_timeline(series[:2], data)
    assert tl.df.equals(want.df)
    assert list(tl.summary["failed"]) == ["toy@9"]
    many = diagnose_many(
        {**paths, "gone": tmp_path / "missing"},
        data,
        tmp_path / "reports",
        executor="ray",
        n_bootstrap=2,
    )
    assert list(many.df["status"][:2]) == ["ok", "ok"] and many.summary["n_failed"] == 1
    assert (tmp_path / "reports" / "s1" / "report.html").is_file()
    assert not (tmp_path / "reports" / "gone").exists()
    local = diagnose_many(paths, data, tmp_path / "local_reports", n_bootstrap=2)
    cols = ["second_half_share", "clean_loss", "depth_score"]
    assert many.df[cols][:2].equals(local.df[cols])


def test_the_cli_refuses_ray_settings_before_any_work(tmp_path: Path, capsys) -> None:
    from probekit.cli import main

    assert main(["sweep", "--out", "rel/sweep", "--executor", "ray", "--steps", "2"]) == 2
    assert "relative path" in capsys.readouterr().err
    out = tmp_path / "s"
    assert main(["sweep", "--out", str(out), "--ray-address", "10.0.0.1:6379"]) == 2
    assert "--executor ray" in capsys.readouterr().err
    assert not out.exists() and not Path("rel").exists()


@pytest.mark.parametrize(
    "address", ["127.0.0.1:1", "localhost:1", "127.0.0.1:99999", "256.1.1.1:6379"]
)
def test_an_unreachable_ray_address_fails_in_seconds(tmp_path: Path, capsys, address) -> None:
    from probekit.cli import main

    out = tmp_path / "s"
    started = time.monotonic()
    argv = ["sweep", "--out", str(out), "--executor", "ray", "--ray-address", address]
    assert main([*argv, "--steps", "2"]) == 2
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ray start --head" in err
    assert ("is not a port" in err) if address.endswith("99999") else ("nothing answers" in err)
    assert not out.exists()


def test_a_cluster_without_cpus_says_what_it_lacks() -> None:
    script = (
        "import ray\n"
        "from probekit.errors import ConfigError\n"
        "from probekit import executor\n"
        "ray.init(num_cpus=0, include_dashboard=False, log_to_driver=False)\n"
        "executor.PENDING_SECONDS = 2\n"
        "try:\n"
        "    executor.run_tasks(abs, [1, -2], executor='ray', progress=False)\n"
        "except ConfigError as err:\n"
        "    print('refused:', err)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert "refused: the Ray cluster has 0 CPU(s) in all" in done.stdout, done.stderr[-2000:]
    assert "2 pending task(s) can never start" in done.stdout
    assert time.monotonic() - started < 120
