"""Per-pair convergence curves of an anchor run: the accuracy of every anchor pair over
training, read from the ``pair_acc`` entries of the run's ``metrics.jsonl``
(:data:`probekit.anchor.evaluation.PAIR_ACC`).

The papers observe that the pairs are learned at different times; :func:`pair_curves` gathers
the curves, :meth:`PairCurvesResult.learned_steps` says when each seen pair first reaches the
``threshold`` accuracy on its training keys, and :meth:`PairCurvesResult.figure` draws one line
per pair in one panel per split.

Example:
    >>> import tempfile
    >>> from probekit.anchor import AnchorTask, TrainConfig, train
    >>> from probekit.training.models import ModelConfig
    >>> cfg = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), steps=4, batch_size=8,
    ...                   eval_every=2, task=AnchorTask(n_train=64, n_test=16))
    >>> out = train(cfg, tempfile.mkdtemp(), progress=False)
    >>> curves = pair_curves(out.out_dir)
    >>> sorted(set(curves.df.step)), curves.summary["n_pairs"]
    ([0, 2, 4], 15)
    >>> fig = curves.figure()                   # one line per pair, one panel per split
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probekit import figures
from probekit.anchor.evaluation import PAIR_ACC
from probekit.errors import InputError
from probekit.result import Result
from probekit.training.metrics import read_metrics
from probekit.words import AXES, FIGURES, figure_words

SPLITS = ("train", "test_data", "test_task")
"""The splits of the per-pair accuracies, in the figure's order."""

THRESHOLD = 0.9
"""The accuracy at which a pair counts as learned (:meth:`PairCurvesResult.learned_steps`)."""


CONCLUSION = (
    "The seen pairs first reach {threshold:.0%} accuracy on their training keys between step "
    "{first_learned_step} and step {last_learned_step} ({n_not_learned} of {n_pairs} never do)."
)
"""The report section's sentence (its numbers from the summary)."""


class PairCurvesResult(Result):
    """``df`` columns: ``run``, ``step``, ``split`` (train / test_data / test_task),
    ``pair`` (``"(a1,a2)"``), ``accuracy``. ``summary``: ``n_pairs`` (the pairs seen in
    training), ``threshold``, ``first_learned_step`` and ``last_learned_step`` (the earliest and
    latest step at which a seen pair first reaches ``threshold`` on its training keys; None when
    none does), ``n_not_learned`` (the seen pairs that never do) and ``learned_spread`` (last
    minus first: how far apart in training the pairs are learned)."""

    kind = "pair_curves"

    def learned_steps(self, threshold: float | None = None) -> pd.DataFrame:
        """Per run and seen pair, the first step at which its accuracy on its training keys
        reaches ``threshold`` (default the result's); NaN where it never does."""
        t = self.summary.get("threshold", THRESHOLD) if threshold is None else threshold
        return _learned_steps(self.df, t)

    def figure(self, run: str | None = None) -> go.Figure:
        """Accuracy against the training step, one line per pair (coloured alike in every
        panel; held-out pairs dashed), one panel per split; ``run`` picks one run of a stack
        (default: the first). Chains of three anchors and more are coloured, and named in the
        legend, by their first two anchors (each line names its chain on hover)."""
        df = self.df
        runs = list(dict.fromkeys(df["run"]))
        part = df[df["run"] == (runs[0] if run is None else run)]
        splits = [s for s in SPLITS if s in set(part["split"])]
        pairs = sorted(set(part["pair"]), key=_anchor_ids)
        chains = len(_anchor_ids(pairs[0])) > 2
        unit = "chain" if chains else "pair"
        groups = list(dict.fromkeys(_group(p, chains) for p in pairs))
        colours = dict(zip(groups, _colours(len(groups)), strict=True))
        held = set(part[part["split"] == "test_task"]["pair"])  # drawn dashed
        fig = make_subplots(
            rows=1,
            cols=len(splits),
            shared_yaxes=True,
            subplot_titles=[figure_words("pair_curves", s, unit=unit) for s in splits],
            horizontal_spacing=0.04,
        )
        for col, split in enumerate(splits, 1):
            for pair in pairs:
                line = part[(part["split"] == split) & (part["pair"] == pair)].sort_values("step")
                if line.empty:
                    continue
                group = _group(pair, chains)
                fig.add_trace(
                    go.Scatter(
                        x=line["step"],
                        y=line["accuracy"],
                        mode="lines",
                        name=figure_words("pair_curves", "legend", unit=unit, pair=group),
                        legendgroup=group,
                        showlegend=group not in _shown(fig),
                        hovertext=f"{unit} {pair}",
                        line={
                            "color": colours[group],
                            "width": 1.5,
                            "dash": "dash" if pair in held else "solid",
                        },
                    ),
                    row=1,
                    col=col,
                )
        for col in range(1, len(splits) + 1):
            fig.update_xaxes(title_text=AXES["training_step"], row=1, col=col)
        fig.update_yaxes(title_text=FIGURES["pair_curves"]["y"], range=[-0.02, 1.02], row=1, col=1)
        title = figure_words("pair_curves", unit=unit, **_title_values(self.summary))
        return figures.fit_top(figures.base_layout(fig, title, width=1100, height=440))


def _anchor_ids(pair: str) -> list[int]:
    """``"(1,2,3)"`` -> ``[1, 2, 3]``."""
    return [int(a) for a in pair.strip("()").split(",")]


def _group(pair: str, chains: bool) -> str:
    """A pair's legend entry: itself, or for a chain its first two anchors, ``"(1,2,…)"``."""
    return pair if not chains else "(" + ",".join(pair.strip("()").split(",")[:2]) + ",…)"


def _shown(fig: go.Figure) -> set[str]:
    """The legend groups that already have a legend entry."""
    return {t.legendgroup for t in fig.data if t.showlegend}


def _colours(n: int) -> list[str]:
    """``n`` colours told apart: probekit's palette, a 24-colour qualitative one, then a
    sampled scale (chains of three anchors and more)."""
    from plotly.colors import qualitative, sample_colorscale

    for palette in (figures.PALETTE, qualitative.Dark24):
        if n <= len(palette):
            return list(palette[:n])
    return sample_colorscale("Turbo", [i / max(1, n - 1) for i in range(n)])


def _title_values(summary: dict[str, Any]) -> dict[str, Any]:
    """The figure title's numbers in words (a pair that is never learned reads 'never')."""
    said = {k: summary.get(k) for k in ("first_learned_step", "last_learned_step")}
    return {
        "threshold": summary.get("threshold", THRESHOLD),
        **{k: "never" if v is None else f"{v:g}" for k, v in said.items()},
    }


def _learned_steps(df: pd.DataFrame, threshold: float) -> pd.DataFrame:
    seen = df[df["split"] == "train"]
    rows = []
    for (run, pair), part in seen.groupby(["run", "pair"], sort=False):
        reached = part[part["accuracy"] >= threshold]["step"]
        rows.append(
            {"run": run, "pair": pair, "step": float(reached.min()) if len(reached) else None}
        )
    return pd.DataFrame(rows, columns=["run", "pair", "step"])


def _rows_of(source: Any) -> list[dict[str, Any]]:
    """The metrics rows of a run folder, a ``metrics.jsonl`` or a list of rows."""
    if isinstance(source, list | tuple):
        return list(source)
    path = Path(source)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise InputError(
            f"{source} holds no metrics.jsonl",
            fix="pass the output folder of probekit train (or its metrics.jsonl)",
        )
    return read_metrics(path, up_to_step=2**62)


def pair_curves(
    source: str | os.PathLike | list[dict[str, Any]],
    *,
    run: str | None = None,
    threshold: float = THRESHOLD,
) -> PairCurvesResult:
    """The per-pair accuracies over training of an anchor run (see the module docstring).

    Args:
        source: the run's output folder, its ``metrics.jsonl``, or the metrics rows.
        run: one run of a stack's metrics (default: every run).
        threshold: the accuracy at which a pair counts as learned.
    """
    rows = [r for r in _rows_of(source) if isinstance(r.get(PAIR_ACC), dict)]
    if run is not None:
        rows = [r for r in rows if r.get("run") == run]
    if not rows:
        raise InputError(
            f"the metrics of {source if not isinstance(source, list) else 'the rows'} hold no "
            "per-pair accuracies" + (f" of run {run!r}" if run else ""),
            fix="train with a probekit that writes them (pair_acc in metrics.jsonl), or pass "
            "the run's name",
        )
    df = pd.DataFrame(
        [
            {
                "run": str(r.get("run", "run")),
                "step": r["step"],
                "split": split,
                "pair": pair,
                "accuracy": float("nan") if acc is None else acc,
            }  # fmt: skip
            for r in rows
            for split, accs in r[PAIR_ACC].items()
            for pair, acc in accs.items()
        ]
    )
    learned = _learned_steps(df, threshold)["step"]
    first, last = learned.min(), learned.max()
    summary = {
        "n_pairs": int(df[df["split"] == "train"]["pair"].nunique()),
        "threshold": threshold,
        "first_learned_step": None if pd.isna(first) else float(first),
        "last_learned_step": None if pd.isna(last) else float(last),
        "n_not_learned": int(learned.isna().sum()),
        "learned_spread": None if pd.isna(first) else float(last - first),
    }
    meta: dict[str, Any] = {
        "source": str(source) if not isinstance(source, list) else "rows",
        "run": run,
        "wording": {"conclusion": CONCLUSION},
    }
    return PairCurvesResult(df, summary, meta)


def checkpoint_pair_curves(checkpoint: str | os.PathLike, run: str) -> PairCurvesResult | None:
    """The per-pair curves of the run ``run`` that wrote ``checkpoint`` (its ``checkpoint/``,
    a kept ``checkpoints/step-N/`` or a stack's ``checkpoint/<run>/``): from the
    ``metrics.jsonl`` of the run folder above it; None when there is none or it holds no
    per-pair accuracies (a run trained before they were written).

    Example:
        >>> import tempfile
        >>> checkpoint_pair_curves(tempfile.mkdtemp(), "run") is None
        True
    """
    folder = Path(checkpoint).resolve()
    for parent in [folder, *folder.parents][:4]:
        if (parent / "metrics.jsonl").is_file():
            try:
                return pair_curves(parent, run=run)
            except InputError:
                return None
    return None


__all__ = [
    "SPLITS",
    "THRESHOLD",
    "PairCurvesResult",
    "checkpoint_pair_curves",
    "pair_curves",
]
