"""What a saved result or lens claims is checked on load (issue 31, item 12): a summary number
that is not a number, and a tuned lens of a format version this probekit does not know, are one
:class:`CheckpointError` naming the entry, not a silent load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import probekit
from probekit.analyses.depth.lens_checks import VERSION
from probekit.analyses.depth.tuned_lens import TunedLens
from probekit.errors import CheckpointError
from probekit.toy import toy_model, toy_tokens


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    model = toy_model("gpt2", n_layers=2)
    path = tmp_path_factory.mktemp("results") / "contributions.json"
    probekit.contributions(model, toy_tokens(2, 6)).save(path)
    return path


def _edited(saved: Path, tmp_path: Path, **summary) -> Path:
    payload = json.loads(saved.read_text())
    payload["summary"].update(summary)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(payload))
    return out


@pytest.mark.parametrize(
    "key, value",
    [
        ("clean_loss", "abc"),
        ("second_half_share", [0.5]),
        ("second_half_share_kl", {"x": 1}),
        ("most_important_layer", True),
        ("clean_loss", "1.5"),
    ],
)
def test_a_summary_number_that_is_not_a_number_is_refused_naming_it(saved, tmp_path, key, value):
    with pytest.raises(CheckpointError, match=f"summary entry '{key}'") as info:
        probekit.Result.load(_edited(saved, tmp_path, **{key: value}))
    assert "Fix:" in str(info.value)


def test_numbers_null_and_the_summary_s_words_still_load(saved, tmp_path):
    edited = _edited(saved, tmp_path, clean_loss=None, second_half_share=1, measure="prob_l2")
    loaded = probekit.Result.load(edited)
    assert loaded.summary["clean_loss"] is None and loaded.summary["measure"] == "prob_l2"
    assert probekit.Result.load(saved).summary == json.loads(saved.read_text())["summary"]


@pytest.fixture(scope="module")
def lens_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lens") / "lens"
    TunedLens.zeros(toy_model("gpt2", n_layers=2)).save(path)
    return path


@pytest.mark.parametrize("version", [99, VERSION + 1, 0, -1, "3", 3.0, True, None])
def test_a_lens_of_an_unknown_format_version_is_refused(lens_dir, tmp_path, version):
    folder = tmp_path / "lens"
    folder.mkdir()
    for name in ("config.json", "lens.safetensors"):
        (folder / name).write_bytes((lens_dir / name).read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config["version"] = version
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="format version") as info:
        TunedLens.load(folder)
    assert f"versions 1 to {VERSION}" in str(info.value) and "Fix:" in str(info.value)


def test_a_lens_of_this_version_loads(lens_dir):
    assert json.loads((lens_dir / "config.json").read_text())["version"] == VERSION
    assert TunedLens.load(lens_dir).n_layers == 2
