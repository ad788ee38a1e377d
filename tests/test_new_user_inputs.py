"""What a new user types wrong, or leaves out, gets one line that names the fix: a Hub name
without --revisions, a data file whose text column has another name, a mistyped folder."""

from __future__ import annotations

import pytest

from probekit.cli import main


def _run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return code, err


def test_timeline_of_a_hub_name_without_revisions_names_the_flag(tmp_path, capsys):
    code, err = _run(["timeline", "org/name", "--out", str(tmp_path / "t")], capsys)
    assert code == 2 and "org/name is one Hub name" in err
    assert "probekit timeline org/name --revisions REV1,REV2" in err
    code, err = _run(["timeline", "org/name", "--revisions", "a", "--out", str(tmp_path)], capsys)
    assert code == 2 and "two or more revisions in --revisions" in err
    code, err = _run(["compare", str(tmp_path), "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "two or more checkpoints" in err and "--revisions" in err
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()


@pytest.fixture()
def parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")

    def write(**columns) -> str:
        path = tmp_path / "data.parquet"
        pd.DataFrame(columns).to_parquet(path)
        return str(path)

    return write


def test_a_parquet_file_with_one_string_column_needs_no_column_flag(parquet):
    from probekit.errors import InputError
    from probekit.tasks.text import dataset_column, dataset_texts

    one = parquet(body=["a first text", "a second one"], n=[1, 2])
    assert dataset_column(one) == "body"
    assert list(dataset_texts(one)) == ["a first text", "a second one"]
    several = parquet(title=["t"], body=["b"], n=[1])
    with pytest.raises(InputError, match="text columns: title, body"):
        list(dataset_texts(several))
    assert list(dataset_texts(several, column="title")) == ["t"]


def test_the_report_names_the_column_it_read(parquet):
    from probekit.sources import DatasetChoice, texts_of

    texts, what, _ = texts_of(None, DatasetChoice(parquet(body=["x y"])), fit=False)
    assert list(texts) == ["x y"] and "column body" in what


def test_a_mistyped_local_folder_is_no_such_folder_not_a_hub_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "models" / "gpt2-small").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code, err = _run(["diagnose", "models/gpt2-smal", "--out", "r"], capsys)
    assert code == 2 and "no such folder here: models/gpt2-smal" in err
    assert "did you mean models/gpt2-small?" in err and "Hub model models/gpt2-smal" in err
    code, err = _run(["diagnose", "gpt2-smal", "--out", "r"], capsys)
    assert code == 2 and "no such folder" not in err  # a one-word Hub name, as before
    code, err = _run(["diagnose", str(tmp_path / "models" / "x" / "y"), "--out", "r"], capsys)
    assert code == 2 and "does not exist" in err  # no parent here: as before
    code, err = _run(["compare", "models/gpt2-small", "models/typo", "--out", "c"], capsys)
    assert code == 2 and "no such folder here: models/typo" in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists()
