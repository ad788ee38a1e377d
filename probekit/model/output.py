"""How a final residual becomes the model's output, resolved once: the masked-LM prediction
head of encoders, or the final norm and unembedding of decoders (written into a tensor the
caller reuses, on a CPU when nothing can see the difference) with the logit scaling or
soft-capping the config defines; a model without a head outputs its final hidden state.

Example:
    >>> import torch
    >>> from probekit.toy import toy_model
    >>> model = toy_model(n_layers=2)
    >>> head = resolve_head(model.bridge, model.hf_model, None, causal=True)
    >>> head(torch.zeros(1, 3, model.d_model)).shape[-1] == model.d_vocab
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probekit.errors import UnsupportedModelError
from probekit.model.bridge import lacks_final_norm
from probekit.model.headless import Headless
from probekit.model.sites import global_hooks, hook_registries
from probekit.model.storage import sliced_product

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class OutputHead:
    """A model's output head, its modules and config numbers looked up once.

    ``first`` runs on the final residual (the final norm; a masked-LM encoder's whole prediction
    head; None: nothing, the residual as it is); ``unembedding`` (the bridge's) then maps the
    result to logits (None: ``first``'s result is the output), which are multiplied by
    ``scale`` (Cohere), soft-capped at ``cap`` (Gemma 2/3) and divided by ``scaling``
    (Granite) where these are set (None: not).

    Example:
        >>> head = OutputHead(first=None)   # a post-norm encoder without its LM head
        >>> float(head(torch.ones(1, 2, 4)).sum())
        8.0
    """

    first: Callable[[torch.Tensor], torch.Tensor] | None
    unembedding: nn.Module | None = None
    scale: float | None = None
    cap: float | None = None
    scaling: float | None = None

    def __call__(self, residual: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The output on a final-layer residual ``[B, T, d_model]`` (``out``: see
        :func:`unembed`; always use the returned tensor)."""
        hidden = residual if self.first is None else self.first(residual)
        if self.unembedding is None:
            return hidden
        logits = unembed(self.unembedding, hidden, out)
        if self.scale is not None:
            logits = logits * self.scale
        if self.cap is not None:
            logits = torch.tanh(logits / self.cap) * self.cap
        if self.scaling is not None:
            logits = logits / self.scaling
        return logits

    def frozen_norm(self, architecture: str) -> FrozenNorm:
        """The final norm (``first``) as a :class:`FrozenNorm`, for a head whose logits are
        linear in the normed residual; else :class:`~probekit.errors.UnsupportedModelError`
        naming the reason (soft-capped logits; a norm that is not a LayerNorm or RMSNorm with a
        weight, e.g. Gemma's (1 + weight) RMSNorm)."""
        if self.cap is not None:
            raise UnsupportedModelError(
                f"{architecture} soft-caps its logits (tanh), which is not linear",
                fix="use activation_patching, which needs no linear head",
            )
        norm = getattr(self.first, "original_component", self.first)
        kind = type(norm).__name__
        weight = getattr(norm, "weight", None)
        eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
        if norm is None or weight is None or eps is None or "Norm" not in kind or "Gemma" in kind:
            raise UnsupportedModelError(
                f"the final norm of {architecture} ({kind}) is not a LayerNorm or RMSNorm "
                "with a weight, so its frozen-scale linear form is unknown",
                fix="use a model with a LayerNorm or RMSNorm final norm (GPT-2, Llama, ...)",
            )
        bias = getattr(norm, "bias", None)
        return FrozenNorm(
            centered="RMS" not in kind,
            weight=weight.detach().double(),
            bias=None if bias is None else bias.detach().double(),
            eps=float(eps),
        )


@dataclass(frozen=True)
class FrozenNorm:
    """A LayerNorm's or RMSNorm's linear form at a frozen scale: ``x -> center(x) * weight /
    scale`` (centred for LayerNorm only), its ``bias`` apart; :meth:`OutputHead.frozen_norm`
    reads it from a model's final norm (weights in float64)."""

    centered: bool
    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float

    def scale(self, h: torch.Tensor) -> torch.Tensor:
        """The clean run's scale per token ``[..., 1]`` of final residuals ``h``."""
        x = h - h.mean(-1, keepdim=True) if self.centered else h
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def linear(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The norm's linear part of ``x`` at the frozen ``scale``."""
        if self.centered:
            x = x - x.mean(-1, keepdim=True)
        return x * self.weight / scale


def resolve_head(
    bridge: Any, hf_model: PreTrainedModel, headless: Headless | None, causal: bool
) -> OutputHead:
    """The output head of the bridge over ``hf_model``: for a model loaded without its LM head
    (``headless``) the base model's final norm, if it has one; the Hugging Face model's own
    prediction head (``cls``; ``lm_head`` too for an encoder, not ``causal``) where there is
    one; else the bridge's final norm and unembedding, with the logit scaling
    (``logit_scale``, ``logits_scaling``) and soft-capping (``final_logit_softcapping``) of
    ``hf_model``'s config. Raises the bridge's ``AttributeError`` when it lacks a final norm,
    unless the model has none by design (post-LN OPT,
    :func:`~probekit.model.bridge.lacks_final_norm`)."""
    if headless is not None:
        return OutputHead(bridge.ln_final if headless.final_norm else None)
    for name in ("cls",) if causal else ("cls", "lm_head"):
        prediction_head = getattr(hf_model, name, None)
        if prediction_head is not None:
            return OutputHead(prediction_head)
    config = hf_model.config
    scale = getattr(config, "logit_scale", None)
    cap = getattr(config, "final_logit_softcapping", None)
    scaling = getattr(config, "logits_scaling", None)
    return OutputHead(
        None if lacks_final_norm(bridge) else bridge.ln_final,
        bridge.unembed,
        scale=scale if isinstance(scale, int | float) and scale != 1 else None,
        cap=cap if cap else None,
        scaling=scaling if scaling and scaling != 1 else None,
    )


def unembed(
    unembedding: nn.Module, normed: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The bridge's ``unembedding`` of ``normed``. Given ``out`` (a contiguous tensor of the
    logits' shape and dtype), on a CPU, when the unembedding is a plain ``nn.Linear`` with no
    hook anywhere on it and no gradient is taken, the same product is written into ``out``
    (one ``addmm``, as ``nn.Linear`` computes it): a caller that measures each variant's
    logits before making the next reuses one tensor instead of fresh memory per variant
    (which the system zeroes page by page on first touch). Otherwise ``out`` is not used; the
    returned tensor is the logits either way. An unembedding whose weight is kept in its
    stored dtype (:func:`~probekit.model.storage.compute_in`) is computed by vocabulary slices
    (:func:`~probekit.model.storage.sliced_product`, also under a gradient), so its float32
    copy is never whole.

    Example:
        >>> from probekit.toy import toy_model
        >>> model = toy_model(n_layers=2)
        >>> normed = torch.randn(1, 3, model.d_model)
        >>> out = torch.empty(1, 3, model.d_vocab)
        >>> with torch.no_grad():
        ...     logits = unembed(model.bridge.unembed, normed, out)
        >>> logits.data_ptr() == out.data_ptr(), torch.equal(logits, model.bridge.unembed(normed))
        (True, True)
    """
    linear = getattr(unembedding, "original_component", None)
    hooked = global_hooks() or any(hook_registries(unembedding)) or hasattr(linear, "_hf_hook")
    autocast = torch.is_autocast_enabled(normed.device.type)
    if isinstance(linear, nn.Module) and not hooked and not autocast:  # kept as stored
        sliced = sliced_product(linear, normed, _usable(out, normed, linear))
        if sliced is not None:
            return sliced
    if out is None or type(linear) is not nn.Linear:
        return unembedding(normed)
    grad = torch.is_grad_enabled() and (normed.requires_grad or linear.weight.requires_grad)
    plain = (
        _usable(out, normed, linear) is not None
        and out.dtype == linear.weight.dtype
        and not torch.is_autocast_enabled("cpu")
        and not grad
        and not hooked
    )
    if not plain:
        return unembedding(normed)
    rows, target = normed.reshape(-1, normed.shape[-1]), out.view(-1, linear.out_features)
    if linear.bias is None:
        torch.mm(rows, linear.weight.t(), out=target)
    else:
        torch.addmm(linear.bias, rows, linear.weight.t(), out=target)
    return out


def _usable(out: torch.Tensor | None, normed: torch.Tensor, linear: nn.Module) -> Any:
    """``out`` when the logits of ``normed`` can be written into it: a contiguous CPU tensor
    of their shape and dtype, with no gradient taken (None otherwise)."""
    if out is None or normed.device.type != "cpu" or out.device != normed.device:
        return None
    if torch.is_grad_enabled() and normed.requires_grad:
        return None
    shape = (*normed.shape[:-1], getattr(linear, "out_features", -1))
    ok = out.dtype == normed.dtype and out.shape == shape and out.is_contiguous()
    return out if ok else None


__all__ = ["OutputHead", "resolve_head", "unembed"]
