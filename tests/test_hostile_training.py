"""Issue 25, training and API side: a full disk, damaged RNG entries, kill windows, runaway
sizes, reproducible checkpoints, and the hostile API arguments of items 7 and 14."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probekit.anchor import TrainConfig, stack_io, train
from probekit.errors import CheckpointError, ConfigError, InputError
from probekit.training import ModelConfig
from probekit.training.lock import LOCK_NAME
from tests.test_training_faults import tiny as faults_tiny

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]


def tiny(**kw) -> TrainConfig:
    """The tiny run of tests/test_training_faults.py, 4 steps."""
    return faults_tiny(**{"steps": 4, **kw})


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "probekit", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ----------------------------------------------------------------------------- item 13
@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
    ],
)
def test_a_full_disk_is_one_error_and_the_last_checkpoint_survives(
    tmp_path, monkeypatch, failure
) -> None:
    real = stack_io.save_moments
    calls = []

    def save_moments(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise failure
        real(*args, **kwargs)

    monkeypatch.setattr(stack_io, "save_moments", save_moments)
    out = tmp_path / "run"
    with pytest.raises(CheckpointError) as info:
        train(tiny(), out, progress=False)
    message = str(info.value)
    assert "no space left" in message and "step 4" in message
    assert "checkpoint of step 2" in message and "Fix:" in message
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "config.json", "metrics.jsonl"]
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    monkeypatch.setattr(stack_io, "save_moments", real)
    assert train(tiny(), out, progress=False).metrics["step"].tolist() == [0, 2, 4]


def test_the_safetensors_writers_disk_full_error_is_recognised() -> None:
    from safetensors import SafetensorError

    from probekit.training.loop import disk_full

    assert disk_full(SafetensorError("Error while serializing: No space left on device (os 28)"))
    assert not disk_full(SafetensorError("Error while deserializing header"))
    assert not disk_full(ValueError("No space left on device"))


def test_a_full_disk_on_the_command_line_is_one_line(tmp_path) -> None:
    script = (
        "import errno, sys\n"
        "from probekit.anchor import stack_io\n"
        "def full(*a, **k):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "stack_io.save_moments = full\n"
        "from probekit.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = ["train", "--out", "run", "--steps", "2", "--eval-every", "1", "--batch-size", "8"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *args, "--quiet", "--d-model", "16", "--n-heads", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    line = one_line_error(proc)
    assert "no space left" in line and "no checkpoint was written" in line
    assert not list((tmp_path / "run").glob(".checkpoint*"))
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert not (tmp_path / "run" / LOCK_NAME).exists()


@pytest.mark.parametrize(
    "entry, value",
    [
        ("rng_python", {"version": 3, "state": ["x"] * 625, "gauss": None}),
        ("rng_python", "garbage"),
        ("rng_numpy", {"kind": "MT19937", "pos": "x"}),
    ],
)
def test_a_garbage_rng_entry_names_the_entry(tmp_path, entry, value) -> None:
    out = tmp_path / "run"
    train(tiny(steps=2), out, progress=False)
    state_file = out / "checkpoint" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state[entry] = value
    state_file.write_text(json.dumps(state))
    with pytest.raises(CheckpointError) as info:
        train(tiny(steps=2), out, progress=False)
    assert entry in str(info.value) and "--no-resume" in str(info.value)
    assert "wrong size" not in str(info.value)


def test_a_garbage_rng_entry_falls_back_to_the_previous_checkpoint(tmp_path) -> None:
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train_until(out, stop_at=3)
    ck = out / "checkpoint"
    assert (out / "checkpoint.previous").is_dir()
    state = json.loads((ck / "trainer_state.json").read_text())
    state["rng_python"] = {"version": 3, "state": [1, 2], "gauss": None}
    (ck / "trainer_state.json").write_text(json.dumps(state))
    with pytest.warns(UserWarning, match="rng_python"):
        done = train(tiny(**EVERY_STEP), out, progress=False)
    assert done.metrics["step"].tolist() == [0, 1, 2, 3, 4]


EVERY_STEP = dict(steps=4, checkpoint_every=1, eval_every=1)


def _train_until(out: Path, stop_at: int) -> None:
    """Train ``tiny(**EVERY_STEP)`` and stop (as a kill would) once step ``stop_at`` is done."""
    from probekit.anchor import training as trainer_mod

    def after_step(stack):
        if stack.step == stop_at:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_mod.AnchorStack, "after_step", after_step)
        train(tiny(**EVERY_STEP), out, progress=False)


# ----------------------------------------------------------------------------- item 17
def test_two_identical_runs_write_byte_identical_checkpoints(tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny(steps=2), a, progress=False)
    import random

    import numpy as np

    random.random(), np.random.rand(), torch.rand(3)  # the process RNGs move on: no matter
    train(tiny(steps=2), b, progress=False)
    for name in ("model.safetensors", "optimizer.safetensors", "config.json", "run_config.json"):
        assert (a / "checkpoint" / name).read_bytes() == (b / "checkpoint" / name).read_bytes()
    states = [json.loads((d / "checkpoint" / "trainer_state.json").read_text()) for d in (a, b)]
    for state in states:
        assert not {"rng_python", "rng_numpy"} & set(state)
        state.pop("elapsed_s")  # the training time, which no two runs share
    assert states[0] == states[1]


def test_two_processes_write_byte_identical_checkpoints(tmp_path) -> None:
    args = ["--steps", "2", "--eval-every", "2", "--batch-size", "8", "--d-model", "16"]
    args += ["--n-heads", "2", "--quiet", "--threads", "1"]
    for name in ("a", "b"):
        proc = cli("train", "--out", name, *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("model.safetensors", "optimizer.safetensors"):
        first = (tmp_path / "a" / "checkpoint" / name).read_bytes()
        assert first == (tmp_path / "b" / "checkpoint" / name).read_bytes()


def test_an_older_checkpoint_with_rng_entries_resumes(tmp_path) -> None:
    """Checkpoints written before the RNG entries were dropped carry them: still resumable."""
    import random

    import numpy as np
    from safetensors.torch import load_file, save_file

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train_until(out, stop_at=3)
    ck = out / "checkpoint"
    tensors = load_file(str(ck / "optimizer.safetensors"))
    np_state = np.random.get_state()
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    save_file(tensors, str(ck / "optimizer.safetensors"))
    state = json.loads((ck / "trainer_state.json").read_text())
    py = random.getstate()
    state["rng_python"] = {"version": py[0], "state": list(py[1]), "gauss": py[2]}
    state["rng_numpy"] = {
        "kind": np_state[0],
        "pos": int(np_state[2]),
        "has_gauss": int(np_state[3]),
        "cached_gaussian": float(np_state[4]),
    }
    (ck / "trainer_state.json").write_text(json.dumps(state))
    resumed = train(tiny(**EVERY_STEP), out, progress=False)
    assert resumed.metrics["step"].tolist() == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------- items 7 and 14
@pytest.fixture(scope="module")
def toy():
    from probekit.toy import toy_model, toy_tokens

    return toy_model(n_layers=3), toy_tokens()


def _enter(manager) -> None:
    with manager:
        pass


def test_a_0d_token_tensor_is_an_input_error(toy) -> None:
    import probekit

    model, _ = toy
    for data in (torch.tensor(3), torch.zeros(2, 3, 4, dtype=torch.long)):
        with pytest.raises(InputError, match="tokens have shape"):
            probekit.contributions(model, data)


def test_masking_targets_outside_the_vocabulary_are_refused(toy) -> None:
    import probekit

    model, tokens = toy
    n = len(tokens)
    for bad in ([model.d_vocab] * n, [-1] * n, torch.full((n,), 10**6), [0.5] * n):
        with pytest.raises(InputError, match="target"):
            probekit.token_masking(model, tokens, targets=bad)


@pytest.mark.parametrize(
    "order, words",
    [
        (["a", "b", "c"], "not an integer"),
        ([0.5, 1, 2], "not an integer"),
        ([True, False, 2], "not an integer"),
        ([0, 1, 7], "outside the model's 3 layers"),
        ([0, 0, 1], "not a permutation"),
        ([0, 1], "not a permutation"),
        (None, "not a list"),
        ("012", "not a list"),
    ],
)
def test_a_bad_layer_order_is_an_input_error(toy, order, words) -> None:
    from probekit.interventions import reorder_layers

    model, _ = toy
    blocks = list(model.blocks)
    with pytest.raises(InputError, match=words):
        _enter(reorder_layers(model, order))
    assert list(model.blocks) == blocks


def test_ablating_a_layer_the_model_lacks_names_the_range(toy) -> None:
    from probekit.interventions import ablate

    model, tokens = toy
    for mode in ("mean", "zero"):
        with pytest.raises(InputError, match=r"outside the model's 3 layers.*0\.\.2"):
            _enter(ablate(model, 9, "attn", mode, data=tokens))
    with pytest.raises(InputError, match="unknown sublayer"):
        _enter(ablate(model, 0, "ffn", "mean", data=tokens))


def test_resuming_a_trace_in_an_unknown_order_is_an_input_error(toy) -> None:
    model, tokens = toy
    [batch] = model.prepare(tokens)
    trace = model.trace(batch)
    for order in ([5], ["a"], [1.0], 3):
        with pytest.raises(InputError):
            trace.resume(0, order=order)
    for start in (True, 1.0, float("nan"), 4, -1):
        with pytest.raises(InputError, match=r"start layer .* not an integer in \[0, 3\]"):
            trace.resume(start)
    assert torch.allclose(trace.resume(0, order=[0, 1, 2]), trace.logits, atol=1e-5)


def test_saving_a_result_where_it_cannot_be_written_is_one_error(toy, tmp_path, monkeypatch):
    import probekit
    from probekit import io as io_mod

    model, tokens = toy
    res = probekit.residual_stats(model, tokens)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="cannot write the result"):
        res.save(tmp_path / "file" / "r.json")  # a file where the folder should be

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(io_mod.tempfile, "mkstemp", read_only)
    with pytest.raises(InputError, match="Permission denied") as info:
        res.save(tmp_path / "r.json")
    assert "Fix:" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), -5, 0, "1000", True])
def test_a_family_budget_that_is_not_a_positive_number_is_a_config_error(budget) -> None:
    from probekit.training.families import depth_family

    with pytest.raises(ConfigError, match="budget"):
        depth_family(budget, [2, 4])


@pytest.mark.parametrize(
    "kwargs", [dict(depths=[True]), dict(depths=[2.0]), dict(tolerance=float("nan"))]
)
def test_other_bad_family_settings_are_config_errors(kwargs) -> None:
    from probekit.training.families import depth_family

    with pytest.raises(ConfigError):
        depth_family(200_000, **{"depths": [2, 4], **kwargs})


@pytest.mark.parametrize("n_layers, block", [(4, True), (4, 2.0), (True, 1), (4, 0)])
def test_a_bool_or_float_layer_map_size_is_a_config_error(n_layers, block) -> None:
    from probekit.training.growth import layer_map

    with pytest.raises(ConfigError, match="must be a positive integer"):
        layer_map(n_layers, "append", block)


def _saved(toy, tmp_path) -> tuple[Path, dict]:
    import probekit

    model, tokens = toy
    path = probekit.logit_lens(model, tokens).save(tmp_path / "lens.json")
    return path, json.loads(path.read_text())


def test_a_renamed_column_is_named_when_the_figure_is_drawn(toy, tmp_path) -> None:
    from probekit.result import Result

    path, payload = _saved(toy, tmp_path)
    table = payload["df"]
    table["columns"] = ["renamed" if c == "value" else c for c in table["columns"]]
    table["dtypes"]["renamed"] = table["dtypes"].pop("value")
    table["data"]["renamed"] = table["data"].pop("value")
    path.write_text(json.dumps(payload))
    loaded = Result.load(path)
    with pytest.raises(CheckpointError, match="no column 'value'") as info:
        loaded.figure()
    assert "renamed" in str(info.value) and "Fix:" in str(info.value)


@pytest.mark.parametrize("value", ["1e999", "-1", "10000000000", "2.5", '"3"', "true"])
def test_a_count_out_of_range_in_a_result_file_is_refused_on_load(toy, tmp_path, value) -> None:
    from probekit.result import Result

    path, payload = _saved(toy, tmp_path)
    text = json.dumps(payload).replace(
        f'"n_layers": {payload["summary"]["n_layers"]}', f'"n_layers": {value}'
    )
    assert text != json.dumps(payload)
    path.write_text(text)
    with pytest.raises(CheckpointError, match="n_layers"):
        Result.load(path)


# ----------------------------------------------------------------------------- item 15
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_write(tmp_path) -> None:
    from probekit.io import owner_tag, swapped_directory

    out = tmp_path / "report"
    host = owner_tag().rsplit(".", 1)[0]
    dead = tmp_path / f".report.{host}.{_dead_pid()}.k1ll3d.tmp"
    live = tmp_path / f".report.{host}.{os.getpid()}.l1ve00.tmp"
    other_host = tmp_path / f".report.elsewhere-node.{_dead_pid()}.n0de00.tmp"
    unrelated = tmp_path / ".report.old-format.tmp"
    for folder in (dead, live, other_host, unrelated):
        folder.mkdir()
        (folder / "half.html").write_text("<html")
    with swapped_directory(out) as tmp:
        assert str(os.getpid()) in tmp.name
        (tmp / "a.txt").write_text("new")
    assert not dead.exists()
    assert live.is_dir() and other_host.is_dir() and unrelated.is_dir()
    assert (out / "a.txt").read_text() == "new"


def test_a_run_folder_whose_swap_was_interrupted_stands_for_its_previous_checkpoint(
    tmp_path,
) -> None:
    from probekit.run_folders import load_run
    from probekit.sources import checkpoint_to_diagnose

    out = tmp_path / "run"
    train(tiny(steps=2), out, progress=False)
    os.replace(out / "checkpoint", out / "checkpoint.previous")  # the kill between the renames
    assert load_run(out).path == out / "checkpoint.previous"
    path, _, lines = checkpoint_to_diagnose(out)
    assert Path(path) == out / "checkpoint.previous"
    notices = [line for line in lines if "checkpoint.previous" in line]
    assert len(notices) == 1 and notices[0].startswith("notice:")
    # the next train puts checkpoint/ back (one warning saying so); then no notice
    with pytest.warns(UserWarning, match=r"checkpoint.previous \(step 2\) is put back"):
        assert train(tiny(steps=2), out, progress=False).checkpoint == out / "checkpoint"
    path, _, lines = checkpoint_to_diagnose(out)
    assert Path(path) == out / "checkpoint" and not lines


@pytest.mark.slow
def test_sigkill_during_diagnose_leaves_nothing_a_later_run_keeps(tmp_path) -> None:
    import signal
    import time

    run = tmp_path / "run"
    train(tiny(steps=2), run, progress=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, "-m", "probekit", "diagnose", "run", "--out", "rep", "--quiet"]
    args += ["--n-sequences", "8"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".rep.*.tmp")) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("diagnose finished before it could be killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(tmp_path.glob(".rep.*.tmp"))
    done = cli("diagnose", "run", "--out", "rep", "--quiet", "--n-sequences", "8", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(tmp_path.glob(".rep.*")) and (tmp_path / "rep" / "report.html").is_file()


# ----------------------------------------------------------------------------- item 16
@pytest.mark.parametrize(
    "flags, words",
    [
        (["--n-layers", "100000"], "n_layers = 100000 is more than the 4096 layers"),
        (["--n-layers", "100000", "--d-model", "8", "--n-heads", "2"], "n_layers = 100000"),
        (["--steps", str(10**12)], "steps = 1000000000000 is more than the 100000000 steps"),
    ],
)
def test_runaway_sizes_are_refused_in_seconds_with_nothing_written(tmp_path, flags, words):
    proc = cli("train", "--out", "run", "--quiet", *flags, cwd=tmp_path)
    line = one_line_error(proc)
    assert words in line and "Fix:" in line
    assert not (tmp_path / "run").exists()


def test_the_memory_estimate_counts_a_cost_per_layer(monkeypatch) -> None:
    from probekit.anchor import training as trainer_mod
    from probekit.training import memory
    from probekit.training.loop import checked_device

    shallow = tiny(model=ModelConfig(n_layers=1, d_model=8, n_heads=2))
    deep = tiny(model=ModelConfig(n_layers=4001, d_model=8, n_heads=2))
    extra = trainer_mod.stack_bytes([deep]) - trainer_mod.stack_bytes([shallow])
    assert extra >= 4000 * memory.LAYER_OVERHEAD_BYTES
    monkeypatch.setattr(memory, "available_memory", lambda device: 2**29)  # 512 MiB free
    with pytest.raises(ConfigError, match="available"):
        checked_device(deep, "cpu", trainer_mod.stack_bytes([deep]), "a deep run")
    from probekit.lm import LMConfig
    from probekit.lm.training import lm_run_bytes

    lm = [LMConfig(n_layers=n, d_model=8, n_heads=2) for n in (1, 4001)]
    extra = lm_run_bytes(lm[1], 256) - lm_run_bytes(lm[0], 256)
    assert extra >= 4000 * memory.LAYER_OVERHEAD_BYTES


@pytest.mark.parametrize("field, value", [("n_layers", 4097), ("n_layers", 10**5)])
def test_both_trainers_refuse_a_model_deeper_than_the_bound(field, value) -> None:
    from probekit.lm import LMConfig

    with pytest.raises(ConfigError, match="4096"):
        ModelConfig(**{field: value})
    with pytest.raises(ConfigError, match="4096"):
        LMConfig(**{field: value}).validate()


def test_a_full_disk_in_the_lm_trainer_is_one_error_too(tmp_path, monkeypatch) -> None:
    from probekit.lm import LMConfig, train_lm
    from probekit.lm import checkpoints as lm_checkpoints
    from tests.conftest import TINY_LM

    real = lm_checkpoints.save_moments
    calls = []

    def save_moments(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(*args, **kwargs)

    monkeypatch.setattr(lm_checkpoints, "save_moments", save_moments)
    cfg = LMConfig(**{**TINY_LM, "save_every": 2})
    out = tmp_path / "lm"
    with pytest.raises(CheckpointError, match="no space left") as info:
        train_lm(cfg, out, progress=False, device="cpu")
    assert "checkpoint of step 2" in str(info.value)
    assert not list(out.glob(".*.tmp")) and not (out / LOCK_NAME).exists()


# ----------------------------------------------------------------------------- families
_LAYER_VALUES = st.one_of(
    st.integers(-5, 8),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=2),
    st.none(),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(order=st.lists(_LAYER_VALUES, max_size=5))
def test_property_any_layer_order_is_run_or_refused_by_name(toy, order) -> None:
    from probekit.interventions import reorder_layers

    model, _ = toy
    blocks = list(model.blocks)
    permutation = all(type(i) is int for i in order) and sorted(order) == list(
        range(model.n_layers)
    )
    if permutation:
        with reorder_layers(model, order):
            assert [model.blocks[p] for p in range(3)] == [blocks[i] for i in order]
    else:
        with pytest.raises(InputError, match="Fix:"):
            _enter(reorder_layers(model, order))
    assert list(model.blocks) == blocks


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    value=st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.booleans(),
        st.text(max_size=3),
        st.lists(st.integers(), max_size=2),
    )
)
def test_property_a_result_count_loads_only_when_it_is_a_count(toy, tmp_path, value) -> None:
    from probekit.result import SIZE_LIMIT, Result

    path, payload = _saved(toy, tmp_path)
    payload["summary"]["n_layers"] = value
    path.write_text(json.dumps(payload))
    valid = type(value) is int and 0 <= value <= SIZE_LIMIT
    if valid:
        assert Result.load(path).summary["n_layers"] == value
    else:
        with pytest.raises(CheckpointError, match="n_layers"):
            Result.load(path)
