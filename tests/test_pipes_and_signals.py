"""Issue 31 item 13: a reader that closes the pipe early (``| head -1``) and SIGTERM end the
command without a traceback: complete outputs keep exit 0, SIGTERM exits 143 and leaves no
hidden temporary folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_hf

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
DIAGNOSE = ("--n-sequences", "4", "--seq-len", "8", "--bootstrap", "0", "--no-images")
TRAIN = ("--steps", "4", "--batch-size", "8", "--eval-every", "2", "--eval-train-samples", "8")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "gpt2"
    make_hf("gpt2", n_layers=2).save_pretrained(path)
    return path


def _closed_pipe_run(args: list[str]) -> subprocess.CompletedProcess:
    """Run ``python -m probekit ARGS`` with stdout a pipe nobody reads (the reader has left,
    as ``head -1`` does once it has its line)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "probekit", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            timeout=120,
        )
    finally:
        os.close(write_end)


def _hidden(folder: Path) -> list[str]:
    """The hidden (temporary) entries in ``folder`` and below it."""
    return [str(p) for p in folder.rglob(".*")]


def test_diagnose_into_a_closed_pipe_finishes_with_exit_0(checkpoint, tmp_path):
    out = tmp_path / "report"
    done = _closed_pipe_run(["diagnose", str(checkpoint), "--out", str(out), *DIAGNOSE])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()
    assert not _hidden(tmp_path)


def test_train_into_a_closed_pipe_finishes_with_exit_0(tmp_path):
    out = tmp_path / "run"
    done = _closed_pipe_run(["train", "--out", str(out), *TRAIN])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert (out / "checkpoint" / "config.json").is_file()
    assert sum(1 for _ in (out / "metrics.jsonl").open()) >= 2


SIGTERM_WHILE_WRITING = """
import os, signal, sys, time
from probekit import report
from probekit.cli import main

original = report.write_report

def write_then_sigterm(*args, **kwargs):
    page = original(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)  # the report is half written: images, the swap left
    time.sleep(30)
    return page

report.write_report = write_then_sigterm
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_while_the_report_is_written_leaves_nothing(checkpoint, tmp_path):
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_WHILE_WRITING, "diagnose", str(checkpoint)]
        + ["--out", str(out), *DIAGNOSE, "--quiet"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert done.returncode == 143, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "probekit: terminated"
    assert not out.exists() and not _hidden(tmp_path)  # no .report.*.tmp folder


def test_sigterm_during_training_exits_143_without_temporary_files(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--out", str(out), *TRAIN, "--quiet"]
    args[args.index("--steps") + 1] = "100000"  # runs until the signal comes
    proc = subprocess.Popen(
        [sys.executable, "-m", "probekit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 60
    while not (out / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "probekit: terminated"
    assert not _hidden(out)  # no .checkpoint.*.tmp, no lock, no .metrics.jsonl.*.tmp
