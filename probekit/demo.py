"""``probekit demo``: the two reference anchor-function models, trained, classified, dissected.

Trains the CPU-sized reference pair of the anchor-function study — one 2-layer model with large
initialization (gamma 0.5), one with small initialization (gamma 0.8), the same shape, so both
train together as one stacked model — then, for each: classifies its solution on the held-out
pair, runs the mechanism analyses (attention-edge knockout by role, condensation, linear probes,
the token-embedding map) and the depth-use diagnosis, and writes one report per model plus an
index page to ``out`` (default ``./probekit-demo/``).

Example:
    $ probekit demo                 # about 10-15 minutes on 2 CPU cores
    $ probekit demo --quick         # a tiny smoke run (the numbers mean nothing)
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from probekit.io import atomic_write_text

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


def _depth_data(task: Any) -> dict[str, Any]:
    import torch

    data = task.dataset("test_data")
    labels = torch.full_like(data.tokens, -100)
    labels[:, -1] = data.targets
    return {"input_ids": data.tokens, "labels": labels}


def analyse(
    checkpoint: str | os.PathLike, out: str | os.PathLike, title: str, n_bootstrap: int = 100
) -> dict[str, Any]:
    """Solution type, mechanisms and depth use of one anchor checkpoint, written to ``out``."""
    import probekit
    from probekit.analyses.mechanisms.maps import embedding_map
    from probekit.analyses.mechanisms.knockout import attention_knockout
    from probekit.analyses.mechanisms.probes import linear_probes
    from probekit.analyses.mechanisms.solutions import solution_types
    from probekit.analyses.weights.condensation import condensation
    from probekit.report import diagnose, write_report
    from probekit.training.trainer import load_run_config

    model = probekit.load(checkpoint, device="cpu")
    task = load_run_config(checkpoint).task
    held = task.dataset("test_task")
    solutions = solution_types(model, task)
    diagnosis = diagnose(
        model, _depth_data(task), positions="last", pairs="all", n_bootstrap=n_bootstrap
    )
    mechanisms = {
        "solutions": solutions,
        "attention_knockout": attention_knockout(model, held, by="role"),
        # probes on up to 800 sequences at the role positions: 80-class logistic probes are slow
        "probes": linear_probes(
            model,
            task.generate("test_data", min(800, task.n_test)),
            task=task,
            sites=("resid",),
            positions="roles",
        ),
        "condensation": condensation(model),
        "embedding_map": embedding_map(model, tokens=range(task.item_low, task.item_high)),
    }
    diagnosis.results = {**mechanisms, **diagnosis.results}
    s = solutions.summary
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
    write_report(diagnosis, out, title=title)
    return {"verdict": diagnosis.verdict, "headline": diagnosis.headline, "diagnosis": diagnosis}


def run_demo(
    out: str | os.PathLike = "probekit-demo",
    quick: bool = False,
    progress: bool = True,
    images: bool = True,
) -> Path:
    """Train, classify and dissect the two reference models; returns the index page."""
    from probekit.training.trainer import train_stack

    out = Path(out)
    runs = train_stack(reference_configs(quick), out / "runs", progress=progress)
    pages, summary = [], {}
    for run in runs:
        result = analyse(
            run.checkpoint,
            out / run.name,
            f"probekit demo: {run.name} model",
            n_bootstrap=10 if quick else 100,
        )
        if images:
            from probekit.cli import _chromium_available, _kaleido_available
            from probekit.report import export_images

            if _chromium_available() and _kaleido_available():
                export_images(result["diagnosis"], out / run.name)
        summary[run.name] = result["headline"]
        items = "".join(f"<li>{html.escape(line)}</li>" for line in result["verdict"])
        pages.append(
            f'<h2><a href="{run.name}/report.html">{html.escape(run.name)} model</a>'
            f"</h2><ul>{items}</ul>"
        )
    from probekit.result import _plain

    atomic_write_text(out / "summary.json", json.dumps(_plain(summary), indent=1))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>probekit demo</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:2rem auto;"
        "line-height:1.5}</style></head><body><h1>probekit demo</h1>"
        "<p>Two 2-layer models trained on the anchor-function task, differing only in "
        "their initialization rate.</p>" + "".join(pages) + "</body></html>"
    )
    return atomic_write_text(out / "index.html", page)


__all__ = ["REFERENCE", "analyse", "reference_configs", "run_demo"]
