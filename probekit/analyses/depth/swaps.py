"""Layer swaps and permutable blocks: which layers can trade places without harm?

For every pair of layers (or only adjacent pairs, for speed) the two blocks exchange positions
and the change of the mean token loss is measured. Layers are then clustered into *contiguous*
permutable blocks: agglomerative clustering (scikit-learn, average linkage) on the distance
``max(loss change of swapping i and j, 0)`` with a chain connectivity graph, so only neighbouring
groups can merge and every cluster is a contiguous range of layers. Clustering stops when the
average swap cost between two neighbouring groups exceeds ``tolerance`` (default: 2% of the
clean loss), or at ``n_blocks`` blocks if given. With adjacent swaps only, the distance between
two layers further apart is the largest adjacent cost between them.

How sure is each boundary? The loss changes are kept per sequence, and a bootstrap resamples
sequences (or whole batches, ``bootstrap_unit="batch"``) with replacement, recomputes every
swap's loss change and reclusters; a boundary's confidence is the fraction of replicates that
place a boundary there, and every swap gets a 95% percentile interval. Finally the blocks found
are swapped whole against each other (``blocks="auto"``), which tests the claim directly.

A model without an LM head has no loss: its swap cost is the mean ``rel_l2`` output change
||z' - z|| / ||z|| of its final hidden state per token (or pooled embedding per sequence),
the clean cost is 0, and the default ``tolerance`` is 0.02 (a 2% relative change);
``summary["output"]`` / ``summary["measure"]`` say which.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = layer_swaps(toy_model(n_layers=4), toy_tokens(), pairs="adjacent", n_bootstrap=20)
    >>> res.summary["n_blocks"] == len(res.summary["blocks"])
    True
    >>> list(res.boundary_confidence().index)
    [1, 2, 3]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from sklearn.cluster import AgglomerativeClustering

from probekit import figures
from probekit.analyses.common import (
    cost_measure,
    loss_mask,
    output_note,
    result_meta,
    sequence_mask,
)
from probekit.analyses.depth.shared import Shared, make_shared
from probekit.data import Data, position_mask
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.model.inputs import swap_pairs, swapped_order
from probekit.progress import expect
from probekit.result import Result
from probekit.words import figure_words, swap_cost

Range = tuple[int, int]

MAX_BOOTSTRAP = 10_000
"""The most bootstrap replicates :func:`layer_swaps` runs (about a second per thousand on a
24-layer model with adjacent swaps; each replicate reclusters)."""


def contiguous_blocks(
    distance: np.ndarray, n_blocks: int | None = None, tolerance: float | None = None
) -> list[Range]:
    """Cluster layers into contiguous blocks from a symmetric ``[L, L]`` distance matrix.

    Exactly one of ``n_blocks`` and ``tolerance`` must be given.

    Example:
        >>> d = np.array([[0, .1, 5, 5], [.1, 0, 5, 5], [5, 5, 0, .1], [5, 5, .1, 0]])
        >>> contiguous_blocks(d, tolerance=1.0)
        [(0, 2), (2, 4)]
    """
    n = distance.shape[0]
    if n == 1:
        return [(0, 1)]
    if n_blocks is not None and not 1 <= n_blocks <= n:
        raise InputError(f"n_blocks={n_blocks} is outside 1..{n}", fix=f"pick 1..{n} blocks")
    connectivity = np.eye(n, k=1) + np.eye(n, k=-1)
    clustering = AgglomerativeClustering(
        n_clusters=n_blocks,
        distance_threshold=None if n_blocks is not None else tolerance,
        metric="precomputed",
        linkage="average",
        connectivity=connectivity,
        compute_full_tree=True,
    )
    labels = clustering.fit_predict(np.asarray(distance, dtype=float))
    starts = [0] + [k for k in range(1, n) if labels[k] != labels[k - 1]]
    return [(a, b) for a, b in zip(starts, starts[1:] + [n], strict=True)]


def swap_distance(delta: np.ndarray, adjacent_only: bool) -> np.ndarray:
    """Distance matrix from a (NaN where unmeasured) matrix of swap loss changes."""
    n = delta.shape[0]
    dist = np.nan_to_num(np.maximum(delta, 0.0), nan=0.0)
    dist = np.maximum(dist, dist.T)
    if adjacent_only:
        steps = np.array([dist[k, k + 1] for k in range(n - 1)])
        for i in range(n):
            for j in range(i + 2, n):
                dist[i, j] = dist[j, i] = steps[i:j].max()
    np.fill_diagonal(dist, 0.0)
    return dist


class SwapResult(Result):
    """``df`` rows by ``kind``: 'layer_swap' and 'block_swap' (a swap of the ranges
    [first_start, first_stop) and [second_start, second_stop) with its mean loss change
    ``value`` and 95% bootstrap interval), 'block' (a permutable block [first_start,
    first_stop), value = mean loss change of swaps inside it) and 'boundary' (a possible block
    boundary before layer first_start, value = bootstrap confidence, ``in_estimate`` whether
    the point estimate has it). ``summary``: ``blocks``, ``n_blocks``, ``clean_loss``,
    ``tolerance``, ``max_adjacent_swap_delta``, ``mean_adjacent_swap_delta``, ``n_layers``.
    """

    kind = "swaps"

    def matrix(self) -> pd.DataFrame:
        """Loss change of swapping layers i and j (symmetric; NaN where not measured)."""
        n = int(self.summary["n_layers"])
        mat = np.full((n, n), np.nan)
        np.fill_diagonal(mat, 0.0)
        for row in self.df[self.df.kind == "layer_swap"].itertuples():
            mat[row.first_start, row.second_start] = mat[row.second_start, row.first_start] = (
                row.value
            )
        return pd.DataFrame(mat, index=range(n), columns=range(n))

    def boundary_confidence(self) -> pd.Series:
        """Bootstrap confidence of a block boundary before each layer 1..L-1."""
        part = self.df[self.df.kind == "boundary"]
        return part.set_index("first_start")["value"].sort_index()

    def figure(self) -> go.Figure:
        mat = self.matrix()
        n = mat.shape[0]
        cost = swap_cost(self.summary.get("measure"))
        fig = figures.heatmap(
            mat.to_numpy(),
            x=list(range(n)),
            y=list(range(n)),
            title=figure_words("swaps", cost=cost["title"]),
            x_title=figure_words("swaps", "x"),
            y_title=figure_words("swaps", "y"),
            colorbar=cost["colorbar"],
            signed=True,
        )
        for start, stop in self.summary["blocks"]:
            fig.add_shape(
                type="rect",
                x0=start - 0.5,
                x1=stop - 0.5,
                y0=start - 0.5,
                y1=stop - 0.5,
                line={"color": "black", "width": 2},
            )
        for k, conf in self.boundary_confidence().items():
            if conf > 0:
                fig.add_annotation(  # above the plot area, not inside a layer's row
                    x=k - 0.5,
                    y=1.0,
                    yref="paper",
                    yanchor="bottom",
                    text=f"{conf:.0%}",
                    showarrow=False,
                    font={"size": 10},
                )
        return figures.fit_top(fig)  # room above the plot for the confidences and the title


def _variant_orders(
    n: int, pairs: str | Sequence[tuple[int, int]]
) -> list[tuple[str, Range, Range]]:
    chosen: list[tuple[int, ...]]
    if pairs in ("adjacent", "all"):
        chosen = list(swap_pairs(n, pairs))
    elif isinstance(pairs, str):
        raise InputError(f"unknown pairs={pairs!r}", fix="use 'adjacent', 'all' or a list of pairs")
    else:
        chosen = [tuple(sorted((int(i), int(j)))) for i, j in pairs]
    variants = []
    for i, j in chosen:
        if i == j or not (0 <= i < n and 0 <= j < n):
            raise InputError(
                f"cannot swap layers ({i}, {j})", fix=f"use distinct layers in 0..{n - 1}"
            )
        variants.append(("layer_swap", (i, i + 1), (j, j + 1)))
    return variants


class _SequenceLosses:
    """Per-sequence sums of the token loss for the clean run and each swap variant (of the
    ``rel_l2`` output change, clean 0, for a model without an LM head)."""

    def __init__(self, shared: Shared, batches: list, positions: str) -> None:
        self.model, self.batches, self.positions = shared.model, batches, positions
        self.shared = shared
        clean, counts, batch_ids = [], [], []
        for index, batch in enumerate(batches):
            mask = self._mask(batch)
            clean.append(self._sums(shared.clean_cost(batch), mask))
            counts.append(mask.sum(-1).double().cpu().numpy())
            batch_ids.append(np.full(batch.tokens.shape[0], index))
        self.clean = np.concatenate(clean)
        self.counts = np.concatenate(counts)
        self.batch_ids = np.concatenate(batch_ids)
        if self.counts.sum() == 0:
            raise InputError(
                "no selected position has a target, so swaps have no loss to change",
                fix="pass labels, or use positions='all'",
            )

    def _mask(self, batch) -> torch.Tensor:
        """The positions whose loss (or hidden-space change) counts: one per sequence for a
        pooled embedding."""
        selected = position_mask(batch, self.positions)
        if self.model.output_kind == "logits":
            return loss_mask(batch.labels, selected)
        return sequence_mask(selected) if self.model.output_kind == "embedding" else selected

    @staticmethod
    def _sums(costs: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        return (costs * mask).sum(-1).cpu().numpy()

    def variants(self, pairs: Sequence[tuple[Range, Range]]) -> np.ndarray:
        """Per-sequence cost sums ``[variants, sequences]`` of the swaps of ``pairs`` (the
        :func:`~probekit.analyses.common.cost_measure`); each resumes at the first swapped
        layer, stacked per pass (see :class:`Shared`)."""
        n = self.model.n_layers
        orders = [swapped_order(n, first, second) for first, second in pairs]
        starts = [min(first[0], second[0]) for first, second in pairs]
        per_batch = []
        expect(len(pairs) * len(self.batches))  # the live line's variants
        for batch in self.batches:
            clean, mask = self.shared.clean_cost(batch), self._mask(batch)
            changes = self.shared.swap_costs(batch, orders, starts)
            per_batch.append([self._sums(clean + change, mask) for change in changes])
        return np.array(
            [np.concatenate([rows[v] for rows in per_batch]) for v in range(len(pairs))]
        ).reshape(len(pairs), len(self.clean))

    def variant(self, first: Range, second: Range) -> np.ndarray:
        return self.variants([(first, second)])[0]


class _SwapDeltas:
    """Loss changes of the swap variants, for any weighting of the sequences (bootstrap)."""

    def __init__(self, losses: _SequenceLosses, variants: list, adjacent_only: bool) -> None:
        self.losses, self.variants, self.adjacent_only = losses, variants, adjacent_only
        self.n = losses.model.n_layers
        self.sums = (
            losses.variants([(first, second) for _, first, second in variants])
            if variants
            else np.zeros((0, len(losses.clean)))
        )
        self.clean_loss = float(losses.clean.sum() / losses.counts.sum())

    def deltas(self, weights: np.ndarray) -> np.ndarray:
        """Mean loss change of every variant with sequence ``weights``."""
        total = (self.losses.counts * weights).sum()
        return ((self.sums - self.losses.clean) * weights).sum(-1) / max(total, 1e-300)

    def matrix(self, values: np.ndarray) -> np.ndarray:
        """``[L, L]`` matrix of variant values (NaN where a pair was not swapped)."""
        mat = np.full((self.n, self.n), np.nan)
        for (_, (i, _i1), (j, _j1)), value in zip(self.variants, values, strict=True):
            mat[i, j] = mat[j, i] = value
        return mat

    def cluster(self, values: np.ndarray, n_blocks: int | None, tolerance: float) -> list[Range]:
        dist = swap_distance(self.matrix(values), self.adjacent_only)
        return contiguous_blocks(dist, n_blocks, None if n_blocks is not None else tolerance)


def _bootstrap(
    swaps: _SwapDeltas, cluster, n_bootstrap: int, unit: str, seed: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Boundary counts per layer and the replicate deltas ``[n_bootstrap, variants]``."""
    losses = swaps.losses
    rng = np.random.default_rng(seed)
    units = np.arange(len(losses.clean)) if unit == "sequence" else losses.batch_ids
    unit_ids = np.unique(units)
    boundary_counts = np.zeros(swaps.n)
    replicates = []
    for _ in range(n_bootstrap):
        picked = rng.choice(unit_ids, size=len(unit_ids), replace=True)
        weights = np.bincount(picked, minlength=unit_ids.max() + 1)[units].astype(float)
        replicate = swaps.deltas(weights)
        replicates.append(replicate)
        for start, _ in cluster(replicate)[1:]:
            boundary_counts[start] += 1
    return boundary_counts, (np.array(replicates) if n_bootstrap else None)


def _check_swap_settings(blocks: Any, tolerance: object, n_layers: int) -> None:
    """Given blocks must be ranges inside the model's layers; a tolerance finite and >= 0."""
    if tolerance is not None and (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, int | float)
        or not math.isfinite(tolerance)
        or tolerance < 0
    ):
        raise InputError(
            f"tolerance={tolerance!r} is not a finite cost change of at least 0",
            fix="pass None (2% of the clean cost) or a number such as 0.05",
        )
    if blocks is None or isinstance(blocks, str):
        return
    for block in blocks:
        pair = tuple(block) if isinstance(block, list | tuple) else ()
        whole = len(pair) == 2 and all(
            hasattr(v, "__index__") and not isinstance(v, bool) for v in pair
        )
        if not whole or not 0 <= pair[0] < pair[1] <= n_layers:
            raise InputError(
                f"block {block!r} is not a half-open layer range [start, stop) of the model's "
                f"{n_layers} layers",
                fix=f"give ranges with 0 <= start < stop <= {n_layers}, e.g. (0, 2)",
            )


def _check_swap_options(bootstrap_unit: str, blocks: object, n_bootstrap: int) -> None:
    if bootstrap_unit not in ("sequence", "batch"):
        raise InputError(
            f"unknown bootstrap_unit={bootstrap_unit!r}", fix="use 'sequence' or 'batch'"
        )
    if isinstance(blocks, str) and blocks != "auto":
        raise InputError(f"unknown blocks={blocks!r}", fix="use 'auto', None or a list of ranges")
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 0:
        raise InputError(
            f"n_bootstrap={n_bootstrap!r} is not a non-negative integer",
            fix="pass a count such as 200 (0: no bootstrap)",
        )
    if n_bootstrap > MAX_BOOTSTRAP:
        raise InputError(
            f"n_bootstrap={n_bootstrap} is more than {MAX_BOOTSTRAP} replicates (each reclusters "
            "the layers; 10**7 would take hours)",
            fix=f"pass at most {MAX_BOOTSTRAP}; 200-1000 give boundary confidences to a percent",
        )


@torch.no_grad()
def layer_swaps(
    model: Model,
    data: Data,
    *,
    pairs: str | Sequence[tuple[int, int]] = "all",
    blocks: str | Sequence[Range] | None = "auto",
    n_blocks: int | None = None,
    tolerance: float | None = None,
    n_bootstrap: int = 200,
    bootstrap_unit: str = "sequence",
    seed: int = 0,
    positions: str = "all",
    batch_size: int | None = None,
    cache: Shared | None = None,
    estimate: bool = True,
) -> SwapResult:
    """Swap layers (and blocks) and cluster the layers into contiguous permutable blocks.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data; the loss is the mean token cross-entropy over positions with targets.
        pairs: 'all' pairs of layers, 'adjacent' pairs only, or an explicit list of pairs.
        blocks: 'auto' swaps the permutable blocks found against each other; a list of
            ``(start, stop)`` ranges swaps those instead; None swaps no blocks.
        n_blocks: cluster into exactly this many blocks (else use ``tolerance``).
        tolerance: the largest average swap loss change inside a block, in nats
            (default 2% of the clean loss).
        n_bootstrap: bootstrap replicates for boundary confidences and swap intervals (0: none).
        bootstrap_unit: resample 'sequence's or whole 'batch'es.
        seed: seed of the bootstrap.
        positions: 'all' real tokens, or the 'last' real token of each sequence.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice of
            :meth:`probekit.Model.default_batch_size`); the numbers do not depend on it, but
            ``bootstrap_unit='batch'`` resamples these batches.
        cache: a :class:`~probekit.analyses.depth.shared.Shared` cache of one diagnosis (its
            clean traces; ``variants_per_pass`` stacks swaps into one forward).
        estimate: before running more than ``ESTIMATE_ABOVE`` swaps (``pairs='all'`` costs
            O(L^2)), print their count and the block passes they cost (to stderr).

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> res = layer_swaps(toy_model(n_layers=3), toy_tokens(), n_bootstrap=5)
        >>> res.summary["n_layers"], res.matrix().shape
        (3, (3, 3))
    """
    # 88 lines long: 16 are the signature and 29 the docstring documenting every parameter;
    # the body is one pipeline (check, measure, bootstrap, table).
    model = load(model)
    _check_swap_options(bootstrap_unit, blocks, n_bootstrap)
    _check_swap_settings(blocks, tolerance, model.n_layers)
    variants = _variant_orders(model.n_layers, pairs)
    shared = make_shared(model, cache)
    batches = model.prepare(data, batch_size)
    if estimate:
        _print_estimate(model.n_layers, variants, batches)
    losses = _SequenceLosses(shared, batches, positions)
    swaps = _SwapDeltas(losses, variants, adjacent_only=pairs == "adjacent")
    if tolerance is None:
        tolerance = 0.02 * swaps.clean_loss if model.output_kind == "logits" else 0.02
    tolerance = float(tolerance)

    def cluster(values: np.ndarray) -> list[Range]:
        return swaps.cluster(values, n_blocks, tolerance)

    point = swaps.deltas(np.ones_like(losses.clean))
    found = cluster(point)
    boundary_counts, replicates = _bootstrap(swaps, cluster, n_bootstrap, bootstrap_unit, seed)
    block_ranges = found if blocks == "auto" else ([] if blocks is None else list(blocks))
    rows = [
        *_swap_rows(variants, point, replicates),
        *_block_swap_rows(losses, block_ranges),
        *_block_rows(swaps.matrix(point), found),
        *_boundary_rows(model.n_layers, found, boundary_counts, n_bootstrap),
    ]
    df = pd.DataFrame(rows)
    df["in_estimate"] = df["in_estimate"].fillna(False).astype(bool)
    summary = _swap_summary(swaps, point, found, boundary_counts, n_bootstrap, pairs, tolerance)
    # the cost the swaps are judged by (the loss change in nats with a vocabulary), as in the
    # heading, the tolerance and the colour bar; not the headline measure of the other analyses
    summary.update(output_note(model), measure=cost_measure(model))
    if model.output_kind != "logits":
        summary["clean_loss"] = float("nan")  # no loss without a vocabulary
    meta = result_meta(
        model,
        positions=positions,
        batch_size=batch_size,
        n_bootstrap=n_bootstrap,
        bootstrap_unit=bootstrap_unit,
        seed=seed,
    )
    return SwapResult(df, summary, meta)


ESTIMATE_ABOVE = 64
"""More swap variants than this print an estimate of their cost before they run."""


def _print_estimate(n: int, variants: list, batches: list) -> None:
    """Print how many swaps will run and their cost in block passes (prefixes reused)."""
    if len(variants) <= ESTIMATE_ABOVE:
        return
    passes = sum(n - min(first[0], second[0]) for _, first, second in variants)
    tokens = sum(batch.tokens.numel() for batch in batches)
    print(
        f"layer_swaps: {len(variants)} swap variants, {passes} block passes over {tokens} "
        f"tokens with prefixes reused (a clean forward is {n}); about "
        f"{passes / max(n, 1):.0f} clean forwards",
        file=sys.stderr,
    )


def _swap_rows(variants: list, point: np.ndarray, replicates: np.ndarray | None) -> list[dict]:
    rows = []
    for index, (kind, first, second) in enumerate(variants):
        low = high = np.nan
        if replicates is not None:
            low, high = np.percentile(replicates[:, index], [2.5, 97.5])
        rows.append(_row(kind, first, second, point[index], low, high))
    return rows


def _block_swap_rows(losses: _SequenceLosses, block_ranges: list) -> list[dict]:
    rows = []
    for first, second in combinations(block_ranges, 2):
        block_sums = losses.variant(tuple(first), tuple(second))
        value = (block_sums - losses.clean).sum() / losses.counts.sum()
        rows.append(_row("block_swap", tuple(first), tuple(second), value, np.nan, np.nan))
    return rows


def _block_rows(mat: np.ndarray, found: list[Range]) -> list[dict]:
    rows = []
    for start, stop in found:
        inside = [mat[i, j] for i in range(start, stop) for j in range(i + 1, stop)]
        inside = [v for v in inside if np.isfinite(v)]
        value = np.mean(inside) if inside else 0.0
        rows.append(_row("block", (start, stop), (-1, -1), value, np.nan, np.nan))
    return rows


def _boundary_rows(
    n: int, found: list[Range], boundary_counts: np.ndarray, n_bootstrap: int
) -> list[dict]:
    starts = {start for start, _ in found[1:]}
    rows = []
    for k in range(1, n):
        conf = boundary_counts[k] / n_bootstrap if n_bootstrap else np.nan
        row = _row("boundary", (k, k), (-1, -1), conf, np.nan, np.nan)
        row["in_estimate"] = k in starts
        rows.append(row)
    return rows


def _swap_summary(
    swaps: _SwapDeltas,
    point: np.ndarray,
    found: list[Range],
    boundary_counts: np.ndarray,
    n_bootstrap: int,
    pairs: object,
    tolerance: float,
) -> dict:
    starts = [start for start, _ in found[1:]]
    adjacent = [point[i] for i, (_, f, s) in enumerate(swaps.variants) if abs(f[0] - s[0]) == 1]
    return {
        "n_layers": swaps.n,
        "clean_loss": swaps.clean_loss,
        "tolerance": tolerance,
        "pairs": pairs if isinstance(pairs, str) else "custom",
        "blocks": [list(b) for b in found],
        "n_blocks": len(found),
        "max_adjacent_swap_delta": float(max(adjacent)) if adjacent else float("nan"),
        "mean_adjacent_swap_delta": float(np.mean(adjacent)) if adjacent else float("nan"),
        "min_boundary_confidence": float(min(boundary_counts[starts] / n_bootstrap))
        if starts and n_bootstrap
        else float("nan"),
    }


def _row(kind: str, first: Range, second: Range, value: float, low: float, high: float) -> dict:
    return {
        "kind": kind,
        "first_start": int(first[0]),
        "first_stop": int(first[1]),
        "second_start": int(second[0]),
        "second_stop": int(second[1]),
        "value": float(value),
        "ci_low": float(low),
        "ci_high": float(high),
        "in_estimate": None,
    }
