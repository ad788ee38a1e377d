"""``probekit demo``: the two reference anchor-function models, trained, classified, dissected.

Trains the CPU-sized reference pair of the anchor-function study — one 2-layer model with large
initialization (gamma 0.5), one with small initialization (gamma 0.8), the same shape, so both
train together as one stacked model — then, for each: classifies its solution on the held-out
pair, runs the mechanism analyses (attention-edge knockout by role, condensation, linear probes,
the token-embedding map) and the depth-use diagnosis, and writes one report per model plus an
index page to ``out`` (default ``./probekit-demo/``).

From a shell: ``probekit demo`` (about 10-15 minutes on 2 CPU cores), or ``probekit demo
--quick`` for a tiny smoke run whose numbers mean nothing.

Example:
    >>> [(config.name, config.model.gamma) for config in reference_configs(quick=True)]
    [('symmetric', 0.5), ('inferential', 0.8)]
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from probekit.io import atomic_write_text, swapped_directory

REFERENCE = {"symmetric": 0.5, "inferential": 0.8}
"""Run name -> initialization rate gamma of the two reference models."""


def reference_configs(quick: bool = False) -> list[Any]:
    """The trainer configs of the two reference models: ``anchor_cpu_config`` (README) at
    gamma 0.5 and 0.8, seed 0; ``quick`` shrinks everything to a smoke run."""
    from probekit.tasks.anchor import AnchorTask
    from probekit.training.models import ModelConfig
    from probekit.training.trainer import anchor_cpu_config

    configs = []
    for name, gamma in REFERENCE.items():
        quick_settings = dict(
            model=ModelConfig(n_layers=2, d_model=16, n_heads=2, gamma=gamma),
            task=AnchorTask(n_train=512, n_test=128),
            steps=20,
            batch_size=32,
            eval_every=10,
            checkpoint_every=20,
            warmup_steps=2,
        )
        configs.append(
            anchor_cpu_config(gamma, seed=0, name=name, **(quick_settings if quick else {}))
        )
    return configs


def analyse(
    checkpoint: str | os.PathLike, out: str | os.PathLike, title: str, n_bootstrap: int = 100
) -> dict[str, Any]:
    """Solution type, mechanisms and depth use of one anchor checkpoint, written to ``out``.

    Returns the verdict lines, the headline numbers and the :class:`~probekit.report.Diagnosis`.
    """
    import probekit
    from probekit.analyses.mechanisms.solutions import solution_types
    from probekit.report import diagnose, write_report
    from probekit.runs import default_data
    from probekit.training.runs import load_run

    model = probekit.load(checkpoint, device="cpu")
    task = load_run(checkpoint).task
    solutions = solution_types(model, task.solution_data())
    data, positions = default_data(checkpoint)
    diagnosis = diagnose(model, data, positions=positions, pairs="all", n_bootstrap=n_bootstrap)
    diagnosis.results = {"solutions": solutions, **_mechanisms(model, task), **diagnosis.results}
    _add_solution(diagnosis, solutions.summary)
    write_report(diagnosis, out, title=title)
    return {"verdict": diagnosis.verdict, "headline": diagnosis.headline, "diagnosis": diagnosis}


def _mechanisms(model: Any, task: Any) -> dict[str, Any]:
    """The mechanism analyses of an anchor model: knockout, probes, condensation, token map."""
    from probekit.analyses.mechanisms.knockout import attention_knockout
    from probekit.analyses.mechanisms.probes import linear_probes
    from probekit.analyses.weights.condensation import condensation
    from probekit.analyses.weights.embeddings import embedding_map

    held = task.dataset("test_task")
    return {
        "attention_knockout": attention_knockout(model, held, by="role"),
        # probes on up to 800 sequences at the role positions: 80-class logistic probes are slow
        "probes": linear_probes(
            model,
            task.generate("test_data", min(800, task.n_test)),
            sites=("resid",),
            positions="roles",
        ),
        "condensation": condensation(model),
        "embedding_map": embedding_map(model, tokens=range(task.item_low, task.item_high)),
    }


def _add_solution(diagnosis: Any, s: dict[str, Any]) -> None:
    """Put the solution type (``s``: the solution_types summary) first in the verdict."""
    diagnosis.verdict.insert(
        0,
        f"Solution: {s['solution']} — on the held-out pair {s['heldout_inferential']:.1%} of "
        f"outputs are inferential (the composite), {s['heldout_symmetric']:.1%} symmetric; "
        f"seen pairs on test keys {s['seen_test_accuracy']:.1%} correct"
        + (" (memorizing)." if s["memorizing"] else "."),
    )
    diagnosis.headline.update(
        {
            k: s[k]
            for k in ("solution", "heldout_inferential", "heldout_symmetric", "seen_test_accuracy")
        }
    )


def is_demo_folder(path: str | os.PathLike) -> bool:
    """Whether the folder ``path`` holds a demo probekit wrote (its index.html and summary.json).

    Example:
        >>> import tempfile
        >>> is_demo_folder(tempfile.mkdtemp())
        False
    """
    folder = Path(path)
    index, summary = folder / "index.html", folder / "summary.json"
    try:
        if not (index.resolve().is_file() and summary.resolve().is_file()):
            return False
        with index.open("rb") as handle:
            head = handle.read(500)
        value = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return b"<title>probekit demo</title>" in head and isinstance(value, dict)


def run_demo(
    out: str | os.PathLike = "probekit-demo",
    quick: bool = False,
    progress: bool = True,
    images: bool = True,
    force: bool = False,
) -> Path:
    """Train, classify and dissect the two reference models; returns the index page.

    Everything is built in a temporary folder beside ``out`` and swapped in whole at the end, so
    ``out`` holds one complete demo (an older demo there is replaced; an interrupted or failed
    run leaves it as it was). A non-empty ``out`` that holds no demo is refused unless ``force``
    (see :func:`probekit.report.check_out_dir`).
    """
    from probekit.errors import InputError
    from probekit.report import check_out_dir

    out = check_out_dir(out, force=force, recognise=is_demo_folder, what="demo")
    try:
        with swapped_directory(out) as tmp:
            _build_demo(tmp, quick, progress, images)
    except OSError as err:
        raise InputError(
            f"could not write the demo to {out} ({err.strerror or err}); nothing changed",
            fix="free disk space or choose another --out",
        ) from err
    return out / "index.html"


def _build_demo(out: Path, quick: bool, progress: bool, images: bool) -> Path:
    """The demo's runs, reports and index page, written into ``out``."""
    from probekit.report import can_export_images, export_images, write_json
    from probekit.training.trainer import train_stack

    runs = train_stack(reference_configs(quick), out / "runs", progress=progress)
    pages, summary = [], {}
    for run in runs:
        result = analyse(
            run.checkpoint,
            out / run.name,
            f"probekit demo: {run.name} model",
            n_bootstrap=10 if quick else 100,
        )
        if images and can_export_images():
            export_images(result["diagnosis"], out / run.name)
        summary[run.name] = result["headline"]
        items = "".join(f"<li>{html.escape(line)}</li>" for line in result["verdict"])
        pages.append(
            f'<h2><a href="{run.name}/report.html">{html.escape(run.name)} model</a>'
            f"</h2><ul>{items}</ul>"
        )
    write_json(out / "summary.json", summary)
    return atomic_write_text(out / "index.html", _index_page(pages))


def _index_page(pages: list[str]) -> str:
    """The demo's index.html around one section per model."""
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>probekit demo</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:2rem auto;"
        "line-height:1.5}</style></head><body><h1>probekit demo</h1>"
        "<p>Two 2-layer models trained on the anchor-function task, differing only in "
        "their initialization rate.</p>" + "".join(pages) + "</body></html>"
    )


__all__ = ["REFERENCE", "analyse", "is_demo_folder", "reference_configs", "run_demo"]
