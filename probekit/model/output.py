"""How a final residual becomes the model's output: the masked-LM prediction head of
encoders, or the final norm and unembedding of decoders (written into a tensor the caller
reuses, on a CPU when nothing can see the difference) with the logit scaling or soft-capping
the config defines; a model without a head outputs its final hidden state.

Example:
    >>> import torch
    >>> from probekit.toy import toy_model
    >>> model = toy_model(n_layers=2)
    >>> apply_head(model, torch.zeros(1, 3, model.d_model)).shape[-1] == model.d_vocab
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probekit.model.hf_blocks import global_hooks, hook_registries

if TYPE_CHECKING:
    from probekit.model.handle import Model


def apply_head(
    model: Model, residual: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``model``'s output on a final-layer residual ``[B, T, d_model]`` (see
    :meth:`probekit.model.Model.head`; ``out`` as there)."""
    if model.headless is not None:
        return model.bridge.ln_final(residual) if model.headless.final_norm else residual
    for name in ("cls",) if model.is_causal else ("cls", "lm_head"):
        prediction_head = getattr(model.hf_model, name, None)
        if prediction_head is not None:
            return prediction_head(residual)
    logits = unembed(model.bridge, model.bridge.ln_final(residual), out)
    config = model.hf_model.config
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, int | float) and scale != 1:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scaling = getattr(config, "logits_scaling", None)
    if scaling and scaling != 1:
        logits = logits / scaling
    return logits


def unembed(bridge: Any, normed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The bridge's unembedding of ``normed``. Given ``out`` (a contiguous tensor of the
    logits' shape and dtype), on a CPU, when the unembedding is a plain ``nn.Linear`` with no
    hook anywhere on it and no gradient is taken, the same product is written into ``out``
    (one ``addmm``, as ``nn.Linear`` computes it): a caller that measures each variant's
    logits before making the next reuses one tensor instead of fresh memory per variant
    (which the system zeroes page by page on first touch). Otherwise ``out`` is not used; the
    returned tensor is the logits either way.

    Example:
        >>> from probekit.toy import toy_model
        >>> model = toy_model(n_layers=2)
        >>> normed = torch.randn(1, 3, model.d_model)
        >>> out = torch.empty(1, 3, model.d_vocab)
        >>> with torch.no_grad():
        ...     logits = unembed(model.bridge, normed, out)
        >>> logits.data_ptr() == out.data_ptr(), torch.equal(logits, model.bridge.unembed(normed))
        (True, True)
    """
    unembedding = bridge.unembed
    linear = getattr(unembedding, "original_component", None)
    if out is None or type(linear) is not nn.Linear:
        return unembedding(normed)
    grad = torch.is_grad_enabled() and (normed.requires_grad or linear.weight.requires_grad)
    plain = (
        normed.device.type == "cpu"
        and out.device == normed.device
        and out.dtype == normed.dtype == linear.weight.dtype
        and out.shape == (*normed.shape[:-1], linear.out_features)
        and out.is_contiguous()
        and not torch.is_autocast_enabled("cpu")
        and not grad
        and not hasattr(linear, "_hf_hook")
        and not global_hooks()
        and not any(hook_registries(unembedding))
    )
    if not plain:
        return unembedding(normed)
    rows, target = normed.reshape(-1, normed.shape[-1]), out.view(-1, linear.out_features)
    if linear.bias is None:
        torch.mm(rows, linear.weight.t(), out=target)
    else:
        torch.addmm(linear.bias, rows, linear.weight.t(), out=target)
    return out


__all__ = ["apply_head", "unembed"]
