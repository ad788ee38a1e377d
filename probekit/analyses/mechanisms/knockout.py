"""Attention-edge knockout: through which layer and from which source position the prediction
at one query position (default: the last real token) gets its information.

:func:`attention_knockout` blocks the attention edge query -> source at one layer (all heads or
one head) with :func:`probekit.interventions.knock_out` and reports the change of accuracy
and of the target's probability: a layers x sources map. With ``mode="pattern"`` (default) the
blocked attention weights are set to 0 without renormalising, which removes exactly what the
edge moves: blocking every source of the query leaves that position's attention update equal
to the output bias (zero without one). ``mode="scores"`` sets the blocked scores to -inf
instead (the softmax renormalises over the remaining sources, as in Geva et al. 2023).

Sources are positions, or the roles of task data (:meth:`probekit.data.TaskData.roles`, plus
``self``, the query position where no single-position role marks it); samples are grouped by
the solution type of their clean prediction (the task data's ``answers()``, then ``other``).

Example:
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.toy import TOY_VOCAB, toy_model
    >>> task = AnchorTask(n_train=64, n_test=32, item_high=40, vocab_size=TOY_VOCAB)
    >>> data = task.dataset("test_task")
    >>> ko = attention_knockout(toy_model("gpt2"), data, by="role", layers=[1])
    >>> list(ko.map().columns), list(ko.strongest_sources().index)
    (['key', 'anchor1', 'anchor2', 'noise', 'self', 'all'], [1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import DataOrTask, result_meta
from probekit.analyses.mechanisms._rows import (
    Rows,
    Scores,
    at_query,
    check_by,
    effects,
    role_units,
    rows,
)
from probekit.interventions import check_knockout, knock_out
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import AXES, figure_words


class KnockoutResult(Result):
    """Effect of blocking the edge query -> source at each layer.

    ``df`` columns: ``layer``, ``source`` (position as text, a role, or 'all' for every source
    at once), ``group``, ``measure``, ``value``, ``n``. ``summary``: clean accuracy and target
    probability per group and ``strongest_edges`` (the three (layer, source) with the largest
    drop of the target's probability). Per layer: :meth:`strongest_sources`.
    """

    kind = "attention_knockout"

    def map(self, measure: str = "p_target_delta", group: str = "all") -> pd.DataFrame:
        """Layers x sources table of one measure for one group."""
        part = self.df[(self.df.measure == measure) & (self.df.group == group)]
        table = part.pivot(index="layer", columns="source", values="value")
        order = [c for c in self.meta.get("sources", []) if c in table.columns]
        return table[order + [c for c in table.columns if c not in order]]

    def strongest_sources(self, group: str = "all") -> pd.DataFrame:
        """Per layer (index), the single source whose knockout lowers the target's probability
        most: columns ``source`` and ``value`` (its ``p_target_delta``)."""
        df = self.df
        drops = df[(df.group == group) & (df.measure == "p_target_delta") & (df.source != "all")]
        worst = drops.loc[drops.groupby("layer").value.idxmin()]
        return worst.set_index("layer")[["source", "value"]]

    def figure(self, measure: str = "p_target_delta", group: str = "all") -> go.Figure:
        table = self.map(measure, group)
        head = self.meta.get("head")
        heads = figure_words(
            "attention_knockout", "all_heads" if head is None else "head", head=head
        )
        return figures.heatmap(
            table.to_numpy(),
            x=[str(c) for c in table.columns],
            y=list(table.index),
            title=figure_words(
                "attention_knockout", heads=heads, group=group, measure=figures.words(measure)
            ),
            x_title=figure_words("attention_knockout", "x", by=self.meta.get("by", "position")),
            y_title=AXES["layer"],
            colorbar=figures.words(measure),
            signed=True,
        )


def _sources(
    model: Model, scored: Rows, by: str, include_all: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Bool ``[B, T]`` source positions per unit, and all the query may attend to."""
    b, t = scored.batch.tokens.shape
    pos = torch.arange(t, device=scored.batch.tokens.device)
    allowed = scored.batch.valid.clone()
    if model.is_causal:
        allowed &= pos[None] <= scored.query[:, None]
    if by == "position":
        out = {str(s): (pos[None] == s).expand(b, t) & allowed for s in range(t)}
    else:
        out = {name: src & allowed for name, src in role_units(scored).items()}
    if include_all:
        out["all"] = allowed
    return out, allowed


def _edges(scored: Rows, src: torch.Tensor, allowed: torch.Tensor, mode: str) -> tuple:
    """``([B, T, T]`` blocked edges query -> ``src``, ``[B]`` rows with an edge to block)."""
    has = src.any(-1)
    if mode == "scores":
        has &= (allowed & ~src).any(-1)  # a query needs one source left to renormalise
        src = src & has[:, None]
    b, t = src.shape
    blocked = torch.zeros(b, t, t, dtype=torch.bool, device=src.device)
    blocked[torch.arange(b), scored.query] = src
    return blocked, has


def _summary(scores: Scores, df: pd.DataFrame) -> dict[str, Any]:
    summary = scores.summary()
    drops = df[(df.group == "all") & (df.measure == "p_target_delta") & (df.source != "all")]
    if len(drops):
        summary["strongest_edges"] = [
            f"L{int(edge.layer)}<-{edge.source} ({edge.value:+.3f})"
            for edge in drops.nsmallest(3, "value").itertuples()
        ]
    return summary


@torch.no_grad()
def attention_knockout(
    model: Model,
    data: DataOrTask,
    *,
    by: str = "position",
    layers: Sequence[int] | None = None,
    head: int | None = None,
    mode: str = "pattern",
    targets: Any = None,
    positions: str | int = "last",
    include_all: bool = True,
    batch_size: int | None = None,
) -> KnockoutResult:
    """Block attention from the query position to each source, one layer at a time.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts (decoders
            whose attention the bridge computes: GPT-2, Llama, ...).
        data: :class:`~probekit.data.TaskData` or any token data.
        by: sources as absolute 'position's, or the task data's 'role's (and ``self``).
        layers: layers to knock out at (default all).
        head: one head, or None for every head.
        mode: 'pattern' (zero the weight, default) or 'scores' (-inf, renormalised).
        targets: one target token per sequence (default: the task data's targets, else the
            clean prediction), as in :func:`~probekit.analyses.mechanisms.masking.token_masking`.
        positions: the one query position per sequence the effect is read at: 'last' real
            token (default) or a position index.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
        include_all: also block every source at once (source 'all'; pattern mode only).
    """
    model = load(model)
    model.require_vocabulary("attention_knockout (it measures the answer's probability)")
    check_by(by, data, "source")
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        model.check_layer(layer)
    head = model.check_head(head)
    check_knockout(model, mode)
    scores, sources = Scores(), []
    for scored in rows(model, data, targets, batch_size, positions):
        trace = model.trace(scored.batch)
        clean = at_query(trace.logits, scored.query)
        targets_b, members = scores.clean(scored, clean)
        units, allowed = _sources(model, scored, by, include_all and mode == "pattern")
        for name, src in units.items():
            blocked, has = _edges(scored, src, allowed, mode)
            if not has.any():
                continue
            if name not in sources:
                sources.append(name)
            for layer in layers:
                with knock_out(model, layer, blocked, head=head, mode=mode):
                    changed = at_query(trace.resume(layer), scored.query)
                scores.add((layer, name), effects(clean, changed, targets_b), members, has)
    df = scores.frame([(layer, s) for layer in layers for s in sources], ["layer", "source"])
    meta = result_meta(model, positions=positions, batch_size=batch_size, by=by, mode=mode)
    meta.update(head=head, sources=sources)
    return KnockoutResult(df, _summary(scores, df), meta)


__all__ = ["KnockoutResult", "attention_knockout"]
