"""Issue 25: every file probekit reads is read in a bounded way — a pipe, a device or JSON
nested past the parser's recursion limit is one error line (a ``--config``) or not taken for
what it pretends to be (a report's summary.json that ``compare`` would reuse), never a hang or a
traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probekit.cluster import diagnose_many
from probekit.toy import toy_hf_model, toy_tokens
from tests.test_cli_fuzz import assert_one_error, run_cli

DEEP = "[" * 200_000 + "]" * 200_000


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "deep", "device"])
def test_a_train_config_that_is_not_a_json_file_is_one_error(tmp_path, kind):
    if kind == "fifo":
        config = _fifo(tmp_path / "config.json")
    elif kind == "device":
        config = Path("/dev/zero")
    else:
        config = tmp_path / "config.json"
        config.write_text(DEEP)
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "--config", str(config), "--out", str(out), "--quiet"])
    line = assert_one_error(code, err)
    assert "config" in line and "Fix:" in line
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_compare_does_not_reuse_a_summary_that_is_a_pipe_or_too_deep(tmp_path, kind):
    toy_hf_model("gpt2", n_layers=2).save_pretrained(tmp_path / "ckpt")
    stale = tmp_path / "out" / "A"
    stale.mkdir(parents=True)
    (stale / "report.html").write_text("<html></html>")
    if kind == "fifo":
        _fifo(stale / "summary.json")
    else:
        (stale / "summary.json").write_text(DEEP)
    table = diagnose_many(
        {"A": str(tmp_path / "ckpt")}, toy_tokens(), tmp_path / "out", n_bootstrap=2
    )
    assert list(table.df.name) == ["A"]  # diagnosed again, not read from the pipe
    assert (stale / "summary.json").is_file() and not (stale / "summary.json").is_fifo()
