"""Per-pair metrics over training: every evaluation writes each anchor pair's accuracy into
metrics.jsonl, :func:`pair_curves` reads them, and an anchor run's report draws them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probekit.anchor import pair_curves, train, train_stack
from probekit.anchor.curves import PairCurvesResult
from probekit.errors import InputError
from probekit.result import Result
from tests.conftest import TINY_ANCHOR_TASK, tiny_anchor


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("curves") / "run"
    train(tiny_anchor(steps=4), out, progress=False)
    return out


def test_metrics_rows_hold_every_pair_on_every_split(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    task = TINY_ANCHOR_TASK
    for row in rows:
        accs = row["pair_acc"]
        assert set(accs) == {"train", "test_data", "test_task"}
        assert set(accs["test_task"]) == {"(4,3)"}
        assert set(accs["train"]) == {f"({a},{b})" for a, b in task.seen_pairs}
        assert all(0 <= v <= 1 for split in accs.values() for v in split.values())
        assert row["test_task_acc"] == pytest.approx(accs["test_task"]["(4,3)"])


def test_pair_accuracies_weight_to_the_split_accuracy(run: Path) -> None:
    """The pairs' accuracies, weighted by their counts, are the split's accuracy."""
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    groups = TINY_ANCHOR_TASK.dataset("test_data").groups()
    total = sum(row["pair_acc"]["test_data"][g] for g in groups) / len(groups)
    assert total == pytest.approx(row["test_data_acc"])


def test_pair_curves_table_summary_figure_and_save(run: Path, tmp_path: Path) -> None:
    curves = pair_curves(run)
    assert set(curves.df.columns) == {"run", "step", "split", "pair", "accuracy"}
    assert sorted(set(curves.df.step)) == [0, 2, 4] and curves.summary["n_pairs"] == 15
    fig = curves.figure()
    legend = [t.name for t in fig.data if t.showlegend]
    assert len(legend) == 16 and legend[0] == "pair (1,1)"  # each pair once, in words
    assert [a.text for a in fig.layout.annotations][:3] == [
        "seen pairs, training keys",
        "seen pairs, test keys",
        "held-out pairs, all keys",
    ]
    loaded = Result.load(curves.save(tmp_path / "c.json"))
    assert isinstance(loaded, PairCurvesResult) and loaded.summary == curves.summary
    learned = curves.learned_steps(threshold=0.0)
    assert set(learned.step) == {0.0}


def test_pair_curves_of_a_stack_pick_a_run(tmp_path: Path) -> None:
    cfgs = [tiny_anchor(steps=2, name=f"s{s}", seed=s) for s in (0, 1)]
    train_stack(cfgs, tmp_path / "st", progress=False)
    assert set(pair_curves(tmp_path / "st").df.run) == {"s0", "s1"}
    assert set(pair_curves(tmp_path / "st", run="s1").df.run) == {"s1"}
    with pytest.raises(InputError, match="per-pair"):
        pair_curves(tmp_path / "st", run="nope")


def test_an_anchor_run_report_draws_the_pair_curves(run: Path, tmp_path: Path) -> None:
    from probekit.cli import main

    out = tmp_path / "report"
    argv = ["diagnose", str(run), "--out", str(out), "--bootstrap", "0", "--no-images"]
    assert main([*argv, "--device", "cpu", "--quiet"]) == 0
    page = (out / "report.html").read_text()
    assert "Per-pair accuracy over training" in page and "seen pairs, test keys" in page
    assert (out / "pair_curves.json").is_file()
