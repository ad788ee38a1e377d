"""The package's shape: import layers without cycles, architecture facts only in
probekit/model/, no helpers in the public API, and a command line that imports the heavy modules
only when it runs a command."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "probekit"

CONTRACTS = ("layers", "model_layers", "cli", "acyclic")
"""The import-linter contracts of setup.cfg ([importlinter:contract:<id>])."""

ARCHITECTURE = re.compile(
    r"\.bridge\b|bridge\.cfg|hook_pattern|hook_attn_scores|blocks\.\{|[\"']blocks\."
)
"""Architecture access that belongs in probekit/model/: the bridge itself, its config, and
hook-name strings."""

HELPERS = (
    "knockout_hooks",
    "weight_matrices",
    "contiguous_blocks",
    "stable_rank",
    "check_knockout_supported",
    "edge_mask",
    "gather",
    "fit_probe",
)
"""Helper functions that must not be offered as probekit's public API."""


def _lint_imports() -> Path:
    script = Path(sys.executable).parent / "lint-imports"
    if not script.exists():
        pytest.fail("lint-imports is missing: pip install -e '.[dev]' installs import-linter")
    return script


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_holds(contract):
    """The layers (as docs/layout.md draws them: see the test below) and no cycles between
    siblings."""
    done = subprocess.run(
        [str(_lint_imports()), "--no-cache", "--no-logo", "--contract", contract],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        broken = done.stdout.split("Broken contracts", 1)[-1].strip("-\n ")
        pytest.fail(f"import contract {contract!r} is broken:\n{broken}{done.stderr}", False)


def _top_layers() -> str:
    """setup.cfg's top-level layers as docs/layout.md writes them: ``cli > ... > errors``."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    layers = config["importlinter:contract:layers"]["layers"].split("\n")
    return " > ".join(line.strip() for line in layers if line.strip() not in ("", "__main__"))


def test_layout_page_draws_the_layers_setup_cfg_checks():
    """docs/layout.md's chain of layers is the one import-linter checks."""
    page = " ".join((ROOT / "docs" / "layout.md").read_text().split())
    assert f"`{_top_layers()}`" in page


def test_every_contract_is_tested():
    config = (ROOT / "setup.cfg").read_text()
    assert set(re.findall(r"^\[importlinter:contract:(\w+)\]", config, re.M)) == set(CONTRACTS)


def test_architecture_access_only_in_the_model_package():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if PACKAGE / "model" not in path.parents
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ARCHITECTURE.search(line)
    ]
    assert not offenders, "architecture access outside probekit/model/:\n" + "\n".join(offenders)


def test_the_architecture_pattern_catches_what_it_should():
    caught = ["model.bridge.W_E", "bridge.cfg.n_heads", 'f"blocks.{layer}.attn.hook_pattern"']
    caught += ["'blocks.0.hook_resid_pre'", "hook_attn_scores"]
    passed = ["from transformer_lens.model_bridge import TransformerBridge", "model.blocks[0]"]
    assert all(ARCHITECTURE.search(text) for text in caught)
    assert not any(ARCHITECTURE.search(text) for text in passed)


def test_public_api_lists_no_helpers():
    import probekit

    leaked = sorted(set(HELPERS) & set(probekit.__all__))
    assert not leaked, f"helpers listed in probekit.__all__: {leaked}"
    missing = [name for name in probekit.__all__ if not hasattr(probekit, name)]
    assert not missing, f"probekit.__all__ lists names probekit lacks: {missing}"


TESTS = ROOT / "tests"
REFLECTION = ("getattr", "setattr", "delattr", "hasattr")
"""Calls that name an attribute by a string (``setattr(obj, "_x", ...)``, monkeypatch's too)."""

FOREIGN = (
    "_actions",  # argparse's, on the parsers probekit builds
    "_subparsers",
    "_group_actions",
    "_format_action_invocation",
    "_expand_help",
    "_repr_html_",  # IPython's display protocol, which probekit's results implement
)
"""Private names of other libraries that tests read through probekit's objects."""


def _private(name: str) -> bool:
    """A name probekit keeps to itself: a leading ``_`` that is neither a dunder nor another
    library's (:data:`FOREIGN`)."""
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in FOREIGN


def _root(node: ast.AST) -> str | None:
    """The variable an expression starts from (``a`` in ``a.b(c)[0].d``), if any."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _probekit_names(tree: ast.AST) -> set[str]:
    """The variables bound to probekit: by ``import probekit...``, ``from probekit... import x``,
    and by assigning something reached from those (``side = CleanSide(...)``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {
                a.asname or "probekit" for a in node.names if a.name.split(".")[0] == "probekit"
            }
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "probekit":
            names |= {a.asname or a.name for a in node.names}
    assigns = [
        n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign | ast.withitem)
    ]
    while True:
        more = {
            target.id
            for n in assigns
            for value, target in _bindings(n)
            if isinstance(target, ast.Name) and _root(value) in names
        } - names
        if not more:
            return names
        names |= more


def _bindings(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(value, target) pairs of an assignment or a ``with ... as`` item."""
    if isinstance(node, ast.withitem):
        return [(node.context_expr, node.optional_vars)] if node.optional_vars else []
    if isinstance(node, ast.AnnAssign):
        return [(node.value, node.target)] if node.value else []
    return [(node.value, target) for target in node.targets]


def private_uses(source: str) -> list[str]:
    """The private probekit names ``source`` imports, reads or sets, as ``line: name``: an
    import of a ``_`` name or module, ``x._y`` and ``setattr(x, "_y", ...)`` where ``x`` is
    bound to probekit (see :func:`_probekit_names`).

    (The examples name modules and attributes probekit does not have.)

    >>> private_uses("from probekit.example import _hidden")
    ['1: _hidden']
    >>> private_uses("from probekit import example\\nexample._hidden = None\\nexample.__name__")
    ['2: example._hidden']
    >>> private_uses("import os\\nos._exit")
    []
    """
    tree = ast.parse(source)
    names = _probekit_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] == "probekit"]
            found += [(node, n) for n in bad if any(map(_private, n.split(".")))]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "probekit":
            if any(map(_private, node.module.split("."))):
                found.append((node, node.module))
            found += [(node, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and _root(node) in names:
            found.append((node, ast.unparse(node)))
        elif isinstance(node, ast.Call) and _reflection(node, names):
            found.append((node, ast.unparse(node)))
    return sorted(f"{node.lineno}: {text}" for node, text in found)


def _reflection(call: ast.Call, names: set[str]) -> bool:
    """``getattr``/``setattr``/... of a private attribute of something bound to probekit."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in REFLECTION or len(call.args) < 2:
        return False
    target, attr = call.args[0], call.args[1]
    private = (
        isinstance(attr, ast.Constant) and isinstance(attr.value, str) and _private(attr.value)
    )
    return private and _root(target) in names


def test_tests_reach_probekit_through_public_names_only():
    found = {
        path.name: uses
        for path in sorted(TESTS.glob("*.py"))
        if (uses := private_uses(path.read_text()))
    }
    assert not found, f"tests reach private probekit names (give them a public one): {found}"


def test_tests_share_only_public_helpers():
    """A helper one test module imports from another is public on purpose (no ``_`` name)."""
    found = {
        path.name: names
        for path in sorted(TESTS.glob("*.py"))
        if (
            names := [
                f"{node.lineno}: {alias.name}"
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests")
                for alias in node.names
                if _private(alias.name)
            ]
        )
    }
    assert not found, f"tests import private helpers of other tests: {found}"


def _top_level_imports(path: Path) -> set[str]:
    """Modules a file imports when it is imported (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


LIGHT_CLI = (
    "cli/__init__",
    "cli/common",
    "cli/demo",
    "cli/diagnose",
    "cli/compare",
    "cli/shutdown",
)
"""The command line's modules that ``probekit diagnose`` and ``probekit demo`` import."""


@pytest.mark.parametrize("module", [*LIGHT_CLI, "sources"])
def test_the_command_line_imports_only_light_modules_up_front(module):
    """torch, transformer_lens and the report load inside the command that needs them."""
    light = set(sys.stdlib_module_names) | {"probekit.errors", "probekit.sources"}
    light |= {"probekit.model", "probekit.model.hub"}  # Hub names resolve before torch loads
    light |= {"probekit." + name.replace("/", ".") for name in LIGHT_CLI}
    heavy = {
        name
        for name in _top_level_imports(PACKAGE / f"{module}.py")
        if name.split(".")[0] not in light and name not in light
    }
    assert not heavy, f"probekit/{module}.py imports {sorted(heavy)} at module level"


def test_help_a_mistyped_command_and_a_bad_path_load_no_torch(tmp_path):
    """``probekit --help`` (train and sweep listed with their help), ``probekit`` alone, a
    mistyped command, a path that does not exist and an ``--out`` that is a file answer before
    torch, transformers or TransformerLens load: in a fraction of a second, not the seconds
    their imports take."""
    from probekit.toy import toy_hf_model

    model, file = tmp_path / "model", tmp_path / "file"
    toy_hf_model("gpt2", n_layers=2).save_pretrained(model)
    file.write_text("not a folder")
    bad_out = [
        ["diagnose", "/nonexistent", "--out", str(tmp_path / "x")],
        ["diagnose", str(model), "--out", str(file)],
        ["compare", str(model), str(model), "--out", str(file)],
        ["timeline", str(model), str(model), "--out", str(file)],
        ["demo", "--quick", "--out", str(file)],
    ]
    code = (
        "import contextlib, io, sys\n"
        "from probekit.cli import main\n"
        "out = io.StringIO()\n"
        f"for argv in (['--help'], [], ['trian'], *{bad_out!r}):\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            code = main(argv)\n"
        "        except SystemExit as exit:\n"
        "            code = exit.code\n"
        "    assert code in (0, 2), (argv, code)\n"
        "heavy = [m for m in ('torch', 'transformers', 'transformer_lens') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "text = out.getvalue()\n"
        "assert 'train a GPT-2-style model' in text and 'sweep gamma' in text, text\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "x").exists() and file.read_text() == "not a folder"


def test_the_light_run_folder_check_names_the_trainers_files():
    """:func:`probekit.sources.checkpoint_of` tells a folder that is no run apart by the
    trainer's own file names, before it imports the trainer."""
    from probekit import run_folders, sources
    from probekit.training import checkpoint

    assert sources.RUN_CONFIG == checkpoint.RUN_CONFIG
    assert sources.RUN_CONFIG_PLACES[-1] == run_folders.PREVIOUS


def test_help_and_usage_errors_load_no_command():
    code = (
        "import sys\n"
        "from probekit.cli import main\n"
        "try:\n"
        "    main(['diagnose', 'x', '--bogus'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 2\n"
        "loaded = [m for m in ('probekit.report', 'probekit.demo') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
