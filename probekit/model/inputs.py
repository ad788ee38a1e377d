"""What a model takes in: the checks of token ids, attention masks, labels, layer and head
indices, the default targets and batch sizes, and text tokenized into a right-padded batch.

:meth:`probekit.model.Model.prepare` runs these checks on every batch, so each problem is one
:class:`~probekit.errors.InputError` naming its fix, before any forward.

Example:
    >>> import torch
    >>> default_labels(torch.tensor([[5, 6, 7]]), None, causal=True)
    tensor([[   6,    7, -100]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from probekit.data import Batch
from probekit.errors import InputError

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
"""Token ids, labels and masks may have any of these dtypes (they become long)."""

OUTPUT_BATCH_BYTES = 64 * 2**20
"""The most bytes one batch's float32 output ``[sequences, tokens, vocabulary or width]`` takes
when no ``batch_size`` is given: :meth:`probekit.model.Model.prepare` splits larger batches so.
Every analysis holds a few output-sized tensors per batch (the clean side, a variant's logits, a
lens layer's logits), so at a real vocabulary this, not the residuals, sets the peak memory;
the per-token numbers do not depend on the split. A backward (``prepare(...,
backward=True)``) counts the output three times and :data:`BACKWARD_FLOATS_PER_LAYER` floats
per token and layer besides."""

BACKWARD_FLOATS_PER_LAYER = 24
"""Floats per token, in units of d_model, that a backward keeps per block (the activations
autograd saves: norms, attention projections and probabilities, the MLP's hidden layer), for
the backward's default batch size."""


STACKED_ROWS = 1024
"""Token rows one block run takes on a CPU when hook-free variants of one batch are stacked
along the batch dimension (:meth:`probekit.model.Trace.resume_stacked`): a batch of fewer
tokens runs ``STACKED_ROWS // tokens`` variants at a time (:func:`stacked_variants`). Measured
on one Llama-3.1-8B block at 128 tokens, two threads (``python benchmarks/bench_scale.py
--shape llama-3.1-8b --stacking``), per variant: 240 ms alone and 179 ms stacked eight times
(188 ms sixteen times) with float32 weights; 443 ms and 206 ms (194 ms) with the weights kept
in bf16 and copied to float32 when read, a copy made once per run instead of per variant. A
batch of 1024 tokens or more runs one variant at a time, as before."""


def stacked_variants(tokens: int) -> int:
    """Hook-free variants a CPU block run stacks for a batch of ``tokens`` tokens
    (:data:`STACKED_ROWS`).

    Example:
        >>> stacked_variants(128), stacked_variants(512), stacked_variants(4096)
        (8, 2, 1)
    """
    return max(1, STACKED_ROWS // max(1, tokens))


def variants_per_run(
    tokens: int,
    device_type: str,
    *,
    d_model: int,
    d_vocab: int,
    n_layers: int,
    free: int | None,
    half: bool = False,
) -> int:
    """Hook-free variants of a batch of ``tokens`` tokens one block run stacks by default: on
    a CPU :func:`stacked_variants`; on an accelerator as many as half its ``free`` bytes hold
    (each variant's activations and output, about ``16 d_model + d_vocab`` floats per token,
    half as many under autocast to a ``half`` dtype), at most ``n_layers``.

    Example:
        >>> variants_per_run(128, "cpu", d_model=64, d_vocab=100, n_layers=2, free=None)
        8
    """
    if device_type == "cpu":
        return stacked_variants(tokens)
    per_variant = 4 * tokens * (16 * d_model + d_vocab) * (1 if half else 2)
    return max(1, min(n_layers, int(0.5 * (free or 0) // max(per_variant, 1))))


def default_batch_size(
    seq_len: int,
    width: int,
    d_model: int,
    n_layers: int,
    backward: bool = False,
    sequences: int | None = None,
    gradient_sums: int | None = None,
) -> int:
    """Sequences of ``seq_len`` tokens per batch whose float32 output of ``width`` values per
    token stays within :data:`OUTPUT_BATCH_BYTES` (at least one); for a ``backward``, with the
    gradients and saved activations of ``n_layers`` blocks of ``d_model`` counted too.

    A backward over several batches holds every block weight's gradient summed over them
    (``gradient_sums`` bytes; :mod:`probekit.analyses.depth.gradients`), one batch holds one
    weight's gradient at a time: so all ``sequences`` run as one batch when their backward
    takes no more memory than those sums would.

    Example:
        >>> default_batch_size(128, 50_000, 512, 8, backward=True)
        1
        >>> default_batch_size(128, 50_000, 512, 8, backward=True, sequences=4,
        ...                    gradient_sums=4 * 10**9)   # 4 GB of sums: one batch is less
        4
    """
    floats = width
    if backward:
        floats = 3 * width + BACKWARD_FLOATS_PER_LAYER * d_model * n_layers
    size = max(1, OUTPUT_BATCH_BYTES // (4 * max(1, seq_len) * floats))
    if backward and sequences is not None and gradient_sums is not None and sequences > size:
        whole = 4 * sequences * max(1, seq_len) * floats
        if whole <= gradient_sums:
            return sequences
    return size


def swap_pairs(n_layers: int, pairs: str = "adjacent") -> list[tuple[int, int]]:
    """The layer pairs ``layer_swaps`` swaps for ``pairs="adjacent"`` (neighbours) or
    ``"all"`` (every pair i < j), as :func:`probekit.model.estimate.diagnosis_plan` counts them.

    Example:
        >>> swap_pairs(3), swap_pairs(3, "all")
        ([(0, 1), (1, 2)], [(0, 1), (0, 2), (1, 2)])
    """
    if pairs == "adjacent":
        return [(i, i + 1) for i in range(n_layers - 1)]
    return [(i, j) for i in range(n_layers) for j in range(i + 1, n_layers)]


def swapped_order(n_layers: int, first: Sequence[int], second: Sequence[int]) -> list[int]:
    """The layer order with two contiguous, non-overlapping ranges of layers exchanged.

    ``first`` and ``second`` are ``(start, stop)`` ranges; single layers are ``(i, i + 1)``.

    Example:
        >>> swapped_order(4, (0, 1), (2, 4))
        [2, 3, 1, 0]
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


def check_token_shape(tokens: torch.Tensor) -> None:
    """Token ids must be an integer ``[batch, pos]`` tensor (a 0-D or 3-D one is refused
    before anything reads its shape).

    Example:
        >>> check_token_shape(torch.tensor(3))
        Traceback (most recent call last):
        ...
        probekit.errors.InputError: tokens have shape (). Fix: pass tokens as [batch, pos].
    """
    if tokens.dtype not in INTEGER_DTYPES:
        raise InputError(
            f"token ids have dtype {tokens.dtype}", fix="pass integer (long) token ids"
        )
    if tokens.ndim != 2:
        raise InputError(
            f"tokens have shape {tuple(tokens.shape)}", fix="pass tokens as [batch, pos]"
        )


def check_tokens(tokens: torch.Tensor, d_vocab: int, n_ctx: int) -> None:
    """Token ids must be an integer ``[batch, pos]`` tensor of ids in the vocabulary, with at
    most ``n_ctx`` positions."""
    check_token_shape(tokens)
    if tokens.numel() == 0:
        raise InputError("the data is empty (no tokens)", fix="pass at least one token")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        bad = high if high >= d_vocab else low
        raise InputError(
            f"token id {bad} is outside the vocabulary [0, {d_vocab})",
            fix="tokenize with this model's vocabulary",
        )
    if tokens.shape[1] > n_ctx:
        raise InputError(
            f"sequences have {tokens.shape[1]} tokens, more than the model's context of {n_ctx}",
            fix=f"truncate or split sequences to at most {n_ctx} tokens",
        )


def check_mask(mask: torch.Tensor) -> None:
    """A mask must be right padding: per row 1 ... 1 0 ... 0, with at least one 1 (left
    padding is moved to the right before, by :func:`probekit.data.right_padded`).

    Any real or bool dtype is accepted as long as every value is exactly 0 or 1."""
    if mask.is_complex():
        raise InputError(
            f"the attention mask has dtype {mask.dtype}",
            fix="pass an integer or bool mask of 0 (padding) and 1 (real token)",
        )
    empty = (~(mask != 0).any(-1)).nonzero()
    if len(empty):
        raise InputError(
            f"row {int(empty[0])} of the attention mask marks no token as real",
            fix="drop sequences that are all padding; mark real tokens with 1",
        )
    if not bool(((mask == 0) | (mask == 1)).all()):
        bad = mask[(mask != 0) & (mask != 1)][0].item()
        raise InputError(
            f"the attention mask holds the value {bad}",
            fix="mark real tokens with 1 and padding with 0",
        )
    real = mask != 0
    after_padding = (~real).long().cummax(-1).values.bool() & real
    if after_padding.any():
        row = int(after_padding.any(-1).nonzero()[0])
        raise InputError(
            f"row {row} of the attention mask has a hole (0 between 1s); probekit handles "
            "left or right padding of one contiguous run of real tokens",
            fix="keep each sequence's real tokens contiguous (pad on the left or the right)",
        )


def check_labels(labels: torch.Tensor, d_vocab: int) -> None:
    """Labels must be integer token ids in the vocabulary, or -100 (no target)."""
    if labels.dtype not in INTEGER_DTYPES:
        raise InputError(
            f"labels have dtype {labels.dtype}",
            fix="pass integer token ids as labels (-100 = no target)",
        )
    bad = (labels != -100) & ((labels < 0) | (labels >= d_vocab))
    if bad.any():
        raise InputError(
            f"label {int(labels[bad][0])} is neither a token id in [0, {d_vocab}) nor -100",
            fix="use the model's token ids as labels and -100 where there is no target",
        )


def check_batch(batch: Batch, d_vocab: int, n_ctx: int) -> None:
    """Every check of one batch: its tokens, the shapes of its mask and labels, the mask's
    right padding and the labels' ids."""
    check_tokens(batch.tokens, d_vocab, n_ctx)
    for what, t in (("attention_mask", batch.attention_mask), ("labels", batch.labels)):
        if t is not None and t.shape != batch.tokens.shape:
            raise InputError(
                f"{what} has shape {tuple(t.shape)} but tokens have {tuple(batch.tokens.shape)}",
                fix=f"give {what} the same [batch, pos] shape as the tokens",
            )
    if batch.attention_mask is not None:
        check_mask(batch.attention_mask)
    if batch.labels is not None:
        check_labels(batch.labels, d_vocab)


def require_targets(batches: Sequence[Batch]) -> None:
    """Refuse prepared ``batches`` in which no position has a target (prepared batches carry
    their labels; one without labels is not refused here)."""
    if all(b.labels is not None and bool((b.labels == -100).all()) for b in batches):
        raise InputError(
            "no position of the data has a target (every label is -100; a decoder's "
            "one-token sequences have no next token)",
            fix="pass sequences of at least two tokens, or labels with token ids",
        )


def default_labels(tokens: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Targets per position: the next real token (``causal``, decoders) or the token itself
    (encoders); -100 where there is none."""
    valid = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
    if not causal:
        return torch.where(valid, tokens, torch.full_like(tokens, -100))
    labels = torch.full_like(tokens, -100)
    ok = valid[:, :-1] & valid[:, 1:]
    labels[:, :-1] = torch.where(ok, tokens[:, 1:], labels[:, :-1])
    return labels


def check_layer(layer: Any, n_layers: int, what: str = "layer") -> int:
    """``layer`` as an int in ``0..n_layers-1``, or :class:`InputError` naming the problem
    (other types, ``True``/``False`` and floats included)."""
    return _check_index(layer, n_layers, what, "layers")


def check_layer_list(layers: Any, n_layers: int, what: str = "layer order") -> list[int]:
    """``layers`` (a list, tuple, range, or a 1-D numpy array or tensor) as a list of layer
    indices in ``0..n_layers-1``, else :class:`InputError` naming the first bad entry.

    Example:
        >>> check_layer_list(range(3), 4), check_layer_list(torch.tensor([2, 0]), 4)
        ([0, 1, 2], [2, 0])
    """
    if hasattr(layers, "tolist") and getattr(layers, "ndim", None) == 1:
        layers = layers.tolist()  # a numpy array or tensor of indices
    if isinstance(layers, str) or not isinstance(layers, list | tuple | range):
        raise InputError(
            f"{what} {layers!r:.60} is not a list of layer indices",
            fix=f"pass layer indices in 0..{n_layers - 1}, e.g. "
            f"{list(reversed(range(n_layers)))[:8]}",
        )
    return [check_layer(layer, n_layers) for layer in layers]


def check_head(head: Any, n_heads: int) -> int | None:
    """``head`` as an int in ``0..n_heads-1``, ``None`` (all heads), or :class:`InputError`."""
    if head is None:
        return None
    return _check_index(head, n_heads, "head", "heads", ", or head=None for all heads")


def _check_index(value: Any, n: int, what: str, unit: str, alternative: str = "") -> int:
    """``value`` as an int in ``0..n-1`` (the model has ``n`` ``unit``), else :class:`InputError`
    naming the problem; ``alternative`` ends the fix (another accepted value)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InputError(
            f"{what} {value!r} is a {type(value).__name__}, not an integer",
            fix=f"pass a {what} index in 0..{n - 1}{alternative}",
        )
    if not 0 <= int(value) < n:
        raise InputError(
            f"{what} {value!r} is outside the model's {n} {unit}",
            fix=f"use a {what} index in 0..{n - 1}{alternative}",
        )
    return int(value)


def probe_batch(n_ctx: int, d_vocab: int, device: torch.device) -> Batch:
    """The fixed batch of 2 to 6 tokens the structure and block-copy checks run."""
    n = max(2, min(6, n_ctx))
    tokens = ((torch.arange(n) * 7 + 3) % d_vocab).view(1, n).to(device)
    return Batch(tokens, torch.ones_like(tokens))


def tokenize(tok: Any, texts: Sequence[str], length: int, architecture: str) -> Batch:
    """``texts`` as one right-padded batch of the tokenizer ``tok`` (``None``: refused for the
    checkpoint ``architecture``), each text cut at ``length`` tokens; see
    :meth:`probekit.model.Model.tokenize`."""
    if tok is None:
        raise InputError(
            f"the {architecture} checkpoint has no tokenizer to tokenize text with",
            fix="save a tokenizer beside the weights, or pass token ids",
        )
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise InputError("texts must be a non-empty list of strings", fix='pass ["...", ...]')
    side, pad = tok.padding_side, tok.pad_token
    if pad is None:
        filler = tok.eos_token or tok.unk_token
        if filler is None:
            raise InputError(
                "the tokenizer has no pad, EOS or UNK token to pad a batch with",
                fix="pass texts one at a time, or token ids with an attention mask",
            )
    try:
        tok.padding_side = "right"
        if pad is None:
            tok.pad_token = filler
        enc = tok(
            list(texts),
            padding=True,
            truncation=True,
            max_length=length,
            add_special_tokens=True,
            return_tensors="pt",
        )
    finally:
        tok.padding_side = side
        if pad is None:
            tok.pad_token = None
    return Batch(enc["input_ids"], enc["attention_mask"])


__all__ = [
    "BACKWARD_FLOATS_PER_LAYER",
    "INTEGER_DTYPES",
    "OUTPUT_BATCH_BYTES",
    "STACKED_ROWS",
    "check_batch",
    "check_head",
    "check_labels",
    "check_layer",
    "check_layer_list",
    "check_mask",
    "check_token_shape",
    "check_tokens",
    "default_batch_size",
    "default_labels",
    "probe_batch",
    "require_targets",
    "stacked_variants",
    "swap_pairs",
    "swapped_order",
    "variants_per_run",
    "tokenize",
]
