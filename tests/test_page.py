"""The one page shell: a report and the comparison page share its layout and styles, and a page
folder is swapped in whole or not at all."""

from __future__ import annotations

import pandas as pd
import pytest

from probekit.cluster import DiagnosesResult
from probekit.compare import comparison_page
from probekit.errors import InputError
from probekit.page import html_page, page_folder
from probekit.report import diagnose, write_report
from probekit.toy import toy_model, toy_tokens


def _style(text: str) -> str:
    return text[text.index("<style>") : text.index("</style>")]


def test_a_report_and_a_comparison_page_share_the_shell(tmp_path):
    shell = html_page("x", "", plotly_src="plotly.min.js")
    diagnosis = diagnose(toy_model("gpt2", n_layers=2), toy_tokens(4, 8), n_bootstrap=2)
    report = write_report(diagnosis, tmp_path / "report", banner="smoke run").read_text()
    table = DiagnosesResult(pd.DataFrame({"name": ["a"], "status": ["failed: x"]}), {}, {})
    comparison = comparison_page(table, {}, title="t", data_label="some data")
    for text in (report, comparison):
        assert _style(text) == _style(shell)
        assert text.startswith('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">')
        assert text.count("plotly.js v") == 1  # embedded once, in the head
        assert text.index("plotly.js v") < text.index("<body>")
    assert "<p class='banner'>smoke run</p><h1>probekit depth diagnosis</h1>" in report
    assert '<h1>t</h1>\n<p class="sub">Data: some data</p>' in comparison


def test_a_failed_page_folder_leaves_the_old_one_and_no_temporary(tmp_path):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "index.html").write_text("old")
    with pytest.raises(InputError, match="could not write the demo to .*nothing changed"):
        with page_folder(out, "demo") as tmp:
            (tmp / "index.html").write_text("new")
            raise OSError(28, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]
    assert (out / "index.html").read_text() == "old"
