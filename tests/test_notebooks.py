"""The notebooks run top to bottom (small settings) inside the test suite, quietly, and their
figures survive an HTML export; their committed outputs (what the docs site shows) are current:
made by each code cell's present source, with every figure a fresh run draws."""

from __future__ import annotations

from pathlib import Path

import nbclient
import nbformat
import pytest

from tests import notebook_outputs

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
    assert notebook_outputs.problems(path, fresh=notebook) == []
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_outputs_are_current(path):
    """Each code cell's outputs were made by its present source, and the figures can be drawn
    by the docs site (python -m tests.notebook_outputs regenerates them)."""
    assert notebook_outputs.problems(path) == []
    figures = notebook_outputs.figure_counts(nbformat.read(path, as_version=4))
    assert sum(figures) >= 6


def _executed_toy(source: str):
    """A notebook as if executed: one code cell showing one plotly figure."""
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source, execution_count=1)
    figure = {"data": [{"type": "bar", "x": [0, 1], "y": [1, 2]}], "layout": {}}
    library = {"text/html": "<script>/** plotly.js v9 */</script>"}  # the renderer's first
    cell.outputs = [
        nbformat.v4.new_output("display_data", library),
        nbformat.v4.new_output("display_data", {notebook_outputs.PLOTLY_JSON: figure}),
    ]
    notebook.cells = [cell]
    return notebook


def test_the_checker_sees_stale_and_missing_outputs(tmp_path):
    path = tmp_path / "toy.ipynb"
    executed = _executed_toy("fig")
    nbformat.write(notebook_outputs.committable(executed, "toy"), path)
    assert notebook_outputs.problems(path, fresh=executed) == []
    committed = nbformat.read(path, as_version=4)
    output = committed.cells[0].outputs
    assert len(output) == 1 and "Plotly.newPlot" in output[0]["data"]["text/html"]

    committed.cells[0].source = "fig.update_layout(title='changed')"  # edited, not rerun
    nbformat.write(committed, path)
    assert "code cell 0 changed since" in " ".join(notebook_outputs.problems(path))

    nbformat.write(_executed_toy("fig"), path)  # executed but not through the script
    assert "never ran" in " ".join(notebook_outputs.problems(path))

    executed.cells[0].outputs.append(executed.cells[0].outputs[1])  # a fresh run draws two
    nbformat.write(notebook_outputs.committable(_executed_toy("fig"), "toy"), path)
    found = " ".join(notebook_outputs.problems(path, fresh=executed))
    assert "[1] committed, [2] in a fresh run" in found and "python -m tests" in found


def test_there_are_notebooks():
    assert NOTEBOOKS
