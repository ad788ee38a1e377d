"""Solution types on a compositional task: inferential, symmetric, memorizing or other.

For every group (the anchor task: every anchor pair) the classifier reads the model's next-token
prediction (argmax of the last-position logits) and reports the fraction of outputs that are

* ``inferential``: the data's ``answers()["inferential"]`` (the anchor task: the composite
  ``g(g(x; a1); a2)``, the generalizing solution),
* ``symmetric``: ``answers()["symmetric"]`` (the anchor task: the trained target of the mirrored
  pair ``(a2, a1)``, ``-1`` = none, then NaN), e.g. ``x - 6`` on the held-out pair ``(4, 3)``
  because ``(3, 4)`` is trained on it,
* ``other``: neither,

plus ``accuracy`` against the data's ``targets``. The data (:class:`~probekit.data.TaskData`)
holds both the seen groups (the anchor task: seen pairs on test keys) and the held-out ones,
told apart by ``heldout()``: :meth:`probekit.tasks.AnchorTask.solution_data` gives it. The model
is *memorizing* when seen groups score below 90%. The distribution of prediction minus the
inferential answer on the held-out groups is kept too (``metric == "diff"`` rows).

Works on any checkpoint :func:`probekit.load` opens whose vocabulary is the task's; the task a
probekit run was trained on is ``probekit.training.runs.load_run(path).task``.

Example:
    >>> from probekit.tasks import AnchorTask
    >>> from probekit.toy import toy_model
    >>> task = AnchorTask(n_train=64, n_test=32, vocab_size=50, item_high=40)
    >>> res = solution_types(toy_model("gpt2", n_layers=1), task.solution_data())
    >>> res.summary["solution"], res.summary["memorizing"]
    ('memorizing', True)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.data import TaskData, task_data
from probekit.errors import ConfigError, InputError, UnsupportedModelError
from probekit.model import Model, load
from probekit.result import Result

COLORS = {"inferential": "#2a9d8f", "symmetric": "#e76f51", "other": "#8d99ae"}
SEEN_COLORS = {"correct": "#457b9d", "wrong": "#d4d4d4"}
DIFF_COLORS = ("#264653", "#6d597a", "#b56576")
LABELS = {
    "inferential": "inferential (composite)",
    "symmetric": "symmetric (mirrored pair's target)",
    "other": "other",
}
ANSWERS = ("inferential", "symmetric")
"""The named answers of the task data that the solution types are read against."""
METRICS = ("accuracy", "inferential", "symmetric", "other")


class SolutionResult(Result):
    """Per-pair solution fractions (``df``), headline numbers (``summary``), and a figure.

    ``df`` columns: ``pair, heldout, n, metric, diff, value`` where ``pair`` is the group (the
    anchor pair) and ``metric`` is one of accuracy / inferential / symmetric / other (``diff``
    empty) or ``diff`` (``value`` is the fraction of held-out outputs at prediction - composite
    == ``diff``). ``summary``: ``seen_test_accuracy``, ``heldout_inferential``,
    ``heldout_symmetric``, ``heldout_other`` (held-out groups, all keys), the same three with
    the suffix ``_train_keys`` (held-out groups, training-key cells only: the official code's
    held-out evaluation; present when the data know their key split, NaN when there are no
    such cells), ``heldout_diff_mode``, ``memorizing``, ``solution``. ``heldout_symmetric`` is
    over the held-out sequences that have a symmetric answer (a trained mirror) and NaN when
    none has: never a 0 for an answer that does not exist.
    """

    kind = "solutions"

    def fractions(self) -> pd.DataFrame:
        """Wide table: one row per pair, columns accuracy / inferential / symmetric / other."""
        df = self.df[self.df["metric"] != "diff"]
        return df.pivot_table(
            index=["pair", "heldout", "n"], columns="metric", values="value"
        ).reset_index()

    def figure(self) -> go.Figure:
        """Stacked bars per pair (seen pairs: correct or wrong; held-out pairs: inferential,
        symmetric or other), and the held-out pairs' histogram of prediction - composite with
        the composite (0) and the symmetric answer marked."""
        fig = make_subplots(
            rows=1,
            cols=2,
            column_widths=[0.6, 0.4],
            horizontal_spacing=0.1,
            subplot_titles=(
                "Outputs per anchor pair (seen: test keys; held-out: all keys)",
                "Held-out pairs: prediction − composite",
            ),
        )
        self._pair_bars(fig)
        self._diff_bars(fig)
        figures.base_layout(fig, self._title(), width=1150, height=440)
        fig.update_layout(barmode="stack", bargap=0.15, legend_traceorder="normal")
        fig.update_yaxes(range=[0, 1.0], title_text="fraction of outputs", row=1, col=1)
        fig.update_yaxes(title_text="fraction of held-out outputs", row=1, col=2)
        fig.update_xaxes(title_text="anchor pair (seen, then held-out)", row=1, col=1)
        fig.update_xaxes(title_text="prediction − composite (tokens)", row=1, col=2)
        return fig

    def _pair_bars(self, fig: go.Figure) -> None:
        frac = self.df[self.df["metric"] != "diff"]
        seen = list(dict.fromkeys(frac[~frac["heldout"].astype(bool)].sort_values("pair")["pair"]))
        held = list(dict.fromkeys(frac[frac["heldout"].astype(bool)].sort_values("pair")["pair"]))
        table = frac.pivot_table(index="pair", columns="metric", values="value")
        acc = table.reindex(seen).get("accuracy", pd.Series(0.0, index=seen)).fillna(0.0)
        bars = [
            (seen, acc, "correct (trained target)", SEEN_COLORS["correct"], "seen pairs"),
            (seen, 1 - acc, "wrong", SEEN_COLORS["wrong"], "seen pairs"),
        ]
        for metric, color in COLORS.items():
            part = table.reindex(held).get(metric, pd.Series(0.0, index=held)).fillna(0.0)
            bars.append((held, part, metric, color, "held-out pairs"))
        for pairs, values, name, color, group in bars:
            if pairs:
                bar = go.Bar(
                    x=pairs,
                    y=list(values),
                    name=name,
                    marker_color=color,
                    legendgroup=group,
                    legendgrouptitle_text=group,
                    hovertext=LABELS.get(name, name),
                )
                fig.add_trace(bar, row=1, col=1)
        fig.update_xaxes(categoryorder="array", categoryarray=seen + held, row=1, col=1)

    def _diff_bars(self, fig: go.Figure) -> None:
        diff = self.df[self.df["metric"] == "diff"]
        offsets = [int(v) for v in (self.meta.get("symmetric_offsets") or {}).values()]
        reach = max([10, *(abs(o) + 4 for o in offsets)])
        clipped = diff.assign(bin=diff["diff"].clip(-reach - 2, reach + 2))
        for k, (pair, sub) in enumerate(clipped.groupby("pair")):
            counts = sub.groupby("bin")["value"].sum()
            fig.add_trace(
                go.Bar(
                    x=list(counts.index),
                    y=list(counts.values),
                    name=f"held-out pair {pair}",
                    marker_color=DIFF_COLORS[k % len(DIFF_COLORS)],
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
        marks = [(0, "composite ", "right")] + [(o, " symmetric", "left") for o in set(offsets)]
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

    def _title(self) -> str:
        s = self.summary
        if not s:
            return "Solution types"
        return (
            f"Solution: {s.get('solution')} (held-out inferential "
            f"{s.get('heldout_inferential', float('nan')):.2f}, symmetric "
            f"{s.get('heldout_symmetric', float('nan')):.2f}; seen pairs on test keys "
            f"{s.get('seen_test_accuracy', float('nan')):.2f})"
        )


def _last_token_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[batch, vocab]`` at the last position, through the probekit model handle."""
    return model.logits(tokens)[:, -1]


@torch.no_grad()
def predict(model: Model, data: TaskData, batch_size: int = 1024) -> torch.Tensor:
    """Argmax next-token predictions of ``model`` (a probekit ``Model``) on ``data``."""
    out = []
    for i in range(0, len(data), batch_size):
        tokens = data.tokens[i : i + batch_size].to(model.device)
        out.append(_last_token_logits(model, tokens).float().argmax(-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def solution_types(
    model: Any,
    data: Any,
    *,
    memorizing_threshold: float = 0.9,
    batch_size: int = 1024,
) -> SolutionResult:
    """Classify the solution a model found on a compositional task (see module docstring).

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: task data holding the seen and the held-out groups (e.g.
            ``task.solution_data()``), or a list of task data sets (concatenated).
        memorizing_threshold: seen-group accuracy below which the model is memorizing.
        batch_size: sequences per forward.
    """
    task = _check_data(data, memorizing_threshold)
    handle = load(model)
    handle.require_vocabulary("solution_types (it reads the model's predicted answers)")
    _check_model(handle, task)
    pred = predict(handle, task, batch_size)
    held = task.heldout().cpu().bool()
    rows = _group_rows(task, pred, held) + _diff_rows(task, pred, held)
    summary = _summary(task, pred, held, memorizing_threshold)
    df = pd.DataFrame(rows, columns=["pair", "heldout", "n", "metric", "diff", "value"])
    meta = {
        "symmetric_offsets": _symmetric_offsets(task, held),
        "memorizing_threshold": memorizing_threshold,
        "n_seen": int((~held).sum()),
        "n_heldout": int(held.sum()),
        "source": str(model) if isinstance(model, str | os.PathLike) else None,
    }
    return SolutionResult(df, summary, meta)


def _check_data(data: Any, memorizing_threshold: float) -> TaskData:
    task = task_data(data)
    if task is None:
        raise ConfigError(
            "no task data given: solution types need task data (TaskData) with seen and "
            "held-out groups",
            fix="pass task.solution_data() (the task the model was trained on; for a probekit "
            "run: probekit.training.runs.load_run(path).task.solution_data())",
        )
    missing = [a for a in ANSWERS if a not in task.answers()]
    if missing:
        raise ConfigError(
            f"the task data has no answers {missing}",
            fix=f"pass task data whose answers() name {list(ANSWERS)}",
        )
    held = task.heldout()
    if bool(held.all()) or not bool(held.any()):
        raise InputError(
            "solution types need both seen and held-out sequences",
            fix="pass task.solution_data() (seen pairs on test keys, then held-out pairs)",
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
            fix="pass the task the model was trained on (AnchorTask(vocab_size=...))",
        )
    seq_len = task.tokens.shape[1]
    if handle.n_ctx < seq_len:
        raise InputError(
            f"the model's context {handle.n_ctx} < the task's {seq_len} tokens",
            fix="pass the task the model was trained on",
        )


def _group_rows(task: TaskData, pred: torch.Tensor, held: torch.Tensor) -> list[dict[str, Any]]:
    """accuracy / inferential / symmetric / other per group: seen groups, then held-out ones."""
    labels = np.array(task.groups())
    answers = {k: task.answers()[k].cpu() for k in ANSWERS}
    rows = []
    for heldout in (False, True):
        for group in sorted(set(labels[(held == heldout).numpy()])):
            sel = torch.from_numpy(labels == group)
            p = pred[sel]
            inf = p == answers["inferential"][sel]
            has_sym = bool((answers["symmetric"][sel] != -1).any())
            sym = p == answers["symmetric"][sel]
            values = {
                "accuracy": float((p == task.targets[sel].cpu()).float().mean()),
                "inferential": float(inf.float().mean()),
                "symmetric": float(sym.float().mean()) if has_sym else float("nan"),
                "other": float((~(inf | sym) if has_sym else ~inf).float().mean()),
            }
            base = {"pair": group, "heldout": heldout, "n": int(sel.sum())}
            rows += [{**base, "metric": m, "diff": np.nan, "value": values[m]} for m in METRICS]
    return rows


def _diff_rows(task: TaskData, pred: torch.Tensor, held: torch.Tensor) -> list[dict[str, Any]]:
    """Share of held-out outputs at each prediction - inferential answer, per held-out group."""
    diff = (pred - task.answers()["inferential"].cpu())[held].numpy()
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


def _fractions(task: TaskData, pred: torch.Tensor, sel: torch.Tensor, suffix: str) -> dict:
    """Held-out inferential / symmetric / other on the sequences ``sel`` (NaN when none;
    symmetric over the sequences that have a symmetric answer, NaN when none has)."""
    keys = [f"heldout_{k}{suffix}" for k in ("inferential", "symmetric", "other")]
    if not bool(sel.any()):
        return dict.fromkeys(keys, float("nan"))
    answers = {k: task.answers()[k].cpu()[sel] for k in ANSWERS}
    p = pred[sel]
    inf, sym = p == answers["inferential"], p == answers["symmetric"]
    has_sym = answers["symmetric"] != -1
    symmetric = float(sym[has_sym].float().mean()) if bool(has_sym.any()) else float("nan")
    return dict(
        zip(
            keys,
            (float(inf.float().mean()), symmetric, float((~(inf | sym)).float().mean())),
            strict=True,
        )
    )


def _symmetric_offsets(task: TaskData, held: torch.Tensor) -> dict[str, int]:
    """Per held-out group, the symmetric answer minus the inferential one when it is one
    number for the whole group (the anchor task's (4,3): +4), for the figure's marker."""
    answers = {k: task.answers()[k].cpu()[held] for k in ANSWERS}
    labels = np.array(task.groups())[held.numpy()]
    out = {}
    for group in sorted(set(labels)):
        sel = torch.from_numpy(labels == group)
        has = answers["symmetric"][sel] != -1
        values = set((answers["symmetric"][sel] - answers["inferential"][sel])[has].tolist())
        if len(values) == 1:
            out[str(group)] = int(values.pop())
    return out


def _summary(
    task: TaskData, pred: torch.Tensor, held: torch.Tensor, memorizing_threshold: float
) -> dict[str, Any]:
    p = pred[held]
    inferential = task.answers()["inferential"].cpu()[held]
    summary: dict[str, Any] = {
        "seen_test_accuracy": float((pred[~held] == task.targets.cpu()[~held]).float().mean()),
        **_fractions(task, pred, held, ""),
        "heldout_diff_mode": float(pd.Series((p - inferential).numpy()).mode().iloc[0]),
    }
    on_training_keys = getattr(task, "on_training_keys", None)
    if callable(on_training_keys) and getattr(task, "key_modulus", 0) is not None:
        summary.update(_fractions(task, pred, held & on_training_keys().cpu(), "_train_keys"))
    memorizing = summary["seen_test_accuracy"] < memorizing_threshold
    summary["memorizing"] = bool(memorizing)
    if memorizing:
        summary["solution"] = "memorizing"
    else:
        fr = {k: summary[f"heldout_{k}"] for k in ("inferential", "symmetric", "other")}
        summary["solution"] = max((k for k in fr if np.isfinite(fr[k])), key=fr.get)
    return summary


__all__ = ["SolutionResult", "predict", "solution_types"]
