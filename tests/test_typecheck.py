"""The type checker: strict enough to catch a wrong argument to an analyzer, and the lazy
package exports seen by it as the names they are (their ``TYPE_CHECKING`` imports), not Any."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAZY_PACKAGES = (
    "probekit",
    "probekit.analyses",
    "probekit.anchor",
    "probekit.lm",
    "probekit.model",
)
"""The packages that export names lazily and type them through ``TYPE_CHECKING`` imports."""

CALLS = """\
import probekit
import probekit.analyses
from probekit.toy import toy_model, toy_tokens

model = toy_model()
probekit.layer_swaps(model, toy_tokens(), {swaps})
probekit.analyses.token_masking(model, toy_tokens(), {masking})
probekit.contributions(model, toy_tokens(), {contributions})
"""

WRONG = {
    "swaps": ('pairz="all"', 'Unexpected keyword argument "pairz"'),
    "masking": ("mode=3", 'Argument "mode" to "token_masking" has incompatible type "int"'),
    "contributions": ('batch_size="8"', 'incompatible type "str"; expected "int | None"'),
}
RIGHT = {"swaps": 'pairs="all"', "masking": 'mode="resample"', "contributions": "batch_size=8"}


def _type_checking_imports(package: str) -> dict[str, str]:
    """Name -> the module a package's ``if TYPE_CHECKING:`` block imports it from."""
    path = Path(importlib.import_module(package).__file__)
    names = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                names.update({alias.name: stmt.module for alias in stmt.names})
    return names


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_lazy_export_is_typed_as_the_object_it_resolves_to(package):
    module = importlib.import_module(package)
    typed = _type_checking_imports(package)
    lazy = {name for name in module.__all__ if name not in vars(module)}
    assert lazy <= set(typed), f"lazy exports of {package} without a TYPE_CHECKING import"
    for name, home in typed.items():
        assert name in module.__all__, f"{package}: {name} typed but not exported"
        value = getattr(importlib.import_module(home), name)
        assert getattr(module, name) is value, (package, name)


def _packages() -> list[ModuleType]:
    """probekit and every package inside it."""
    import probekit

    inner = pkgutil.walk_packages(probekit.__path__, "probekit.")
    return [probekit, *(importlib.import_module(info.name) for info in inner if info.ispkg)]


@pytest.mark.parametrize("package", _packages(), ids=lambda package: package.__name__)
def test_no_export_is_named_like_a_submodule_of_its_package(package):
    """Importing a submodule sets it as its package's attribute of that name, which would hide
    an export of the same name from the package's lazy ``__getattr__`` from then on."""
    lookup = getattr(package, "__getattr__", None)
    for info in pkgutil.iter_modules(package.__path__):
        assert info.name not in getattr(package, "__all__", ()), (package.__name__, info.name)
        if lookup is not None:
            with pytest.raises(AttributeError):
                lookup(info.name)


LOOKUPS_AFTER_THE_MODULES_LOAD = """\
import types
import probekit
import probekit.analyses

probekit.condensation_timeline, probekit.depth_timeline  # both load the timeline's module
for found in (probekit.timeline, probekit.analyses.timeline):
    assert callable(found) and not isinstance(found, types.ModuleType), found
"""


def test_timeline_is_the_function_after_its_module_is_imported():
    """In a fresh process, so that no other test has imported anything yet."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", LOOKUPS_AFTER_THE_MODULES_LOAD],
        env={**os.environ, "PYTHONPATH": path},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def _mypy_errors(tmp_path: Path, monkeypatch, source: str) -> list[str]:
    """mypy's errors in ``source`` alone (errors it reports in probekit itself are left out),
    checked with the project's configuration against this checkout's probekit."""
    api = pytest.importorskip("mypy.api")
    monkeypatch.setenv("MYPYPATH", str(ROOT))  # this checkout, not an installed copy
    script = tmp_path / "calls.py"
    script.write_text(source)
    stdout, stderr, _ = api.run(
        [
            str(script),
            "--config-file",
            str(ROOT / "setup.cfg"),
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--no-error-summary",
        ]
    )
    assert not stderr, stderr
    return [
        line for line in stdout.splitlines() if line.startswith(f"{script}:") and ": error:" in line
    ]


@pytest.mark.slow
def test_mypy_catches_a_wrong_argument_to_an_analyzer(tmp_path, monkeypatch):
    wrong = CALLS.format(**{key: arg for key, (arg, _) in WRONG.items()})
    errors = _mypy_errors(tmp_path, monkeypatch, wrong)
    for line, (key, (_, message)) in enumerate(WRONG.items(), start=6):
        at_line = [error for error in errors if f":{line}: error:" in error]
        assert any(message in error for error in at_line), (key, errors)
    assert len(errors) == len(WRONG), errors

    right = CALLS.format(**RIGHT)
    assert _mypy_errors(tmp_path, monkeypatch, textwrap.dedent(right)) == []
