"""What a diagnosis reads: real text by default (the standard library's sources), a data set as
researchers name it (a Hub name from the local cache, a save_to_disk folder, .jsonl, .parquet),
a text file read only as far as needed, or drawn tokens on request."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import constants

from probekit.cli import main
from probekit.errors import InputError
from probekit.sources import DatasetChoice, default_data
from probekit.tasks.text import dataset_texts, stdlib_texts, token_windows
from probekit.toy import toy_hf_model

ROWS = ["the first row of text", "the second row", "a third one, longer than the others"]


def _char_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{chr(c): c - 31 for c in range(32, 127)}, "\n": 96}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / "model"
    toy_hf_model("gpt2", n_layers=2, vocab_size=100).save_pretrained(folder)
    _char_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """``datasets`` caches what it reads below tmp_path, not in ~/.cache/huggingface (its
    config reads the environment once, at import)."""
    import datasets

    folder = tmp_path / "datasets-cache"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(folder))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", folder)
    return folder


def _decoded(ids) -> str:
    inverse = {i: t for t, i in _char_tokenizer().get_vocab().items()}
    return "".join(inverse[int(i)] for i in ids)


def test_a_model_with_a_tokenizer_reads_the_standard_library_by_default(checkpoint):
    data, positions = default_data(checkpoint, n_sequences=3, seq_len=12)
    assert positions == "all" and data["input_ids"].shape == (3, 12)
    assert "standard library" in data["description"]
    first = next(stdlib_texts("validation"))
    assert first.startswith(_decoded(data["input_ids"][0]))
    fit, _ = default_data(checkpoint, n_sequences=3, seq_len=12, purpose="fit")
    assert not fit["input_ids"].equal(data["input_ids"])  # the train files, kept apart
    drawn, _ = default_data(checkpoint, random=True, n_sequences=3, seq_len=12)
    assert drawn.shape == (3, 12)  # drawn tokens stay an explicit choice


def _save_to_disk(folder):
    import datasets

    splits = {"validation": ROWS, "train": ["only train"]}
    datasets.DatasetDict(
        {k: datasets.Dataset.from_dict({"body": v}) for k, v in splits.items()}
    ).save_to_disk(str(folder))


def _hub_dataset(cache):
    commit = "c" * 40
    root = cache / "datasets--org--texts"
    (root / "snapshots" / commit / "data").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    lines = "".join(json.dumps({"text": r}) + "\n" for r in ROWS)
    (root / "snapshots" / commit / "data" / "validation.jsonl").write_text(lines)


def test_data_sets_as_researchers_name_them(tmp_path, monkeypatch, datasets_cache):
    import pandas as pd

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in ROWS))
    pd.DataFrame({"text": ROWS}).to_parquet(tmp_path / "rows.parquet")
    _save_to_disk(tmp_path / "saved")
    _hub_dataset(tmp_path / "hub")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert list(dataset_texts(tmp_path / "rows.jsonl")) == ROWS
    assert list(dataset_texts(tmp_path / "rows.parquet")) == ROWS
    assert list(dataset_texts(tmp_path / "saved", column="body")) == ROWS
    assert list(dataset_texts(tmp_path / "saved", split="train", column="body")) == ["only train"]
    assert list(dataset_texts("org/texts", split="validation")) == ROWS
    assert list(dataset_texts(tmp_path / "saved")) == ROWS  # its only string column, body
    with pytest.raises(InputError, match="no column 'title' .*columns: body"):
        list(dataset_texts(tmp_path / "saved", column="title"))
    with pytest.raises(InputError, match="no split 'test'"):
        list(dataset_texts(tmp_path / "saved", split="test", column="body"))
    with pytest.raises(InputError, match="org/absent is neither in the local datasets cache"):
        list(dataset_texts("org/absent"))


def test_a_text_is_read_only_as_far_as_needed():
    def texts():
        yield "abcdefghij" * 10
        raise AssertionError("read past what the windows need")

    windows = token_windows(_char_tokenizer(), texts(), length=8, n=4)
    assert len(windows) == 4 and _decoded(windows[0]) == "abcdefgh"


def test_diagnose_on_a_data_set_and_its_flag_errors(checkpoint, tmp_path, capsys, datasets_cache):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in ROWS))
    out = tmp_path / "report"
    argv = ["diagnose", str(checkpoint), "--out", str(out), "--quiet", "--no-images"]
    argv += ["--dataset", str(tmp_path / "rows.jsonl"), "--seq-len", "8", "--n-sequences", "4"]
    assert main(argv) == 0
    measured = json.loads((out / "summary.json").read_text())["measured"]
    assert measured["data_source"].startswith(f"data set {tmp_path / 'rows.jsonl'} (")
    assert "tokenized with the model's tokenizer" in measured["data_source"]
    assert "data set" in (out / "report.html").read_text()
    for extra, message in (
        (["--split", "train"], "--split was given without --dataset"),
        (["--dataset", str(tmp_path / "rows.jsonl"), "--column", "body"], "no column 'body'"),
        (["--dataset", str(tmp_path / "rows.jsonl"), "--random-tokens"], "not allowed with"),
        (["--dataset", str(tmp_path / "rows.jsonl"), "--split", ""], "--split '' is empty"),
        (["--dataset", str(tmp_path / "rows.jsonl"), "--column", " "], "--column ' ' is empty"),
        (["--dataset", "wikitext", "--dataset-config", ""], "--dataset-config '' is empty"),
    ):
        capsys.readouterr()
        try:
            code = main(["diagnose", str(checkpoint), "--out", str(tmp_path / "r2"), *extra])
        except SystemExit as exit:  # argparse's own errors
            code = exit.code
        assert code == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / "r2").exists()


def test_dataset_choice_in_words():
    choice = DatasetChoice("wikitext", "wikitext-2-raw-v1", "validation")
    assert choice.describe() == (
        "data set wikitext (config wikitext-2-raw-v1, split validation, column text)"
    )


@pytest.mark.parametrize("what", ["config", "split", "column"])
def test_an_empty_config_split_or_column_is_refused(what, tmp_path, datasets_cache):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in ROWS))
    with pytest.raises(InputError, match=f"data set's {what} '' is empty"):
        next(dataset_texts(tmp_path / "rows.jsonl", **{what: ""}))


@pytest.mark.parametrize(
    "name, content",
    [
        ("rows.jsonl", b'{"text": "caf\xe9 au lait"}\n' * 3),
        ("rows.json", b'[{"text": "caf\xe9 au lait"}]'),
        ("rows.csv", b"text\ncaf\xe9 au lait\n"),
    ],
    ids=["jsonl", "json", "csv"],
)
def test_a_data_set_file_that_is_not_utf8_is_refused_naming_it(
    name, content, tmp_path, datasets_cache
):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputError, match=f"{name} is not valid UTF-8 .*Fix: convert it to UTF-8"):
        next(dataset_texts(tmp_path / name))


def test_a_long_row_is_read_in_pieces(tmp_path, monkeypatch, datasets_cache):
    """A row of 60 MB was tokenized whole (the tokenizer aborted the process); rows are cut
    like a .txt file's chunks (here with a chunk of 1000 characters for speed)."""
    from probekit.tasks import text

    monkeypatch.setattr(text, "CHUNK_CHARS", 1000)
    row = "".join(f"word{i} " + ("\n" if i % 97 == 0 else "") for i in range(5000))
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": row}) + "\n")
    pieces = list(dataset_texts(tmp_path / "long.jsonl"))
    assert len(pieces) > 30 and max(map(len, pieces)) <= 1000
    assert "".join(pieces) == row
    cuts = zip(pieces, pieces[1:], strict=False)  # after a line end, else before a space
    assert all(a.endswith("\n") or b.startswith(" ") for a, b in cuts)


def test_a_non_utf8_txt_data_set_warns_as_text_does(checkpoint, tmp_path, capsys):
    (tmp_path / "latin1.txt").write_bytes("café au lait, déjà vu\n".encode("latin-1") * 20)
    argv = ["diagnose", str(checkpoint), "--quiet", "--no-images", "--seq-len", "8"]
    argv += ["--n-sequences", "2", "--bootstrap", "0"]
    for flag, out in (("--text", "r1"), ("--dataset", "r2")):
        capsys.readouterr()
        assert main([*argv, "--out", str(tmp_path / out), flag, str(tmp_path / "latin1.txt")]) == 0
        err = capsys.readouterr().err
        assert "probekit: warning:" in err and "latin1.txt is not valid UTF-8" in err, (flag, err)


def _closed_port() -> int:
    """A local port nothing listens on (a connection to it is refused at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_a_data_set_name_not_cached_fails_as_fast_as_a_model_name(
    hub, tmp_path, monkeypatch, datasets_cache
):
    """Nothing cached: offline (HF_HUB_OFFLINE=1) or with the Hub unreachable (here a local
    port that refuses), one error in a moment; datasets retried the Hub for 26-34 s."""
    import time

    import datasets

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    offline = hub == "offline"
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    endpoint = f"http://127.0.0.1:{_closed_port()}"  # never the real Hub
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    why = "HF_HUB_OFFLINE=1 forbids" if offline else "the Hugging Face Hub is unreachable"
    start = time.monotonic()
    with pytest.raises(InputError, match=f"wikitext is neither in the local datasets cache.*{why}"):
        next(dataset_texts("wikitext", config="wikitext-2-raw-v1"))
    assert time.monotonic() - start < 10
    _hub_dataset(tmp_path / "hub")  # what is cached still loads, as fast
    assert list(dataset_texts("org/texts", split="validation")) == ROWS
    assert time.monotonic() - start < 20
