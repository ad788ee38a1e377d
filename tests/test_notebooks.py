"""The notebooks run top to bottom (small settings) inside the test suite, quietly, and their
figures survive an HTML export."""

from __future__ import annotations

from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def _outputs(notebook, kind):
    return [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == kind
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    assert not _outputs(notebook, "error")
    stderr = " ".join(
        o.get("text", "") for o in _outputs(notebook, "stream") if o["name"] == "stderr"
    )
    assert "TqdmWarning" not in stderr and "tokenizers" not in stderr.lower(), stderr[:500]
    assert "[transformers]" not in stderr and "_token_id" not in stderr, stderr[:500]
    written = [p for p in tmp_path.iterdir() if p.name != "notebook-outputs"]
    assert not written, f"{path.name} wrote outside notebook-outputs/: {written}"
    if "03_" in path.name:
        assert (tmp_path / "notebook-outputs" / "report" / "report.html").is_file()
        _check_html_export(notebook)


def _check_html_export(notebook):
    """The executed notebook exported to HTML keeps its figures, plotly.js included."""
    import nbconvert  # in the [dev] and [notebook] extras

    body, _ = nbconvert.HTMLExporter().from_notebook_node(notebook)
    assert body.count('class="plotly-graph-div"') >= 6
    assert "Plotly.newPlot" in body and "plotly.js v" in body  # the library travels along


def test_there_are_notebooks():
    assert NOTEBOOKS
