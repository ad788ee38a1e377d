"""Interventions: context managers that change what a model computes and always restore it.

Each one restores the model in ``finally``: no hook, no reordered layer and no changed weight
survives the ``with`` block, even one that raised. The ``*_hooks`` functions return the
TransformerLens hook lists the context managers install; the analyzers run their resumed
forwards (:meth:`probekit.model.Trace.resume`) inside these context managers, and
:func:`merge` is the whole-layer skip at chosen positions as a residual, the fast path of a
skip that needs no hook at all.

:class:`InterventionSetting` is how the depth analyzers intervene and reduce: one frozen value
(convention, mode, the position kept, the future positions and their seed, the answer starts,
the positions per component, the ablation kind) passed as ``setting=`` to
:func:`~probekit.contributions`, :func:`~probekit.skip_effects`, :func:`~probekit.logit_lens`,
:func:`~probekit.residual_stats` and :func:`~probekit.diagnose`; it is checked when made and
resolved against a model (:meth:`InterventionSetting.resolved`) when an analysis starts.

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

import dataclasses
import hashlib
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from probekit.data import Batch, Data
from probekit.errors import InputError, UnsupportedModelError
from probekit.model import HookList, Model
from probekit.model.inputs import check_layer_list, swapped_order
from probekit.model.structure import MID_SITES

SUBLAYERS = ("attn", "mlp")
KNOCKOUT_MODES = ("pattern", "scores")
"""How :func:`knock_out` blocks an edge: 'pattern' zeroes its attention weight after the
softmax (no renormalisation); 'scores' sets its score to -inf (the softmax renormalises)."""
CONVENTIONS = ("probekit", "csordas2025")
"""How the depth analyses reduce per-token values (see
:mod:`probekit.analyses.depth.conventions`)."""
MODES = ("current", "future")
"""Where an intervention applies: at every position, or before positions t (measured after)."""
ABLATIONS = ("zero", "mean", "resample")
"""What an ablated update is replaced by (the ``ablation`` of :class:`InterventionSetting`):
zero; its mean over the data's real tokens (:func:`sublayer_means`); or, per position, the
update of another sequence of the same batch at that position (:func:`resample_rows`)."""
COMPONENT_POSITIONS = ("shared", "redrawn")
"""Whether the attention and MLP ablations of future mode use the layer's positions t or draw
their own after it."""


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


def masked_ablate_hooks(model: Model, layer: int, sublayer: str, mask: torch.Tensor) -> HookList:
    """Hooks that zero the ``sublayer`` update of ``layer`` at the positions in ``mask`` only
    (updates as in :meth:`probekit.Model.update_hooks`)."""
    if not model.post_norm:
        site = model.hook_name(layer, "attn_out" if sublayer == "attn" else "mlp_out")
        return [(site, lambda t, hook: t.masked_fill(mask[..., None], 0.0))]
    held: dict[str, torch.Tensor] = {}

    def keep(tensor: torch.Tensor, hook: Any) -> None:
        held["base"] = tensor

    def replace(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
        return torch.where(mask[..., None], held.pop("base"), tensor)

    mid = MID_SITES[model.structure.kind]
    before, at = ("resid_in", mid) if sublayer == "attn" else (mid, "resid_out")
    return [(model.hook_name(layer, before), keep), (model.hook_name(layer, at), replace)]


def merge(mask: torch.Tensor | None, intervened: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """``intervened`` where ``mask`` (everywhere when ``None``), ``clean`` elsewhere: with a
    block's input as ``intervened`` and its output as ``clean``, the residual leaving the block
    when it is skipped at the positions in ``mask`` (what :func:`skip_layer` computes there).

    Example:
        >>> merge(torch.tensor([True, False]), torch.zeros(2, 1), torch.ones(2, 1)).tolist()
        [[0.0], [1.0]]
    """
    if mask is None:
        return intervened
    return torch.where(mask[..., None], intervened, clean)


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
    *,
    at: torch.Tensor | None = None,
) -> Iterator[Model]:
    """Zero- or mean-ablate the attention or MLP update of one layer.

    Mean ablation replaces the update by its mean over all real tokens of ``data``. ``at``
    (a bool ``[batch, pos]`` mask of the batch that is run) zero-ablates at those positions
    only (:func:`masked_ablate_hooks`); ``None`` ablates at every position.
    """
    model.check_layer(layer)
    _site(sublayer)
    if at is not None:
        if mode != "zero":
            raise InputError(
                f"ablation at chosen positions is zero ablation; mode={mode!r} was given",
                fix="use mode='zero' with at=..., or at=None",
            )
        with model.hooks(masked_ablate_hooks(model, layer, sublayer, at)):
            yield model
        return
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
    """Mean update ``[d_model]`` of every layer over the real tokens of data (padding left
    out), keyed ``(layer, part)``: the attention ('attn') and MLP ('mlp') updates (as in
    :meth:`probekit.Model.update_hooks`) and the whole block's ('layer', its output minus
    its input). The one home of mean ablation (:func:`ablate` and the analyses'
    ``ablation='mean'``); accumulated in float64, returned in the model's dtype.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> means = sublayer_means(toy_model("gpt2", n_layers=2), toy_tokens(2, 5))
        >>> sorted(means)[:3], tuple(means[(0, "layer")].shape)
        ([(0, 'attn'), (0, 'layer'), (0, 'mlp')], (32,))
    """
    sums: dict[tuple[int, str], torch.Tensor] = {}
    count = 0

    def accumulate(layer: int, valid: torch.Tensor) -> Any:
        def fn(h_in, attn, mlp, h_out) -> None:
            for name, update in (("attn", attn), ("mlp", mlp), ("layer", h_out - h_in)):
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


@torch.no_grad()
def clean_updates(model: Model, batch: Batch) -> dict[tuple[int, str], torch.Tensor]:
    """The attention and MLP updates ``[batch, pos, d_model]`` of every layer in the clean
    forward of ``batch`` (one hooked forward), keyed ``(layer, 'attn' | 'mlp')``: what
    resample ablation takes from the other sequences."""
    out: dict[tuple[int, str], torch.Tensor] = {}

    def keep(layer: int) -> Any:
        def fn(h_in, attn, mlp, h_out) -> None:
            out[(layer, "attn")], out[(layer, "mlp")] = attn, mlp

        return fn

    fwd = [
        hook for layer in range(model.n_layers) for hook in model.update_hooks(layer, keep(layer))
    ]
    model.forward(batch, fwd)
    return out


def check_resample(batches: Sequence[Batch]) -> None:
    """Refuse batches that resample ablation cannot draw from: every batch needs two
    sequences or more, and at every real position of a sequence another sequence of its
    batch that is real there (the longest length of a batch held by two sequences or more)."""
    for i, batch in enumerate(batches):
        lengths = sorted(batch.valid.sum(-1).tolist())
        if len(lengths) < 2:
            raise InputError(
                f"resample ablation takes each update from another sequence of the same "
                f"batch, but batch {i} holds one sequence",
                fix="pass two sequences or more per batch (batch_size >= 2), or use "
                "ablation='mean'",
            )
        if lengths[-1] > lengths[-2]:
            raise InputError(
                f"resample ablation takes the update at each position from another sequence "
                f"real there, but one sequence of batch {i} has {int(lengths[-1])} real "
                f"tokens and every other at most {int(lengths[-2])}",
                fix="pass sequences of equal length (or two of the longest length per "
                "batch), or use ablation='mean'",
            )


def derangement(n: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of ``range(n)`` (n >= 2) that moves every index (drawn until
    one does).

    Example:
        >>> perm = derangement(5, torch.Generator().manual_seed(0))
        >>> sorted(perm.tolist()), bool((perm != torch.arange(5)).all())
        ([0, 1, 2, 3, 4], True)
    """
    while True:
        perm = torch.randperm(n, generator=generator)
        if bool((perm != torch.arange(n)).all()):
            return perm


def resample_rows(valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Per position ``[batch, pos]``: the sequence whose update replaces that position's in
    resample ablation. Each sequence b takes its updates from one other sequence d(b) (a
    seeded :func:`derangement`); where d(b) is padding, that position takes its update from
    another sequence drawn among those real there (never b itself, never a pad). Padding
    positions keep their own row. A position no other sequence is real at has no donor
    (InputError; :func:`check_resample` refuses such batches before any forward).

    Example:
        >>> valid = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
        >>> rows = resample_rows(valid, torch.Generator().manual_seed(0))
        >>> bool((rows != torch.arange(3)[:, None])[valid].all())
        True
    """
    valid = valid.cpu()
    n_rows = valid.shape[0]
    donor = derangement(n_rows, generator)
    rows = donor[:, None].expand_as(valid).clone()
    own = torch.arange(n_rows)[:, None].expand_as(valid)
    rows = torch.where(valid, rows, own)
    lacking = valid & ~torch.gather(valid, 0, rows)  # the donor is padding there
    for b, t in lacking.nonzero().tolist():
        others = [c for c in range(n_rows) if c != b and bool(valid[c, t])]
        if not others:
            check_resample([Batch(valid.long(), valid.long())])  # says which and why
        rows[b, t] = others[int(torch.randint(len(others), (1,), generator=generator))]
    return rows


@dataclass(frozen=True)
class Replacement:
    """What the ablated updates of one batch are replaced by: nothing (``kind='zero'``), the
    data's mean update ``means[(layer, part)]`` ('mean', :func:`sublayer_means`), or at each
    position the clean update of the sequence ``rows[b, t]`` at that position ('resample',
    :func:`resample_rows`). ``key`` tells replacements apart in a cache.

    Example:
        >>> updates = torch.arange(4.0).reshape(2, 2, 1)
        >>> swap = Replacement("resample", rows=torch.tensor([[1, 1], [0, 0]]), key="r")
        >>> swap.update(0, "layer", updates)[..., 0].tolist()
        [[2.0, 3.0], [0.0, 1.0]]
    """

    kind: str = "zero"
    means: dict[tuple[int, str], torch.Tensor] | None = field(default=None, repr=False)
    rows: torch.Tensor | None = field(default=None, repr=False)
    key: str = "zero"

    def update(
        self, layer: int, part: str, clean: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The update that replaces ``part`` ('layer', 'attn', 'mlp') of ``layer``: None for
        zero; ``clean`` (the clean updates ``[batch, pos, d_model]``) is read by resample."""
        if self.kind == "zero":
            return None
        if self.kind == "mean":
            assert self.means is not None, "a mean replacement holds the means"
            return self.means[(layer, part)]
        assert self.rows is not None and clean is not None, "resample reads the clean updates"
        rows = self.rows.to(clean.device)
        cols = torch.arange(rows.shape[1], device=clean.device).expand_as(rows)
        return clean[rows, cols]


def replace_update_hooks(
    model: Model, layer: int, sublayer: str, value: torch.Tensor | None, at: torch.Tensor | None
) -> HookList:
    """Hooks that replace the ``sublayer`` update of ``layer`` by ``value`` (``[d_model]`` or
    ``[batch, pos, d_model]``; None: zero) at the positions in ``at`` (None: everywhere).
    Zero ablation keeps its own hooks (:func:`ablate_hooks`, :func:`masked_ablate_hooks`)."""
    if value is None:
        if at is None:
            return ablate_hooks(model, layer, sublayer)
        return masked_ablate_hooks(model, layer, sublayer, at)
    model.check_layer(layer)
    return model.replace_update_hooks(layer, sublayer, value, at)


@contextmanager
def replace_update(
    model: Model, layer: int, sublayer: str, value: torch.Tensor | None, at: torch.Tensor | None
) -> Iterator[Model]:
    """Replace one sublayer update (:func:`replace_update_hooks`); hooks removed on exit."""
    with model.hooks(replace_update_hooks(model, layer, _site(sublayer), value, at)):
        yield model


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


# ---------------------------------------------------------------- the depth analyses' setting
@dataclass(frozen=True)
class InterventionSetting:
    """How the depth analyses intervene and reduce: one value passed as ``setting=`` to
    :func:`~probekit.contributions`, :func:`~probekit.skip_effects`,
    :func:`~probekit.logit_lens` and :func:`~probekit.residual_stats` (which only reduce, so
    read only ``convention``) and to :func:`~probekit.diagnose`. Checked when made (an
    :class:`~probekit.errors.InputError` names the field); see
    :mod:`probekit.analyses.depth.conventions` for what each field means.

    Attributes:
        convention: 'probekit' (token means) or 'csordas2025' (max over tokens, positions t
            and prompts; the reference code's reductions).
        mode: 'current' (intervene at every position) or 'future' (intervene at positions
            < t, measure at positions >= t).
        keep_first: never intervene at position 0 (None: when the tokenizer adds a BOS token,
            and always under 'csordas2025'; see :meth:`resolved`).
        n_future: how many positions t per prompt future mode draws.
        seed: the seed of future mode's draws.
        answer_start: future mode at given positions: per prompt an int (e.g. the answer
            start) or a sequence of ints (the effects are maxed over them); lists, arrays and
            tensors of integers are kept as a tuple of tuples of ints.
        component_positions: in future mode with drawn positions, 'shared' (the attention and
            MLP ablations of :func:`~probekit.contributions` use the layer's positions t) or
            'redrawn' (each draws its own, continuing the layer's random stream, as the
            reference code does); None: 'redrawn' under 'csordas2025', else 'shared'.
        ablation: what a removed update is replaced by (:data:`ABLATIONS`): 'zero' (the
            default; a skipped block returns its input), 'mean' (the update's mean over the
            data's real tokens at that site, computed once per analysis or diagnosis) or
            'resample' (per position the clean update of another sequence of the same batch,
            drawn with ``seed``; see :func:`resample_rows`). Read by
            :func:`~probekit.contributions` and :func:`~probekit.skip_effects`.

    Example:
        >>> from probekit.toy import toy_model
        >>> setting = InterventionSetting("csordas2025", "future").resolved(toy_model())
        >>> setting.keep_first, setting.component_positions, setting.reduction
        (True, 'redrawn', 'max')
        >>> InterventionSetting(mode="past")
        Traceback (most recent call last):
        ...
        probekit.errors.InputError: unknown mode 'past'. Fix: use one of ('current', 'future').
    """

    convention: str = "probekit"
    mode: str = "current"
    keep_first: bool | None = None
    n_future: int = 4
    seed: int = 123
    answer_start: Sequence[int | Sequence[int]] | None = None
    component_positions: str | None = None
    ablation: str = "zero"

    def __post_init__(self) -> None:
        check_convention(self.convention)
        check_ablation(self.ablation)
        if self.mode not in MODES:
            raise InputError(f"unknown mode {self.mode!r}", fix=f"use one of {MODES}")
        keep_first = self.keep_first
        if keep_first is not None and not isinstance(keep_first, bool):
            raise InputError(
                f"keep_first={keep_first!r} is not a bool", fix="pass True, False or None"
            )
        n_future, seed = self.n_future, self.seed
        if isinstance(n_future, bool) or not isinstance(n_future, int) or n_future < 1:
            raise InputError(f"n_future={n_future!r} is not a positive int", fix="e.g. n_future=4")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InputError(f"seed={seed!r} is not an int", fix="e.g. seed=123")
        if self.answer_start is not None:
            object.__setattr__(self, "answer_start", _positions(self.answer_start))
            if self.mode != "future":
                raise InputError("answer_start needs mode='future'", fix="pass mode='future'")
        _check_component_positions(self.component_positions, self.mode, self.answer_start)

    @property
    def _draws(self) -> bool:
        """Whether future mode draws the positions t (no ``answer_start`` gives them)."""
        return self.mode == "future" and self.answer_start is None

    def resolved(self, model: Model) -> InterventionSetting:
        """This setting with ``keep_first`` and ``component_positions`` decided for ``model``
        (the defaults the class docstring gives; set values are kept)."""
        keep_first = self.keep_first
        if keep_first is None:
            keep_first = self.convention == "csordas2025" or adds_bos(model.tokenizer)
        per_component = self.component_positions
        if per_component is None:
            redraw = self._draws and self.convention == "csordas2025"
            per_component = "redrawn" if redraw else "shared"
        return dataclasses.replace(self, keep_first=keep_first, component_positions=per_component)

    @property
    def reduction(self) -> str:
        """How skip and ablation effects are reduced: 'max' or 'token_mean'."""
        return "max" if self.convention == "csordas2025" else "token_mean"

    @property
    def redraws(self) -> bool:
        """Whether the attention and MLP ablations draw their own positions t."""
        return self.component_positions == "redrawn"

    def meta(self) -> dict:
        """The ``meta`` entries of an intervention analysis (future mode: also its draws)."""
        out: dict[str, Any] = {"convention": self.convention, "mode": self.mode}
        out["keep_first"] = self.keep_first
        if self.mode == "future":
            out.update(n_future=self.n_future, seed=self.seed)
        out["ablation"] = self.ablation
        if self.ablation == "resample":
            out["seed"] = self.seed
        return out


def check_ablation(ablation: object) -> str:
    """``ablation``, unless it is not one of :data:`ABLATIONS` (then InputError)."""
    if not isinstance(ablation, str) or ablation not in ABLATIONS:
        raise InputError(f"unknown ablation {ablation!r}", fix=f"use one of {ABLATIONS}")
    return ablation


def with_ablation(setting: InterventionSetting, ablation: str | None) -> InterventionSetting:
    """``setting`` checked (:func:`check_setting`), with the analyzers' ``ablation=``
    shorthand put in it: None keeps the setting's; a kind given both ways must agree (a
    setting's non-default kind is not silently overridden).

    Example:
        >>> with_ablation(InterventionSetting(), "mean").ablation
        'mean'
    """
    setting = check_setting(setting)
    if ablation is None:
        return setting
    check_ablation(ablation)
    if setting.ablation not in ("zero", ablation):
        raise InputError(
            f"ablation={ablation!r} was given beside a setting with ablation={setting.ablation!r}",
            fix="give the ablation kind once: in the setting or as ablation=",
        )
    return dataclasses.replace(setting, ablation=ablation)


def plan_replacements(
    model: Model,
    setting: InterventionSetting,
    batches: Sequence[Batch],
    means: dict[tuple[int, str], torch.Tensor] | None = None,
) -> list[Replacement]:
    """Per batch, what the ablated updates are replaced by under ``setting.ablation``: the
    mean updates ``means`` (:func:`sublayer_means` of the batches when not given), or the
    resampled rows drawn batch by batch from one generator seeded with ``setting.seed``
    (:func:`check_resample` refuses data it cannot draw from, before any forward)."""
    kind = setting.ablation
    if kind == "zero":
        return [Replacement() for _ in batches]
    if kind == "mean":
        means = sublayer_means(model, list(batches)) if means is None else means
        key = "mean:" + _digest(*(means[k] for k in sorted(means)))
        return [Replacement("mean", means=means, key=key) for _ in batches]
    check_resample(batches)
    generator = torch.Generator().manual_seed(setting.seed)
    out = []
    for batch in batches:
        rows = resample_rows(batch.valid, generator)
        out.append(Replacement("resample", rows=rows, key="resample:" + _digest(rows)))
    return out


def _digest(*tensors: torch.Tensor) -> str:
    """A short fingerprint of ``tensors``' values (a cache key)."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        raw = tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8)
        digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


def check_setting(setting: InterventionSetting) -> InterventionSetting:
    """``setting``, unless it is not an :class:`InterventionSetting` (then InputError)."""
    if not isinstance(setting, InterventionSetting):
        raise InputError(
            f"setting={setting!r} is not an InterventionSetting",
            fix="pass setting=probekit.InterventionSetting(convention=..., mode=..., ...)",
        )
    return setting


def check_convention(convention: str) -> None:
    """Raise :class:`InputError` unless ``convention`` is one of :data:`CONVENTIONS`."""
    if convention not in CONVENTIONS:
        raise InputError(f"unknown convention {convention!r}", fix=f"use one of {CONVENTIONS}")


def adds_bos(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` puts its BOS token first when encoding text (False if none)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if tokenizer is None or bos is None:
        return False
    try:
        ids = tokenizer("a")["input_ids"]
    except Exception:  # a tokenizer that cannot encode says nothing about BOS
        return False
    return len(ids) > 1 and ids[0] == bos


def _check_component_positions(value: str | None, mode: str, starts: object) -> None:
    """Refuse an unknown ``component_positions``, and 'redrawn' where no positions are drawn."""
    if value is not None and value not in COMPONENT_POSITIONS:
        raise InputError(
            f"unknown component_positions {value!r}", fix=f"use one of {COMPONENT_POSITIONS}"
        )
    if value == "redrawn" and not (mode == "future" and starts is None):
        raise InputError(
            "component_positions='redrawn' draws positions t, but "
            + ("answer_start gives them" if starts is not None else "mode='current' has none"),
            fix="leave component_positions unset, or use mode='future' without answer_start",
        )


ANSWER_FIX = "per prompt one int position, or a sequence of int positions, in data order"


def _positions(values: Sequence[int | Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """``values`` (per prompt an int, or a sequence of ints: lists, arrays or tensors of
    integers) as a tuple of tuples of ints, else InputError."""
    try:
        if isinstance(values, (str, bytes)):
            raise TypeError
        items = list(values)
    except TypeError:
        raise InputError(f"answer_start={values!r} is not a sequence", fix=ANSWER_FIX) from None
    return tuple(_prompt_positions(i, v) for i, v in enumerate(items))


def _prompt_positions(i: int, value: int | Sequence[int]) -> tuple[int, ...]:
    """The positions of prompt ``i``: an int, or a sequence of ints (not nested further)."""
    try:
        items: list[Any] = [value] if _is_int(value) else list(value)  # type: ignore[arg-type]
        if isinstance(value, (str, bytes)) or not all(_is_int(t) for t in items):
            raise TypeError
    except TypeError:
        raise InputError(
            f"answer_start[{i}]={value!r} is not an integer position or a sequence of them",
            fix=ANSWER_FIX,
        ) from None
    return tuple(operator.index(t) for t in items)


def _is_int(value: object) -> bool:
    """An integer that is not a bool (int, numpy integer, integer 0-d tensor)."""
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        return False
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


__all__ = [
    "ABLATIONS",
    "COMPONENT_POSITIONS",
    "CONVENTIONS",
    "KNOCKOUT_MODES",
    "MODES",
    "SUBLAYERS",
    "InterventionSetting",
    "Replacement",
    "ablate",
    "ablate_hooks",
    "check_ablation",
    "check_order",
    "check_resample",
    "clean_updates",
    "derangement",
    "edge_mask",
    "hooks",
    "knock_out",
    "knockout_hooks",
    "masked_ablate_hooks",
    "merge",
    "plan_replacements",
    "reorder_layers",
    "replace_update",
    "replace_update_hooks",
    "resample_rows",
    "resume_from",
    "skip_layer",
    "skip_layer_hooks",
    "sublayer_means",
    "swap_blocks",
    "swap_layers",
    "swapped_order",
    "with_ablation",
]
