"""Issue 14, training side: locked run folders, damaged resume state, divergence, growth."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.anchor import training as trainer_mod
from probekit.anchor.sweep import SweepConfig, run_sweep
from probekit.errors import CheckpointError, ConfigError, NumericalError
from probekit.lm import LMConfig, train_lm
from probekit.training import ModelConfig
from probekit.training import lock as lock_mod
from probekit.training import optim as optim_mod
from probekit.training.growth import grow_checkpoint
from probekit.training.lock import LOCK_NAME, run_folder_lock
from tests.conftest import TINY_LM

torch.set_num_threads(1)

TASK = AnchorTask(n_train=128, n_test=32, seed=3)


def tiny(**kw) -> TrainConfig:
    base = dict(
        model=ModelConfig(n_layers=1, d_model=16, n_heads=2),
        task=TASK,
        steps=6,
        batch_size=16,
        lr=3e-3,
        warmup_steps=1,
        eval_every=2,
        checkpoint_every=2,
        eval_train_samples=32,
        device="cpu",
    )
    return TrainConfig(**{**base, **kw})


class Killed(Exception):
    """Stands for a kill of the training process."""


def kill_at(monkeypatch, step: int) -> None:
    def after_step(stack):
        if stack.step == step:
            raise Killed

    monkeypatch.setattr(trainer_mod.AnchorStack, "after_step", after_step)


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# ----------------------------------------------------------------------------- the lock
@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_second_writer_is_refused(tmp_path: Path, live_pid: int) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(f"{live_pid}\n")
    with pytest.raises(ConfigError, match=f"in use by another training process \\(pid {live_pid}"):
        train(tiny(), out, progress=False)
    with pytest.raises(ConfigError, match="in use"):
        train_lm(LMConfig(**TINY_LM), out, progress=False, device="cpu")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written


def test_a_lock_held_by_another_process_blocks_in_process(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = (
        "import sys, time; from probekit.training.lock import run_folder_lock\n"
        f"with run_folder_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {proc.pid}"):
            with run_folder_lock(out):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).write_text(f"{dead.pid}\n")
    train(tiny(steps=2), out, progress=False)
    assert not (out / LOCK_NAME).exists()


def test_the_lock_names_its_host_and_keeps_a_heartbeat(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lock_mod, "HEARTBEAT_S", 0.05)
    out = tmp_path / "run"
    with run_folder_lock(out) as lock:
        assert lock.read_text().split() == [str(os.getpid()), lock_mod.this_host()]
        os.utime(lock, (1.0, 1.0))  # as if last touched in 1970
        deadline = time.monotonic() + 10
        while lock.stat().st_mtime < 2.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.stat().st_mtime > 2.0  # touched again by the heartbeat
    assert not out.exists()


def test_a_lock_of_another_host_is_judged_by_its_heartbeat(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lock_mod, "STALE_AFTER_S", 0.5)
    monkeypatch.setattr(lock_mod, "HEARTBEAT_S", 0.05)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that runs nowhere here: a lock from another node must not be judged by it
    out = tmp_path / "run"
    out.mkdir()
    lock = out / LOCK_NAME
    lock.write_text(f"{dead.pid} gpu-node-7\n")
    stop = threading.Event()

    def beat() -> None:  # the owner on gpu-node-7, alive
        while not stop.wait(0.05):
            os.utime(lock)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        with pytest.raises(ConfigError, match=f"pid {dead.pid} on host gpu-node-7"):
            with run_folder_lock(out):
                pass
    finally:
        stop.set()
        thread.join()
    os.utime(lock, (1.0, 1.0))  # its node died long ago: no heartbeat since
    holder = lock_mod.lock_holder(out)
    assert holder is not None and not holder.alive() and not holder.is_self()
    with run_folder_lock(out) as taken:
        assert taken.read_text().split()[1] == lock_mod.this_host()
    assert not lock.exists()


def test_out_that_is_a_file_is_one_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        train(tiny(steps=2), tmp_path / "file", progress=False)
    with pytest.raises(ConfigError, match="is a file"):
        train(tiny(steps=2), tmp_path / "file" / "run", progress=False)


# ----------------------------------------------------------------------------- corrupt checkpoints
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    train(tiny(), out, progress=False)
    return out


def killed_run(tmp_path: Path, monkeypatch, at: int = 5) -> Path:
    out = tmp_path / "cut"
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_at(patch, at)
        train(tiny(), out, progress=False)
    return out


def test_killed_run_keeps_the_last_two_checkpoints(tmp_path, monkeypatch) -> None:
    out = killed_run(tmp_path, monkeypatch)
    steps = [
        json.loads((out / n / "trainer_state.json").read_text())["step"]
        for n in ("checkpoint", "checkpoint.previous")
    ]
    assert steps == [4, 2]


def test_a_truncated_checkpoint_falls_back_to_the_previous(tmp_path, monkeypatch, reference):
    out = killed_run(tmp_path, monkeypatch)
    truncate(out / "checkpoint" / "model.safetensors")
    with pytest.warns(UserWarning, match="model.safetensors is corrupt.*previous checkpoint"):
        resumed = train(tiny(), out, progress=False)
    assert same_weights(resumed.checkpoint, reference / "checkpoint")
    assert resumed.metrics["step"].tolist() == [0, 2, 4, 6]
    assert (out / "checkpoint.corrupt").is_dir() and not (out / "checkpoint.previous").exists()


def test_a_truncated_checkpoint_without_a_previous_one_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(tiny(steps=2), out, progress=False)
    truncate(out / "checkpoint" / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt") as info:
        train(tiny(steps=2), out, progress=False)
    assert "--no-resume" in str(info.value)
    assert train(tiny(steps=2), out, resume=False, progress=False).status == "ok"


def test_resuming_with_other_settings_names_them(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(tiny(steps=2), out, progress=False)
    with pytest.raises(ConfigError, match=r"lr \(saved 0.003, now 0.01\).*model.gamma"):
        train(
            tiny(steps=2, lr=1e-2, model=ModelConfig(n_layers=1, d_model=16, n_heads=2, gamma=0.7)),
            out,
            progress=False,
        )
    with pytest.raises(ConfigError, match="steps"):
        train(tiny(steps=4), out, progress=False)


def test_leftovers_of_a_kill_are_cleaned_up(tmp_path, monkeypatch, reference) -> None:
    out = killed_run(tmp_path, monkeypatch)
    (out / ".metrics.jsonl.abc123.tmp").write_text('{"step": 1')
    (out / ".config.json.x.tmp").write_text("{")
    (out / ".checkpoint.def.tmp").mkdir()
    (out / ".checkpoint.def.tmp" / "model.safetensors").write_bytes(b"half")
    resumed = train(tiny(), out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "config.json", "metrics.jsonl"]
    assert same_weights(resumed.checkpoint, reference / "checkpoint")


def test_a_kill_between_the_two_renames_of_a_swap_is_recovered(tmp_path, monkeypatch, reference):
    """swap_in moves checkpoint -> checkpoint.previous, then the new one in: kill in between."""
    out = killed_run(tmp_path, monkeypatch)
    import shutil

    shutil.rmtree(out / "checkpoint.previous")
    os.replace(out / "checkpoint", out / "checkpoint.previous")
    (out / ".checkpoint.zz.tmp").mkdir()  # the complete-or-not new one: discarded
    with pytest.warns(UserWarning, match=r"checkpoint.previous \(step \d+\) is put back") as seen:
        resumed = train(tiny(), out, progress=False)
    assert len([w for w in seen if "put back" in str(w.message)]) == 1  # one notice
    assert same_weights(resumed.checkpoint, reference / "checkpoint")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "config.json", "metrics.jsonl"]


# ----------------------------------------------------------------------------- damaged state
def _drop_tensor(path: Path, key: str) -> None:
    tensors = load_file(str(path))
    del tensors[key]
    save_file(tensors, str(path))


def _set_state(ck: Path, **values) -> None:
    state = json.loads((ck / "trainer_state.json").read_text())
    state.update(values)
    (ck / "trainer_state.json").write_text(json.dumps(state))


DAMAGE = {
    "truncated model": lambda ck, out: truncate(ck / "model.safetensors"),
    "truncated optimizer": lambda ck, out: truncate(ck / "optimizer.safetensors"),
    "no optimizer": lambda ck, out: (ck / "optimizer.safetensors").unlink(),
    "missing moment": lambda ck, out: _drop_tensor(
        ck / "optimizer.safetensors", "exp_avg.transformer.h.0.mlp.c_fc.weight"
    ),
    "garbage rng_python of an older checkpoint": lambda ck, out: _set_state(
        ck, rng_python={"version": 3, "state": [1, 2], "gauss": None}
    ),
    "garbage rng_numpy of an older checkpoint": lambda ck, out: _set_state(ck, rng_numpy=[]),
    "missing weight": lambda ck, out: _drop_tensor(
        ck / "model.safetensors", "transformer.h.0.attn.c_proj.weight"
    ),
    "negative step": lambda ck, out: _set_state(ck, step=-3),
    "huge step": lambda ck, out: _set_state(ck, step=10**12),
    "step of the wrong type": lambda ck, out: _set_state(ck, step="4"),
    "no loss sums": lambda ck, out: _set_state(ck, loss_sum=None),
    "state not json": lambda ck, out: (ck / "trainer_state.json").write_text("{"),
    "state a list": lambda ck, out: (ck / "trainer_state.json").write_text("[]"),
    "no run_config": lambda ck, out: (ck / "run_config.json").unlink(),
    "bad metrics line": lambda ck, out: (out / "metrics.jsonl").write_text(
        (out / "metrics.jsonl").read_text() + "{not json\n"
    ),
    "metrics row without step": lambda ck, out: (out / "metrics.jsonl").write_text('{"a": 1}\n'),
    "metrics gone": lambda ck, out: (out / "metrics.jsonl").unlink(),
    "metrics truncated": lambda ck, out: (out / "metrics.jsonl").write_text(
        (out / "metrics.jsonl").read_text().splitlines()[0] + "\n"
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_resume_state_is_one_checkpoint_error_with_a_way_out(tmp_path, damage) -> None:
    out = tmp_path / "run"
    train(tiny(steps=2), out, progress=False)  # finished: no previous checkpoint is kept
    DAMAGE[damage](out / "checkpoint", out)
    with pytest.raises(CheckpointError) as info:
        train(tiny(steps=2), out, progress=False)
    assert "--no-resume" in str(info.value) and "Fix:" in str(info.value)
    assert not (out / LOCK_NAME).exists()
    again = train(tiny(steps=2), out, resume=False, progress=False)  # the way out works
    assert again.metrics["step"].tolist() == [0, 2]


def test_a_killed_no_resume_run_leaves_no_stuck_folder(tmp_path, monkeypatch) -> None:
    """Issue 14: a --no-resume run killed early left the old checkpoint without metrics."""
    out = tmp_path / "run"
    train(tiny(steps=2), out, progress=False)
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_at(patch, 1)
        train(tiny(steps=2), out, resume=False, progress=False)
    assert not (out / "checkpoint").exists()
    assert train(tiny(steps=2), out, progress=False).metrics["step"].tolist() == [0, 2]


# ----------------------------------------------------------------------------- divergence
def poison_update(monkeypatch, at_step: int, runs: tuple[int, ...] = (0,)) -> None:
    """Make the update of 0-based step ``at_step`` turn the given runs' weights into inf."""
    real = optim_mod.StackedAdamW.update

    def update(self, grads, step, multiplier):
        updated = real(self, grads, step, multiplier)
        if step == at_step:  # the new weights of these runs
            for m in runs:
                updated["transformer.h.0.mlp.c_fc.weight"][0][m] *= float("inf")
        return updated

    monkeypatch.setattr(optim_mod.StackedAdamW, "update", update)


def test_a_non_finite_update_is_caught_before_its_checkpoint(tmp_path, monkeypatch) -> None:
    poison_update(monkeypatch, at_step=2)  # the 3rd update
    out = tmp_path / "run"
    with pytest.raises(NumericalError) as info:
        train(tiny(checkpoint_every=1), out, progress=False)
    msg = str(info.value)
    assert "updated weights became NaN/inf at step 3" in msg
    assert "checkpoint of step 2" in msg
    ck = out / "checkpoint"
    assert json.loads((ck / "trainer_state.json").read_text())["step"] == 2
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert all(
            bool(torch.isfinite(t.float()).all()) for t in load_file(str(ck / name)).values()
        )
    assert not (out / LOCK_NAME).exists()


def test_divergence_before_any_checkpoint_says_so(tmp_path, monkeypatch) -> None:
    poison_update(monkeypatch, at_step=0)
    with pytest.raises(NumericalError, match="no checkpoint was written"):
        train(tiny(checkpoint_every=4), tmp_path / "run", progress=False)


def test_a_sweep_labels_diverged_runs_and_leaves_them_out_of_the_diagrams(tmp_path, monkeypatch):
    poison_update(monkeypatch, at_step=1, runs=(0,))
    res = run_sweep(SweepConfig(tiny(steps=4), gammas=[0.3, 0.8]), tmp_path / "s", progress=False)
    by_run = dict(zip(res.df["run"], res.df["solution"], strict=True))
    assert by_run["L1_g0.3_wd0.01_s0"] == "diverged"
    assert by_run["L1_g0.8_wd0.01_s0"] != "diverged"
    assert res.summary["n_diverged"] == 1
    assert list(res.summary["diverged"]) == ["L1_g0.3_wd0.01_s0"]
    z = res.figure().data[0].z  # gamma x depth: the diverged run's cell has no colour
    assert z.shape == (1, 2) and bool(torch.isnan(torch.tensor(z[0][0]))) and z[0][1] == z[0][1]
    ck = tmp_path / "s" / "stacks" / "L1" / "checkpoint" / "L1_g0.3_wd0.01_s0"
    assert all(
        bool(torch.isfinite(t).all()) for t in load_file(str(ck / "model.safetensors")).values()
    )


# ----------------------------------------------------------------------------- LM trainer
def test_lm_damaged_final_checkpoint_falls_back_or_refuses(tmp_path: Path) -> None:
    ref = train_lm(
        LMConfig(**TINY_LM, save_every=2), tmp_path / "ref", progress=False, device="cpu"
    )
    out = tmp_path / "run"
    train_lm(LMConfig(**TINY_LM, save_every=2), out, progress=False, device="cpu")
    truncate(out / "final" / "model.safetensors")
    with pytest.warns(UserWarning, match="resuming from .*step2"):
        again = train_lm(LMConfig(**TINY_LM, save_every=2), out, progress=False, device="cpu")
    assert same_weights(again.final, ref.final)
    alone = tmp_path / "alone"
    train_lm(LMConfig(**TINY_LM), alone, progress=False, device="cpu")
    truncate(alone / "final" / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="optimizer.safetensors is corrupt.*--no-resume"):
        train_lm(LMConfig(**TINY_LM), alone, progress=False, device="cpu")
    train_lm(LMConfig(**TINY_LM), alone, progress=False, device="cpu", resume=False)


@pytest.mark.parametrize("damage", ["negative step", "metrics gone", "missing moment", "flops"])
def test_lm_damaged_state_is_one_checkpoint_error(tmp_path: Path, damage: str) -> None:
    out = tmp_path / "run"
    train_lm(LMConfig(**TINY_LM), out, progress=False, device="cpu")
    ck = out / "final"
    if damage == "negative step":
        _set_state(ck, step=-1)
    elif damage == "flops":
        _set_state(ck, flops="many")
    elif damage == "metrics gone":
        (out / "metrics.jsonl").unlink()
    else:
        _drop_tensor(ck / "optimizer.safetensors", "exp_avg.transformer.h.0.mlp.c_fc.weight")
    with pytest.raises(CheckpointError, match="no-resume"):
        train_lm(LMConfig(**TINY_LM), out, progress=False, device="cpu")


def test_lm_leftovers_are_cleaned_and_no_resume_starts_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train_lm(LMConfig(**TINY_LM, save_every=2), out, progress=False, device="cpu")
    (out / ".metrics.jsonl.q.tmp").write_text("{")
    (out / ".final.q.tmp").mkdir()
    run = train_lm(LMConfig(**TINY_LM), out, progress=False, device="cpu", resume=False)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert not (out / "step2").exists() and run.metrics["step"].tolist() == [2, 4]


def test_lm_nan_update_stops_before_a_save(tmp_path: Path, monkeypatch) -> None:
    real = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.state and next(iter(self.state.values()))["step"] >= 3:
            with torch.no_grad():
                self.param_groups[0]["params"][0].mul_(float("nan"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    out = tmp_path / "run"
    with pytest.raises(NumericalError, match="update of step 2 made weights NaN/inf.*step 2"):
        train_lm(LMConfig(**TINY_LM, save_every=2), out, progress=False, device="cpu")
    assert not (out / "step3").exists() and not (out / "final").exists()


# ----------------------------------------------------------------------------- growth, modes
def test_grow_checkpoint_refuses_to_overwrite_its_source(tmp_path: Path) -> None:
    train_lm(LMConfig(**TINY_LM), tmp_path / "run", progress=False, device="cpu")
    src = tmp_path / "run" / "final"
    before = (src / "model.safetensors").read_bytes()
    for dst in (src, src / "inner", tmp_path / "run", Path(str(src) + "/../final")):
        with pytest.raises(ConfigError, match="overwrite its source"):
            grow_checkpoint(src, dst, "midas", 2)
    assert (src / "model.safetensors").read_bytes() == before
    assert not (src / "inner").exists()


def test_checkpoint_folders_get_the_users_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        train(tiny(steps=2), tmp_path / "a", progress=False)
        train_lm(LMConfig(**TINY_LM), tmp_path / "b", progress=False, device="cpu")
        grow_checkpoint(tmp_path / "b" / "final", tmp_path / "grown", "midas", 2)
    finally:
        os.umask(old)
    for folder in (tmp_path / "a" / "checkpoint", tmp_path / "b" / "final", tmp_path / "grown"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder


def test_a_fresh_run_that_diverges_before_its_first_checkpoint_leaves_nothing(
    tmp_path, monkeypatch
) -> None:
    """Issue 31 item 15: no config.json / metrics.jsonl of a run that never checkpointed."""
    poison_update(monkeypatch, at_step=2)
    out = tmp_path / "run"
    with pytest.raises(NumericalError, match="no checkpoint was written"):
        train(tiny(checkpoint_every=4), out, progress=False)
    assert not out.exists()
    out.mkdir()  # a folder the user made: kept, empty
    with pytest.raises(NumericalError, match="no checkpoint was written"):
        train(tiny(checkpoint_every=4), out, progress=False)
    assert out.is_dir() and not list(out.iterdir())


def test_a_run_that_diverges_after_a_checkpoint_keeps_its_files(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    poison_update(monkeypatch, at_step=3)
    for _ in range(2):  # a fresh start, then a resume: both keep the checkpoint of step 2
        with pytest.raises(NumericalError, match="checkpoint of step 2"):
            train(tiny(checkpoint_every=2), out, progress=False)
        assert {"checkpoint", "config.json", "metrics.jsonl"} <= {p.name for p in out.iterdir()}
