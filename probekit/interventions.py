"""Interventions: context managers that change what a model computes and always restore it.

Each one restores the model in ``finally``: no hook, no reordered layer and no changed weight
survives the ``with`` block, even one that raised. The ``*_hooks`` functions return the
TransformerLens hook lists the context managers install, so the fast paths in the analyzers can
apply exactly the same edit inside a resumed forward (:meth:`probekit.model.Trace.resume`).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model, tokens = toy_model("gpt2", n_layers=2), toy_tokens(2, 5)
    >>> with skip_layer(model, 1):            # layer 1's output := its input
    ...     skipped = model.logits(tokens)
    >>> with swap_layers(model, 0, 1):
    ...     swapped = model.logits(tokens)
    >>> with knock_out(model, 1, [(-1, 0)]):  # the last token does not attend to the first
    ...     blocked = model.logits(tokens)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from probekit.data import Data
from probekit.errors import InputError, UnsupportedModelError
from probekit.model import HookList, Model
from probekit.model.inputs import check_layer_list

SUBLAYERS = ("attn", "mlp")
KNOCKOUT_MODES = ("pattern", "scores")
"""How :func:`knock_out` blocks an edge: 'pattern' zeroes its attention weight after the
softmax (no renormalisation); 'scores' sets its score to -inf (the softmax renormalises)."""


def _site(sublayer: str) -> str:
    if sublayer not in SUBLAYERS:
        raise InputError(f"unknown sublayer {sublayer!r}", fix="use 'attn' or 'mlp'")
    return sublayer


def skip_layer_hooks(model: Model, layer: int) -> list[tuple[str, Any]]:
    """Hooks that make block ``layer`` return its input unchanged (its whole update removed)."""
    model.check_layer(layer)
    stash: dict[str, torch.Tensor] = {}

    def keep_input(tensor: torch.Tensor, hook: Any) -> None:
        stash["h"] = tensor

    def return_input(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        return stash.pop("h")

    return [
        (model.hook_name(layer, "resid_in"), keep_input),
        (model.hook_name(layer, "resid_out"), return_input),
    ]


def ablate_hooks(
    model: Model, layer: int, sublayer: str, value: torch.Tensor | None = None
) -> list[tuple[str, Any]]:
    """Hooks that replace the ``sublayer`` ('attn' or 'mlp') update of ``layer``.

    ``value=None`` zero-ablates; otherwise the update is replaced by ``value`` (broadcast, e.g.
    a ``[d_model]`` mean for mean ablation). In pre-norm models the update is the sublayer output
    added to the residual stream; in post-norm models (BERT) it is the change the sublayer and
    its add-norm make to the stream, so zero-ablating it leaves the stream as it entered.
    """
    model.check_layer(layer)
    _site(sublayer)
    return model.replace_update_hooks(layer, sublayer, value)


@contextmanager
def hooks(model: Model, fwd_hooks: HookList) -> Iterator[Model]:
    """Install arbitrary TransformerLens forward hooks, removed on exit."""
    with model.hooks(fwd_hooks):
        yield model


@contextmanager
def skip_layer(model: Model, layers: int | Sequence[int]) -> Iterator[Model]:
    """Skip one or more layers: each block's output is set to its input."""
    if isinstance(layers, str) or not isinstance(layers, Sequence | range):
        layers = [layers]  # one layer; model.check_layer refuses what is not an integer
    fwd = [h for layer in layers for h in skip_layer_hooks(model, layer)]
    with model.hooks(fwd):
        yield model


@contextmanager
def ablate(
    model: Model,
    layer: int,
    sublayer: str,
    mode: str = "zero",
    data: Data | None = None,
) -> Iterator[Model]:
    """Zero- or mean-ablate the attention or MLP update of one layer.

    Mean ablation replaces the update by its mean over all real tokens of ``data``.
    """
    model.check_layer(layer)
    _site(sublayer)
    if mode == "zero":
        value = None
    elif mode == "mean":
        if data is None:
            raise InputError("mean ablation needs data", fix="pass data=tokens to ablate()")
        value = sublayer_means(model, data)[(layer, sublayer)]
    else:
        raise InputError(f"unknown ablation mode {mode!r}", fix="use mode='zero' or 'mean'")
    with model.hooks(ablate_hooks(model, layer, sublayer, value)):
        yield model


@torch.no_grad()
def sublayer_means(model: Model, data: Data) -> dict[tuple[int, str], torch.Tensor]:
    """Mean attention and MLP update ``[d_model]`` of every layer over the real tokens of data."""
    sums: dict[tuple[int, str], torch.Tensor] = {}
    count = 0

    def accumulate(layer: int, valid: torch.Tensor) -> Any:
        def fn(h_in, attn, mlp, h_out) -> None:
            for name, update in (("attn", attn), ("mlp", mlp)):
                total = (update * valid[..., None]).sum((0, 1), dtype=torch.float64)
                sums[(layer, name)] = sums.get((layer, name), 0) + total

        return fn

    for batch in model.prepare(data):
        valid = batch.valid.to(model.dtype)
        fwd = [
            hook
            for layer in range(model.n_layers)
            for hook in model.update_hooks(layer, accumulate(layer, valid))
        ]
        model.forward(batch, fwd)
        count += int(batch.valid.sum())
    return {key: (total / count).to(model.dtype) for key, total in sums.items()}


@contextmanager
def resume_from(model: Model, layer: int, residual: torch.Tensor) -> Iterator[Model]:
    """Forwards inside the block continue from ``residual`` as the input of block ``layer``.

    What blocks before ``layer`` compute is discarded (they still run, as in TransformerLens'
    ``start_at_layer``); :meth:`probekit.model.Trace.resume` is the fast path that skips them.
    ``residual`` must match the batch that is run: ``[batch, pos, d_model]``.
    """
    model.check_layer(layer)

    def replace(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        if tensor.shape != residual.shape:
            raise InputError(
                f"cached residual has shape {tuple(residual.shape)} but the forward's residual "
                f"at layer {layer} has {tuple(tensor.shape)}",
                fix="run the same batch the residual was cached from",
            )
        return residual.to(tensor.dtype)

    with model.hooks([(model.hook_name(layer, "resid_in"), replace)]):
        yield model


def check_order(model: Model, order: Sequence[int]) -> list[int]:
    """Validate that ``order`` is a permutation of ``range(n_layers)``: a sequence of layer
    indices (integers, not floats, bools or names), each layer exactly once."""
    order = check_layer_list(order, model.n_layers)
    if sorted(order) != list(range(model.n_layers)):
        raise InputError(
            f"layer order {order} is not a permutation of 0..{model.n_layers - 1}",
            fix="list every layer index exactly once",
        )
    return order


@contextmanager
def reorder_layers(model: Model, order: Sequence[int]) -> Iterator[Model]:
    """Run the blocks in ``order`` (a permutation of layer indices); restored on exit.

    The block modules themselves move in the model's ModuleList (weights are untouched); each
    keeps its hook names, so the output hook of block 3 still reads block 3 wherever it runs.
    """
    order = check_order(model, order)
    blocks = model.blocks
    original = list(blocks)
    try:
        for position, layer in enumerate(order):
            blocks[position] = original[layer]
        yield model
    finally:
        for position, module in enumerate(original):
            blocks[position] = module


def swapped_order(n_layers: int, first: Sequence[int], second: Sequence[int]) -> list[int]:
    """The layer order with two contiguous, non-overlapping ranges of layers exchanged.

    ``first`` and ``second`` are ``(start, stop)`` ranges; single layers are ``(i, i + 1)``.
    """
    (a, b), (c, d) = sorted([tuple(first), tuple(second)])
    if not (0 <= a < b <= c < d <= n_layers):
        raise InputError(
            f"blocks {tuple(first)} and {tuple(second)} are not two non-overlapping ranges "
            f"inside 0..{n_layers}",
            fix="give (start, stop) ranges with start < stop that do not overlap",
        )
    layers = list(range(n_layers))
    return layers[:a] + layers[c:d] + layers[b:c] + layers[a:b] + layers[d:]


@contextmanager
def swap_layers(model: Model, i: int, j: int) -> Iterator[Model]:
    """Exchange the positions of layers ``i`` and ``j``; restored on exit."""
    model.check_layer(i)
    model.check_layer(j)
    if i == j:
        raise InputError(f"cannot swap layer {i} with itself", fix="pass two different layers")
    with reorder_layers(model, swapped_order(model.n_layers, (i, i + 1), (j, j + 1))):
        yield model


@contextmanager
def swap_blocks(model: Model, first: tuple[int, int], second: tuple[int, int]) -> Iterator[Model]:
    """Exchange two contiguous blocks of layers, given as ``(start, stop)`` ranges."""
    with reorder_layers(model, swapped_order(model.n_layers, first, second)):
        yield model


# ---------------------------------------------------------------- attention-edge knockout
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


def check_knockout(model: Model, mode: str) -> None:
    """Raise unless ``mode`` is a knockout mode and ``model`` applies attention-pattern edits
    (:attr:`~probekit.model.Model.supports_pattern_edits`, tested once per model)."""
    if mode not in KNOCKOUT_MODES:
        raise InputError(f"unknown knockout mode {mode!r}", fix=f"use one of {KNOCKOUT_MODES}")
    if not model.supports_pattern_edits:
        raise UnsupportedModelError(
            f"the {model.architecture} bridge ignores edits of the attention pattern, so edges "
            "cannot be knocked out",
            fix="use a decoder whose attention the bridge computes itself (GPT-2, Llama, ...)",
        )


def _block_edges(tensor: torch.Tensor, blocked: torch.Tensor, mode: str) -> torch.Tensor:
    """``tensor`` (pattern or scores ``[B, heads, T, T]``) with the ``blocked`` entries removed."""
    if mode == "pattern":
        return tensor.masked_fill(blocked, 0.0)
    out = tensor.masked_fill(blocked, float("-inf"))
    # masked entries hold -inf or the dtype's minimum (HF's causal / padding mask)
    if (out <= torch.finfo(out.dtype).min).all(-1).any():
        raise InputError(
            "mode='scores' blocks every source of a query, which leaves no attention "
            "to renormalise",
            fix="use mode='pattern' to remove a query's whole attention update",
        )
    return out


def knockout_hooks(
    model: Model, layer: int, edges: Any, head: int | None = None, mode: str = "pattern"
) -> HookList:
    """Hooks that block the attention edges ``edges`` (see :func:`edge_mask`) at ``layer``.

    ``head=None`` blocks them in every head; ``mode`` is one of :data:`KNOCKOUT_MODES`.
    """
    layer = model.check_layer(layer)
    head = model.check_head(head)
    check_knockout(model, mode)

    def edit(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        blocked = edge_mask(edges, tensor.shape[-1]).to(tensor.device)
        while blocked.ndim < 3:
            blocked = blocked[None]
        blocked = blocked[:, None]  # [B or 1, 1, T, T]
        if head is not None:
            heads = torch.zeros(tensor.shape[1], dtype=torch.bool, device=tensor.device)
            heads[head] = True
            blocked = blocked & heads[None, :, None, None]
        return _block_edges(tensor, blocked, mode)

    site = "attn_pattern" if mode == "pattern" else "attn_scores"
    return [(model.hook_name(layer, site), edit)]


@contextmanager
def knock_out(
    model: Model, layer: int, edges: Any, *, head: int | None = None, mode: str = "pattern"
) -> Iterator[Model]:
    """Block attention edges ``(query, source)`` at one layer inside the block (see
    :func:`knockout_hooks`); the hooks are removed on exit, even after an exception.

    With ``mode="pattern"`` blocking every source of a query leaves that position's attention
    update equal to the output bias (zero without one).

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> model, tokens = toy_model("gpt2", n_layers=2), toy_tokens(2, 5)
        >>> with knock_out(model, 0, [(-1, s) for s in range(5)]):
        ...     blocked = model.logits(tokens)
        >>> bool((blocked[:, :-1] == model.logits(tokens)[:, :-1]).all())
        True
    """
    with model.hooks(knockout_hooks(model, layer, edges, head, mode)):
        yield model


__all__ = [
    "KNOCKOUT_MODES",
    "SUBLAYERS",
    "ablate",
    "ablate_hooks",
    "check_order",
    "edge_mask",
    "hooks",
    "knock_out",
    "knockout_hooks",
    "reorder_layers",
    "resume_from",
    "skip_layer",
    "skip_layer_hooks",
    "sublayer_means",
    "swap_blocks",
    "swap_layers",
    "swapped_order",
]
