"""What a study pretrains on (probekit.studies.data, probekit.lm.corpus.ByteCorpus.from_texts):
a text file or a local data set (.jsonl, .csv) built on disk, checked before any training,
written once into the study folder, and its fingerprint guarding a resumed study."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from probekit.cli import main
from probekit.errors import ConfigError, InputError, ProbekitError
from probekit.lm import training as lm_training
from probekit.lm.corpus import EOS, ByteCorpus
from probekit.sources import DatasetChoice
from probekit.studies import depth_width, width_transition
from probekit.studies.data import StudyData

LINE = "the quick brown fox jumps over the lazy dog; 0123456789\n"


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(LINE * 100)  # 5,600 bytes
    return path


def tiny_transition(out: Path, **kw):
    args = dict(depths=[1, 2, 3], widths=[16], seeds=[0], steps=3, progress=False)
    return width_transition(out, **{**args, **kw})


# ---- the corpus of texts ------------------------------------------------------------------------
def test_a_corpus_of_texts_is_their_bytes_with_a_held_out_tail(tmp_path: Path) -> None:
    corpus = ByteCorpus.from_texts(["ab", "cdé"], "two texts", validation_fraction=0.25)
    stream = [*b"ab", EOS, *"cdé".encode(), EOS]
    assert corpus.stream("train").tolist() + corpus.stream("validation").tolist() == stream
    assert len(corpus.stream("validation")) == 2  # the last quarter
    # saved and read back as it was (an LM run's corpus_root)
    again = ByteCorpus(corpus.save(tmp_path / "c"))
    assert again.fingerprint() == corpus.fingerprint() and again.source == "two texts"
    assert again.stream("validation").tolist() == corpus.stream("validation").tolist()
    other = ByteCorpus.from_texts(["ab", "cdX"], validation_fraction=0.25)
    assert other.fingerprint() != corpus.fingerprint()
    capped = ByteCorpus.from_texts(iter(["x" * 100] * 1000), max_tokens=250)
    assert len(capped.stream("train")) + len(capped.stream("validation")) == 250
    with pytest.raises(ConfigError, match="too little text"):
        ByteCorpus.from_texts([])


def test_a_text_file_and_local_data_sets_are_read(tmp_path: Path, text_file: Path) -> None:
    rows = [{"body": LINE * 5, "n": i} for i in range(20)]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    csv = tmp_path / "d.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    from_text = StudyData.of(None, text_file, None).read(tokens=1_000, seq_len=64)
    n = len(LINE) * 100
    assert len(from_text.stream("train")) + len(from_text.stream("validation")) > n
    for path in (jsonl, csv):
        data = StudyData.of(None, None, DatasetChoice(str(path), column="body"))
        data.check()
        corpus = data.read(tokens=1_000, seq_len=64)
        assert len(corpus.stream("train")) + len(corpus.stream("validation")) == 20 * (
            len(LINE) * 5 + 1
        )
        assert "column body" in data.describe()
    # the only string column is found without --column
    only = StudyData.of(None, None, str(jsonl)).read(tokens=1_000, seq_len=64)
    assert only.fingerprint() == corpus.fingerprint()


# ---- refused before any training ----------------------------------------------------------------
def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda p: p / "missing.txt", InputError, "does not exist"),
        (lambda p: _write(p, "b.txt", b"\x00\x01" * 100), InputError, "binary"),
        (lambda p: _write(p, "e.txt", b""), ConfigError, "too little text"),
        (lambda p: _write(p, "s.txt", LINE.encode() * 20), ConfigError, "one sequence of 64"),
        (lambda p: _write(p, "m.txt", LINE.encode() * 200), ConfigError, "passes over it"),
    ],
)
def test_bad_text_is_one_error_before_any_training(
    tmp_path: Path, monkeypatch, make, error, words
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(lm_training, "train_lm", lambda cfg, out, *a, **k: calls.append(out))
    with pytest.raises(error, match=words):
        tiny_transition(tmp_path / "t", text=make(tmp_path), steps=2_000)
    assert calls == [] and not (tmp_path / "t").exists()


def test_a_data_set_not_in_the_caches_is_refused_offline(tmp_path: Path, monkeypatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(InputError, match="neither in the local datasets cache"):
        tiny_transition(tmp_path / "t", dataset="no-such-org/no-such-data", dry_run=True)
    assert not (tmp_path / "t").exists()


def test_one_source_only(tmp_path: Path, text_file: Path) -> None:
    with pytest.raises(ConfigError, match="corpus and text"):
        tiny_transition(tmp_path / "t", corpus=str(tmp_path), text=text_file)
    with pytest.raises(ConfigError, match="from scratch"):
        depth_width(
            tmp_path / "s", budgets=[20_000], depths=[1, 2, 3], text=text_file, from_scratch=True
        )


def test_the_cli_refuses_bad_data_in_one_line(tmp_path: Path, text_file: Path, capsys) -> None:
    out = tmp_path / "t"
    base = ["study", "transition", "--out", str(out), "--depths", "1,2,3", "--widths", "16"]
    for extra, words in [
        (["--text", str(tmp_path / "nope.txt")], "does not exist"),
        (["--text", str(text_file), "--steps", "2000"], "passes over it"),
        (["--split", "train"], "without --dataset"),
        (["--dataset", str(tmp_path / "d.tsv")], "neither in the local datasets cache"),
    ]:
        assert main([*base, *extra, "--quiet"]) == 2, extra
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as exit_:  # argparse: one of them
        main([*base, "--text", str(text_file), "--corpus", str(tmp_path)])
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err
    assert not out.exists()


# ---- a study on a text file ---------------------------------------------------------------------
def test_a_study_on_a_text_file_records_it_and_refuses_other_data(
    tmp_path: Path, text_file: Path, monkeypatch
) -> None:
    out = tmp_path / "t"
    study = tiny_transition(out, text=text_file)
    assert len(study.members) == 3
    saved = json.loads((out / "study.json").read_text())
    corpus = ByteCorpus(out / "corpus")
    assert saved["config"]["text"] == str(text_file.resolve())
    assert saved["corpus"]["fingerprint"] == corpus.fingerprint()
    assert saved["corpus"]["source"] == f"text file {text_file.resolve()}"
    run = json.loads((out / "members" / "L2-w16-s0" / "pretrain" / "run_config.json").read_text())
    assert run["lm"]["corpus_root"] == str((out / "corpus").resolve())
    # resumed on the same text: nothing trained again
    calls: list[str] = []
    monkeypatch.setattr(lm_training, "train_lm", lambda cfg, o, *a, **k: calls.append(o))
    tiny_transition(out, text=text_file)
    assert calls == []
    # the same path with other text: refused before any work
    text_file.write_text(LINE.upper() * 100)
    with pytest.raises(ProbekitError, match="pretrained on other data"):
        tiny_transition(out, text=text_file)
    assert calls == []
    # another source: other settings
    with pytest.raises(ConfigError, match="other settings"):
        tiny_transition(out)


def test_the_cli_pretrains_on_a_local_data_set(tmp_path: Path, capsys) -> None:
    data = tmp_path / "d.csv"
    pd.DataFrame({"body": [LINE * 5] * 20}).to_csv(data, index=False)
    out = tmp_path / "t"
    argv = ["study", "transition", "--out", str(out), "--depths", "1,2,3", "--widths", "16"]
    argv += ["--dataset", str(data), "--column", "body", "--steps", "2"]
    assert main([*argv, "--dry-run"]) == 0
    assert f"pretrained on data set {data}" in capsys.readouterr().out
    assert main([*argv, "--quiet"]) == 0
    assert len(pd.read_csv(out / "members.csv")) == 3
    assert json.loads((out / "study.json").read_text())["config"]["dataset"]["column"] == "body"
