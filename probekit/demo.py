"""``probekit demo``: the two reference anchor-function models, trained, classified, dissected.

Trains the CPU-sized reference pair of the anchor-function study — one 2-layer model with large
initialization (gamma 0.5), one with small initialization (gamma 0.8), the same shape, so both
train together as one stacked model — then, for each: classifies its solution on the held-out
pair, runs the mechanism analyses (attention-edge knockout by role, condensation, linear probes,
the token-embedding map) and the depth-use diagnosis, and writes one report per model plus an
index page to ``out`` (default ``./probekit-demo/``).

From a shell: ``probekit demo`` (minutes on 2 CPU cores; docs/getting-started.md), or
``probekit demo --quick``, a smoke run of the same pipeline on briefly trained models (its
pages say so).

Example:
    >>> [(config.name, config.model.gamma) for config in reference_configs(quick=True)]
    [('symmetric', 0.5), ('inferential', 0.8)]
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from probekit.io import atomic_write_text
from probekit.page import figure_html, html_page, side_by_side
from probekit.progress import live, phase

REFERENCE = {"symmetric": 0.5, "inferential": 0.8}
"""Run name -> initialization rate gamma of the two reference models."""

QUICK_BANNER = (
    "Smoke run (probekit demo --quick): the models trained for only a few hundred steps, so "
    "they have not settled on a solution yet; the numbers show that the pipeline works, not "
    "what the reference models learn. Run probekit demo for those."
)
"""The banner above every page of a quick demo."""

BAR_FIELDS = (
    "training bar: loss = training loss of the last batch; data = accuracy on seen anchor "
    "pairs with unseen keys; inf / sym = share of the held-out pair's outputs that are "
    "inferential / symmetric (mean over the two stacked models)"
)
"""The training progress bar's fields, in words."""


QUICK_STEPS = 300
"""Optimizer steps of each model in ``probekit demo --quick``."""


def reference_configs(quick: bool = False) -> list[Any]:
    """The trainer configs of the two reference models: ``anchor_cpu_config`` (docs/results.md) at
    gamma 0.5 and 0.8, seed 0; ``quick`` shrinks everything to a smoke run."""
    from probekit.anchor import AnchorTask, anchor_cpu_config
    from probekit.training.models import ModelConfig

    configs = []
    for name, gamma in REFERENCE.items():
        quick_settings = dict(
            model=ModelConfig(n_layers=2, d_model=64, n_heads=4, gamma=gamma),
            task=AnchorTask(n_train=20000, n_test=128, key_split="probekit_v1"),
            steps=QUICK_STEPS,
            batch_size=128,
            lr=5e-3,
            eval_every=QUICK_STEPS // 2,
            checkpoint_every=QUICK_STEPS,
            warmup_steps=40,
        )
        configs.append(
            anchor_cpu_config(gamma, seed=0, name=name, **(quick_settings if quick else {}))
        )
    return configs


class Phases:
    """Prints one line per phase with its time (to stderr), unless ``quiet``."""

    def __init__(self, prefix: str = "", quiet: bool = False) -> None:
        self.prefix, self.quiet = prefix, quiet

    def __call__(self, what: str, call: Callable[[], Any]) -> Any:
        """Run ``call`` under a live line naming ``what`` (its block passes counted), then
        print ``what`` and the seconds it took."""
        start = time.perf_counter()
        shown = not self.quiet and live()  # elsewhere the line below is the phase's one line
        with phase(f"{self.prefix}{what}", enabled=shown):
            value = call()
        self.say(f"{what} ({time.perf_counter() - start:.1f} s)")
        return value

    def say(self, line: str) -> None:
        """Print one progress line."""
        if not self.quiet:
            print(f"probekit demo: {self.prefix}{line}", file=sys.stderr, flush=True)


def analyse(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    title: str,
    n_bootstrap: int = 100,
    *,
    phases: Phases | None = None,
    banner: str = "",
    plotly_src: str | None = None,
    checkpoint_label: str | None = None,
) -> dict[str, Any]:
    """Solution type, mechanisms and depth use of one anchor checkpoint, written to ``out``.

    ``phases`` prints a line per analysis with its time; ``banner`` and ``plotly_src`` go to
    :func:`~probekit.report.write_report`. Returns the verdict lines, the headline numbers
    and the :class:`~probekit.report.Diagnosis`.
    """
    from probekit.analyses.mechanisms.solutions import solution_types
    from probekit.data import describe
    from probekit.errors import CheckpointError
    from probekit.report import diagnose, write_report
    from probekit.sources import locate, resolve

    step = phases or Phases(quiet=True)
    folder, run = locate(checkpoint)  # the run folder read once, before anything loads
    if run is None or run.task is None:
        raise CheckpointError(
            f"{checkpoint} is no checkpoint of an anchor training run",
            fix="pass the checkpoint folder of a run of `probekit train`",
        )
    source = resolve(folder, run, device="cpu")
    model, data, positions = source.model, source.data, source.positions
    task = run.task
    solutions = step("solution types", lambda: solution_types(model, task.solution_data()))
    mechanisms = {
        name: step(name.replace("_", " "), call) for name, call in _mechanisms(model, task).items()
    }
    diagnosis = step(
        "depth diagnosis (6 analyses)",
        lambda: diagnose(model, data, positions=positions, pairs="all", n_bootstrap=n_bootstrap),
    )
    diagnosis.results = {"solutions": solutions, **mechanisms, **diagnosis.results}
    diagnosis.meta = {
        "checkpoint": checkpoint_label or os.path.abspath(checkpoint),
        "data_source": describe(data),
        **diagnosis.meta,
    }
    _add_solution(diagnosis, solutions.summary)
    step(
        "report",
        lambda: write_report(diagnosis, out, title=title, banner=banner, plotly_src=plotly_src),
    )
    return {"verdict": diagnosis.verdict, "headline": diagnosis.headline, "diagnosis": diagnosis}


def _mechanisms(model: Any, task: Any) -> dict[str, Callable[[], Any]]:
    """The mechanism analyses of an anchor model, as calls still to make: knockout, probes,
    condensation, token map."""
    from probekit.analyses.mechanisms.knockout import attention_knockout
    from probekit.analyses.mechanisms.probes import linear_probes
    from probekit.analyses.weights.condensation import condensation
    from probekit.analyses.weights.embeddings import embedding_map

    held = task.dataset("test_task")
    return {
        "attention_knockout": lambda: attention_knockout(model, held, by="role"),
        # probes on up to 800 sequences at the role positions: 80-class logistic probes are slow
        "probes": lambda: linear_probes(
            model,
            task.generate("test_data", min(800, task.n_test)),
            sites=("resid",),
            positions="roles",
        ),
        "condensation": lambda: condensation(model),
        "embedding_map": lambda: embedding_map(model, tokens=range(task.item_low, task.item_high)),
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
    except (OSError, ValueError, RecursionError):  # JSON nested too deep: RecursionError
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
    (see :func:`probekit.page.check_out_dir`).
    """
    from probekit.page import check_out_dir, page_folder  # light: a wrong --out is quick

    out = check_out_dir(out, force=force, recognise=is_demo_folder, what="demo")
    with page_folder(out, "demo") as tmp:
        build_demo(tmp, quick, progress, images)
    return out / "index.html"


def build_demo(out: Path, quick: bool, progress: bool, images: bool) -> Path:
    """The demo's runs, reports and index page, written into the folder ``out`` (which
    :func:`run_demo` makes beside its destination and swaps in whole); returns the index page.
    ``quick``, ``progress`` and ``images`` as for :func:`run_demo`."""
    import plotly.offline

    from probekit.anchor.training import train_stack
    from probekit.page import can_export_images, write_json
    from probekit.report import export_images

    phases = Phases(quiet=not progress)
    configs = reference_configs(quick)
    phases.say(
        f"training the two models as one stack ({configs[0].steps} steps each); {BAR_FIELDS}"
    )
    runs = phases("training", lambda: train_stack(configs, out / "runs", progress=progress))
    atomic_write_text(out / "plotly.min.js", plotly.offline.get_plotlyjs())
    cards, summary = [], {}
    for run in runs:
        phases.prefix = f"{run.name}: "
        result = analyse(
            run.checkpoint,
            out / run.name,
            f"probekit demo: {model_label(run.name)}" + (" (smoke run)" if quick else ""),
            n_bootstrap=10 if quick else 100,
            phases=phases,
            banner=QUICK_BANNER if quick else "",
            plotly_src="../plotly.min.js",
            checkpoint_label=os.path.relpath(run.checkpoint, out) + " (in the demo folder)",
        )
        if images and not quick and can_export_images():  # a smoke run: HTML figures only
            phases("PNG/SVG images", partial(export_images, result["diagnosis"], out / run.name))
        summary[run.name] = {**result["headline"], "verdict": result["verdict"]}
        cards.append(_card(run.name, result))
    summary["_about"] = {"quick": quick, "steps": configs[0].steps, "gammas": REFERENCE}
    write_json(out / "summary.json", summary)
    return atomic_write_text(out / "index.html", _index_page(cards, quick))


_HEADLINE_ROWS = (
    ("solution", "solution on the held-out pair", str),
    ("heldout_inferential", "held-out outputs inferential", "{:.1%}".format),
    ("heldout_symmetric", "held-out outputs symmetric", "{:.1%}".format),
    ("seen_test_accuracy", "seen pairs, unseen keys: accuracy", "{:.1%}".format),
    ("second_half_share", "second-half share of the output change", "{:.1%}".format),
    ("clean_loss", "loss of the answer", "{:.3f}".format),
    ("chance_loss", "loss of a uniform guess", "{:.3f}".format),
)


def model_label(name: str) -> str:
    """A reference model named by what it is (its initialization), not by the solution it
    is expected to find, which a short run may not reach.

    Example:
        >>> model_label("symmetric")
        'γ 0.5 model (large initial weights)'
    """
    gamma = REFERENCE[name]
    return f"γ {gamma} model ({'large' if gamma < 0.65 else 'small'} initial weights)"


def _card(name: str, result: dict[str, Any]) -> str:
    """One model's column of the index: γ, headline numbers, key figure, verdict."""
    head = result["headline"]
    rows = "".join(
        f"<tr><th>{label}</th><td>{html.escape(fmt(head[key]))}</td></tr>"
        for key, label, fmt in _HEADLINE_ROWS
        if head.get(key) is not None
    )
    figure = result["diagnosis"].results["attention_knockout"].figure()
    figure.layout.width = None  # the card's width, not the figure's own
    # the card's heading says what the figure is: a plotly title does not wrap in half a page
    figure.update_layout(height=420, autosize=True, title_text=None, margin_t=30)
    plot = figure_html(figure, fill=True)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in result["verdict"])
    return (
        f"<div class='card'><h2><a href='{name}/report.html'>{html.escape(model_label(name))}"
        f"</a></h2><p>found: <strong>{html.escape(str(head.get('solution')))}</strong> "
        f"(the paper's reference model of this γ is {html.escape(name)}; folder {name}/)</p>"
        f"<table>{rows}</table><h3>Attention-edge knockout: the answer's probability when "
        f"the query position cannot attend to one role</h3>{plot}"
        f"<details><summary>Verdict</summary><ul>{items}</ul></details>"
        f"<p><a href='{name}/report.html'>full report</a></p></div>"
    )


def _index_page(cards: list[str], quick: bool = False) -> str:
    """The demo's index.html: the two models side by side."""
    intro = (
        "<p>Two 2-layer models trained on the anchor-function task, differing only in "
        "their initialization rate γ. On the held-out anchor pair (4,3) the inferential "
        "solution composes the two anchors' shifts (x−10); the symmetric one copies the "
        "answer of the mirrored pair (3,4), x−6.</p>"
    )
    return html_page(
        "probekit demo",
        intro + side_by_side(cards),
        heading="probekit demo" + (" (smoke run)" if quick else ""),
        banner=QUICK_BANNER if quick else "",
        plotly_src="plotly.min.js",
    )


__all__ = [
    "BAR_FIELDS",
    "Phases",
    "QUICK_BANNER",
    "REFERENCE",
    "analyse",
    "build_demo",
    "is_demo_folder",
    "reference_configs",
    "run_demo",
]
