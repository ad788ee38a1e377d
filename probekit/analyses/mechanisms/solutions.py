"""Solution types on the anchor-function task: inferential, symmetric, memorizing or other.

For every anchor pair the classifier reads the model's next-token prediction (argmax of the
last-position logits) and reports the fraction of outputs that are

* ``inferential``: the composite ``g(g(x; a1); a2)`` (the generalizing solution),
* ``symmetric``: the trained target of the mirrored pair ``(a2, a1)`` (NaN when the mirror is not
  trained), e.g. ``x - 6`` on the held-out pair ``(4, 3)`` because ``(3, 4)`` is trained on it,
* ``other``: neither,

plus ``accuracy`` against the split's label. Seen pairs are measured on the test keys
(``test_data``), held-out pairs on ``test_task``. The model is *memorizing* when seen pairs on
test keys score below 90%. The distribution of prediction minus composite on the held-out pairs
is kept too (``metric == "diff"`` rows).

Works on any checkpoint :func:`probekit.load` opens whose vocabulary is the task's.

Example:
    >>> res = solution_types("runs/anchor-g0.8/checkpoint")        # doctest: +SKIP
    >>> res.summary["solution"], res.summary["heldout_inferential"]  # doctest: +SKIP
    ('inferential', 0.97)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit.errors import ConfigError, InputError, UnsupportedModelError
from probekit.result import Result
from probekit.tasks.anchor import AnchorData, AnchorTask

COLORS = {"inferential": "#2a9d8f", "symmetric": "#e76f51", "other": "#8d99ae"}


class SolutionResult(Result):
    """Per-pair solution fractions (``df``), headline numbers (``summary``), and a figure.

    ``df`` columns: ``split, pair, a1, a2, heldout, n, metric, diff, value`` where ``metric`` is
    one of accuracy / inferential / symmetric / other (``diff`` empty) or ``diff`` (``value`` is
    the fraction of held-out outputs at prediction - composite == ``diff``).
    """

    kind = "solutions"

    def fractions(self) -> pd.DataFrame:
        """Wide table: one row per pair, columns accuracy / inferential / symmetric / other."""
        df = self.df[self.df["metric"] != "diff"]
        return df.pivot_table(index=["split", "pair", "heldout", "n"], columns="metric",
                              values="value").reset_index()

    def figure(self) -> go.Figure:
        """Stacked bars of the solution fractions per pair, and the held-out diff histogram."""
        df = self.df
        frac = df[df["metric"].isin(list(COLORS))]
        fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], subplot_titles=(
            "Solution type per anchor pair (seen: test keys; held-out: all keys)",
            "Held-out pairs: prediction - composite"))
        pairs = list(dict.fromkeys(
            frac.sort_values(["heldout", "a1", "a2"], ascending=[False, True, True])["pair"]))
        for metric, color in COLORS.items():
            sub = frac[frac["metric"] == metric].set_index("pair").reindex(pairs)
            fig.add_trace(go.Bar(x=pairs, y=sub["value"].fillna(0.0), name=metric,
                                 marker_color=color), row=1, col=1)
        diff = df[df["metric"] == "diff"]
        for pair, sub in diff.groupby("pair"):
            fig.add_trace(go.Bar(x=sub["diff"], y=sub["value"], name=f"{pair} diff",
                                 marker_color="#264653"), row=1, col=2)
        fig.update_layout(barmode="stack", template="plotly_white", height=420,
                          title=self._title(), legend_title_text="output")
        fig.update_yaxes(range=[0, 1.0], title_text="fraction of outputs", row=1, col=1)
        fig.update_xaxes(title_text="anchor pair", row=1, col=1)
        fig.update_xaxes(title_text="prediction - composite", row=1, col=2)
        return fig

    def _title(self) -> str:
        s = self.summary
        if not s:
            return "Solution types"
        return (f"Solution: {s.get('solution')} (held-out inferential "
                f"{s.get('heldout_inferential', float('nan')):.2f}, symmetric "
                f"{s.get('heldout_symmetric', float('nan')):.2f}; seen pairs on test keys "
                f"{s.get('seen_test_accuracy', float('nan')):.2f})")


def _task_from_checkpoint(source: Any) -> AnchorTask | None:
    if isinstance(source, str | os.PathLike):
        path = Path(source) / "run_config.json"
        if path.is_file():
            try:
                return AnchorTask.from_dict(json.loads(path.read_text())["task"])
            except (ValueError, KeyError):
                return None
    return None


def _last_token_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[batch, vocab]`` at the last position, through the probekit model handle."""
    return model.logits(tokens)[:, -1]


@torch.no_grad()
def predict(model: Any, data: AnchorData, batch_size: int = 1024) -> torch.Tensor:
    """Argmax next-token predictions of ``model`` (a probekit ``Model``) on ``data``."""
    out = []
    for i in range(0, len(data), batch_size):
        tokens = data.tokens[i:i + batch_size].to(model.device)
        out.append(_last_token_logits(model, tokens).float().argmax(-1).cpu())
    return torch.cat(out)


def solution_types(
    model: Any,
    task: AnchorTask | None = None,
    *,
    n: int | None = None,
    memorizing_threshold: float = 0.9,
    batch_size: int = 1024,
) -> SolutionResult:
    """Classify the solution a model found on the anchor-function task (see module docstring).

    ``model`` is a :class:`probekit.model.Model` or anything :func:`probekit.load` accepts;
    ``task`` defaults to the one stored in a probekit checkpoint's ``run_config.json``. ``n``
    overrides the number of test samples per split (default: the task's ``n_test``).

    Example:
        >>> res = solution_types(model, AnchorTask())                 # doctest: +SKIP
        >>> res.fractions()                                            # doctest: +SKIP
    """
    import probekit

    if task is None:
        task = _task_from_checkpoint(model)
        if task is None:
            raise ConfigError("no task given and none stored with the model",
                              fix="pass task=AnchorTask(...) (the task the model was trained on)")
    if not isinstance(task, AnchorTask):
        raise ConfigError(f"task is a {type(task).__name__}, not an AnchorTask",
                          fix="pass probekit.tasks.AnchorTask(...)")
    if not (0.0 < memorizing_threshold <= 1.0):
        raise ConfigError(f"memorizing_threshold {memorizing_threshold} is not in (0, 1]",
                          fix="use 0.9 as in the papers")
    handle = probekit.load(model)
    if not handle.is_causal:
        raise UnsupportedModelError(
            "solution types need a next-token (causal) model; this one is a masked LM",
            fix="pass a decoder trained on the anchor task")
    if handle.d_vocab != task.vocab_size:
        raise InputError(
            f"the model's vocabulary has {handle.d_vocab} tokens, the task's {task.vocab_size}",
            fix="pass the task the model was trained on (AnchorTask(vocab_size=...))")
    if getattr(handle, "n_ctx", task.seq_len) < task.seq_len:
        raise InputError(f"the model's context {handle.n_ctx} < the task's {task.seq_len} tokens",
                         fix="pass the task the model was trained on")

    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for split in ("test_data", "test_task"):
        data = task.generate(split, n) if n is not None else task.dataset(split)
        pred = predict(handle, data, batch_size)
        for r in task.score(data, pred):
            base = {k: r[k] for k in ("pair", "a1", "a2", "heldout", "n")}
            for metric in ("accuracy", "inferential", "symmetric", "other"):
                rows.append({"split": split, **base, "metric": metric, "diff": np.nan,
                             "value": r[metric]})
        if split == "test_data":
            summary["seen_test_accuracy"] = float((pred == data.targets).float().mean())
        else:
            diff = (pred - data.composite).numpy()
            labels = [f"({a},{b})" for a, b in data.pairs.tolist()]
            frame = pd.DataFrame({"pair": labels, "diff": diff})
            for pair, sub in frame.groupby("pair"):
                counts = sub["diff"].value_counts(normalize=True).sort_index()
                a1, a2 = (int(v) for v in pair.strip("()").split(","))
                for d, frac in counts.items():
                    rows.append({"split": split, "pair": pair, "a1": a1, "a2": a2,
                                 "heldout": True, "n": len(sub), "metric": "diff",
                                 "diff": float(d), "value": float(frac)})
            inf = (pred == data.composite)
            sym = (pred == data.symmetric)
            summary["heldout_inferential"] = float(inf.float().mean())
            summary["heldout_symmetric"] = float(sym.float().mean())
            summary["heldout_other"] = float((~(inf | sym)).float().mean())
            summary["heldout_diff_mode"] = float(pd.Series(diff).mode().iloc[0])
    memorizing = summary["seen_test_accuracy"] < memorizing_threshold
    summary["memorizing"] = bool(memorizing)
    if memorizing:
        summary["solution"] = "memorizing"
    else:
        fr = {k: summary[f"heldout_{k}"] for k in ("inferential", "symmetric", "other")}
        summary["solution"] = max(fr, key=fr.get)
    df = pd.DataFrame(rows, columns=["split", "pair", "a1", "a2", "heldout", "n", "metric",
                                     "diff", "value"])
    meta = {"task": task.to_dict(), "memorizing_threshold": memorizing_threshold,
            "n": n, "source": str(model) if isinstance(model, str | os.PathLike) else None}
    return SolutionResult(df, summary, meta)


__all__ = ["SolutionResult", "predict", "solution_types"]
