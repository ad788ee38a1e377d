"""Token masking, attention-edge knockout and the information-flow figure.

Three looks at which input positions the prediction at one query position (default: the last
real token) depends on, and through which layer the information travels:

* :func:`token_masking` replaces the token at each position (or each *role* of an anchor input:
  key, first anchor, second anchor, noise) by padding, a fixed mask token or a random resample,
  and reports the change of accuracy and of the target's probability, per solution type.
* :func:`attention_knockout` blocks the attention edge query -> source at one layer (all heads or
  one head) and reports the same changes: a layers x sources map. With ``mode="pattern"``
  (default) the blocked entries of ``blocks.{l}.attn.hook_pattern`` are set to 0 without
  renormalising, which removes exactly what the edge moves: blocking every source of the query
  leaves that position's attention update equal to the output bias (zero without one).
  ``mode="scores"`` sets ``blocks.{l}.attn.hook_attn_scores`` to -inf instead (the softmax
  renormalises over the remaining sources, as in Geva et al. 2023).
* :func:`information_flow` draws, for one input and averaged over many, the attention each layer
  moves between positions as lines whose width is the weight.

Solution types are per sample, from the clean prediction: ``inferential`` (= the composite),
``symmetric`` (= the mirrored pair's trained target), ``other``. They need an
:class:`~probekit.tasks.anchor.AnchorData` (most telling on the held-out split ``test_task``).

Example:
    >>> data = task.dataset("test_task")                              # doctest: +SKIP
    >>> ko = attention_knockout(model, data, by="role")               # doctest: +SKIP
    >>> ko.figure().show()                                            # doctest: +SKIP
    >>> with knock_out(model, layer=1, edges=[(-1, 2)]):               # doctest: +SKIP
    ...     logits = model.logits(data.tokens)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses._common import TokenMeans, check_finite
from probekit.data import Batch, position_mask
from probekit.errors import InputError, UnsupportedModelError
from probekit.model import Model, load
from probekit.result import Result

ROLES = ("key", "anchor1", "anchor2", "noise", "self")
"""Roles of an anchor input's positions; ``self`` is the query position when it is none of the
others (token masking never masks ``self``: it has nothing of the key or the anchors)."""

MASK_MODES = ("pad", "mask", "resample")
KNOCKOUT_MODES = ("pattern", "scores")
MEASURES = ("p_target_delta", "accuracy_delta", "kl", "prob_l2", "pred_changed")
"""Effects at the query position, per sample, averaged: change of the target's probability, of
accuracy (argmax == target), KL(clean || changed), ||p' - p||_2, share of changed argmaxes."""


# ---------------------------------------------------------------- the knockout intervention
def _check_layer(model: Model, layer: int) -> int:
    if not isinstance(layer, int | np.integer) or not 0 <= int(layer) < model.n_layers:
        raise InputError(
            f"layer {layer!r} is outside the model's {model.n_layers} layers",
            fix=f"use a layer index in 0..{model.n_layers - 1}",
        )
    return int(layer)


def _check_head(model: Model, head: int | None) -> int | None:
    n_heads = int(model.bridge.cfg.n_heads)
    if head is not None and not 0 <= int(head) < n_heads:
        raise InputError(
            f"head {head} is outside the model's {n_heads} heads",
            fix=f"use a head index in 0..{n_heads - 1}, or head=None for all heads",
        )
    return None if head is None else int(head)


def edge_mask(edges: Any, n_pos: int) -> torch.Tensor:
    """Bool ``[..., query, source]`` mask of blocked edges from ``(query, source)`` pairs
    (negative indices count from the end) or a bool tensor broadcastable to ``[B, T, T]``.

    Example:
        >>> edge_mask([(-1, 0)], 3).int().tolist()
        [[0, 0, 0], [0, 0, 0], [1, 0, 0]]
    """
    if isinstance(edges, torch.Tensor):
        if edges.dtype != torch.bool or edges.shape[-1] != n_pos or edges.shape[-2] != n_pos:
            raise InputError(
                f"an edge mask of shape {tuple(edges.shape)} and dtype {edges.dtype} does not "
                f"fit {n_pos} positions",
                fix=f"pass a bool tensor [..., {n_pos}, {n_pos}] (query, source)",
            )
        return edges
    mask = torch.zeros(n_pos, n_pos, dtype=torch.bool)
    for pair in edges:
        q, s = (int(v) for v in pair)
        if not (-n_pos <= q < n_pos and -n_pos <= s < n_pos):
            raise InputError(
                f"edge {(q, s)} is outside the {n_pos} positions",
                fix=f"use (query, source) positions in -{n_pos}..{n_pos - 1}",
            )
        mask[q, s] = True
    return mask


def knockout_hooks(
    model: Model, layer: int, edges: Any, head: int | None = None, mode: str = "pattern"
) -> list[tuple[str, Callable]]:
    """Hooks that block the attention edges ``edges`` (see :func:`edge_mask`) at ``layer``.

    ``head=None`` blocks them in every head; ``mode`` is 'pattern' (zero the attention weight,
    no renormalisation) or 'scores' (-inf score, softmax renormalises over the other sources).
    """
    model = load(model)
    layer = _check_layer(model, layer)
    head = _check_head(model, head)
    if mode not in KNOCKOUT_MODES:
        raise InputError(f"unknown knockout mode {mode!r}", fix=f"use one of {KNOCKOUT_MODES}")
    site = "hook_pattern" if mode == "pattern" else "hook_attn_scores"

    def edit(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        blocked = edge_mask(edges, tensor.shape[-1]).to(tensor.device)
        while blocked.ndim < 3:
            blocked = blocked[None]
        blocked = blocked[:, None]  # [B or 1, 1, T, T]
        if head is not None:
            heads = torch.zeros(tensor.shape[1], dtype=torch.bool, device=tensor.device)
            heads[head] = True
            blocked = blocked & heads[None, :, None, None]
        if mode == "scores":
            out = tensor.masked_fill(blocked, float("-inf"))
            # masked entries hold -inf or the dtype's minimum (HF's causal / padding mask)
            if (out <= torch.finfo(out.dtype).min).all(-1).any():
                raise InputError(
                    "mode='scores' blocks every source of a query, which leaves no attention "
                    "to renormalise",
                    fix="use mode='pattern' to remove a query's whole attention update",
                )
            return out
        return tensor.masked_fill(blocked, 0.0)

    return [(f"blocks.{layer}.attn.{site}", edit)]


@contextmanager
def knock_out(
    model: Any, layer: int, edges: Any, head: int | None = None, mode: str = "pattern"
) -> Iterator[Model]:
    """Block attention edges at one layer for the duration of the block (see
    :func:`knockout_hooks`); the hooks are removed on exit, even after an exception.

    Example:
        >>> with knock_out(model, 0, [(-1, s) for s in range(9)]):    # doctest: +SKIP
        ...     logits = model.logits(tokens)
    """
    model = load(model)
    with model.hooks(knockout_hooks(model, layer, edges, head, mode)):
        yield model


@torch.no_grad()
def check_knockout_supported(model: Model, batch: Batch) -> None:
    """Raise :class:`UnsupportedModelError` when the bridge discards attention-pattern edits
    (attention computed inside the wrapped HF module, e.g. BERT)."""
    import warnings

    clean = model.forward(batch)
    everything = torch.ones(batch.tokens.shape[1], batch.tokens.shape[1], dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        edited = model.forward(batch, knockout_hooks(model, 0, everything))
    if torch.equal(clean, edited):
        raise UnsupportedModelError(
            f"the {model.architecture} bridge ignores edits of the attention pattern, so edges "
            "cannot be knocked out",
            fix="use a decoder whose attention the bridge computes itself (GPT-2, Llama, ...)",
        )


# ---------------------------------------------------------------- data with targets and roles
@dataclass
class _Rows:
    """One batch of samples with what the analyses score them by."""

    batch: Batch
    query: torch.Tensor  # [B] query position
    targets: torch.Tensor | None  # [B]; None = the clean argmax
    key_pos: torch.Tensor | None  # [B] key position (anchor data)
    composite: torch.Tensor | None
    symmetric: torch.Tensor | None


def _is_anchor(data: Any) -> bool:
    return all(hasattr(data, a) for a in ("tokens", "targets", "composite", "positions", "pairs"))


def _rows(
    model: Model, data: Any, targets: Any, batch_size: int | None, query: str | int
) -> list[_Rows]:
    if _is_anchor(data):
        n = len(data.tokens)
        if targets is None:
            targets = data.targets
        batches = model.prepare(data.tokens, batch_size)
        extras = {
            "key_pos": data.positions,
            "composite": data.composite,
            "symmetric": data.symmetric,
        }
    else:
        batches = model.prepare(data, batch_size)
        n = sum(len(b.tokens) for b in batches)
        extras = {}
    if targets is not None:
        targets = torch.as_tensor(targets).reshape(-1).long()
        if len(targets) != n:
            raise InputError(
                f"{len(targets)} targets for {n} sequences", fix="give one target per sequence"
            )
    out, start = [], 0
    for batch in batches:
        size = len(batch.tokens)
        sl = slice(start, start + size)
        start += size
        if query == "last":
            q = position_mask(batch, "last").long().argmax(-1)
        else:
            t = batch.tokens.shape[1]
            if not -t <= int(query) < t:
                raise InputError(
                    f"query position {query} is outside the {t} positions",
                    fix="use query='last' or a position index",
                )
            q = torch.full((size,), int(query) % t, dtype=torch.long, device=batch.tokens.device)
        dev = batch.tokens.device
        out.append(
            _Rows(
                batch,
                q,
                None if targets is None else targets[sl].to(dev),
                *(
                    None if extras.get(k) is None else extras[k][sl].to(dev)
                    for k in ("key_pos", "composite", "symmetric")
                ),
            )
        )
    return out


def _role_positions(rows: _Rows, role: str) -> torch.Tensor:
    """Bool ``[B, T]`` of the positions of ``role`` in each row (anchor data only)."""
    if rows.key_pos is None:
        raise InputError(
            f"role {role!r} needs anchor-task data",
            fix="pass task.dataset(split), or by='position'",
        )
    if role not in ROLES:
        raise InputError(f"unknown role {role!r}", fix=f"use one of {ROLES}")
    b, t = rows.batch.tokens.shape
    pos = torch.arange(t, device=rows.key_pos.device)[None].expand(b, t)
    key = pos == rows.key_pos[:, None]
    a1 = pos == rows.key_pos[:, None] + 1
    a2 = pos == rows.key_pos[:, None] + 2
    q = pos == rows.query[:, None]
    special = key | a1 | a2
    return {
        "key": key,
        "anchor1": a1,
        "anchor2": a2,
        "noise": ~special & ~q & (pos < rows.query[:, None]),
        "self": q & ~special,
    }[role]


def _groups(rows: _Rows, pred: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sample masks per solution type of the clean prediction (plus 'all')."""
    groups = {"all": torch.ones_like(pred, dtype=torch.bool)}
    if rows.composite is not None:
        inf = pred == rows.composite
        sym = (pred == rows.symmetric) & (rows.symmetric >= 0) & ~inf
        groups.update({"inferential": inf, "symmetric": sym, "other": ~(inf | sym)})
    return groups


def _at_query(logits: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    return logits[torch.arange(len(query), device=logits.device), query].double()


def _effects(clean: torch.Tensor, changed: torch.Tensor, targets: torch.Tensor) -> dict:
    check_finite(changed, "the outputs of an intervened forward")
    logp, logq = clean.log_softmax(-1), changed.log_softmax(-1)
    p, q = logp.exp(), logq.exp()
    idx = targets[:, None]
    pred, pred2 = clean.argmax(-1), changed.argmax(-1)
    return {
        "p_target_delta": (q.gather(-1, idx) - p.gather(-1, idx))[:, 0],
        "accuracy_delta": (pred2 == targets).double() - (pred == targets).double(),
        "kl": (p * (logp - logq)).sum(-1),
        "prob_l2": (q - p).norm(dim=-1),
        "pred_changed": (pred2 != pred).double(),
    }


def _add(acc: TokenMeans, key: tuple, effects: dict, groups: dict, where: torch.Tensor) -> None:
    for group, members in groups.items():
        sel = members & where
        for name, values in effects.items():
            acc.add(key + (group, name), values, sel)


def _clean_stats(acc: TokenMeans, clean: torch.Tensor, targets: torch.Tensor, groups) -> None:
    p = clean.softmax(-1).gather(-1, targets[:, None])[:, 0]
    correct = (clean.argmax(-1) == targets).double()
    for group, members in groups.items():
        acc.add(("clean", group, "p_target"), p, members)
        acc.add(("clean", group, "accuracy"), correct, members)


def _frame(acc: TokenMeans, keys: list[tuple], columns: list[str]) -> pd.DataFrame:
    rows = []
    for key in keys:
        for group in ("all", "inferential", "symmetric", "other"):
            if acc.counts.get(key + (group, "kl"), 0) == 0:
                continue
            for name in MEASURES:
                rows.append(
                    {
                        **dict(zip(columns, key, strict=True)),
                        "group": group,
                        "measure": name,
                        "value": acc.mean(key + (group, name)),
                        "n": acc.counts[key + (group, name)],
                    }
                )
    return pd.DataFrame(rows)


def _clean_summary(acc: TokenMeans) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group in ("all", "inferential", "symmetric", "other"):
        if acc.counts.get(("clean", group, "accuracy"), 0):
            out[f"clean_accuracy_{group}"] = acc.mean(("clean", group, "accuracy"))
            out[f"clean_p_target_{group}"] = acc.mean(("clean", group, "p_target"))
            out[f"n_{group}"] = acc.counts[("clean", group, "accuracy")]
    return out


# ---------------------------------------------------------------- token masking
class MaskingResult(Result):
    """Effect of masking each position or role on the prediction at the query position.

    ``df`` columns: ``unit`` (position index as text, or role), ``group`` (all / inferential /
    symmetric / other), ``measure`` (see :data:`MEASURES`), ``value``, ``n``. ``summary``: clean
    accuracy and target probability per group, ``most_important`` (unit with the largest drop
    of the target's probability) and its ``..._p_target_delta``.
    """

    kind = "token_masking"

    def table(self, measure: str = "p_target_delta") -> pd.DataFrame:
        """Units x groups table of one measure."""
        part = self.df[self.df.measure == measure]
        return part.pivot(index="unit", columns="group", values="value")

    def figure(self, measure: str = "p_target_delta") -> go.Figure:
        part = self.df[self.df.measure == measure]
        fig = figures.bars(
            part,
            "unit",
            "value",
            "group",
            f"Token masking ({self.meta.get('mode', '')}): {measure} at the query position",
            "masked " + self.meta.get("by", "unit"),
            measure,
        )
        return fig


def mask_tokens(
    tokens: torch.Tensor,
    where: torch.Tensor,
    mode: str = "pad",
    *,
    pad_token: int = 0,
    mask_token: int | None = None,
    low: int = 1,
    high: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A copy of ``tokens`` with the positions in ``where`` replaced (the input is untouched).

    ``mode``: 'pad' (``pad_token``), 'mask' (``mask_token``) or 'resample' (uniform in
    ``[low, high)``, a fresh draw per position). The attention mask is left as it is.

    Example:
        >>> mask_tokens(torch.tensor([[5, 6, 7]]), torch.tensor([[False, True, False]])).tolist()
        [[5, 0, 7]]
    """
    if mode not in MASK_MODES:
        raise InputError(f"unknown masking mode {mode!r}", fix=f"use one of {MASK_MODES}")
    if mode == "pad":
        fill = torch.full_like(tokens, pad_token)
    elif mode == "mask":
        if mask_token is None:
            raise InputError("mode='mask' needs a mask token", fix="pass mask_token=<token id>")
        fill = torch.full_like(tokens, mask_token)
    else:
        if high is None or high <= low:
            raise InputError(
                f"cannot resample from [{low}, {high})", fix="pass low < high token ids"
            )
        fill = torch.randint(low, high, tokens.shape, generator=generator).to(tokens.device)
    return torch.where(where, fill, tokens)


@torch.no_grad()
def token_masking(
    model: Any,
    data: Any,
    *,
    by: str = "position",
    mode: str = "pad",
    mask_token: int | None = None,
    pad_token: int = 0,
    resample_range: tuple[int, int] | None = None,
    targets: Any = None,
    query: str | int = "last",
    batch_size: int | None = None,
    seed: int = 0,
) -> MaskingResult:
    """Mask each input position (or anchor role) and measure the effect at the query position.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: an :class:`~probekit.tasks.anchor.AnchorData` (targets, roles and solution types
            come with it) or any token data (see :mod:`probekit.data`).
        by: 'position' (each position before the query) or 'role' (key, anchor1, anchor2,
            noise; anchor data only).
        mode: 'pad' (``pad_token``, default 0), 'mask' (``mask_token``) or 'resample' (uniform
            in ``resample_range``; default the anchor item range [20, 100) for anchor data,
            else [1, d_vocab)).
        targets: one target token per sequence (default: anchor targets, else the clean
            prediction, so accuracy means "prediction unchanged").
        query: 'last' real token or a position index.
        seed: seed of the resampling.

    Example:
        >>> res = token_masking(model, task.dataset("test_task"), by="role")  # doctest: +SKIP
        >>> res.table()                                                      # doctest: +SKIP
    """
    model = load(model)
    if by not in ("position", "role"):
        raise InputError(f"unknown masking unit by={by!r}", fix="use by='position' or 'role'")
    if mode not in MASK_MODES:
        raise InputError(f"unknown masking mode {mode!r}", fix=f"use one of {MASK_MODES}")
    if mode == "mask" and mask_token is None:
        raise InputError("mode='mask' needs a mask token", fix="pass mask_token=<token id>")
    for what, tok in (("mask_token", mask_token), ("pad_token", pad_token)):
        if tok is not None and not 0 <= int(tok) < model.d_vocab:
            raise InputError(
                f"{what} {tok} is outside the vocabulary [0, {model.d_vocab})",
                fix=f"pick a {what} of this model's vocabulary",
            )
    if resample_range is None:
        resample_range = (20, 100) if _is_anchor(data) else (1, model.d_vocab)
    low, high = (int(v) for v in resample_range)
    if not 0 <= low < high <= model.d_vocab:
        raise InputError(
            f"resample range [{low}, {high}) is not inside the vocabulary [0, {model.d_vocab})",
            fix="pass resample_range=(low, high) with 0 <= low < high <= d_vocab",
        )
    if by == "role" and not _is_anchor(data):
        raise InputError("by='role' needs anchor-task data", fix="pass task.dataset(split)")
    generator = torch.Generator().manual_seed(seed)
    acc = TokenMeans()
    units: list = []
    for rows in _rows(model, data, targets, batch_size, query):
        batch = rows.batch
        clean = _at_query(model.forward(batch), rows.query)
        check_finite(clean)
        targets_b = clean.argmax(-1) if rows.targets is None else rows.targets
        groups = _groups(rows, clean.argmax(-1))
        _clean_stats(acc, clean, targets_b, groups)
        t = batch.tokens.shape[1]
        if by == "position":
            candidates = list(range(t))
        else:
            candidates = ["key", "anchor1", "anchor2", "noise"]
        for unit in candidates:
            if by == "position":
                where = torch.zeros_like(batch.tokens, dtype=torch.bool)
                where[:, unit] = True
                # a position is maskable in rows where it is real and before the query
                where &= batch.valid & (unit < rows.query[:, None])
            else:
                where = _role_positions(rows, unit) & batch.valid
            has = where.any(-1)
            if not has.any():
                continue
            tokens = mask_tokens(
                batch.tokens,
                where,
                mode,
                pad_token=pad_token,
                mask_token=mask_token,
                low=low,
                high=high,
                generator=generator,
            )
            changed = model.forward(Batch(tokens, batch.attention_mask, batch.labels))
            effects = _effects(clean, _at_query(changed, rows.query), targets_b)
            _add(acc, (str(unit),), effects, groups, has)
            if str(unit) not in units:
                units.append(str(unit))
    df = _frame(acc, [(u,) for u in units], ["unit"])
    summary = _clean_summary(acc)
    drops = df[(df.group == "all") & (df.measure == "p_target_delta")]
    if len(drops):
        worst = drops.loc[drops.value.idxmin()]
        summary["most_important"] = worst.unit
        summary["most_important_p_target_delta"] = float(worst.value)
    meta = {"by": by, "mode": mode, "query": query, "model": repr(model)}
    return MaskingResult(df, summary, meta)


# ---------------------------------------------------------------- attention-edge knockout
class KnockoutResult(Result):
    """Effect of blocking the edge query -> source at each layer.

    ``df`` columns: ``layer``, ``source`` (position as text, a role, or 'all' for every source
    at once), ``group``, ``measure``, ``value``, ``n``. ``summary``: clean accuracy and target
    probability per group, ``strongest_edges`` (the three (layer, source) with the largest drop
    of the target's probability) and ``strongest_source_L<l>`` per layer.
    """

    kind = "attention_knockout"

    def map(self, measure: str = "p_target_delta", group: str = "all") -> pd.DataFrame:
        """Layers x sources table of one measure for one group."""
        part = self.df[(self.df.measure == measure) & (self.df.group == group)]
        table = part.pivot(index="layer", columns="source", values="value")
        order = [c for c in self.meta.get("sources", []) if c in table.columns]
        return table[order + [c for c in table.columns if c not in order]]

    def figure(self, measure: str = "p_target_delta", group: str = "all") -> go.Figure:
        table = self.map(measure, group)
        head = self.meta.get("head")
        heads = "all heads" if head is None else f"head {head}"
        return figures.heatmap(
            table.to_numpy(),
            x=[str(c) for c in table.columns],
            y=list(table.index),
            title=f"Attention knockout into the query position ({heads}, {group}): {measure}",
            x_title="source " + self.meta.get("by", "position"),
            y_title="layer",
            colorbar=measure,
            signed=True,
        )


@torch.no_grad()
def attention_knockout(
    model: Any,
    data: Any,
    *,
    by: str = "position",
    layers: Sequence[int] | None = None,
    head: int | None = None,
    mode: str = "pattern",
    targets: Any = None,
    query: str | int = "last",
    include_all: bool = True,
    batch_size: int | None = None,
) -> KnockoutResult:
    """Block attention from the query position to each source, one layer at a time.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts (decoders
            whose attention the bridge computes: GPT-2, Llama, ...).
        data: :class:`~probekit.tasks.anchor.AnchorData` or any token data.
        by: sources as absolute 'position's, or anchor 'role's (key, anchor1, anchor2, noise,
            self; anchor data only).
        layers: layers to knock out at (default all).
        head: one head, or None for every head.
        mode: 'pattern' (zero the weight, default) or 'scores' (-inf, renormalised).
        targets, query, batch_size: as in :func:`token_masking`.
        include_all: also block every source at once (source 'all'; pattern mode only).

    Example:
        >>> ko = attention_knockout(model, task.dataset("test_task"), by="role")  # doctest: +SKIP
        >>> ko.map()                                                             # doctest: +SKIP
    """
    model = load(model)
    if by not in ("position", "role"):
        raise InputError(f"unknown source unit by={by!r}", fix="use by='position' or 'role'")
    if by == "role" and not _is_anchor(data):
        raise InputError("by='role' needs anchor-task data", fix="pass task.dataset(split)")
    layers = list(range(model.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        _check_layer(model, layer)
    head = _check_head(model, head)
    if mode not in KNOCKOUT_MODES:
        raise InputError(f"unknown knockout mode {mode!r}", fix=f"use one of {KNOCKOUT_MODES}")
    include_all = include_all and mode == "pattern"
    acc = TokenMeans()
    sources: list[str] = []
    all_rows = _rows(model, data, targets, batch_size, query)
    check_knockout_supported(model, all_rows[0].batch)
    for rows in all_rows:
        batch = rows.batch
        trace = model.trace(batch)
        clean = _at_query(trace.logits, rows.query)
        check_finite(clean)
        targets_b = clean.argmax(-1) if rows.targets is None else rows.targets
        groups = _groups(rows, clean.argmax(-1))
        _clean_stats(acc, clean, targets_b, groups)
        b, t = batch.tokens.shape
        pos = torch.arange(t, device=batch.tokens.device)
        allowed = batch.valid.clone()
        if model.is_causal:
            allowed &= pos[None] <= rows.query[:, None]
        units: list[tuple[str, torch.Tensor]] = []
        if by == "position":
            for s in range(t):
                units.append((str(s), (pos[None] == s).expand(b, t) & allowed))
        else:
            units += [(role, _role_positions(rows, role) & allowed) for role in ROLES]
        if include_all:
            units.append(("all", allowed))
        for name, src in units:
            has = src.any(-1)
            if not has.any():
                continue
            if mode == "scores":
                has &= (allowed & ~src).any(-1)  # a query needs one source left to renormalise
                src = src & has[:, None]
                if not has.any():
                    continue
            blocked = torch.zeros(b, t, t, dtype=torch.bool, device=src.device)
            blocked[torch.arange(b), rows.query] = src
            if name not in sources:
                sources.append(name)
            for layer in layers:
                logits = trace.resume(
                    layer, fwd_hooks=knockout_hooks(model, layer, blocked, head, mode)
                )
                effects = _effects(clean, _at_query(logits, rows.query), targets_b)
                _add(acc, (layer, name), effects, groups, has)
    df = _frame(acc, [(layer, s) for layer in layers for s in sources], ["layer", "source"])
    summary = _clean_summary(acc)
    drops = df[(df.group == "all") & (df.measure == "p_target_delta") & (df.source != "all")]
    if len(drops):
        top = drops.nsmallest(3, "value")
        summary["strongest_edges"] = [
            f"L{int(r.layer)}<-{r.source} ({r.value:+.3f})" for r in top.itertuples()
        ]
        for layer, part in drops.groupby("layer"):
            worst = part.loc[part.value.idxmin()]
            summary[f"strongest_source_L{int(layer)}"] = worst.source
            summary[f"strongest_delta_L{int(layer)}"] = float(worst.value)
    meta = {
        "by": by,
        "mode": mode,
        "head": head,
        "query": query,
        "sources": sources,
        "model": repr(model),
    }
    return KnockoutResult(df, summary, meta)


# ---------------------------------------------------------------- information flow
class FlowResult(Result):
    """Attention moved between positions per layer, for one input and averaged over many.

    ``df`` columns: ``scope`` ('single' or 'mean'), ``layer``, ``query``, ``source``,
    ``weight`` (mean over heads), ``token`` (the single input's token at ``source``).
    ``summary``: ``n_mean`` (inputs averaged), ``strongest_into_last_L<l>`` (source with the
    largest weight into the last position per layer, single input).
    """

    kind = "information_flow"

    def figure(self, min_weight: float = 0.05) -> go.Figure:
        """Lines from (source, layer l) to (query, layer l+1), width = attention weight."""
        scopes = [s for s in ("single", "mean") if s in set(self.df.scope)]
        fig = make_subplots(
            rows=1,
            cols=len(scopes),
            subplot_titles=[
                "one input" + (f" ({self.meta.get('label')})" if self.meta.get("label") else "")
                if s == "single"
                else f"mean over {self.summary.get('n_mean')} inputs"
                for s in scopes
            ],
        )
        n_layers = int(self.df.layer.max()) + 1
        n_pos = int(self.df["query"].max()) + 1
        tokens = (
            self.df[
                (self.df.scope == "single") & (self.df.layer == 0) & (self.df["query"] == n_pos - 1)
            ]
            .sort_values("source")
            .token.tolist()
        )
        for c, scope in enumerate(scopes, start=1):
            part = self.df[(self.df.scope == scope) & (self.df.weight >= min_weight)]
            for r in part.itertuples():
                fig.add_trace(
                    go.Scatter(
                        x=[r.source, r.query],
                        y=[r.layer, r.layer + 1],
                        mode="lines",
                        line={
                            "width": 0.5 + 8 * r.weight,
                            "color": figures.PALETTE[int(r.layer) % len(figures.PALETTE)],
                        },
                        opacity=min(1.0, 0.25 + r.weight),
                        hovertext=f"L{r.layer}: {r.source} -> {r.query}: {r.weight:.3f}",
                        hoverinfo="text",
                        showlegend=False,
                    ),
                    row=1,
                    col=c,
                )
            xs = [x for x in range(n_pos) for _ in range(n_layers + 1)]
            ys = [y for _ in range(n_pos) for y in range(n_layers + 1)]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="markers",
                    marker={"color": "#333", "size": 6},
                    showlegend=False,
                    hoverinfo="skip",
                ),
                row=1,
                col=c,
            )
            fig.update_xaxes(
                tickvals=list(range(n_pos)),
                ticktext=[f"{i}<br>{tok}" for i, tok in enumerate(tokens)]
                if (scope == "single" and len(tokens) == n_pos)
                else list(range(n_pos)),
                title_text="position",
                row=1,
                col=c,
            )
            fig.update_yaxes(
                tickvals=list(range(n_layers + 1)),
                ticktext=["embed"] + [f"after L{i}" for i in range(n_layers)],
                row=1,
                col=c,
            )
        figures.base_layout(fig, "Information flow: attention moved by each layer")
        fig.update_layout(height=140 + 110 * n_layers, width=520 * len(scopes))
        return fig


def _default_flow_input(task: Any, key: int) -> tuple[Any, Any]:
    """One held-out input with ``key`` and a set with the same key position and pair."""
    data = task.dataset("test_task")
    pos, pair = int(data.positions[0]), data.pairs[0]
    if not task.item_low <= key < task.item_high:
        raise InputError(
            f"key {key} is outside the task's item range [{task.item_low}, {task.item_high})",
            fix="pick a key in the item range",
        )
    same = (data.positions == pos) & (data.pairs == pair).all(-1)
    many = data.tokens[same]
    one = data.tokens[0:1].clone()
    one[0, pos] = key
    return one, many


@torch.no_grad()
def information_flow(
    model: Any,
    data: Any,
    *,
    index: int = 0,
    key: int = 99,
    head: int | None = None,
    n_mean: int | None = 512,
) -> FlowResult:
    """Attention per layer between positions, for one input and averaged over many.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: an :class:`~probekit.tasks.anchor.AnchorTask` (the single input is a held-out
            pair with key ``key`` = 99 by default; the mean is over held-out inputs with the
            same key position and pair), or any token data (single input = row ``index``, mean
            over all rows, absolute positions).
        head: one head, or None for the mean over heads.
        n_mean: at most this many inputs in the mean (None = all).

    Example:
        >>> information_flow(model, task).figure().show()   # doctest: +SKIP
    """
    model = load(model)
    head = _check_head(model, head)
    label = None
    if hasattr(data, "dataset") and hasattr(data, "heldout_pairs"):
        one, many = _default_flow_input(data, key)
        label = f"key {key}, pair {tuple(data.heldout_pairs[0])}"
    else:
        tokens = data.tokens if _is_anchor(data) else data
        batches = model.prepare(tokens)
        many = torch.cat([b.tokens for b in batches])
        if any(b.attention_mask is not None and not b.valid.all() for b in batches):
            raise InputError(
                "information_flow needs unpadded inputs of one length",
                fix="pass sequences without padding",
            )
        if not -len(many) <= index < len(many):
            raise InputError(
                f"index {index} is outside the {len(many)} inputs", fix="pick a valid row"
            )
        one = many[index : index + 1]
    if n_mean is not None:
        many = many[:n_mean]
    rows = []
    for scope, tokens in (("single", one), ("mean", many)):
        patterns = _patterns(model, tokens, head)
        for layer, pat in enumerate(patterns):
            t = pat.shape[-1]
            for q in range(t):
                for s in range(t):
                    if model.is_causal and s > q:
                        continue
                    rows.append(
                        {
                            "scope": scope,
                            "layer": layer,
                            "query": q,
                            "source": s,
                            "weight": float(pat[q, s]),
                            "token": int(one[0, s]),
                        }
                    )
    df = pd.DataFrame(rows)
    summary: dict[str, Any] = {"n_mean": len(many)}
    last = df[(df.scope == "single") & (df["query"] == df["query"].max())]
    for layer, part in last.groupby("layer"):
        summary[f"strongest_into_last_L{int(layer)}"] = int(part.loc[part.weight.idxmax()].source)
    meta = {"head": head, "label": label, "model": repr(model)}
    return FlowResult(df, summary, meta)


@torch.no_grad()
def _patterns(model: Model, tokens: torch.Tensor, head: int | None) -> list[np.ndarray]:
    """Mean (over inputs, and heads unless ``head``) attention pattern ``[T, T]`` per layer."""
    sums: dict[int, torch.Tensor] = {}

    def keep(layer: int) -> Callable:
        def fn(tensor: torch.Tensor, hook: Any) -> None:
            pat = tensor.detach().double()
            pat = pat[:, head] if head is not None else pat.mean(1)
            sums[layer] = sums.get(layer, 0) + pat.sum(0)

        return fn

    count = 0
    for batch in model.prepare(tokens, 256):
        hooks = [(f"blocks.{i}.attn.hook_pattern", keep(i)) for i in range(model.n_layers)]
        model.forward(batch, hooks)
        count += len(batch.tokens)
    return [(sums[i] / count).cpu().numpy() for i in range(model.n_layers)]


__all__ = [
    "KNOCKOUT_MODES",
    "MASK_MODES",
    "MEASURES",
    "ROLES",
    "FlowResult",
    "KnockoutResult",
    "MaskingResult",
    "attention_knockout",
    "check_knockout_supported",
    "edge_mask",
    "information_flow",
    "knock_out",
    "knockout_hooks",
    "mask_tokens",
    "token_masking",
]
