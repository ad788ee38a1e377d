"""Weights kept in the dtype they were stored in, every computation in float32: the storage
dtype apart from the compute dtype.

:func:`compute_in` turns every floating parameter of a loaded model (stored in bfloat16 or
float16) into a tensor computed on access (a :mod:`torch.nn.utils.parametrize`
parametrization): the stored tensor stays in memory as it is, and each read of
``module.weight`` (by a block's forward, the output head, the final norm, or probekit's
readers of weights: ``W_U``, ``W_E``, the frozen norm, the weight analyses) returns a fresh
float32 copy that lives only as long as the operation using it. bfloat16 and float16 values are
exactly representable in float32, so the numbers are those of a float32 load, while the memory
is the stored weights plus one weight matrix in float32 at a time (the largest is the
``vocab x d_model`` unembedding) and the activations. Floating buffers (rotary frequencies,
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
    floating buffer ``dtype`` outright; mark ``hf_model`` (:func:`storage_dtypes`).

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
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_floating_point() and param.dtype != dtype:
                param.requires_grad_(False)
                parametrize.register_parametrization(module, name, Upcast(dtype), unsafe=True)
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
    "StoredCopy",
    "Upcast",
    "compute_in",
    "pack_saved",
    "plain_name",
    "saved_as_stored",
    "storage_dtypes",
    "stored_tensor",
    "unpack_saved",
]
