"""``probekit compare`` and ``probekit timeline``: several checkpoints on the same data, each
with its own report, and one page that sets them side by side."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from huggingface_hub import constants

from probekit.cli import main
from probekit.cluster import DiagnosesResult
from probekit.compare import comparison_page, timeline_figure
from probekit.sources import checkpoints_to_compare
from probekit.toy import toy_hf_model
from tests.browser import figure_problems, open_page

FAST = ["--quiet", "--random-tokens", "--bootstrap", "0", "--n-sequences", "4", "--seq-len", "8"]


def _run(argv, capsys):
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    for name, layers, seed in (("L2", 2, 0), ("L3", 3, 1), ("run/step100", 2, 2),
                               ("run/step20", 2, 3), ("run/step300", 2, 4)):  # fmt: skip
        toy_hf_model("gpt2", n_layers=layers, seed=seed).save_pretrained(root / name)
    toy_hf_model("gpt2", n_layers=2, vocab_size=60).save_pretrained(root / "other_vocab")
    _damaged(root)
    return root


def _damaged(root):
    """Copies of L2 broken one way each: truncated weights, a config.json that is not JSON,
    a tensor missing (found only when the weights load), and a plain file."""
    for name in ("truncated", "bad_config", "missing_tensor"):
        shutil.copytree(root / "L2", root / name)
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (root / "bad_config" / "config.json").write_text("{not json")
    from safetensors.torch import load_file, save_file

    weights = load_file(root / "missing_tensor" / "model.safetensors")
    weights.pop("transformer.h.1.mlp.c_fc.weight")
    save_file(weights, root / "missing_tensor" / "model.safetensors", metadata={"format": "pt"})
    (root / "README.md").write_text("# not a checkpoint\n")


def test_compare_writes_each_report_and_one_page_side_by_side(folders, tmp_path, capsys):
    out = tmp_path / "cmp"
    code, err = _run(
        ["compare", str(folders / "L2"), str(folders / "L3"), "--out", str(out), *FAST], capsys
    )
    assert code == 0, err
    assert (out / "L2" / "report.html").is_file() and (out / "L3" / "report.html").is_file()
    page = (out / "index.html").read_text()
    for words in ("second-half share", "permutable blocks", "href='L2/report.html'", "layers 0"):
        assert words in page, words
    assert "relative depth" in page  # a 2- and a 3-layer model share one axis
    assert "Data: tokens drawn uniformly from the vocabulary (seed 0)" in page
    figures, errors = open_page(out / "index.html")
    assert errors == [] and len(figures) == 2
    assert figure_problems(figures) == []
    assert [t["n_traces"] for t in figures] == [2, 2]
    _assert_at_chance_warned(page, ["L2", "L3"])


def _assert_at_chance_warned(page, names):
    """Each checkpoint at chance (random tokens) has its warning counted in the table and
    written out under it, by name."""
    assert "<th>warnings</th>" in page and page.count(">1 warning</a>") == len(names)
    listed = page[page.index("<div class='warnings'>") :]
    for name in names:
        item = listed[listed.index(f"<li id='warnings-{name}'>") :]
        assert item.startswith(f"<li id='warnings-{name}'><strong>{name}</strong>: the clean loss")
        assert "close to ln(vocabulary)" in item[: item.index("</li>")]


def test_timeline_orders_a_runs_checkpoints_by_step(folders, tmp_path, capsys):
    assert list(checkpoints_to_compare([str(folders / "run")], run=True)) == [
        "step20",
        "step100",
        "step300",
    ]
    out = tmp_path / "tl"
    code, err = _run(["timeline", str(folders / "run"), "--out", str(out), *FAST], capsys)
    assert code == 0, err
    page = (out / "index.html").read_text()
    assert "Depth use over training" in page and "training step" in page
    assert page.index("step20") < page.index("step100") < page.index("step300")
    _assert_at_chance_warned(page, ["step20", "step100", "step300"])
    figures, errors = open_page(out / "index.html")
    assert errors == [] and len(figures) == 3 and figure_problems(figures) == []
    assert figures[0]["title_text"] == "Depth use over training"


def _table(steps, shares, scores, status=None):
    df = pd.DataFrame(
        {
            "name": [f"c{i}" for i in range(len(steps))],
            "status": status or ["ok"] * len(steps),
            "second_half_share": shares,
            "depth_score": scores,
        }
    )
    return DiagnosesResult(df, {}, {})


def test_timeline_figure_draws_each_measure_in_its_own_panel_with_round_ticks():
    """The share and the depth score each get a panel of their own over one x axis (not two
    y axes over the same pixels), in distinct markers, with ticks at round values in the
    measure's units (a percent; a few decimals, never 1.46423) and integer steps."""
    table = _table([20, 100, 300], [0.121, 0.1243, 0.131], [1.46423, 1.4712, 1.502])
    fig = timeline_figure(table, [20, 100, 300])
    top, bottom = fig.layout.yaxis, fig.layout.yaxis2
    assert top.overlaying is None and bottom.overlaying is None
    assert max(bottom.domain) < min(top.domain)  # one panel above the other
    assert fig.layout.xaxis.matches == "x2" and fig.data[1].yaxis == "y2"
    assert top.tickformat == ".0%" and "share" in top.title.text and "(%)" in top.title.text
    assert bottom.tickformat == ".2f" and "depth score" in bottom.title.text
    assert bottom.dtick == 0.01 and top.dtick == 0.05 and top.range[0] < 0  # 0% in view
    for values, axis in ((fig.data[0].y, top), (fig.data[1].y, bottom)):
        assert axis.range[0] < min(values) and max(values) < axis.range[1]  # none clipped
    assert {trace.marker.symbol for trace in fig.data} == {"circle", "diamond"}
    assert [a.text for a in fig.layout.annotations] == [
        "second-half share of the output change",
        "skip-effect depth score (centre of mass, layer)",
    ]
    x_axis = fig.layout.xaxis2
    assert x_axis.title.text == "training step" and x_axis.tickformat == ",d"
    assert x_axis.dtick == 50 and fig.layout.xaxis.showticklabels is False


def test_timeline_figure_over_failed_and_unnumbered_checkpoints():
    """A failed checkpoint leaves a gap; checkpoints without steps are numbered in order; an
    unchanging measure still gets a band of round ticks around its value."""
    table = _table([None] * 3, [0.5, 0.5, None], [1.0, 1.0, None], ["ok", "ok", "failed: x"])
    fig = timeline_figure(table, [None] * 3)
    assert list(fig.data[0].x) == [0, 1, 2] and fig.data[0].y[2] is None
    assert fig.layout.xaxis2.title.text == "checkpoint (in the order given)"
    assert fig.layout.xaxis2.dtick == 1
    assert list(fig.layout.yaxis2.range) == pytest.approx([0.884, 1.116])


def test_a_page_without_warnings_lists_none():
    """No checkpoint warned: no warnings column and no list."""
    page = comparison_page(_table([1, 2], [0.1, 0.2], [1.0, 2.0]), {}, title="t", warnings={})
    assert "<th>warnings</th>" not in page and "<div class='warnings'>" not in page


def test_timeline_over_hub_revisions(folders, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    for ref, commit in (("main", "a" * 40), ("v1", "b" * 40)):
        snapshot = cache / "models--org--tiny" / "snapshots" / commit
        toy_hf_model("gpt2", n_layers=2, seed=len(ref)).save_pretrained(snapshot)
        (cache / "models--org--tiny" / "refs").mkdir(parents=True, exist_ok=True)
        (cache / "models--org--tiny" / "refs" / ref).write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    found = checkpoints_to_compare(["org/tiny"], revisions=["main", "v1"], run=True)
    assert list(found) == ["tiny@main", "tiny@v1"]
    assert found["tiny@v1"].endswith("b" * 40)


def test_bad_inputs_get_one_line_and_nothing_written(folders, tmp_path, capsys):
    out = tmp_path / "bad"
    cases = [
        (["compare", str(folders / "L2")], "1 checkpoint(s) to compare"),
        (["compare", str(folders / "L2"), str(tmp_path / "absent")], "does not exist"),
        (["compare", str(folders / "L2"), str(folders / "other_vocab")], "different vocab"),
        (["compare", str(folders / "L2"), str(folders / "L3"), "--names", "a"], "1 names for 2"),
        (["timeline", str(folders / "L2"), "--revisions", "a,b"], "exactly one Hub name"),
        (["compare", str(folders / "L2"), str(folders / "L3"), "--ray-address", "x:1"], "--ray"),
        (["compare", str(folders / "L2"), str(folders / "README.md")], "is a file, not a dir"),
        (["compare", str(folders / "L2"), str(folders / "truncated")], "truncated"),
        (["compare", str(folders / "bad_config"), str(folders / "L2")], "not valid JSON"),
        (["timeline", str(folders / "L2"), str(folders / "truncated")], "truncated"),
    ]
    for argv, message in cases:
        code, err = _run([*argv, "--out", str(out), *FAST], capsys)
        assert code == 2, argv
        assert message in err and err.count("\n") == 1, (argv, err)
        assert not out.exists()
    summary = json.dumps(sorted(p.name for p in tmp_path.iterdir()))
    assert "bad" not in summary


@pytest.mark.parametrize("command", ["compare", "timeline"])
def test_a_checkpoint_failing_during_the_run_exits_1_and_is_named(
    command, folders, tmp_path, capsys
):
    """A failure only the load finds (a missing tensor): the others' reports and the page are
    written, the failure is on the page and in diagnoses.csv, one error line names it (also
    with --quiet) and the exit status is 1, not 0."""
    out = tmp_path / "cmp"
    argv = [command, str(folders / "L2"), str(folders / "missing_tensor"), "--out", str(out)]
    code, err = _run([*argv, *FAST], capsys)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("probekit: error: checkpoint missing_tensor")
    assert "missing tensor" in lines[0]
    assert (out / "L2" / "report.html").is_file() and (out / "index.html").is_file()
    assert "failed" in (out / "index.html").read_text()
    assert "missing_tensor,failed" in (out / "diagnoses.csv").read_text().replace('"', "")
