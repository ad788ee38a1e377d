"""The tutorials' committed outputs: what the docs site shows (mkdocs.yml: ``execute: false``).

The notebooks are committed executed at their small default settings, so the site shows their
figures without running them at every build (20-45 s each on 2 cores; the test suite already
runs them once). After changing a notebook, regenerate its outputs (about a minute for all):

    python -m tests.notebook_outputs                                   # every notebooks/*.ipynb
    python -m tests.notebook_outputs notebooks/03_diagnose_a_checkpoint.ipynb

Each code cell records the hash of the source that made its outputs (cell metadata
``probekit.source_sha256``): tests/test_notebooks.py fails when a cell has changed since, and
checks against its own fresh run that each cell drawing figures has them committed.

Kept per figure: plotly's JSON (JupyterLab and VS Code draw it) and an HTML div drawn by the
page's plotly.js (docs/hooks.py adds the library once per tutorial page). Left out: plotly.js
itself (4.8 MB per notebook), widget progress bars, timing and kernel metadata.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import nbformat  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PLOTLY_JSON = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
COMMAND = "python -m tests.notebook_outputs"
SITE_WIDTH = 560  # px: mkdocs-material's text column beside both sidebars is about 580
MAX_BYTES = 1_000_000  # a committed notebook above this carries something it should not


def source_hash(source: str) -> str:
    """The hash recorded for a code cell's source (first 16 hex digits of its SHA-256)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def execute(notebook: Any, workdir: Path, timeout: int = 600) -> Any:
    """Run ``notebook`` (in place) top to bottom in ``workdir``, as the test suite does."""
    import nbclient

    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return notebook


def _is_plotly_library(output: dict) -> bool:
    html = "".join(output.get("data", {}).get("text/html", ""))
    return PLOTLY_JSON not in output.get("data", {}) and "plotly.js v" in html


def figure_html(figure: dict, div_id: str) -> str:
    """A div that draws ``figure`` with the page's plotly.js (no require.js, no CDN), laid out
    again for the site's text column (:data:`SITE_WIDTH`; its own 1000 px would run past it)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from probekit.figures import resize

    fig = resize(go.Figure(figure), SITE_WIDTH)
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id, validate=False)


def _committable_outputs(outputs: list, name: str, counter: list[int]) -> list:
    kept = []
    for output in outputs:
        data = output.get("data", {})
        if WIDGET in data or _is_plotly_library(output):
            continue
        if PLOTLY_JSON in data:
            counter[0] += 1
            data["text/html"] = figure_html(data[PLOTLY_JSON], f"{name}-figure-{counter[0]}")
        kept.append(output)
    return kept


def committable(executed: Any, name: str) -> Any:
    """The executed notebook as committed: figures the site can draw, each code cell's source
    hash recorded, nothing volatile (widgets, timings, kernel details)."""
    notebook = copy.deepcopy(executed)
    counter = [0]
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = _committable_outputs(cell.outputs, name, counter)
        cell.metadata.pop("execution", None)
        cell.metadata["probekit"] = {"source_sha256": source_hash(cell.source)}
    notebook.metadata = {"kernelspec": notebook.metadata.get("kernelspec", {})}
    return notebook


def figure_counts(notebook: Any) -> list[int]:
    """The number of plotly figures each code cell shows."""
    return [
        sum(PLOTLY_JSON in o.get("data", {}) for o in cell.get("outputs", []))
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]


def _cell_problems(index: int, cell: Any) -> list[str]:
    recorded = cell.metadata.get("probekit", {}).get("source_sha256")
    if recorded != source_hash(cell.source):
        return [f"code cell {index} changed since its outputs were made (or never ran)"]
    problems = []
    for output in cell.outputs:
        data = output.get("data", {})
        if output.get("output_type") == "error":
            problems.append(f"code cell {index} failed: {output.get('ename')}")
        elif PLOTLY_JSON in data and "Plotly.newPlot" not in "".join(data.get("text/html", "")):
            problems.append(f"code cell {index}: a figure without HTML the site can draw")
        elif WIDGET in data or _is_plotly_library(output):
            problems.append(f"code cell {index}: a widget or plotly.js itself is committed")
    return problems


def problems(path: Path, fresh: Any | None = None) -> list[str]:
    """What is stale or missing in the committed notebook at ``path``, one line each (empty:
    nothing); with ``fresh`` (the same notebook just executed), also every figure the fresh
    run draws that the committed outputs lack."""
    committed = nbformat.read(path, as_version=4)
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    found = [p for i, cell in enumerate(code) for p in _cell_problems(i, cell)]
    if fresh is not None and figure_counts(fresh) != figure_counts(committed):
        found.append(
            f"figures per code cell: {figure_counts(committed)} committed, "
            f"{figure_counts(fresh)} in a fresh run"
        )
    if path.stat().st_size > MAX_BYTES:
        found.append(f"{path.stat().st_size} bytes, over {MAX_BYTES}")
    return [f"{path.name}: {p}; regenerate: {COMMAND} {path.name}" for p in found]


def regenerate(path: Path) -> Path:
    """Execute the notebook at ``path`` in a temporary folder and write it back with its
    outputs (whole: a temporary file renamed over it)."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as workdir:
        execute(notebook, Path(workdir))
    result = committable(notebook, path.stem)
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(result, tmp)
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    args = parser.parse_args(argv)
    for path in args.paths or sorted(NOTEBOOKS.glob("*.ipynb")):
        regenerate(path)
        print(f"{path}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
