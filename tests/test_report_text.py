"""The report speaks plainly: warnings, where reference ranges apply, block wording, tables."""

from __future__ import annotations

import json

import pytest

import probekit
from probekit.report import diagnose, write_report
from probekit.report_text import conclusion
from probekit.sources import data_source
from probekit.toy import toy_model, toy_tokens
from probekit.verdict import blocks_line, headline_and_verdict


@pytest.fixture(scope="module")
def untrained():
    return diagnose(toy_model("gpt2", n_layers=2), toy_tokens(4, 8), n_bootstrap=2)


def test_an_untrained_model_is_flagged_and_gets_no_reference_range(untrained):
    assert untrained.verdict[0].startswith("Warning: the clean loss")
    share_line = next(line for line in untrained.verdict if "second half" in line)
    assert "no reference range" in share_line and "15%" not in share_line
    assert untrained.meta["n_sequences"] == 4 and untrained.meta["n_bootstrap"] == 2


def test_reference_range_for_deeper_pre_ln_models():
    diagnosis = diagnose(toy_model("gpt2", n_layers=3), toy_tokens(4, 8), n_bootstrap=0)
    assert any("typically stay below 15%" in line for line in diagnosis.verdict)


def test_block_wording():
    alone = blocks_line([(0, 1), (1, 2)], {1: 1.0})
    assert alone.startswith("No permutable block") and "0; 1" not in alone
    wide = blocks_line([(0, 8), (8, 12)], {8: 0.9})
    assert "layers 0–7; layers 8–11" in wide and "before layer 8: 90%" in wide


def test_report_sections_speak_in_words(untrained, tmp_path):
    page = write_report(untrained, tmp_path).read_text()
    assert "Skip effects</h2><p class='conclusion'>Depth score" in page
    assert "loss of the unmodified model" in page and "The figure" not in page[:500]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["headline"]["permutable_blocks_convention"].startswith("half-open")
    assert summary["measured"]["positions"] == "all"


def test_the_depth_score_is_named_a_position_in_report_table_and_figure(untrained, tmp_path):
    # issue 31: "how much the later layers' work depends on the earlier ones" read a centre of
    # mass (a random model is near (L-1)/2) as an amount; the table's "depth score from the
    # effects on later layers: 0" then seemed to contradict the headline's 0.52
    page = write_report(untrained, tmp_path).read_text()
    assert "depends on the earlier ones" not in page
    assert "how much later layers depend on earlier ones" not in page
    assert "depth score from the effects on later layers" not in page
    skips = untrained.results["skip_effects"]
    sentence = conclusion("skip_effects", skips)
    assert f"Depth score {skips.summary['depth_score']:.2f} on a scale of 0 to 1" in sentence
    assert "centre of mass" in sentence and "near 0.5" in sentence
    assert "later-layer depth score: where skipping a layer changes the later layers" in page
    assert "depth score: where skipping a layer changes the output" in page
    title = skips.figure().layout.title.text
    assert "later-layer depth score 0.00" in title and "output depth score" in title


RANDOM_WHY = "random tokens are unpredictable to any model"


@pytest.mark.parametrize(
    "source, random",
    [
        (data_source("gpt2", None, seed=3), True),
        (None, False),  # not known (the API with plain tokens)
        ("the Python standard library's sources (validation files; real text)", False),
        ("text file /tmp/notes.txt", False),
        ("data set corpus.jsonl (split train, column text)", False),
    ],
)
def test_the_at_chance_warning_blames_random_tokens_only_for_random_tokens(
    untrained, source, random
):
    # issue 31: the warning said "(random tokens are unpredictable ...)" on real text too
    model = probekit.load(toy_model("gpt2", n_layers=2))
    _, verdict = headline_and_verdict(model, untrained.results, source)
    assert verdict[0].startswith("Warning: the clean loss")
    assert (RANDOM_WHY in verdict[0]) is random


def test_diagnose_records_the_data_source_and_words_the_warning_by_it():
    source = data_source("gpt2", None)
    diagnosis = diagnose(
        toy_model("gpt2", n_layers=2), toy_tokens(4, 8), n_bootstrap=0, data_source=source
    )
    assert diagnosis.meta["data_source"] == source and RANDOM_WHY in diagnosis.verdict[0]


def test_the_layer_swap_table_names_the_loss_change_it_is_measured_by(untrained, tmp_path):
    # issue 31: the table said "change of the output probabilities (L2)" under a heading,
    # tolerance and colour bar in nats of loss
    swaps = untrained.results["layer_swaps"]
    assert swaps.summary["measure"] == "loss_delta"
    assert swaps.figure().data[0].colorbar.title.text.startswith("Δ loss")
    page = write_report(untrained, tmp_path).read_text()
    section = page.split("Layer swaps and permutable blocks</h2>")[1].split("<h2>")[0]
    assert "change of the loss (nats)" in section
    assert "change of the output probabilities (L2)" not in section
