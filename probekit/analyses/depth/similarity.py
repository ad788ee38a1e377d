"""Layer similarity: how alike are the states of two layers, within one model or across two?

For every pair of layers (i, j) the hidden states of the measured tokens (the real tokens at
``positions``; pad positions are dropped) are compared. Layer numbers: at the site
``"resid_out"`` layer ``l`` is the residual stream after block ``l`` and layer ``-1`` the
embedding output (the input of block 0), so the axes are the integers -1 .. L-1; at
``"attn_out"`` / ``"mlp_out"`` layer ``l`` is that sublayer's update in block ``l`` (0 .. L-1).
Write X_i for the ``[n, d]`` states of layer i over the n measured tokens and X̄_i for X_i
centred by its mean over those n tokens (per layer).

- ``measure="cka"``: linear CKA(X_i, X_j) = HSIC(X_i, X_j) ÷ sqrt(HSIC(X_i, X_i) HSIC(X_j, X_j))
  with the *debiased* (unbiased) HSIC estimator of Song et al. (2012), as in Nguyen, Raghu and
  Kornblith (2021), by default (``debiased=True``; it can fall slightly outside [0, 1], and is
  exactly 1 for a layer against itself), or the biased estimator ||X̄_i^T X̄_j||_F^2 ÷ (n − 1)^2
  of Kornblith et al. (2019) (``debiased=False``). Both are computed in feature form, from the
  ``d_i x d_j`` products X̄_i^T X̄_j (or the ``n x n`` Gram matrices when there are fewer tokens
  than features), never an ``n x n`` matrix for n > d. Needs n >= 4 tokens.
- ``measure="cosine"``: the mean over the n tokens of cos(X̄_i[t], X̄_j[t]), the cosine of the
  two layers' centred states of the same token (torch's ``cosine_similarity``, eps 1e-12: a zero
  vector gives 0). Needs the same width in both layers.
- ``measure="linear_map"``: how well a least-squares affine map from layer i (rows) predicts
  layer j (columns), ``Y ≈ X W + b`` fitted on the tokens of a training part of the sequences
  and scored on the held-out sequences (``holdout``, drawn with ``seed``) as R² = 1 −
  Σ||Y − Ŷ||² ÷ Σ||Y − Ȳ||² (Ȳ: the held-out tokens' mean; summed over all features). Not
  symmetric: row i predicts column j. The cross-model layer map of the reference depth code.

With ``other=`` a second model the same tokens run through both (same vocabulary; refused
otherwise) and the matrix is L1 x L2, rows for ``model`` and columns for ``other``.

Blocks: runs of adjacent layers whose states are all mutually similar (every pair within the
run, in both directions, at least ``block_threshold``), read off the within-model matrix of
the first site greedily from the first layer (a partition of the layers). Near-identity layers
(at ``"resid_out"``): layer l whose output is alike its input (the similarity of layers l − 1
and l at least ``block_threshold``), a layer that changes the stream little (up to a rotation
and scale, for CKA); the summary gives them in the numbering of the layer swaps' permutable
blocks, so a permutable block made of near-identity layers reads apart from one whose layers
do work in any order.

The states of the measured tokens are held on the CPU in float32 (4 · n · d bytes per layer and
model); every measure is computed in float64.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = layer_similarity(toy_model(n_layers=2), toy_tokens())
    >>> res.matrix().shape, res.summary["measure"], res.summary["debiased"]
    ((3, 3), 'cka', True)
    >>> fig = res.figure()          # fig.show() in a notebook
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from probekit import figures
from probekit.analyses.common import check_outputs_finite, result_meta
from probekit.data import Batch, Data, position_mask
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.progress import counted
from probekit.result import Result
from probekit.words import figure_words, similarity_words

SIMILARITY_MEASURES = ("cka", "cosine", "linear_map")
"""The measures of :func:`layer_similarity` (see the module)."""

SIMILARITY_SITES = ("resid_out", "attn_out", "mlp_out")
"""The sites whose states :func:`layer_similarity` compares."""

INPUT_LAYER = -1
"""The layer number of the embedding output (the input of block 0) at ``"resid_out"``."""

COSINE_EPS = 1e-12


# ---------------------------------------------------------------- the measures
def _frobenius_cross(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||X^T Y||_F^2 from the ``d_x x d_y`` product, or from the ``n x n`` Gram matrices when
    there are fewer tokens than features (the same number)."""
    n, dx, dy = x.shape[0], x.shape[1], y.shape[1]
    if n * n < dx * dy:
        return ((x @ x.T) * (y @ y.T)).sum()
    return (x.T @ y).square().sum()


def hsic(x: torch.Tensor, y: torch.Tensor, debiased: bool = True) -> float:
    """Linear-kernel HSIC of the ``[n, d]`` states ``x`` and ``y`` (float64), in feature form.

    ``debiased``: the unbiased estimator of Song et al. (2012) with K = x x^T, L = y y^T and
    K̃, L̃ their zero-diagonal copies, 1/(n(n−3)) [tr(K̃L̃) + 1ᵀK̃1 1ᵀL̃1 / ((n−1)(n−2)) −
    2/(n−2) 1ᵀK̃L̃1], written with x^T y and the row norms so no n x n matrix is formed; it does
    not change when x or y is shifted. Else the biased ||x̄^T ȳ||_F^2 / (n − 1)^2 of the centred
    states.

    Example:
        >>> x = torch.randn(50, 3, dtype=torch.float64)
        >>> round(hsic(x, x) / hsic(x + 5.0, x), 10)
        1.0
    """
    n = x.shape[0]
    if not debiased:
        xc, yc = x - x.mean(0), y - y.mean(0)
        return float(_frobenius_cross(xc, yc)) / (n - 1) ** 2
    a, b = x.square().sum(1), y.square().sum(1)
    sx, sy = x.sum(0), y.sum(0)
    trace = _frobenius_cross(x, y) - (a * b).sum()
    sum_k, sum_l = sx @ sx - a.sum(), sy @ sy - b.sum()
    k1_l1 = ((x @ sx - a) * (y @ sy - b)).sum()
    value = trace + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 * k1_l1 / (n - 2)
    return float(value) / (n * (n - 3))


def linear_cka(x: torch.Tensor, y: torch.Tensor, debiased: bool = True) -> float:
    """Linear CKA of the ``[n, d_x]`` and ``[n, d_y]`` states of the same n tokens (float64,
    :func:`hsic`); NaN where a layer's own HSIC is not positive (constant states).

    Example:
        >>> x = torch.randn(40, 6, dtype=torch.float64)
        >>> q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
        >>> round(linear_cka(x, 3.0 * x @ q), 10)
        1.0
    """
    x, y = _centred(x), _centred(y)
    scale = hsic(x, x, debiased) * hsic(y, y, debiased)
    return hsic(x, y, debiased) / math.sqrt(scale) if scale > 0 else math.nan


def _centred(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x - x.mean(0)


def _cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean over tokens of cos(x̄[t], ȳ[t]) of the centred states."""
    return float(F.cosine_similarity(_centred(x), _centred(y), dim=-1, eps=COSINE_EPS).mean())


def _split(sequence_ids: torch.Tensor, holdout: float, seed: int) -> tuple[torch.Tensor, ...]:
    """Token masks (train, held out): a seeded draw of ``holdout`` of the sequences (at least
    one, and at least one kept for training) is held out whole."""
    sequences = torch.unique(sequence_ids)
    g = torch.Generator().manual_seed(seed)
    order = sequences[torch.randperm(len(sequences), generator=g)]
    n_out = min(max(1, round(holdout * len(sequences))), len(sequences) - 1)
    held = torch.isin(sequence_ids, order[:n_out])
    return ~held, held


def _map_score(x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, test: torch.Tensor) -> float:
    """Held-out R² of the least-squares affine map from ``x`` to ``y`` fitted on ``train``."""
    x, y = x.double(), y.double()
    ones = torch.ones(x.shape[0], 1, dtype=torch.float64)
    design = torch.cat([x, ones], dim=1)
    weights = torch.linalg.lstsq(design[train], y[train], driver="gelsd").solution
    target = y[test]
    error = (design[test] @ weights - target).square().sum()
    spread = (target - target.mean(0)).square().sum()
    return float(1.0 - error / spread) if spread > 0 else math.nan


# ---------------------------------------------------------------- reading the states
def _site_layers(model: Model, site: str) -> list[int]:
    first = [INPUT_LAYER] if site == "resid_out" else []
    return first + list(range(model.n_layers))


def _hook(model: Model, site: str, layer: int) -> str:
    if layer == INPUT_LAYER:
        return model.hook_name(0, "resid_in")
    return model.hook_name(layer, site)


def _states(
    model: Model, batches: list[Batch], masks: list[torch.Tensor], sites: Sequence[str]
) -> dict[tuple[str, int], torch.Tensor]:
    """The ``[n, d]`` float32 CPU states of the measured tokens, per (site, layer), in the
    order of the batches and their tokens."""
    parts: dict[tuple[str, int], list[torch.Tensor]] = {}
    for batch, mask in counted(list(zip(batches, masks, strict=True))):

        def keep(key: tuple[str, int], mask: torch.Tensor = mask) -> Any:
            def fn(tensor: torch.Tensor, hook: Any) -> None:
                chosen = tensor.detach()[mask.to(tensor.device)]
                parts.setdefault(key, []).append(chosen.float().cpu())

            return fn

        hooks = [
            (_hook(model, site, layer), keep((site, layer)))
            for site in sites
            for layer in _site_layers(model, site)
        ]
        check_outputs_finite(model.forward(batch, hooks))
    return {key: torch.cat(chunks) for key, chunks in parts.items()}


def _measured_tokens(batches: list[Batch], masks: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([b.tokens[m].cpu() for b, m in zip(batches, masks, strict=True)])


def _sequence_ids(batches: list[Batch], masks: list[torch.Tensor]) -> torch.Tensor:
    ids, first = [], 0
    for mask in masks:
        rows = torch.arange(first, first + mask.shape[0]).unsqueeze(1).expand_as(mask)
        ids.append(rows[mask.cpu()])
        first += mask.shape[0]
    return torch.cat(ids)


# ---------------------------------------------------------------- blocks
def similar_blocks(matrix: np.ndarray, layers: Sequence[int], threshold: float) -> list[list[int]]:
    """Half-open layer ranges ``[start, stop)`` partitioning ``layers``: each run, grown from
    the left while every pair inside it (both directions) is at least ``threshold``.

    Example:
        >>> m = np.array([[1, .95, .5], [.95, 1, .6], [.5, .6, 1]])
        >>> similar_blocks(m, [-1, 0, 1], 0.9)
        [[-1, 1], [1, 2]]
    """
    n, blocks, start = len(layers), [], 0
    alike = np.minimum(matrix, matrix.T) >= threshold
    while start < n:
        stop = start + 1
        while stop < n and alike[start : stop + 1, start : stop + 1].all():
            stop += 1
        blocks.append([int(layers[start]), int(layers[stop - 1]) + 1])
        start = stop
    return blocks


def near_identity_layers(
    matrix: np.ndarray, layers: Sequence[int], threshold: float
) -> list[list[int]]:
    """Half-open ranges of the near-identity layers of a ``"resid_out"`` matrix: layer l
    (>= 0) whose output state is alike its input state (layer l − 1's output, or the
    embeddings), both directions at least ``threshold``; adjacent ones joined.

    Example:
        >>> m = np.array([[1, .5, .4, .4], [.5, 1, .95, .9], [.4, .95, 1, .97], [.4, .9, .97, 1]])
        >>> near_identity_layers(m, [-1, 0, 1, 2], 0.9)
        [[1, 3]]
    """
    runs: list[list[int]] = []
    for k in range(1, len(layers)):
        if min(matrix[k - 1, k], matrix[k, k - 1]) < threshold:
            continue
        layer = int(layers[k])
        if runs and runs[-1][1] == layer:
            runs[-1][1] = layer + 1
        else:
            runs.append([layer, layer + 1])
    return runs


# ---------------------------------------------------------------- the result
class SimilarityResult(Result):
    """``df`` columns: ``site``, ``layer`` (of the model, the rows), ``other_layer`` (of the
    other model, or the same one: the columns), ``value``. ``summary``: ``measure``,
    ``debiased`` (CKA), ``n_tokens``, ``n_layers`` (and ``n_layers_other``), and within one model
    ``block_threshold``, ``blocks_site``, ``similar_blocks`` and ``near_identity_layers`` (see
    the module); ``mean_adjacent`` is the mean similarity of adjacent layers."""

    kind = "layer_similarity"

    def matrix(self, site: str | None = None) -> pd.DataFrame:
        """The similarity matrix of ``site`` (default: the first): rows the model's layers,
        columns the other's."""
        site = site or str(self.df.site.iloc[0])
        part = self.df[self.df.site == site]
        return part.pivot(index="layer", columns="other_layer", values="value")

    def figure(self, site: str | None = None) -> go.Figure:
        site = site or str(self.df.site.iloc[0])
        table = self.matrix(site)
        measure = str(self.summary["measure"])
        said = similarity_words(measure, bool(self.summary.get("debiased", True)))
        names = self.meta.get("names") or ["model", "model"]
        rows, cols = [int(v) for v in table.index], [int(v) for v in table.columns]
        where = figure_words("layer_similarity", site)
        fig = figures.heatmap(
            table.to_numpy(),
            cols,
            rows,
            figure_words("layer_similarity", "title", measure=said["title"], site=where),
            x_title=figure_words("layer_similarity", "axis", name=names[1]),
            y_title=figure_words("layer_similarity", "axis", name=names[0]),
            colorbar=said["colorbar"],
        )
        low, high = said["range"]
        fig.update_traces(zmin=low, zmax=high, colorscale=said["scale"])
        fig.update_layout(width=720, height=640)
        return fig


# ---------------------------------------------------------------- checks
def _check_options(
    measure: object, sites: object, block_threshold: object, holdout: object
) -> tuple[str, ...]:
    if measure not in SIMILARITY_MEASURES:
        raise InputError(
            f"unknown measure={measure!r}", fix=f"use one of {list(SIMILARITY_MEASURES)}"
        )
    if isinstance(sites, str):
        sites = (sites,)
    if not isinstance(sites, list | tuple) or not sites:
        raise InputError(f"sites={sites!r} is not a list of sites", fix="pass e.g. ('resid_out',)")
    for site in sites:
        if site not in SIMILARITY_SITES:
            raise InputError(f"unknown site {site!r}", fix=f"use {list(SIMILARITY_SITES)}")
    for name, value in (("block_threshold", block_threshold), ("holdout", holdout)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InputError(f"{name}={value!r} is not a finite number", fix=f"pass a {name}")
    if not 0 < holdout < 1:  # type: ignore[operator]  # a number: checked just above
        raise InputError(f"holdout={holdout!r} is outside (0, 1)", fix="pass e.g. holdout=0.25")
    return tuple(dict.fromkeys(sites))


def _check_other(model: Model, other: Model, measure: str) -> None:
    """Refuse a second model that reads the tokens otherwise: another vocabulary size, another
    tokenizer's vocabulary; and the cosine between states of different widths."""
    if other.d_vocab != model.d_vocab:
        raise InputError(
            f"the two models have vocabularies of {model.d_vocab} and {other.d_vocab} tokens, so "
            "the same token ids are different tokens",
            fix="compare models that share a tokenizer (two checkpoints of a run, a static and a "
            "grown model of one recipe)",
        )
    mine, theirs = model.tokenizer, other.tokenizer
    if mine is not None and theirs is not None and mine.get_vocab() != theirs.get_vocab():
        raise InputError(
            "the two models' tokenizers map tokens to different ids",
            fix="compare models that share a tokenizer",
        )
    if measure == "cosine" and other.d_model != model.d_model:
        raise InputError(
            f"the cosine compares states of one width, but the models are {model.d_model} and "
            f"{other.d_model} wide",
            fix="use measure='cka' or 'linear_map', which compare states of any widths",
        )


def _prepared(
    model: Model, data: Data, positions: str, batch_size: int | None
) -> tuple[list[Batch], list[torch.Tensor]]:
    batches = model.prepare(data, batch_size)
    return batches, [position_mask(b, positions) for b in batches]


# ---------------------------------------------------------------- the analyzer
@torch.no_grad()
def layer_similarity(
    model: Model,
    data: Data,
    *,
    other: Model | None = None,
    measure: str = "cka",
    sites: Sequence[str] = ("resid_out",),
    positions: str = "all",
    batch_size: int | None = None,
    debiased: bool = True,
    block_threshold: float = 0.9,
    holdout: float = 0.25,
    seed: int = 0,
    names: Sequence[str] | None = None,
) -> SimilarityResult:
    """The layer x layer similarity matrix of ``model`` (or against ``other``) on ``data``.

    Args:
        other: a second model (same vocabulary) run on the same tokens; None: ``model`` itself.
        measure: 'cka' (linear CKA, debiased unless ``debiased=False``), 'cosine' (mean cosine
            of the centred states) or 'linear_map' (held-out R² of a least-squares map from
            each row layer to each column layer); see the module.
        sites: 'resid_out' (the residual stream after each block, layer -1 the embeddings),
            'attn_out', 'mlp_out'.
        block_threshold: the similarity every pair inside a block of alike layers reaches.
        holdout: the share of the sequences the linear map is scored on.
        seed: the draw of the held-out sequences.
        names: the two models' names on the figure's axes (default: 'model' / 'other model').

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> a, b = toy_model(n_layers=2), toy_model("llama", n_layers=3)
        >>> res = layer_similarity(a, toy_tokens(8, 12), other=b, measure="linear_map")
        >>> res.matrix().shape
        (3, 4)
    """
    model = load(model)
    other_model = None if other is None else load(other)
    chosen = _check_options(measure, sites, block_threshold, holdout)
    batches, masks = _prepared(model, data, positions, batch_size)
    n = int(sum(int(m.sum()) for m in masks))
    needed = {"cka": 4, "cosine": 1, "linear_map": 3}[measure]
    if n < needed:
        raise InputError(
            f"{measure} needs at least {needed} measured tokens, the data give {n}",
            fix="pass more or longer sequences, or positions='all'",
        )
    pair = None
    if other_model is not None:
        _check_other(model, other_model, measure)
        pair = _prepared(other_model, data, positions, batch_size)
        if not torch.equal(_measured_tokens(batches, masks), _measured_tokens(*pair)):
            raise InputError(
                "the two models read different tokens from the data",
                fix="pass token ids both models take as they are",
            )
    train = test = None
    heldout: list[int] | None = None
    if measure == "linear_map":
        ids = _sequence_ids(batches, masks)
        if len(torch.unique(ids)) < 2:
            raise InputError(
                "the linear map is scored on held-out sequences, but the data have one",
                fix="pass two or more sequences",
            )
        train, test = _split(ids, holdout, seed)
        heldout = sorted({int(i) for i in ids[test]})
    states = _states(model, batches, masks, chosen)
    states_other = states
    if other_model is not None and pair is not None:
        states_other = _states(other_model, *pair, chosen)
    second = model if other_model is None else other_model
    rows = []
    for site in chosen:
        score = _scorer(measure, debiased, train, test, states, states_other, site)
        for i in _site_layers(model, site):
            for j in _site_layers(second, site):
                rows.append({"site": site, "layer": i, "other_layer": j, "value": score(i, j)})
    df = pd.DataFrame(rows)
    result_names = list(names) if names is not None else ["model", "other model"]
    if other_model is None and names is None:
        result_names = ["model", "model"]
    summary = _summary(df, model, other_model, measure, debiased, n, block_threshold, chosen[0])
    meta = result_meta(
        model,
        other=None if other_model is None else repr(other_model),
        positions=positions,
        batch_size=batch_size,
        sites=list(chosen),
        holdout=holdout if measure == "linear_map" else None,
        seed=seed if measure == "linear_map" else None,
        heldout_sequences=heldout,
        names=result_names,
    )
    return SimilarityResult(df, summary, meta)


def _scorer(
    measure: str,
    debiased: bool,
    train: torch.Tensor | None,
    test: torch.Tensor | None,
    states: dict[tuple[str, int], torch.Tensor],
    states_other: dict[tuple[str, int], torch.Tensor],
    site: str,
) -> Any:
    """``score(i, j)``: the measure of the model's layer i against the other's layer j."""
    if measure == "cosine":
        return lambda i, j: _cosine(states[(site, i)], states_other[(site, j)])
    if measure == "linear_map":
        assert train is not None and test is not None, "the linear map has its split"
        return lambda i, j: _map_score(states[(site, i)], states_other[(site, j)], train, test)

    # each layer is centred (in float64) when it is read, so no float64 copy of all is held
    def own_hsic(table: dict[tuple[str, int], torch.Tensor]) -> dict[int, float]:
        return {
            k[1]: hsic(_centred(x), _centred(x), debiased) for k, x in table.items() if k[0] == site
        }

    symmetric = states_other is states
    own = own_hsic(states)
    own_other = own if symmetric else own_hsic(states_other)
    done: dict[tuple[int, int], float] = {}

    def cka(i: int, j: int) -> float:
        key = (min(i, j), max(i, j)) if symmetric else (i, j)  # symmetric: computed once
        if key not in done:
            x, y = _centred(states[(site, key[0])]), _centred(states_other[(site, key[1])])
            scale = own[key[0]] * own_other[key[1]]
            done[key] = hsic(x, y, debiased) / math.sqrt(scale) if scale > 0 else math.nan
        return done[key]

    return cka


def _summary(
    df: pd.DataFrame,
    model: Model,
    other: Model | None,
    measure: str,
    debiased: bool,
    n: int,
    threshold: float,
    site: str,
) -> dict[str, Any]:
    summary: dict[str, Any] = {"measure": measure, "n_tokens": n, "n_layers": model.n_layers}
    if measure == "cka":
        summary["debiased"] = debiased
    if other is not None:
        summary["n_layers_other"] = other.n_layers
        return summary
    part = df[df.site == site]
    table = part.pivot(index="layer", columns="other_layer", values="value")
    matrix = table.to_numpy()
    layers = [int(v) for v in table.index]
    blocks = similar_blocks(matrix, layers, threshold)
    adjacent = [matrix[k, k + 1] for k in range(len(layers) - 1)]
    summary.update(
        block_threshold=float(threshold),
        blocks_site=site,
        similar_blocks=blocks,
        near_identity_layers=near_identity_layers(matrix, layers, threshold)
        if site == "resid_out"
        else [],
        mean_adjacent=float(np.mean(adjacent)) if adjacent else math.nan,
    )
    return summary
