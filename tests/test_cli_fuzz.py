"""Hostile input to ``probekit diagnose`` / ``probekit demo``: one line and exit 2, never a
traceback, a hang or a half-written folder (issue 14).

Every case runs :func:`probekit.cli.main` in-process on tiny settings. A case passes when it
exits 0 (and wrote a complete report) or exits 2 with exactly one ``probekit: error:`` line on
stderr and nothing written anywhere.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import probekit
import probekit.io
from probekit.cli import LIMITS, check_int_flags, main
from tests.conftest import make_hf

TINY = ["--n-sequences", "2", "--seq-len", "4", "--bootstrap", "0", "--no-images", "--quiet"]
HANG_SECONDS = 60


# ---- the sandbox: checkpoints, files, pipes ------------------------------------------------
def _save_without(src: Path, dst: Path, tensor: str) -> None:
    """A copy of the checkpoint ``src`` whose safetensors lack ``tensor``."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    weights.pop(tensor)
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})


class _Trap:
    """Unpickling this creates the file ``path``: proof that a pickle was loaded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _booby_trap(ckpt: Path, marker: Path) -> None:
    """Pickles and remote code beside the safetensors of ``ckpt``, each creating ``marker``."""
    payload = pickle.dumps(_Trap(marker))
    (ckpt / "pytorch_model.bin").write_bytes(payload)
    (ckpt / "extra.bin").write_bytes(payload)
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "extra.bin"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    code = f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n"
    (ckpt / "evil.py").write_text(code)
    config = json.loads((ckpt / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.Evil", "AutoModelForCausalLM": "evil.Evil"}
    (ckpt / "config.json").write_text(json.dumps(config))
    tok = {"auto_map": {"AutoTokenizer": ["evil.Evil", None]}, "tokenizer_class": "Evil"}
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tok))


def _save_tokenizer(folder: Path) -> None:
    """A character-level tokenizer of 32 tokens (U+FFFD among them) saved into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyz ,.\n\ufffd"))
    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)


def _damaged(good: Path, root: Path) -> dict[str, Path]:
    """Copies of the checkpoint ``good``, each damaged one way."""
    items = {name: root / name for name in ("fifo_config", "truncated", "bad_run", "list_config")}
    for folder in items.values():
        shutil.copytree(good, folder)
    (items["fifo_config"] / "config.json").unlink()
    os.mkfifo(items["fifo_config"] / "config.json")
    weights = items["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (items["bad_run"] / "run_config.json").write_text('{"kind": "anchor", "task": [1]}')
    (items["list_config"] / "config.json").write_text("[1, 2]")
    return items


def build_sandbox(root: Path) -> dict[str, Path]:
    """The inputs of the fuzz: checkpoints good and bad, text files, pipes, folders."""
    good = root / "ckpt"
    make_hf("gpt2", n_layers=2).save_pretrained(good)
    items = {"ckpt": good, "missing": root / "missing"}
    _save_without(good, items["missing"], "transformer.h.1.mlp.c_fc.weight")
    for name in ("zoo/runs/a/checkpoint", "zoo/runs/b/checkpoint"):
        shutil.copytree(good, root / name)
    items["zoo"] = root / "zoo"
    items["trapped"] = root / "trapped"
    shutil.copytree(good, items["trapped"])
    _booby_trap(items["trapped"], root / "UNPICKLED")
    items.update(_damaged(good, root))
    items["tokenized"] = root / "tokenized"
    shutil.copytree(good, items["tokenized"])
    _save_tokenizer(items["tokenized"])
    (root / "empty").mkdir()
    items["empty"] = root / "empty"
    items["file"] = root / "file.txt"
    items["file"].write_text("just some text for a tokenizer\n" * 4)
    items["binary"] = root / "binary.txt"
    items["binary"].write_bytes(b"\x00\x01\x02text\x00" * 20)
    items["utf16"] = root / "utf16.txt"
    items["utf16"].write_bytes("hello world".encode("utf-16"))
    items["latin1"] = root / "latin1.txt"
    items["latin1"].write_bytes("café au lait, déjà vu\n".encode("latin-1") * 4)
    items["fifo"] = root / "fifo"
    os.mkfifo(items["fifo"])
    items["nothing"] = root / "no" / "such" / "path"
    return items


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> dict[str, Path]:
    return build_sandbox(tmp_path_factory.mktemp("sandbox"))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path below ``root`` with its type, size and modification time."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st_ = path.lstat()
            seen[str(path.relative_to(root))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns)
    return seen


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)``'s exit status, stdout and stderr; a hang or a traceback fails the test."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code
    except _Hang:
        pytest.fail(f"hang: {argv}")
    except Exception as exc:  # any escaped exception is a traceback for the user
        pytest.fail(f"{type(exc).__name__}: {exc} from {argv}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def assert_one_error(code: int, err: str) -> str:
    """Exit 2 with exactly one ``probekit: error:`` line; returns that line."""
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("probekit: error:")]
    assert len(errors) == 1, err
    return errors[0]


# ---- the table-driven and property-based fuzz ---------------------------------------------
def _outs(root: Path) -> dict[str, Path]:
    """Output targets, rebuilt for every case below ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    outs = {"new": root / "new" / "report", "file": root / "a_file", "fifo": root / "a_fifo"}
    outs["file"].write_text("not a folder")
    os.mkfifo(outs["fifo"])
    outs["under_file"] = outs["file"] / "report"
    (root / "empty_dir").mkdir()
    outs["empty_dir"] = root / "empty_dir"
    (root / "foreign").mkdir()
    (root / "foreign" / "thesis.tex").write_text("precious")
    outs["foreign"] = root / "foreign"
    return outs


MODELS = [
    *("ckpt", "tokenized", "missing", "zoo", "trapped", "list_config", "fifo_config"),
    *("truncated", "bad_run", "empty", "file", "fifo", "nothing"),
]
OUTS = ["new", "file", "fifo", "under_file", "empty_dir", "foreign", "", ".", "/", "CKPT"]
TEXTS = [None, "file", "binary", "utf16", "latin1", "fifo", "empty", "nothing"]
FLAGS = {
    "--n-sequences": ["0", "-1", "1", "3", "nan", "1e3", "x", "100001"],
    "--seq-len": ["0", "-5", "1", "2", "inf", "4.5", "1048577"],
    "--bootstrap": ["-1", "2", "10001", "nan"],
    "--batch-size": ["0", "-2", "1", "nan"],
    "--seed": ["-1", "7", "4294967296", "18446744073709551616", "inf"],
    "--device": ["cpu", "tpu", "cuda", "cuda:7", "mps", "", "cpu:0"],
    "--positions": ["all", "last", "middle", ""],
    "--pairs": ["all", "none"],
    "--bogus": [None],
    "--force": [None],
}


def fuzz_case(
    sandbox: dict, outs: dict, model: str, out: str, text: str | None, extra: list
) -> list[str]:
    """The argv of one case: model, ``--out``, ``--text`` and extra flags by name."""
    model_path = str(sandbox[model])
    if out in ("", ".", "/"):
        out_path = out
    elif out == "CKPT":
        out_path = model_path
    else:
        out_path = str(outs[out])
    argv = ["diagnose", model_path, "--out", out_path, *TINY]
    if text is not None:
        argv += ["--text", str(sandbox[text])]
    for flag, value in extra:
        argv += [flag] if value is None else [flag, value]
    return argv


def check_case(argv: list[str], sandbox_root: Path, outs_root: Path, out_path: str) -> int:
    """Run one case and check its outcome; returns the exit status."""
    before_sandbox, before_outs = snapshot(sandbox_root), snapshot(outs_root)
    code, _, err = run_cli(argv)
    assert not (sandbox_root / "UNPICKLED").exists(), "a pickle or remote code was executed"
    assert snapshot(sandbox_root) == before_sandbox, "the inputs were changed"
    if code == 0:
        assert "Traceback" not in err and "probekit: error:" not in err
        report = Path(out_path)
        assert (report / "report.html").is_file() and (report / "summary.json").is_file()
        assert not [p for p in report.parent.iterdir() if p.name.endswith((".tmp", ".old"))]
    else:
        assert_one_error(code, err)
        assert snapshot(outs_root) == before_outs, f"exit 2 wrote something: {argv}"
    return code


@pytest.fixture
def fuzz_cwd(tmp_path, monkeypatch):
    """A scratch current folder, so that relative outputs land nowhere that matters."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


TABLE = [
    ("ckpt", "new", None, []),
    ("ckpt", "new", "latin1", []),  # no tokenizer: the warning, then the error
    ("ckpt", "new", "binary", []),
    ("ckpt", "new", "utf16", []),
    ("ckpt", "new", "fifo", []),
    ("ckpt", "new", "empty", []),
    ("ckpt", "new", "nothing", []),
    ("missing", "new", None, []),
    ("zoo", "new", None, []),
    ("trapped", "new", None, []),
    ("list_config", "new", None, []),
    ("fifo_config", "new", None, []),
    ("truncated", "new", None, []),
    ("bad_run", "new", None, []),
    ("tokenized", "new", "latin1", []),
    ("tokenized", "new", "file", [("--seq-len", "8")]),
    ("tokenized", "new", "binary", []),
    ("tokenized", "new", "empty", []),
    ("empty", "new", None, []),
    ("file", "new", None, []),
    ("fifo", "new", None, []),
    ("nothing", "new", None, []),
    *[("ckpt", out, None, []) for out in OUTS if out != "new"],
    ("ckpt", "foreign", None, [("--force", None)]),
    ("ckpt", "empty_dir", None, [("--pairs", "all"), ("--batch-size", "1")]),
    *[("ckpt", "new", None, [(flag, v)]) for flag, vs in FLAGS.items() for v in vs],
]


@pytest.mark.parametrize("model, out, text, extra", TABLE)
def test_hostile_argv_table(sandbox, fuzz_cwd, model, out, text, extra):
    outs = _outs(fuzz_cwd / "outs")
    argv = fuzz_case(sandbox, outs, model, out, text, extra)
    root = sandbox["ckpt"].parent
    code = check_case(argv, root, fuzz_cwd / "outs", argv[3])
    good = model in ("ckpt", "trapped", "tokenized") and out in ("new", "empty_dir", "foreign")
    if not good or text not in (None, "latin1", "file"):
        assert code == 2, argv
    if out == "foreign" and code == 0:
        assert not (outs["foreign"] / "thesis.tex").exists()


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    model=st.sampled_from(MODELS),
    out=st.sampled_from(OUTS),
    text=st.sampled_from(TEXTS),
    extra=st.lists(
        st.sampled_from(list(FLAGS)).flatmap(
            lambda f: st.tuples(st.just(f), st.sampled_from(FLAGS[f]))
        ),
        max_size=3,
    ),
)
def test_hostile_argv_fuzz(sandbox, fuzz_cwd, model, out, text, extra):
    root = Path(tempfile.mkdtemp(dir=fuzz_cwd))
    try:
        outs = _outs(root / "outs")
        argv = fuzz_case(sandbox, outs, model, out, text, extra)
        check_case(argv, sandbox["ckpt"].parent, root / "outs", argv[3])
    finally:
        shutil.rmtree(root)


# ---- the numeric flags, property-based ------------------------------------------------------
@given(
    flag=st.sampled_from(sorted(LIMITS)),
    value=st.integers(min_value=-(2**70), max_value=2**70),
)
@settings(max_examples=200, deadline=None, database=None)
def test_int_flags_in_range_or_refused(flag, value):
    import argparse

    from probekit.errors import ConfigError

    low, high = LIMITS[flag]
    args = argparse.Namespace(**{flag: value})
    if low <= value <= high:
        check_int_flags(args)
    else:
        with pytest.raises(ConfigError, match="outside"):
            check_int_flags(args)


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--seq-len", "0"),
        ("--seq-len", "-1"),
        ("--n-sequences", "0"),
        ("--n-sequences", "-4"),
        ("--bootstrap", "-1"),
        ("--batch-size", "0"),
        ("--seed", "-1"),
        ("--seed", str(2**32)),
        ("--seed", "nan"),
        ("--seq-len", "inf"),
        ("--bootstrap", "nan"),
        ("--device", "tpu"),
        ("--device", "meta"),
        ("--device", "cuda:x"),
        ("--positions", "middle"),
        ("--positions", "ALL"),
    ],
)
def test_bad_flag_refused_before_the_model_loads(flag, value, sandbox, tmp_path, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(probekit, "load", no_load)
    out = tmp_path / "report"
    argv = ["diagnose", str(sandbox["ckpt"]), "--out", str(out), *TINY, flag, value]
    line = assert_one_error(*run_cli(argv)[::2])
    assert flag in line or value in line
    assert not out.exists()


def test_cuda_refused_without_cuda_and_checked_with_it(monkeypatch):
    import torch

    from probekit.cli import check_device
    from probekit.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_device("cuda")
    check_device("cuda:0")
    with pytest.raises(ConfigError, match="only 1 CUDA device"):
        check_device("cuda:1")


# ---- output folders ---------------------------------------------------------------------------
def diagnose_argv(model: Path, out: Path | str, *extra: str) -> list[str]:
    return ["diagnose", str(model), "--out", str(out), *TINY, "--device", "cpu", *extra]


@pytest.mark.parametrize(
    "target, match",
    [
        ("file", "not a folder"),
        ("fifo", "not a folder"),
        ("under_file", "which is a file"),
        ("", "not a folder name"),
        (".", "current folder"),
        ("/", "current folder"),
        ("..", "current folder"),
        ("CKPT", "holds"),
        ("CKPT_PARENT", "holds"),
        ("foreign", "holds no probekit report"),
    ],
)
def test_bad_out_is_one_error_and_nothing_written(target, match, sandbox, fuzz_cwd):
    outs = _outs(fuzz_cwd / "outs")
    out = {"CKPT": sandbox["ckpt"], "CKPT_PARENT": sandbox["ckpt"].parent}.get(
        target, outs.get(target, target)
    )
    before = snapshot(fuzz_cwd), snapshot(sandbox["ckpt"].parent)
    line = assert_one_error(*run_cli(diagnose_argv(sandbox["ckpt"], out))[::2])
    assert match in line
    assert (snapshot(fuzz_cwd), snapshot(sandbox["ckpt"].parent)) == before


def test_unwritable_parent_is_refused(sandbox, tmp_path, monkeypatch):
    # root ignores chmod 0500, so the permission answer itself is simulated
    import probekit.report as report

    parent = tmp_path / "locked"
    parent.mkdir(mode=0o500)
    real_access = os.access
    monkeypatch.setattr(
        report.os, "access", lambda p, mode: False if Path(p) == parent else real_access(p, mode)
    )
    line = assert_one_error(*run_cli(diagnose_argv(sandbox["ckpt"], parent / "a" / "b"))[::2])
    assert "not writable" in line and str(parent) in line
    assert not list(parent.iterdir())


def test_report_of_another_model_is_replaced_whole(sandbox, tmp_path):
    out = tmp_path / "report"
    other = tmp_path / "other"
    make_hf("gpt2", n_layers=3, seed=1).save_pretrained(other)
    assert run_cli(diagnose_argv(other, out))[0] == 0
    for stale in ("contributions.png", "contributions.svg", "notes.txt"):
        (out / stale).write_text("of the old model")
    assert run_cli(diagnose_argv(sandbox["ckpt"], out))[0] == 0
    names = sorted(p.name for p in out.iterdir())
    assert "contributions.png" not in names and "notes.txt" not in names
    assert json.loads((out / "summary.json").read_text())["headline"]["n_layers"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "report"]


@pytest.mark.parametrize("fail_at", [1, 2, 13, 14])  # a result, a CSV, summary.json, the page
def test_disk_full_leaves_the_old_report(fail_at, sandbox, tmp_path, monkeypatch):
    out = tmp_path / "report"
    assert run_cli(diagnose_argv(sandbox["ckpt"], out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = probekit.io.atomic_write_bytes, []

    def full_disk(path, data):
        calls.append(path)
        if len(calls) == fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(probekit.io, "atomic_write_bytes", full_disk)
    other = tmp_path / "other"
    make_hf("gpt2", n_layers=3, seed=1).save_pretrained(other)
    line = assert_one_error(*run_cli(diagnose_argv(other, out))[::2])
    assert "No space left on device" in line and len(calls) == fail_at
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "report"]


def test_foreign_folder_needs_force(sandbox, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    line = assert_one_error(*run_cli(diagnose_argv(sandbox["ckpt"], out))[::2])
    assert "--force" in line and (out / "thesis.tex").read_text() == "precious"
    assert run_cli(diagnose_argv(sandbox["ckpt"], out, "--force"))[0] == 0
    assert not (out / "thesis.tex").exists() and (out / "report.html").is_file()


def test_text_inside_out_is_refused(sandbox, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "input.txt").write_text("some text")
    argv = diagnose_argv(sandbox["ckpt"], out, "--text", str(out / "input.txt"), "--force")
    assert "holds" in assert_one_error(*run_cli(argv)[::2])
    assert (out / "input.txt").exists()


# ---- the demo's folder --------------------------------------------------------------------------
def test_demo_refuses_bad_out_before_training(tmp_path, monkeypatch):
    import probekit.demo as demo

    monkeypatch.setattr(demo, "build_demo", lambda *a: pytest.fail("trained anyway"))
    (tmp_path / "file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("x")
    for out, match in [
        (tmp_path / "file", "not a folder"),
        (tmp_path / "file" / "demo", "which is a file"),
        (tmp_path / "foreign", "holds no probekit demo"),
        ("", "not a path"),
    ]:
        line = assert_one_error(*run_cli(["demo", "--quick", "--out", str(out), "--quiet"])[::2])
        assert match in line, line
    assert (tmp_path / "foreign" / "keep.txt").exists()


def _fake_demo(fail: bool):
    """A stand-in for the demo's build: writes an index, then fails (disk full) if asked."""

    def build(out: Path, quick: bool, progress: bool, images: bool) -> Path:
        (out / "summary.json").write_text("{}")
        page = out / "index.html"
        page.write_text("<!DOCTYPE html><html><head><title>probekit demo</title>new")
        if fail:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return page

    return build


def test_demo_is_swapped_in_whole(tmp_path, monkeypatch):
    import probekit.demo as demo

    out = tmp_path / "demo"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / "index.html").write_text("<html><head><title>probekit demo</title>old")
    (out / "stale.png").write_text("old")
    monkeypatch.setattr(demo, "build_demo", _fake_demo(fail=True))
    line = assert_one_error(*run_cli(["demo", "--out", str(out), "--quiet"])[::2])
    assert "No space left" in line and (out / "stale.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    monkeypatch.setattr(demo, "build_demo", _fake_demo(fail=False))
    assert run_cli(["demo", "--out", str(out), "--quiet"])[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "summary.json"]
    assert "new" in (out / "index.html").read_text()


# ---- --text -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, match",
    [("binary", "binary file"), ("utf16", "binary file"), ("fifo", "not a regular file")],
)
def test_text_that_is_not_text_is_refused(name, match, sandbox, tmp_path, monkeypatch):
    from probekit.errors import InputError
    from probekit.sources import check_text_file

    monkeypatch.setattr(probekit, "load", lambda *a, **k: pytest.fail("loaded"))
    argv = diagnose_argv(sandbox["ckpt"], tmp_path / "r", "--text", str(sandbox[name]))
    assert match in assert_one_error(*run_cli(argv)[::2])
    with pytest.raises(InputError, match=match):
        check_text_file(sandbox[name])


def test_non_utf8_text_is_read_with_replacement_and_a_warning(sandbox, tmp_path):
    import torch

    from probekit.sources import text_tokens

    out = tmp_path / "r"
    argv = diagnose_argv(sandbox["tokenized"], out, "--text", str(sandbox["latin1"]))
    code, _, err = run_cli(argv)
    warnings = [line for line in err.splitlines() if line.startswith("probekit: warning:")]
    assert code == 0 and (out / "report.html").is_file(), err
    assert len(warnings) == 1 and "not valid UTF-8" in warnings[0] and "U+FFFD" in warnings[0]
    argv = diagnose_argv(sandbox["ckpt"], out, "--text", str(sandbox["latin1"]))
    code, _, err = run_cli(argv)
    assert "no tokenizer" in assert_one_error(code, err)  # the warning, then the error
    assert len([line for line in err.splitlines() if "warning" in line]) == 1

    class Chars:  # a stand-in model whose tokenizer maps characters to their code points
        n_ctx = 8

        @staticmethod
        def tokenizer(text):
            return {"input_ids": [ord(c) for c in text]}

    ids = text_tokens("m", Chars(), sandbox["latin1"], 2, 8)
    assert ids.shape == (2, 8) and 0xFFFD in ids.view(-1).tolist()
    assert torch.equal(ids[0, :3], torch.tensor([ord("c"), ord("a"), ord("f")]))


# ---- folders of checkpoints, safety notices -----------------------------------------------------
def test_folder_with_checkpoints_below_lists_them(sandbox, tmp_path):
    line = assert_one_error(*run_cli(diagnose_argv(sandbox["zoo"], tmp_path / "r"))[::2])
    for run in ("a", "b"):
        assert str(sandbox["zoo"] / "runs" / run / "checkpoint") in line


def test_run_folder_with_an_interrupted_save_says_so(sandbox, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sandbox["ckpt"], run / ".checkpoint.abc123.old" / "old")
    line = assert_one_error(*run_cli(diagnose_argv(run, tmp_path / "r"))[::2])
    assert "interrupted" in line and ".checkpoint.abc123.old" in line
    assert not (tmp_path / "r").exists()


def test_pickles_and_remote_code_are_never_run_and_noticed(sandbox, tmp_path):
    out = tmp_path / "report"
    code, _, err = run_cli(diagnose_argv(sandbox["trapped"], out))
    assert not (sandbox["trapped"].parent / "UNPICKLED").exists()
    assert code == 0, err
    notices = [line for line in err.splitlines() if line.startswith("probekit: notice: ignored")]
    text = "\n".join(notices)
    for name in ("pytorch_model.bin", "extra.bin", "model.safetensors.index.json", "evil.py"):
        assert name in text, name
    assert "auto_map in config.json" in text and "auto_map in tokenizer_config.json" in text
    assert (out / "report.html").is_file()


def test_help_states_the_policies():
    from probekit.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    diagnose = " ".join(sub["diagnose"].format_help().split())
    assert "U+FFFD" in diagnose and "binary files are refused" in diagnose
    assert "--force" in diagnose and "swapped in whole" in diagnose
    assert "--force" in sub["demo"].format_help()
