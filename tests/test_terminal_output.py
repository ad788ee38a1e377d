"""What the command line writes when its output is no terminal (a log file, a pipe): one plain
line per phase, no carriage returns or cursor escapes; ``--quiet`` still says where the output
went."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from probekit import progress
from probekit.cli import main
from tests.conftest import make_hf

FAST = ["--n-sequences", "4", "--seq-len", "8", "--bootstrap", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "gpt2"
    make_hf("gpt2", n_layers=2).save_pretrained(path)
    return path


def _plain(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text, repr(text[:300])


def test_a_piped_diagnosis_writes_one_plain_line_per_phase(checkpoint, tmp_path, capsys):
    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "r"), *FAST, "--no-images"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    _plain(captured.out + captured.err)
    lines = captured.err.splitlines()
    assert len(lines) <= 10, lines  # seven analyses, the diagnosis, a warning
    assert any(line.startswith("contributions: ") and "block passes" in line for line in lines)
    assert any(line.startswith("diagnose: 7/7 analyses") for line in lines)


def test_quiet_prints_only_where_the_report_is(checkpoint, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["diagnose", str(checkpoint), "--out", str(out), *FAST, "--no-images", "--quiet"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"report: {out.resolve() / 'report.html'}"]
    assert "block passes" not in captured.err and "analyses" not in captured.err
    _plain(captured.out + captured.err)


def test_a_folder_without_a_tokenizer_says_so_on_the_terminal(checkpoint, tmp_path, capsys):
    """Random tokens instead of text: one warning line naming how to give text, even with
    --quiet; none when random tokens are asked for."""
    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "r"), *FAST, "--no-images"]
    assert main([*argv, "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"probekit: warning: {checkpoint} has no tokenizer")
    assert "random tokens" in warned[0] and "--text" in warned[0] and "--dataset" in warned[0]
    assert main([*argv, "--force", "--random-tokens", "--quiet"]) == 0
    assert "no tokenizer" not in capsys.readouterr().err


def test_default_data_warns_in_python_too(checkpoint):
    from probekit.errors import ProbekitWarning
    from probekit.sources import default_data

    with pytest.warns(ProbekitWarning, match="has no tokenizer"):
        default_data(checkpoint, n_sequences=2, seq_len=4)


def test_quiet_demo_and_comparison_print_their_page(checkpoint, tmp_path, capsys, monkeypatch):
    import probekit.compare
    import probekit.demo

    page = tmp_path / "page.html"
    monkeypatch.setattr(probekit.demo, "run_demo", lambda *a, **k: page)
    monkeypatch.setattr(probekit.compare, "compare_checkpoints", lambda *a, **k: (page, {}))
    assert main(["demo", "--quick", "--out", str(tmp_path / "d"), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"demo report: {page}"]
    argv = ["compare", str(checkpoint), str(checkpoint), "--out", str(tmp_path / "c")]
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"comparison: {page}"]


def test_bars_redraw_only_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert progress.live(Terminal()) and not progress.live(io.StringIO())
    assert not isinstance(progress.bar(total=2, file=Terminal()), progress.PlainBar)
    log = io.StringIO()
    with progress.bar(total=2, desc="steps", unit=" step", file=log) as bar:
        bar.update(2)
        bar.set_postfix(loss="0.5")
    assert log.getvalue().startswith("steps: 2/2 step, loss=0.5 (")
    assert log.getvalue().count("\n") == 1
    quiet = io.StringIO()
    for _ in progress.bar([1, 2], desc="x", disable=True, file=quiet):
        pass
    assert quiet.getvalue() == ""


def test_the_quick_demo_piped_writes_plain_lines(tmp_path, capsys, monkeypatch):
    """The demo's training bar and phases, written to a pipe: one plain line each."""
    import probekit.demo as demo

    monkeypatch.setattr(demo, "QUICK_STEPS", 4)
    monkeypatch.setattr(demo, "analyse", _no_analysis)
    out = tmp_path / "demo"
    with pytest.raises(_Stop):
        main(["demo", "--quick", "--out", str(out), "--no-images"])
    err = capsys.readouterr().err
    _plain(err)
    assert len(err.splitlines()) <= 4, err  # the legend, the training bar and its phase


class _Stop(Exception):
    pass


def _no_analysis(checkpoint: Path, *args, **kwargs):
    raise _Stop  # the training is what this test reads
