"""Every figure, text and verdict takes its words and units from the measure actually used: a
sentence-embedding model (no vocabulary, measure rel_l2) is never described in terms of loss."""

from __future__ import annotations

import re

import probekit
from probekit.report import diagnose, write_report
from tests.conftest import sample_tokens
from tests.test_headless import sentence_folder


def _words_of(fig) -> str:
    layout = fig.to_dict()["layout"]
    texts = [str(layout.get("title", {}).get("text", ""))]
    for axis in ("xaxis", "yaxis"):
        texts.append(str(layout.get(axis, {}).get("title", {}).get("text", "")))
    for trace in fig.to_dict()["data"]:
        texts.append(str(trace.get("colorbar", {}).get("title", {}).get("text", "")))
    return " ".join(texts).replace("<br>", " ")


def test_an_embedding_model_is_never_described_by_loss(tmp_path):
    model = probekit.load(sentence_folder(tmp_path, "mean"))
    diagnosis = diagnose(model, sample_tokens(), n_bootstrap=5)
    swaps = _words_of(diagnosis.results["layer_swaps"].figure())
    assert "Output change of swapping" in swaps and "relative output change" in swaps
    contributions = _words_of(diagnosis.results["contributions"].figure())
    assert "relative change of the output" in contributions and "rel l2" not in contributions
    write_report(diagnosis, tmp_path / "report")
    page = (tmp_path / "report" / "report.html").read_text()
    prose = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the words, not the plots
    assert not re.search(r"\bloss\b", prose.split("Layer swaps")[-1].split("<section")[0])
    assert "relative change of the output" in prose
    for line in diagnosis.verdict:  # saying there is no loss is fine
        assert "loss" not in line.replace("no loss", ""), line
    for name, result in diagnosis.results.items():
        assert "loss" not in _words_of(result.figure()).lower(), name


def test_a_language_model_keeps_its_loss_words(tmp_path):
    from probekit.toy import toy_hf_model

    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    diagnosis = diagnose(model, sample_tokens(), n_bootstrap=5)
    swaps = _words_of(diagnosis.results["layer_swaps"].figure())
    assert "Loss change of swapping" in swaps and "Δ loss (nats)" in swaps


def test_summary_tables_speak_in_words_for_a_language_and_an_embedding_model(tmp_path):
    from probekit.result import json_ready, readable, shown_rows
    from probekit.toy import toy_hf_model

    for model in (
        probekit.load(toy_hf_model("gpt2", n_layers=3)),
        probekit.load(sentence_folder(tmp_path, "mean")),
    ):
        diagnosis = diagnose(model, sample_tokens(), n_bootstrap=5)
        for name, result in diagnosis.results.items():
            rows = shown_rows(json_ready(result.summary), result.kind)
            shown = {label: value for label, value in rows}
            labels = {readable(str(key), result.kind) for key in result.summary}
            raw = [k for k in result.summary if "_" in k and k.replace("_", " ") in labels]
            assert not raw, (name, raw)  # a key of several words, shown as its key
            assert len(shown) == len(rows), name  # no label twice
            if "output change measured by" in shown:  # the measure in words, not its key
                assert "_" not in shown["output change measured by"], name
