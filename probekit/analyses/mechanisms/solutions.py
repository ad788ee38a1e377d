"""Solution types on a compositional task: which answer category a model's outputs fall in.

For every group (the task data's ``groups()``) the classifier reads the model's next-token
prediction (argmax of the last-position logits) and reports the fraction of outputs in each of
the task's answer categories (``categories()``, sorted by its ``classify()``; a category with
no answer for a sequence is left out of that sequence's count, and its fraction is NaN where it
has none), plus ``accuracy`` against the data's ``targets``. The task data
(:class:`~probekit.data.TaskData`) hold both the seen groups and the held-out ones, told apart
by ``heldout()``; the words of the figure and of the report come from its
``solution_wording()`` and ``group_label``.

The model's solution is the category with the largest fraction of held-out outputs, or the
wording's ``memorizing`` when the seen groups score below ``memorizing_threshold`` (90%): a
model that has not learned the seen groups has no solution on the held-out ones. The
distribution of prediction minus the first category's answer (the reference) on the held-out
groups is kept too (``metric == "diff"`` rows). The anchor task's categories (inferential,
symmetric, other) and its data are in :mod:`probekit.anchor`.

Works on any checkpoint :func:`probekit.load` opens whose vocabulary is the task's; the task a
probekit run was trained on is ``probekit.run_folders.load_run(path).task``.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.toy import toy_model
    >>> task = AnchorTask(n_train=64, n_test=32, vocab_size=50, item_high=40)
    >>> res = solution_types(toy_model("gpt2", n_layers=1), task.solution_data())
    >>> res.summary["solution"], res.summary["memorizing"]
    ('memorizing', True)
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses.common import DataOrTask, result_meta
from probekit.data import (
    SolutionWording,
    TaskData,
    category_shares,
    check_batch_size,
    task_data,
)
from probekit.errors import ConfigError, InputError, UnsupportedModelError
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import figure_words

CATEGORY_COLORS = ("#2a9d8f", "#e76f51", "#8d99ae", "#e9c46a", "#6d597a", "#b56576")
"""The colours of the answer categories, in the task's order."""
SEEN_COLORS = {"correct": "#457b9d", "wrong": "#d4d4d4"}
DIFF_COLORS = ("#264653", "#6d597a", "#b56576")


class SolutionResult(Result):
    """Per-group solution fractions (``df``), headline numbers (``summary``), and a figure.

    ``df`` columns: ``pair, heldout, n, metric, diff, value`` where ``pair`` is the group
    (the anchor task: the anchor pair) and ``metric`` is ``accuracy`` or one of the task's
    answer categories (``diff`` empty), or ``diff`` (``value`` is the fraction of held-out
    outputs at prediction - reference answer == ``diff``). ``summary``: ``seen_test_accuracy``,
    ``heldout_<category>`` for each category (held-out groups, all their sequences; over the
    sequences where the category has an answer, NaN when none has: never a 0 for an answer
    that does not exist), ``heldout_diff_mode``, the same category fractions with the suffix
    ``_<subset>`` for each of the task data's ``subsets()`` (the anchor task: ``_train_keys``,
    the official code's held-out evaluation; NaN when the subset holds no held-out sequence),
    ``memorizing`` and ``solution``. ``meta`` keeps the task's ``categories`` and ``wording``
    (the words of the figure and of the report) and, per category other than the reference,
    its ``answer_offsets`` from the reference on each held-out group.
    """

    kind = "solutions"

    def fractions(self) -> pd.DataFrame:
        """Wide table: one row per group, columns accuracy and the answer categories."""
        df = self.df[self.df["metric"] != "diff"]
        return df.pivot_table(
            index=["pair", "heldout", "n"], columns="metric", values="value"
        ).reset_index()

    def categories(self) -> dict[str, str]:
        """The task's answer categories, in order, with their descriptions."""
        known = self.meta.get("categories")
        if isinstance(known, dict) and known:
            return {str(k): str(v) for k, v in known.items()}
        metrics = self.df["metric"][~self.df["metric"].isin(["accuracy", "diff"])]
        return {str(m): str(m) for m in dict.fromkeys(metrics)}

    def wording(self) -> dict[str, str]:
        """The words of the figure and the report: the task's ``group_label`` as ``group``
        and its :class:`~probekit.data.SolutionWording` (defaults where a saved result lacks
        them)."""
        stored = self.meta.get("wording")
        return {
            "group": "group",
            **asdict(SolutionWording()),
            **(stored if isinstance(stored, dict) else {}),
        }

    def figure(self) -> go.Figure:
        """Stacked bars per group (seen groups: correct or wrong; held-out groups: one bar per
        answer category), and the held-out groups' histogram of prediction - reference answer
        with the reference (0) and the other answers marked."""
        words = self.wording()
        fig = make_subplots(
            rows=1,
            cols=2,
            column_widths=[0.6, 0.4],
            horizontal_spacing=0.1,
            subplot_titles=(
                figure_words("solutions", "left", **words),
                figure_words("solutions", "right", **words),
            ),
        )
        self._group_bars(fig, words)
        self._diff_bars(fig, words)
        figures.base_layout(fig, self._title(words), width=1150, height=440)
        # one column per legend group (seen, held-out, the difference), each under its title
        fig.update_layout(barmode="stack", bargap=0.15, legend_traceorder="grouped")
        fig.update_layout(legend_entrywidth=None, legend_tracegroupgap=40)
        for col, side in ((1, "left"), (2, "right")):
            x_title = figure_words("solutions", f"x_{side}", **words)
            fig.update_xaxes(title_text=x_title, row=1, col=col)
            fig.update_yaxes(title_text=figure_words("solutions", f"y_{side}"), row=1, col=col)
        fig.update_yaxes(range=[0, 1.0], row=1, col=1)
        return fig

    def _group_bars(self, fig: go.Figure, words: dict[str, str]) -> None:
        frac = self.df[self.df["metric"] != "diff"]
        seen = list(dict.fromkeys(frac[~frac["heldout"].astype(bool)].sort_values("pair")["pair"]))
        held = list(dict.fromkeys(frac[frac["heldout"].astype(bool)].sort_values("pair")["pair"]))
        table = frac.pivot_table(index="pair", columns="metric", values="value")
        acc = table.reindex(seen).get("accuracy", pd.Series(0.0, index=seen)).fillna(0.0)
        seen_group = figure_words("solutions", "seen", **words)
        held_group = figure_words("solutions", "heldout", **words)
        correct, wrong = (figure_words("solutions", k, **words) for k in ("correct", "wrong"))
        bars = [
            (seen, acc, correct, SEEN_COLORS["correct"], seen_group),
            (seen, 1 - acc, wrong, SEEN_COLORS["wrong"], seen_group),
        ]
        categories = self.categories()
        for k, metric in enumerate(categories):
            part = table.reindex(held).get(metric, pd.Series(0.0, index=held)).fillna(0.0)
            color = CATEGORY_COLORS[k % len(CATEGORY_COLORS)]
            bars.append((held, part, metric, color, held_group))
        for groups, values, name, color, legend_group in bars:
            if groups:
                bar = go.Bar(
                    x=groups,
                    y=list(values),
                    name=name,
                    marker_color=color,
                    legendgroup=legend_group,
                    legendgrouptitle_text=legend_group,
                    hovertext=categories.get(name, name),
                )
                fig.add_trace(bar, row=1, col=1)
        fig.update_xaxes(categoryorder="array", categoryarray=seen + held, row=1, col=1)

    def _answer_offsets(self) -> dict[str, list[int]]:
        """Per category other than the reference, its offsets from the reference answer."""
        stored = self.meta.get("answer_offsets") or {}
        return {
            str(name): [int(v) for v in per_group.values()] for name, per_group in stored.items()
        }

    def _diff_bars(self, fig: go.Figure, words: dict[str, str]) -> None:
        diff = self.df[self.df["metric"] == "diff"]
        marks_of = self._answer_offsets()
        offsets = [o for values in marks_of.values() for o in values]
        reach = max([10, *(abs(o) + 4 for o in offsets)])
        clipped = diff.assign(bin=diff["diff"].clip(-reach - 2, reach + 2))
        for k, (group, sub) in enumerate(clipped.groupby("pair")):
            counts = sub.groupby("bin")["value"].sum()
            fig.add_trace(
                go.Bar(
                    x=list(counts.index),
                    y=list(counts.values),
                    name=figure_words("solutions", "heldout_group", **{**words, "name": group}),
                    marker_color=DIFF_COLORS[k % len(DIFF_COLORS)],
                    legendgroup="difference",
                    legendgrouptitle_text=figure_words("solutions", "difference", **words),
                    width=0.8,
                ),
                row=1,
                col=2,
            )
        marked = {0, *offsets}
        grid = [t for t in range(-reach, reach + 1, 5) if all(abs(t - m) > 2 for m in marked)]
        ticks = sorted({*marked, *grid})
        fig.update_xaxes(
            range=[-reach - 3, reach + 3],
            tickvals=[-reach - 2, *ticks, reach + 2],
            ticktext=[f"≤{-reach - 2}", *[f"{t:+d}" if t else "0" for t in ticks], f"≥{reach + 2}"],
            tickangle=0,
            row=1,
            col=2,
        )
        marks = [(0, f"{words['reference']} ", "right")] + [
            (o, f" {name}", "left") for name, values in marks_of.items() for o in set(values)
        ]
        for x, text, side in marks:
            fig.add_vline(x=x, line={"dash": "dot", "color": "#555", "width": 1}, row=1, col=2)
            fig.add_annotation(
                x=x,
                xref="x2",
                y=0.98,
                yref="y2 domain",
                text=text,
                showarrow=False,
                yanchor="top",
                xanchor=side,
                font={"size": 11},
            )

    def _title(self, words: dict[str, str]) -> str:
        s = self.summary
        if not s:
            return figure_words("solutions", "empty")
        categories = list(self.categories())
        answered = [c for c in categories if c == categories[0] or c in self._answer_offsets()]
        shares = ", ".join(f"{c} {s.get(f'heldout_{c}', float('nan')):.2f}" for c in answered)
        accuracy = s.get("seen_test_accuracy", float("nan"))
        return figure_words(
            "solutions", solution=s.get("solution"), shares=shares, accuracy=accuracy, **words
        )


def last_token_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[batch, vocab]`` at the last position, through the probekit model handle: what
    :func:`predict` (and so :func:`solution_types`) reads of the model."""
    return model.logits(tokens)[:, -1]


@torch.no_grad()
def predict(model: Model, data: TaskData, batch_size: int | None = None) -> torch.Tensor:
    """Argmax next-token predictions of ``model`` (a probekit ``Model``) on ``data``, in
    batches of ``batch_size`` sequences (``None``: the model's memory-bounded choice,
    :meth:`~probekit.Model.default_batch_size`)."""
    out = []
    check_batch_size(batch_size)
    if batch_size is None:
        batch_size = model.default_batch_size(int(data.tokens.shape[-1]))
    for i in range(0, len(data), batch_size):
        tokens = data.tokens[i : i + batch_size].to(model.device)
        out.append(last_token_logits(model, tokens).float().argmax(-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def solution_types(
    model: Model,
    data: DataOrTask,
    *,
    memorizing_threshold: float = 0.9,
    batch_size: int | None = None,
) -> SolutionResult:
    """Classify the solution a model found on a compositional task (see module docstring).

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: task data holding the seen and the held-out groups (e.g. the anchor task's
            ``task.solution_data()``), or a list of task data sets (concatenated).
        memorizing_threshold: seen-group accuracy below which the model is memorizing.
        batch_size: sequences per forward (``None``: the automatic, memory-bounded choice).

    It reads the answer at the last position of each sequence (``positions="last"`` in its
    meta), where a compositional task's answer is predicted; it takes no ``positions``.
    """
    task = _check_data(data, memorizing_threshold)
    handle = load(model)
    handle.require_vocabulary("solution_types (it reads the model's predicted answers)")
    _check_model(handle, task)
    pred = predict(handle, task, batch_size)
    held = task.heldout().cpu().bool()
    found = task.classify(pred.to(task.targets.device))
    classified = {name: found[name].cpu() for name in task.categories()}
    reference = next(iter(task.categories()))
    rows = _group_rows(task, pred, held, classified) + _diff_rows(task, pred, held, reference)
    summary = _summary(task, pred, held, classified, memorizing_threshold)
    df = pd.DataFrame(rows, columns=["pair", "heldout", "n", "metric", "diff", "value"])
    meta = result_meta(handle, positions="last", batch_size=batch_size)
    meta |= {
        "answer_offsets": _answer_offsets(task, held, reference),
        "memorizing_threshold": memorizing_threshold,
        "n_seen": int((~held).sum()),
        "n_heldout": int(held.sum()),
        "source": str(model) if isinstance(model, str | os.PathLike) else None,
        "categories": dict(task.categories()),
        "wording": {"group": task.group_label, **asdict(task.solution_wording())},
    }
    return SolutionResult(df, summary, meta)


def _check_data(data: Any, memorizing_threshold: float) -> TaskData:
    task = task_data(data)
    if task is None:
        raise ConfigError(
            "no task data given: solution types need task data (TaskData) with seen and "
            "held-out groups",
            fix="pass task.solution_data() (the task the model was trained on; for a probekit "
            "run: probekit.run_folders.load_run(path).task.solution_data())",
        )
    categories = list(task.categories())
    if not categories or categories[0] not in task.answers():
        raise ConfigError(
            f"the task data's first answer category ({categories[0] if categories else 'none'})"
            f" is not one of its answers {list(task.answers())}",
            fix="list first in categories() the answer that predictions are compared with",
        )
    held = task.heldout()
    if bool(held.all()) or not bool(held.any()):
        raise InputError(
            "solution types need both seen and held-out sequences",
            fix="pass task data with seen and held-out groups (e.g. task.solution_data())",
        )
    if not (0.0 < memorizing_threshold <= 1.0):
        raise ConfigError(
            f"memorizing_threshold {memorizing_threshold} is not in (0, 1]",
            fix="use 0.9 as in the papers",
        )
    return task


def _check_model(handle: Model, task: TaskData) -> None:
    if not handle.is_causal:
        raise UnsupportedModelError(
            "solution types need a next-token (causal) model; this one is a masked LM",
            fix="pass a decoder trained on the task",
        )
    vocab = task.vocab_size
    if vocab is not None and handle.d_vocab != vocab:
        raise InputError(
            f"the model's vocabulary has {handle.d_vocab} tokens, the task's {vocab}",
            fix="pass the task the model was trained on (its vocab_size)",
        )
    seq_len = task.tokens.shape[1]
    if handle.n_ctx < seq_len:
        raise InputError(
            f"the model's context {handle.n_ctx} < the task's {seq_len} tokens",
            fix="pass the task the model was trained on",
        )


def _group_rows(
    task: TaskData, pred: torch.Tensor, held: torch.Tensor, classified: dict[str, torch.Tensor]
) -> list[dict[str, Any]]:
    """accuracy and the category fractions per group: seen groups, then held-out ones."""
    labels = np.array(task.groups())
    targets = task.targets.cpu()
    metrics = ("accuracy", *classified)
    rows = []
    for heldout in (False, True):
        for group in sorted(set(labels[(held == heldout).numpy()])):
            sel = torch.from_numpy(labels == group)
            values = {
                "accuracy": float((pred[sel] == targets[sel]).float().mean()),
                **category_shares(classified, sel),
            }
            base = {"pair": group, "heldout": heldout, "n": int(sel.sum())}
            rows += [{**base, "metric": m, "diff": np.nan, "value": values[m]} for m in metrics]
    return rows


def _diff_rows(
    task: TaskData, pred: torch.Tensor, held: torch.Tensor, reference: str
) -> list[dict[str, Any]]:
    """Share of held-out outputs at each prediction - reference answer, per held-out group."""
    diff = (pred - task.answers()[reference].cpu())[held].numpy()
    labels = np.array(task.groups())[held.numpy()]
    rows = []
    for group, sub in pd.DataFrame({"pair": labels, "diff": diff}).groupby("pair"):
        counts = sub["diff"].value_counts(normalize=True).sort_index()
        for d, frac in counts.items():
            rows.append(
                {
                    "pair": group,
                    "heldout": True,
                    "n": len(sub),
                    "metric": "diff",
                    "diff": float(d),
                    "value": float(frac),
                }  # fmt: skip
            )
    return rows


def _heldout_shares(
    classified: dict[str, torch.Tensor], sel: torch.Tensor, suffix: str
) -> dict[str, float]:
    """The category fractions on the held-out sequences ``sel``, keyed ``heldout_<category>``
    plus ``suffix`` (NaN when ``sel`` is empty or the category has no answer there)."""
    return {f"heldout_{k}{suffix}": v for k, v in category_shares(classified, sel).items()}


def _answer_offsets(task: TaskData, held: torch.Tensor, reference: str) -> dict[str, dict]:
    """Per answer category other than the reference, per held-out group, its answer minus
    the reference answer when that is one number for the whole group (the anchor task's
    symmetric answer on (4,3): +4), for the figure's markers."""
    answers = {k: v.cpu()[held] for k, v in task.answers().items()}
    labels = np.array(task.groups())[held.numpy()]
    out: dict[str, dict] = {}
    for name in task.categories():
        if name == reference or name not in answers:
            continue
        out[name] = {}
        for group in sorted(set(labels)):
            sel = torch.from_numpy(labels == group)
            has = answers[name][sel] != -1
            values = set((answers[name][sel] - answers[reference][sel])[has].tolist())
            if len(values) == 1:
                out[name][str(group)] = int(values.pop())
    return out


def _summary(
    task: TaskData,
    pred: torch.Tensor,
    held: torch.Tensor,
    classified: dict[str, torch.Tensor],
    memorizing_threshold: float,
) -> dict[str, Any]:
    reference = next(iter(task.categories()))
    p = pred[held]
    answer = task.answers()[reference].cpu()[held]
    summary: dict[str, Any] = {
        "seen_test_accuracy": float((pred[~held] == task.targets.cpu()[~held]).float().mean()),
        **_heldout_shares(classified, held, ""),
        "heldout_diff_mode": float(pd.Series((p - answer).numpy()).mode().iloc[0]),
    }
    for name, subset in task.subsets().items():
        summary.update(_heldout_shares(classified, held & subset.cpu().bool(), f"_{name}"))
    memorizing = summary["seen_test_accuracy"] < memorizing_threshold
    summary["memorizing"] = bool(memorizing)
    if memorizing:
        summary["solution"] = task.solution_wording().memorizing
    else:
        fr = {k: summary[f"heldout_{k}"] for k in classified}
        summary["solution"] = max((k for k in fr if np.isfinite(fr[k])), key=fr.__getitem__)
    return summary


__all__ = ["SolutionResult", "last_token_logits", "predict", "solution_types"]
