"""Information flow: the attention each layer moves between positions, for one input and
averaged over many, drawn as lines whose width is the weight.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> flow = information_flow(toy_model("gpt2"), toy_tokens(8, 5), index=2)
    >>> flow.summary["n_mean"], list(flow.strongest_sources().index)
    (8, [0, 1])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses.common import DataOrTask, result_meta
from probekit.data import task_data
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import AXES, figure_words


class FlowResult(Result):
    """Attention moved between positions per layer, for one input and averaged over many.

    ``df`` columns: ``scope`` ('single' or 'mean'), ``layer``, ``query``, ``source``,
    ``weight`` (mean over heads), ``token`` (the single input's token at ``source``).
    ``summary``: ``n_mean`` (inputs averaged). Per layer: :meth:`strongest_sources`.
    """

    kind = "information_flow"

    def strongest_sources(self, scope: str = "single", query: int | None = None) -> pd.Series:
        """Per layer (index), the source position with the largest weight into ``query``
        (default the last position) in ``scope``."""
        part = self.df[self.df.scope == scope]
        part = part[part["query"] == (part["query"].max() if query is None else query)]
        worst = part.loc[part.groupby("layer").weight.idxmax()]
        return worst.set_index("layer").source.astype(int)

    def figure(self, min_weight: float = 0.05) -> go.Figure:
        """Lines from (source, layer l) to (query, layer l+1), width = attention weight."""
        scopes = [s for s in ("single", "mean") if s in set(self.df.scope)]
        label = self.meta.get("label")
        single = "single_labelled" if label else "single"
        titles = {"single": figure_words("information_flow", single, label=label)}
        titles["mean"] = figure_words("information_flow", "mean", n_mean=self.summary.get("n_mean"))
        fig = make_subplots(rows=1, cols=len(scopes), subplot_titles=[titles[s] for s in scopes])
        n_layers = int(self.df.layer.max()) + 1
        n_pos = int(self.df["query"].max()) + 1
        df = self.df
        first = df[(df.scope == "single") & (df.layer == 0) & (df["query"] == n_pos - 1)]
        tokens = first.sort_values("source").token.tolist()
        for col, scope in enumerate(scopes, start=1):
            _lines(fig, df[(df.scope == scope) & (df.weight >= min_weight)], col)
            ticks = tokens if scope == "single" and len(tokens) == n_pos else None
            _grid(fig, n_layers, n_pos, ticks, col)
        per_layer = 110 if n_layers <= 4 else 60
        figures.base_layout(
            fig,
            figure_words("information_flow", min_weight=min_weight),
            width=520 * len(scopes),
            height=180 + per_layer * n_layers,
        )
        return fig


def _lines(fig: go.Figure, part: pd.DataFrame, col: int) -> None:
    """One line per edge of ``part``, from (source, layer) to (query, layer + 1)."""
    for r in part.itertuples():
        line = {
            "width": 0.5 + 8 * r.weight,
            "color": figures.PALETTE[int(r.layer) % len(figures.PALETTE)],
        }
        trace = go.Scatter(
            x=[r.source, r.query],
            y=[r.layer, r.layer + 1],
            mode="lines",
            line=line,
            opacity=min(1.0, 0.25 + r.weight),
            hovertext=f"L{r.layer}: {r.source} -> {r.query}: {r.weight:.3f}",
            hoverinfo="text",
            showlegend=False,
        )
        fig.add_trace(trace, row=1, col=col)


def _grid(fig: go.Figure, n_layers: int, n_pos: int, tokens: list | None, col: int) -> None:
    """The (position, layer) dots and the axes of one panel."""
    xs = [x for x in range(n_pos) for _ in range(n_layers + 1)]
    ys = [y for _ in range(n_pos) for y in range(n_layers + 1)]
    dots = go.Scatter(
        x=xs,
        y=ys,
        mode="markers",
        marker={"color": "#333", "size": 6},
        showlegend=False,
        hoverinfo="skip",
    )
    fig.add_trace(dots, row=1, col=col)
    ticktext = (
        list(range(n_pos)) if tokens is None else [f"{i}<br>{t}" for i, t in enumerate(tokens)]
    )
    fig.update_xaxes(
        tickvals=list(range(n_pos)),
        ticktext=ticktext,
        title_text=figure_words("information_flow", "x_tokens") if tokens else AXES["position"],
        row=1,
        col=col,
    )
    fig.update_yaxes(
        tickvals=list(range(n_layers + 1)),
        ticktext=["embed"] + [f"after L{i}" for i in range(n_layers)],
        title_text=figure_words("information_flow", "y") if col == 1 else "",
        row=1,
        col=col,
    )


def _unpadded(model: Model, data: Any, what: str) -> torch.Tensor:
    """``[n, T]`` tokens of ``data`` (token data or TaskData), refusing padding."""
    task = task_data(data)
    batches = model.prepare(data if task is None else task.tokens)
    if any(b.attention_mask is not None and not b.valid.all() for b in batches):
        raise InputError(
            f"information_flow needs unpadded inputs of one length ({what})",
            fix="pass sequences without padding",
        )
    return torch.cat([b.tokens for b in batches])


def _inputs(model: Model, data: Any, single: Any, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The single input ``[1, T]`` and the inputs of the mean ``[n, T]``."""
    many = _unpadded(model, data, "data")
    if single is not None:
        one = _unpadded(model, single, "single")
        if one.shape != (1, many.shape[1]):
            raise InputError(
                f"the single input has shape {tuple(one.shape)}, the data {tuple(many.shape)}",
                fix=f"pass one sequence of {many.shape[1]} tokens as single=",
            )
        return one, many
    if not -len(many) <= index < len(many):
        raise InputError(f"index {index} is outside the {len(many)} inputs", fix="pick a valid row")
    return many[index : index + 1], many


def _patterns(
    model: Model, tokens: torch.Tensor, head: int | None, batch_size: int | None
) -> list[np.ndarray]:
    """Mean (over inputs, and heads unless ``head``) attention pattern ``[T, T]`` per layer."""
    sums: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Callable:
        def fn(tensor: torch.Tensor, hook: Any) -> None:
            pat = tensor.detach().double()
            pat = pat[:, head] if head is not None else pat.mean(1)
            sums[layer] = sums.get(layer, 0) + pat.sum(0)

        return fn

    count = 0
    hooks = [(model.hook_name(i, "attn_pattern"), keep(i)) for i in range(model.n_layers)]
    for batch in model.prepare(tokens, batch_size):
        model.forward(batch, hooks)
        count += len(batch.tokens)
    return [(sums[i] / count).cpu().numpy() for i in range(model.n_layers)]


@torch.no_grad()
def information_flow(
    model: Model,
    data: DataOrTask,
    *,
    single: DataOrTask | None = None,
    index: int = 0,
    head: int | None = None,
    n_mean: int | None = 512,
    label: str | None = None,
    batch_size: int | None = None,
) -> FlowResult:
    """Attention per layer between positions, for one input and averaged over many.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: the inputs of the mean (unpadded token data of one length, or
            :class:`~probekit.data.TaskData`); positions are absolute, so for task data pass
            inputs whose roles sit at the same positions.
        single: the one input of the single panel (default: row ``index`` of ``data``).
        head: one head, or None for the mean over heads.
        n_mean: at most this many inputs in the mean (None = all).
        label: names the single input in the figure.
        batch_size: sequences per forward of the mean (None: the automatic, memory-bounded
            choice; the mean is the same up to float rounding).

    There is no ``positions``: the result holds every query position (the figure draws them
    all, :meth:`FlowResult.strongest_sources` picks one).
    """
    model = load(model)
    head = model.check_head(head)
    one, many = _inputs(model, data, single, index)
    if n_mean is not None:
        many = many[:n_mean]
    out = []
    for scope, tokens in (("single", one), ("mean", many)):
        for layer, pat in enumerate(_patterns(model, tokens, head, batch_size)):
            t = pat.shape[-1]
            out += [
                {"scope": scope, "layer": layer, "query": q, "source": s}
                | {"weight": float(pat[q, s]), "token": int(one[0, s])}
                for q in range(t)
                for s in range(t)
                if not (model.is_causal and s > q)
            ]
    meta = result_meta(model, batch_size=batch_size, head=head, label=label)
    return FlowResult(pd.DataFrame(out), {"n_mean": len(many)}, meta)


__all__ = ["FlowResult", "information_flow"]
