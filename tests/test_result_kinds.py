"""Saved results load in a fresh process: ``Result.load`` knows every kind probekit writes."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pandas as pd
import pytest

import probekit
from probekit.errors import CheckpointError
from probekit.result import RESULT_MODULES, Result, registered_results


def _all_result_classes() -> dict[str, type[Result]]:
    """Import every probekit module (but ``__main__``), then read the registry they fill."""
    for info in pkgutil.walk_packages(probekit.__path__, "probekit."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    return {kind: klass for kind, klass in registered_results().items() if klass is not Result}


def test_every_result_kind_is_mapped_to_its_module():
    classes = _all_result_classes()
    assert set(classes) == set(RESULT_MODULES)
    for kind, klass in classes.items():
        assert importlib.import_module(RESULT_MODULES[kind]).__dict__[klass.__name__] is klass


def _load_in_fresh_process(paths: list) -> list[str]:
    script = (
        "import sys, probekit\n"
        "for p in sys.argv[1:]:\n"
        "    r = probekit.Result.load(p)\n"
        "    print(type(r).__name__, r.kind, len(r.df), sorted(r.summary))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_every_kind_loads_in_a_fresh_process(tmp_path):
    paths, want = [], []
    for kind, klass in sorted(_all_result_classes().items()):
        result = klass.__new__(klass)
        Result.__init__(result, pd.DataFrame({"layer": [0, 1], "value": [0.5, 0.25]}), {"n": 2})
        paths.append(result.save(tmp_path / f"{kind}.json"))
        want.append(f"{klass.__name__} {kind} 2 ['n']")
    assert _load_in_fresh_process(paths) == want


def test_a_real_analysis_saved_as_the_readme_does_loads_in_a_fresh_process(tmp_path):
    from probekit.toy import toy_hf_model, toy_tokens

    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    res = probekit.contributions(model, toy_tokens())
    path = res.save(tmp_path / "contributions.json")
    (line,) = _load_in_fresh_process([path])
    assert line.startswith(f"ContributionResult contributions {len(res.df)} ")
    assert "second_half_share" in line


@pytest.mark.parametrize("kind", ["no_such_kind", ["a", "list"], 5])
def test_an_unknown_kind_names_what_it_found_and_what_it_knows(tmp_path, kind):
    path = tmp_path / "r.json"
    empty = {"columns": [], "dtypes": {}, "data": {}}
    path.write_text(json.dumps({"kind": kind, "summary": {}, "meta": {}, "df": empty}))
    with pytest.raises(CheckpointError) as info:
        Result.load(path)
    message = str(info.value)
    assert repr(kind)[:20] in message
    if isinstance(kind, str):
        assert "contributions" in message and "swaps" in message
