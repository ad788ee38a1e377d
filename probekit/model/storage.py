"""Weights kept in the dtype they were stored in, every computation in float32: the storage
dtype apart from the compute dtype.

:func:`compute_in` turns every floating parameter of a loaded model (stored in bfloat16 or
float16) into a tensor computed on access (a :mod:`torch.nn.utils.parametrize`
parametrization): the stored tensor stays in memory as it is, and each read of
``module.weight`` (by a block's forward, the output head, the final norm, or probekit's
readers of weights: ``W_U``, ``W_E``, the frozen norm, the weight analyses) returns a fresh
float32 copy that lives only as long as the operation using it. bfloat16 and float16 values are
exactly representable in float32, so the numbers are those of a float32 load, while the memory
is the stored weights plus one weight matrix in float32 at a time (one block's while a step of
stacked variants runs it chunk by chunk, :meth:`probekit.model.Trace.resume_stacked`) and the
activations. The
two ``vocab x d_model`` matrices are never copied whole by the analyses' forwards: an
embedding lookup gathers stored rows (the table is not parametrized) and the unembedding is
computed by vocabulary slices (:func:`sliced_product`, the forward of every linear layer to
the vocabulary), so the largest copy a forward makes is a block's largest matrix (readers of
the whole unembedding, ``W_U``, still copy it). Floating buffers (rotary frequencies,
masks) are small and become float32 outright, and the embedding's output is float32, so the
whole residual stream is.

No hook is added to a block: nothing needs removing after an exception, and the pure Hugging
Face copies of the blocks (:mod:`probekit.model.hf_blocks`) share the parametrized modules'
parameters and compute in float32 too. A forward that records a backward (the gradient norms)
saves each weight as its stored tensor and copies it again when the backward reads it
(:func:`saved_as_stored`), so the backward also holds one module's float32 weights at a time;
the weights' gradients accumulate in the stored dtype (their norms move by about 1e-3 in bf16).

Example:
    >>> import torch
    >>> from probekit.toy import toy_model
    >>> model = toy_model("llama", n_layers=2)
    >>> model.hf_model.to(torch.bfloat16)  # doctest: +ELLIPSIS
    LlamaForCausalLM(...)
    >>> compute_in(model.bridge, model.hf_model, torch.float32)
    >>> storage_dtypes(model.hf_model)
    (torch.bfloat16, torch.float32)
    >>> model.blocks[0].ln1.original_component.weight.dtype
    torch.float32
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn

STORAGE_CHOICES = ("auto", "stored", "dtype")
"""How :func:`probekit.load` keeps the weights in memory (its ``storage``): ``"dtype"``, cast
to the computation's dtype (a float32 computation holds a float32 copy of the weights);
``"stored"``, in the dtype the checkpoint stores them in, each weight computed in the
computation's dtype when it is read (:func:`compute_in`); ``"auto"`` (the default), as
``"dtype"`` unless its copy would not fit in the free memory while the stored weights would."""

_MARK = "_probekit_storage"
"""The attribute of a Hugging Face model that :func:`compute_in` sets: (stored, compute)."""


_UPCASTS: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
"""The copies :class:`Upcast` made while gradients are on and still alive: ``id`` -> (a weak
reference to the copy, the stored tensor it was made from), for :func:`saved_as_stored`."""


class Upcast(nn.Module):
    """The parametrization of a stored weight: a copy of it in ``dtype`` (exact from bfloat16
    or float16 to float32), made each time the weight is read."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, stored: torch.Tensor) -> torch.Tensor:
        copy = stored.to(self.dtype)
        if torch.is_grad_enabled():
            key = id(copy)
            _UPCASTS[key] = (weakref.ref(copy, lambda _: _UPCASTS.pop(key, None)), stored)
        return copy


class StoredCopy(NamedTuple):
    """A float32 copy of a stored weight (or a view of one) that a backward saved, kept as
    the stored tensor and made again when the backward reads it."""

    stored: torch.Tensor
    dtype: torch.dtype
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


def pack_saved(tensor: torch.Tensor) -> Any:
    """A tensor a backward saves, or for a copy made by :class:`Upcast`, the stored tensor."""
    base = tensor if tensor._base is None else tensor._base
    entry = _UPCASTS.get(id(base))
    if entry is None or entry[0]() is not base:
        return tensor
    offset = int(tensor.storage_offset())
    return StoredCopy(entry[1], base.dtype, tensor.size(), tensor.stride(), offset)


def unpack_saved(packed: Any) -> torch.Tensor:
    """The saved tensor of :func:`pack_saved` (a stored weight: its copy made again)."""
    if not isinstance(packed, StoredCopy):
        return packed
    copy = packed.stored.to(packed.dtype)
    return copy.as_strided(packed.size, packed.stride, packed.offset)


@contextmanager
def saved_as_stored(hf_model: nn.Module) -> Iterator[None]:
    """While the forward of a model that :func:`compute_in` set apart records a backward, the
    float32 weight copies the backward would save (every matmul's weight, so the whole model
    in float32 until the backward) are saved as the stored tensors and copied again when the
    backward reads them: one module's float32 weights at a time in the backward too, the same
    numbers. Nothing for any other model, or without gradients."""
    if storage_dtypes(hf_model) is None or not torch.is_grad_enabled():
        yield
        return
    with torch.autograd.graph.saved_tensors_hooks(pack_saved, unpack_saved):
        yield


def _unique_modules(roots: Iterable[nn.Module]) -> list[nn.Module]:
    """Every module under ``roots`` once, parametrization containers left out."""
    from torch.nn.utils.parametrize import ParametrizationList

    seen: dict[int, nn.Module] = {}
    for root in roots:
        for module in root.modules():
            if not isinstance(module, ParametrizationList):
                seen.setdefault(id(module), module)
    return list(seen.values())


@torch.no_grad()
def compute_in(bridge: nn.Module, hf_model: nn.Module, dtype: torch.dtype) -> None:
    """Make every floating parameter of the modules of ``bridge`` and ``hf_model`` that is not
    in ``dtype`` read as a ``dtype`` copy of its stored tensor (kept as it is), and every
    floating buffer ``dtype`` outright; mark ``hf_model`` (:func:`storage_dtypes`). An
    embedding table (``nn.Embedding``) stays as stored and unparametrized: a lookup gathers
    its rows as they are and the bridge's embedding output is made ``dtype``
    (:func:`_embeddings_output_in`; exact), so no forward copies the whole table (2 GiB in
    float32 at Llama 3's 128,256 x 4,096); its readers (``W_E``) get the stored tensor.

    Call it once the bridge is attached (the bridge's split views of a fused weight, GPT-2's
    ``q``/``k``/``v`` of ``c_attn``, are then parameters of their own, upcast on read too).
    """
    from torch.nn.utils import parametrize

    modules = _unique_modules([bridge, hf_model])
    stored = next(
        (p.dtype for p in hf_model.parameters() if p.is_floating_point() and p.dtype != dtype),
        None,
    )
    if stored is None:
        return  # already in dtype: nothing is kept apart
    buffers: dict[int, torch.Tensor] = {}
    for module in modules:
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                module._buffers[name] = buffers.setdefault(id(buffer), buffer.to(dtype))
    for module in modules:
        if isinstance(module, nn.Embedding):
            continue  # a lookup reads its rows as stored; the bridge's output is made dtype
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_floating_point() and param.dtype != dtype:
                param.requires_grad_(False)
                parametrize.register_parametrization(module, name, Upcast(dtype), unsafe=True)
    vocab = getattr(getattr(hf_model, "config", None), "vocab_size", None)
    for module in modules:
        if isinstance(module, nn.Linear) and module.out_features == vocab:
            module.forward = types.MethodType(_sliced_forward, module)  # type: ignore[method-assign]
    _embeddings_output_in(bridge, dtype)
    if hasattr(bridge, "cfg") and hasattr(bridge.cfg, "dtype"):
        bridge.cfg.dtype = dtype
    hf_model.__dict__[_MARK] = (stored, dtype)


def _embeddings_output_in(bridge: nn.Module, dtype: torch.dtype) -> None:
    """Make the bridge's embeddings return ``dtype``: TransformerLens casts an embedding's
    output to the dtype of its stored weight (the same values, exact; the residual stream would
    then run in the stored dtype). A permanent forward hook of the model, outside every block."""
    from transformer_lens.model_bridge.generalized_components import EmbeddingBridge

    def upcast(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.to(dtype) if output.is_floating_point() else output

    for module in bridge.modules():
        if isinstance(module, EmbeddingBridge):
            module.register_forward_hook(upcast)


def stored_tensor(module: nn.Module, name: str = "weight") -> torch.Tensor:
    """The tensor ``module`` (or the Hugging Face module a TransformerLens component wraps)
    keeps as its ``name``: for a weight :func:`compute_in` reads in another dtype, the stored
    tensor itself (the one ``named_parameters`` lists), else the attribute.

    Example:
        >>> from probekit.toy import toy_model
        >>> model = toy_model(n_layers=2)
        >>> stored_tensor(model.bridge.unembed) is model.hf_model.lm_head.weight
        True
    """
    from torch.nn.utils import parametrize

    inner = getattr(module, "original_component", None)
    if isinstance(inner, nn.Module):
        module = inner
    if parametrize.is_parametrized(module, name):
        parametrizations: Any = module.parametrizations
        return parametrizations[name].original
    return getattr(module, name)


UNEMBED_SLICE = 8192
"""Vocabulary rows of a stored unembedding copied to the compute dtype at a time by
:func:`sliced_product` (at d_model 4096: 128 MiB in float32, against 2 GiB for Llama 3's
whole 128,256-row matrix)."""


class _SlicedProduct(torch.autograd.Function):
    """``rows @ stored.T`` with ``stored`` copied to ``rows``' dtype :data:`UNEMBED_SLICE`
    rows at a time, in the forward and in the backward (the gradient of ``rows`` only: the
    stored weight is frozen)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, stored: torch.Tensor, out: Any) -> torch.Tensor:
        ctx.save_for_backward(stored)
        vocab = stored.shape[0]
        logits = rows.new_empty(rows.shape[0], vocab) if out is None else out
        for first in range(0, vocab, UNEMBED_SLICE):
            part = stored[first : first + UNEMBED_SLICE].to(rows.dtype)
            logits[:, first : first + UNEMBED_SLICE] = torch.mm(rows, part.t())
        return logits

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (stored,) = ctx.saved_tensors
        out = grad.new_zeros(grad.shape[0], stored.shape[1])
        for first in range(0, stored.shape[0], UNEMBED_SLICE):
            part = stored[first : first + UNEMBED_SLICE].to(grad.dtype)
            out.addmm_(grad[:, first : first + UNEMBED_SLICE], part)
        return out, None, None


def sliced_product(
    linear: nn.Module, x: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``linear(x)`` for an ``nn.Linear`` whose frozen weight :func:`compute_in`
    keeps in its stored dtype, with the weight copied to the compute dtype
    :data:`UNEMBED_SLICE` rows at a time instead of whole (the same numbers: each output
    column is the same product), written into ``out`` (``x``'s rows by the output features,
    contiguous) when given; its backward gives ``x`` its gradient the same way. None when
    ``linear`` is not such a layer (the caller runs it as it is).

    Example:
        >>> import torch
        >>> from probekit.toy import toy_model
        >>> model = toy_model("llama", n_layers=2)
        >>> model.hf_model.to(torch.bfloat16)  # doctest: +ELLIPSIS
        LlamaForCausalLM(...)
        >>> compute_in(model.bridge, model.hf_model, torch.float32)
        >>> x = torch.randn(2, 3, model.d_model)
        >>> linear = model.bridge.unembed.original_component
        >>> bool(torch.allclose(sliced_product(linear, x), linear(x), atol=1e-5))
        True
    """
    from torch.nn.utils import parametrize

    if not isinstance(linear, nn.Linear):
        return None  # (a parametrized nn.Linear is of a subclass parametrize makes)
    if not parametrize.is_parametrized(linear, "weight"):
        return None
    parametrizations: Any = linear.parametrizations
    chain = parametrizations["weight"]
    if len(chain) != 1 or not isinstance(chain[0], Upcast):
        return None  # another parametrization (e.g. a weight norm) is the model's own
    stored = stored_tensor(linear)
    if stored.requires_grad and torch.is_grad_enabled():
        return None
    rows = x.reshape(-1, x.shape[-1])
    target = None if out is None else out.view(-1, stored.shape[0])
    logits = _SlicedProduct.apply(rows, stored, target).view(*x.shape[:-1], stored.shape[0])
    if linear.bias is None:
        return logits
    bias = linear.bias.to(logits.dtype)
    return logits.add_(bias) if out is not None else logits + bias


def _sliced_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward :func:`compute_in` gives the unembedding (a linear layer to the
    vocabulary): :func:`sliced_product`, or the plain one when that does not apply."""
    logits = sliced_product(self, x)
    return torch.nn.functional.linear(x, self.weight, self.bias) if logits is None else logits


def plain_name(name: str) -> str:
    """The name of a parameter as the model names it without :func:`compute_in`'s
    parametrization.

    Example:
        >>> plain_name("h.0.ln_1.parametrizations.weight.original")
        'h.0.ln_1.weight'
    """
    return name.replace(".parametrizations.", ".").removesuffix(".original")


def storage_dtypes(hf_model: nn.Module) -> tuple[torch.dtype, torch.dtype] | None:
    """``(stored, compute)`` dtypes of a model that :func:`compute_in` set apart (None: its
    weights are in the dtype it computes in)."""
    return hf_model.__dict__.get(_MARK)


__all__ = [
    "STORAGE_CHOICES",
    "UNEMBED_SLICE",
    "StoredCopy",
    "Upcast",
    "compute_in",
    "pack_saved",
    "plain_name",
    "saved_as_stored",
    "sliced_product",
    "storage_dtypes",
    "stored_tensor",
    "unpack_saved",
]
