"""Hugging Face Hub names: resolved from a Hub cache that the test builds on disk in the cache's
own layout (models--org--name/refs, snapshots/<commit>), offline, through the real loading code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from huggingface_hub import constants

import probekit
from probekit.cli import main
from probekit.errors import CheckpointError
from probekit.model.hub import check_revision, fetch_command, hub_name, resolve
from probekit.sources import checkpoints_to_compare
from probekit.toy import toy_hf_model

MAIN = "a" * 40
V1 = "b" * 40


def _snapshot(cache, repo, commit, refs, seed, pickled=False):
    root = cache / f"models--{repo.replace('/', '--')}"
    folder = root / "snapshots" / commit
    model = toy_hf_model("gpt2", n_layers=2, seed=seed)
    model.save_pretrained(folder)
    if pickled:  # a repository that publishes pickled weights only
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return model


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    models = {
        "main": _snapshot(cache, "org/tiny", MAIN, ["main"], seed=0),
        "v1": _snapshot(cache, "org/tiny", V1, ["v1"], seed=1),
    }
    (cache / "models--org--tiny" / "refs" / "refs" / "pr").mkdir(parents=True)
    (cache / "models--org--tiny" / "refs" / "refs" / "pr" / "1").write_text(V1)  # a Hub PR
    _snapshot(cache, "org/pickled", MAIN, ["main"], seed=2, pickled=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache, models


def _same_weights(model, hf):
    """The loaded model computes the logits of the saved one."""
    tokens = torch.arange(10).reshape(2, 5)
    with torch.no_grad():
        return torch.allclose(model.logits(tokens), hf(tokens).logits, atol=1e-5)


def test_a_hub_name_and_its_revisions_load_from_the_cache(hub_cache):
    cache, models = hub_cache
    assert resolve("org/tiny") == cache / "models--org--tiny" / "snapshots" / MAIN
    main = probekit.load("org/tiny", device="cpu")
    v1 = probekit.load("org/tiny@v1", device="cpu")
    same_v1 = probekit.load("org/tiny", revision="v1", device="cpu")
    by_commit = probekit.load(f"org/tiny@{V1}", device="cpu")
    assert _same_weights(main, models["main"]) and not _same_weights(main, models["v1"])
    for model in (v1, same_v1, by_commit):
        assert _same_weights(model, models["v1"])


def test_a_name_that_is_not_cached_offline_says_how_to_fetch_it(hub_cache):
    with pytest.raises(CheckpointError) as info:
        probekit.load("org/missing@v2")
    message = str(info.value)
    assert "not in the local Hugging Face cache" in message and "HF_HUB_OFFLINE" in message
    assert fetch_command("org/missing", "v2") in message
    assert "hf download org/missing --revision v2 --include '*.json'" in message


def test_pickled_weights_only_are_refused(hub_cache):
    with pytest.raises(CheckpointError, match=r"org/pickled .* holds no \*\.safetensors"):
        probekit.load("org/pickled")


def test_revision_conflicts_and_folders_with_a_revision_are_refused(hub_cache, tmp_path):
    with pytest.raises(CheckpointError, match="give the revision once"):
        probekit.load("org/tiny@v1", revision="main")
    toy_hf_model("gpt2", n_layers=2).save_pretrained(tmp_path / "folder")
    with pytest.raises(CheckpointError, match="only with a Hugging Face Hub name"):
        probekit.load(tmp_path / "folder", revision="main")


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "probekit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_diagnose_takes_a_hub_name_with_a_revision(hub_cache, tmp_path):
    cache, _ = hub_cache
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "report"
    done = _cli("diagnose", "org/tiny@v1", "--out", str(out), "--quiet", "--no-images", env=env)
    assert done.returncode == 0, done.stderr
    measured = json.loads((out / "summary.json").read_text())["measured"]
    assert measured["checkpoint"].startswith("org/tiny@v1 (snapshot ")
    assert measured["checkpoint"].endswith(f"{V1})")
    missing = _cli("diagnose", "org/missing", "--out", str(tmp_path / "r2"), env=env)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "hf download org/missing" in missing.stderr
    assert not (tmp_path / "r2").exists()


BAD_NAMES = ["fuzz/ti--ny", "fuzz/tiny.", "fuzz/tiny-", "fuzz/tïny", "fuzz/tiny.git", "a..b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_names_the_hub_refuses_are_refused_before_any_lookup(hub_cache, name):
    with pytest.raises(CheckpointError, match="not a valid Hugging Face Hub name"):
        hub_name(name)
    with pytest.raises(CheckpointError, match="not a valid Hugging Face Hub name"):
        probekit.load(name)


def test_a_name_with_white_space_around_it_is_refused_not_stripped(hub_cache):
    for name in ("org/tiny\n", " org/tiny", "org/tiny\t"):
        with pytest.raises(CheckpointError, match="white space around it"):
            probekit.load(name)
    assert hub_name("a b") is None and hub_name("./x") is None and hub_name("x/y/z") is None


def test_the_cli_refuses_a_bad_hub_name_in_one_line(hub_cache, tmp_path):
    cache, _ = hub_cache
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    for name in ("fuzz/ti--ny", "org/tiny\n"):
        done = _cli("diagnose", name, "--out", str(tmp_path / "o"), env=env)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and "Fix:" in done.stderr
        assert not (tmp_path / "o").exists()


BAD_REVISIONS = ["../../../x", "refs/../../x", 123, "", " main", "main\n", "/main", "main/", "a b"]


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_bad_revision_is_refused_before_the_cache_is_read(hub_cache, revision):
    with pytest.raises(CheckpointError, match="not a Hub revision|must be a string") as info:
        probekit.load("org/tiny", revision=revision)
    assert "Fix:" in str(info.value)
    if isinstance(revision, str) and "\n" not in revision and " " not in revision:
        with pytest.raises(CheckpointError, match="is not a Hub revision"):
            probekit.load(f"org/tiny@{revision}")


def test_a_pull_request_revision_loads_and_names_a_timeline_folder(hub_cache, tmp_path, capsys):
    cache, models = hub_cache
    assert check_revision("refs/pr/1") == "refs/pr/1"
    assert _same_weights(probekit.load("org/tiny", revision="refs/pr/1"), models["v1"])
    assert _same_weights(probekit.load("org/tiny@refs/pr/1"), models["v1"])
    found = checkpoints_to_compare(["org/tiny"], revisions=["main", "refs/pr/1"], run=True)
    assert list(found) == ["tiny@main", "tiny@refs-pr-1"]
    out = tmp_path / "timeline"
    argv = ["timeline", "org/tiny", "--revisions", "main,refs/pr/1", "--out", str(out)]
    fast = [
        "--quiet",
        "--random-tokens",
        "--bootstrap",
        "0",
        "--n-sequences",
        "2",
        "--seq-len",
        "4",
    ]
    assert main([*argv, *fast]) == 0, capsys.readouterr().err
    assert (out / "tiny@refs-pr-1" / "summary.json").is_file()
    with pytest.raises(CheckpointError, match="revision '' of org/tiny@"):
        checkpoints_to_compare(["org/tiny"], revisions=["main", "", "v1"], run=True)
