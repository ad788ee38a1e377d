"""The command line: diagnose writes a self-contained report; bad input is one line, exit 2."""

from __future__ import annotations

import json
import re

import pytest

from probekit.cli import build_parser, main
from tests.conftest import make_hf
from tests.runs import anchor_run, count_run_reads

ANALYSES = ("contributions", "skip_effects", "layer_swaps", "residual", "logit_lens", "gradients")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "gpt2"
    make_hf("gpt2", scale=2.0).save_pretrained(path)
    return path


def test_diagnose_writes_report(checkpoint, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(
        [
            "diagnose",
            str(checkpoint),
            "--out",
            str(out),
            "--n-sequences",
            "6",
            "--seq-len",
            "8",
            "--bootstrap",
            "5",
            "--device",
            "cpu",
            "--no-images",
        ]
    )
    assert code == 0
    page = (out / "report.html").read_text()
    assert "Verdict" in page and "second half of the network" in page
    assert not re.search(r"<script[^>]+src=", page)  # plotly embedded: opens offline
    assert page.count("plotly-graph-div") >= 6
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["headline"]["second_half_share"] <= 1
    measured = summary["measured"]
    assert measured["checkpoint"] == str(checkpoint.resolve())
    assert "drawn uniformly" in measured["data_source"]
    assert (measured["n_sequences"], measured["seq_len"], measured["n_bootstrap"]) == (6, 8, 5)
    assert {"probekit", "torch", "transformer-lens"} <= set(measured["versions"])
    assert measured["device"] == "cpu" and measured["date"]
    assert "What was measured" in page and "Zero-ablation contributions" in page
    assert "second_half_share" not in page.split("<section>", 1)[1].split("<script")[0]
    for name in ANALYSES:
        assert (out / f"{name}.json").is_file() and (out / f"{name}.csv").is_file()
    assert "report:" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, match",
    [
        (["diagnose", "/no/such/dir", "--out", "x"], "does not exist"),
        (["diagnose", "CKPT", "--out", "OUT", "--text", "/no/file.txt"], "does not exist"),
        (["diagnose", "CKPT", "--out", "OUT", "--text", "CKPT/config.json"], "no tokenizer"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, match, checkpoint, tmp_path, capsys):
    argv = [a.replace("CKPT", str(checkpoint)).replace("OUT", str(tmp_path / "o")) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probekit: error:") and "\n" not in err and match in err


def test_bad_flags_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "x", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probekit: error:") and "\n" not in err


def test_help_explains_every_flag():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["diagnose"]
    text = sub.format_help()
    for action in sub._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, action.dest
            assert action.option_strings[-1] in text


def test_images_or_a_one_line_notice(checkpoint, tmp_path, capsys, monkeypatch):
    import probekit.page as page

    argv = [
        "diagnose",
        str(checkpoint),
        "--out",
        str(tmp_path / "a"),
        "--n-sequences",
        "4",
        "--seq-len",
        "8",
        "--bootstrap",
        "0",
        "--quiet",
        "--random-tokens",  # asked for: no warning that the folder has no tokenizer
    ]
    monkeypatch.setattr(page, "chromium_available", lambda: False)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "HTML figures only" in err and len(err.strip().splitlines()) == 1
    assert "Chromium" in err and "kaleido" not in err
    assert not list((tmp_path / "a").glob("*.png"))
    monkeypatch.undo()
    argv[3] = str(tmp_path / "b")
    assert page.chromium_available(), "chromium is installed by .ci/run"
    assert main(argv) == 0
    for name in ANALYSES:
        png = (tmp_path / "b" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (tmp_path / "b" / f"{name}.svg").read_bytes()[:500]
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith(".")]


def test_default_data_of_an_anchor_run(tmp_path):
    from probekit.sources import checkpoint_of, default_data

    run, task = anchor_run(tmp_path)
    assert checkpoint_of(run) == str(run / "checkpoint")
    assert checkpoint_of(run / "checkpoint") == str(run / "checkpoint")
    data, positions = default_data(run)
    expected = task.dataset("test_data")
    assert positions == "last"
    assert data["input_ids"].equal(expected.tokens)
    assert data["labels"][:, -1].equal(expected.targets)
    assert (data["labels"][:, :-1] == -100).all()


def test_default_data_of_an_lm_run_in_the_old_format(tmp_path):
    from probekit.lm import ByteCorpus
    from probekit.sources import default_data
    from probekit.toy import toy_model

    (tmp_path / "run_config.json").write_text(json.dumps({"lm": {"corpus_max_files": 20}}))
    tokens, positions = default_data(tmp_path, model=toy_model(), n_sequences=3, seq_len=64)
    assert positions == "all"  # 64 capped at the toy model's context of 16:
    assert tokens.equal(ByteCorpus(max_files=20).sequences("validation", 16, n=3))


def test_default_data_draws_tokens_for_other_models(checkpoint):
    from probekit.sources import default_data, random_tokens

    tokens, positions = default_data(checkpoint, n_sequences=5, seq_len=8, seed=3)
    assert positions == "all" and tokens.shape == (5, 8)
    assert tokens.equal(random_tokens(str(checkpoint), 5, 8, seed=3))
    assert not tokens.equal(random_tokens(str(checkpoint), 5, 8, seed=4))


def test_diagnose_a_run_folder(tmp_path, capsys):
    run, _ = anchor_run(tmp_path)
    out = tmp_path / "report"
    argv = ["diagnose", str(run), "--out", str(out), "--bootstrap", "0", "--no-images"]
    assert main([*argv, "--device", "cpu"]) == 0
    page = (out / "report.html").read_text()
    assert f"probekit depth diagnosis: {run / 'checkpoint'}" in page
    assert "report:" in capsys.readouterr().out
    meta = json.loads((out / "contributions.json").read_text())["meta"]
    assert meta["positions"] == "last"  # the answer position of the anchor task
    assert main([*argv, "--positions", "all", "--quiet"]) == 0
    assert json.loads((out / "contributions.json").read_text())["meta"]["positions"] == "all"


def test_diagnose_reads_a_run_folder_once(tmp_path, monkeypatch, capsys):
    """``probekit diagnose RUN`` enters the run reader once: the checkpoint folder, the data, the
    data to fit a lens on, their positions and their description come from one reading
    (:func:`probekit.sources.resolve`), and the report is the one of the run's task."""
    run, task = anchor_run(tmp_path)
    reads = count_run_reads(monkeypatch)
    out = tmp_path / "report"
    argv = ["diagnose", str(run), "--out", str(out), "--bootstrap", "0", "--no-images"]
    assert main([*argv, "--device", "cpu", "--tuned-lens", "--lens-steps", "1"]) == 0
    assert [str(path) for path in reads] == [str(run)]
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {out / 'report.html'}"
    summary = json.loads((out / "summary.json").read_text())
    measured = summary["measured"]
    assert measured["checkpoint"] == str(run / "checkpoint") and measured["dtype"] == "stored"
    assert measured["data_source"] == (
        f"{task.dataset('test_data').description()} stored with the run (answer at the last token)"
    )
    assert (measured["positions"], measured["n_sequences"]) == ("last", task.n_test)
    assert "tuned_lens_formed_at_depth" in summary["headline"]
    assert f"probekit depth diagnosis: {run / 'checkpoint'}" in (out / "report.html").read_text()


def test_random_tokens_of_a_run_are_named_random_tokens(tmp_path):
    """``--random-tokens`` on a run folder: the source says tokens were drawn (not the run's
    corpus), so the "at chance" warning can blame them."""
    from probekit.sources import is_random_tokens, locate, resolve

    run, _ = anchor_run(tmp_path)
    source = resolve(*locate(run), random=True, n_sequences=2, seq_len=4, seed=3)
    assert source.description == "tokens drawn uniformly from the vocabulary (seed 3)"
    assert is_random_tokens(source.description) and source.run is not None


def test_diagnose_with_conventions_and_a_tuned_lens(checkpoint, tmp_path, capsys):
    """--tuned-lens fits a lens on other data and shows it beside the logit lens; the
    convention flags reach the analyses and the headline."""
    out = tmp_path / "report"
    argv = [
        "diagnose",
        str(checkpoint),
        "--out",
        str(out),
        "--n-sequences",
        "4",
        "--seq-len",
        "8",
        "--bootstrap",
        "0",
        "--device",
        "cpu",
        "--no-images",
        "--quiet",
        "--convention",
        "csordas2025",
        "--keep-first",
        "yes",
        "--tuned-lens",
        "--lens-steps",
        "3",
    ]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["headline"]["convention"] == "csordas2025"
    assert "tuned_lens_formed_at_depth" in summary["headline"]
    assert any("tuned lens" in line for line in summary["verdict"])
    tuned = json.loads((out / "tuned_lens.json").read_text())
    assert tuned["meta"]["overlap_sequences"] == 0  # fitted on other tokens than it read
    skips = json.loads((out / "skip_effects.json").read_text())
    assert skips["meta"]["convention"] == "csordas2025"
    assert "logit lens" in (out / "report.html").read_text()


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--lens", "/no/such/lens"], "is not a folder"),
        (["--lens-steps", "0"], "--lens-steps 0 is outside"),
        (["--convention", "paper"], "invalid choice"),
    ],
)
def test_bad_lens_and_convention_flags(extra, match, checkpoint, tmp_path, capsys):
    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "o"), *extra]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own choices check
        code = exc.code
    assert code == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_diagnose_in_another_dtype(checkpoint, tmp_path):
    """--dtype loads the weights in that dtype; the report names it in the model line."""
    out = tmp_path / "report"
    argv = [
        "diagnose",
        str(checkpoint),
        "--out",
        str(out),
        "--n-sequences",
        "2",
        "--seq-len",
        "6",
        "--bootstrap",
        "0",
        "--device",
        "cpu",
        "--no-images",
        "--quiet",
        "--dtype",
        "bfloat16",
    ]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "torch.bfloat16" in summary["model"]
    assert 0 <= summary["headline"]["second_half_share"] <= 1


def test_missing_image_pieces_are_named(monkeypatch):
    import importlib.util

    import probekit.page as page
    import probekit.report as report

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "kaleido" else real(n))
    monkeypatch.setattr(page, "chromium_available", lambda: True)
    assert 'pip install -e ".[png]"' in report.missing_for_images()
    assert "Chromium" not in report.missing_for_images()


def test_a_folder_of_runs_lists_its_checkpoints(checkpoint, tmp_path, capsys):
    import shutil

    for name in ("a", "b"):
        shutil.copytree(checkpoint, tmp_path / "runs" / name / "checkpoint")
    assert main(["diagnose", str(tmp_path / "runs"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "a/checkpoint" in err and "b/checkpoint" in err and len(err.splitlines()) == 1


def test_a_typo_suggests_the_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--out", "x", "--weight-decy", "0.1"])
    assert stop.value.code == 2
    assert "did you mean --weight-decy -> --weight-decay?" in capsys.readouterr().err


def test_train_help_reads_right_and_the_preset_is_the_reference(capsys):
    from probekit.anchor import anchor_cpu_config
    from probekit.cli.train_flags import build_train_config

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "skip the evaluation before the first step --device" in text  # no "(default: True)"
    assert "(default: 20,100)" in text and "[20, 100]" not in text
    args = build_parser().parse_args(["train", "--out", "x", "--preset", "cpu-reference"])
    args_lr = build_parser().parse_args(
        ["train", "--out", "x", "--preset", "cpu-reference", "--lr", "0.01", "--gamma", "0.8"]
    )
    reference = anchor_cpu_config(0.5).to_dict()
    got = build_train_config(args).to_dict()
    assert {k: v for k, v in got.items() if k != "name"} == {
        k: v for k, v in reference.items() if k != "name"
    }
    changed = build_train_config(args_lr)
    assert changed.lr == 0.01 and changed.model.gamma == 0.8 and changed.steps == 1500


def test_train_flags_reach_the_task_and_model_settings():
    from probekit.cli.train_flags import build_train_config

    argv = ["train", "--out", "x", "--key-split", "anchor_function_pub", "--special-form"]
    argv += ["shift", "--special-targets", "3,4:-6", "--init-scheme", "official"]
    cfg = build_train_config(build_parser().parse_args(argv + ["--layernorm-scaling"]))
    assert cfg.task.key_split == "anchor_function_pub" and cfg.task.special_form == "shift"
    assert cfg.task.special_targets == {(3, 4): -6}
    assert cfg.model.init_scheme == "official" and cfg.model.layernorm_scaling is True
    default = build_train_config(build_parser().parse_args(["train", "--out", "x"]))
    assert default.task.key_split == "complexity_control" and default.model.init_scheme == "fan_in"
    assert default.task.special_targets == {(3, 4): 4} and not default.model.layernorm_scaling
    modulus = build_parser().parse_args(["train", "--out", "x", "--key-split", "7"])
    assert build_train_config(modulus).task.key_split == 7


def test_threads_flag_and_the_omp_wait_policy(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    before = torch.get_num_threads()
    try:
        missing = ["diagnose", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]
        assert main(missing + ["--threads", "0"]) == 2
        assert "--threads 0" in capsys.readouterr().err
        assert main(missing + ["--threads", "1"]) == 2
        assert torch.get_num_threads() == 1  # set before the path was checked
        assert "does not exist" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)
    import os

    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    main(missing)
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's choice is kept
    assert "train" not in build_parser("diagnose")._subparsers._group_actions[0].choices
    assert "train" in build_parser()._subparsers._group_actions[0].choices


def test_import_probekit_chooses_passive_openmp_waits_before_torch_loads():
    import os
    import subprocess
    import sys

    code = "import os, sys, probekit; print(os.getenv('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.split() == ["PASSIVE", "False"]  # set, and torch not loaded yet
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.split() == ["ACTIVE", "False"]  # the user's choice is kept


def test_abbreviated_flags_are_refused_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["train", "--out", "x", "--n-layer", "3"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--n-layers" in err and "unrecognized" in err


def test_another_subcommands_flag_is_named_as_theirs_not_as_a_typo(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["diagnose", "model", "--out", "x", "--quick"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--quick is a flag of probekit demo" in err and "did you mean" not in err
    with pytest.raises(SystemExit):  # a typo is matched against the subcommand's own flags
        main(["diagnose", "model", "--out", "x", "--n-sequence", "3"])
    assert "did you mean --n-sequence -> --n-sequences?" in capsys.readouterr().err
