"""How a final residual becomes the model's output: the masked-LM prediction head of
encoders, or the final norm and unembedding of decoders (computed in blocks of the vocabulary
on a CPU when nothing can see the difference) with the logit scaling or soft-capping the
config defines; a model without a head outputs its final hidden state.

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
from probekit.numerics import VOCAB_CHUNK, blocked_linear

if TYPE_CHECKING:
    from probekit.model.handle import Model


def apply_head(model: Model, residual: torch.Tensor) -> torch.Tensor:
    """``model``'s output on a final-layer residual ``[B, T, d_model]`` (see
    :meth:`probekit.model.Model.head`)."""
    if model.headless is not None:
        return model.bridge.ln_final(residual) if model.headless.final_norm else residual
    for name in ("cls",) if model.is_causal else ("cls", "lm_head"):
        prediction_head = getattr(model.hf_model, name, None)
        if prediction_head is not None:
            return prediction_head(residual)
    logits = unembed(model.bridge, model.bridge.ln_final(residual))
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


def unembed(bridge: Any, normed: torch.Tensor) -> torch.Tensor:
    """The bridge's unembedding of ``normed``; on a CPU, when it is a plain ``nn.Linear``
    with no hook anywhere on it and no gradient is taken, the same product computed
    :data:`~probekit.numerics.VOCAB_CHUNK` rows of the weight at a time (the same logits,
    faster)."""
    unembedding = bridge.unembed
    linear = getattr(unembedding, "original_component", None)
    if type(linear) is not nn.Linear:
        return unembedding(normed)
    grad = torch.is_grad_enabled() and (normed.requires_grad or linear.weight.requires_grad)
    plain = (
        normed.device.type == "cpu"
        and linear.out_features > 2 * VOCAB_CHUNK
        and not grad
        and not hasattr(linear, "_hf_hook")
        and not global_hooks()
        and not any(hook_registries(unembedding))
    )
    if not plain:
        return unembedding(normed)
    return blocked_linear(normed, linear.weight, linear.bias, VOCAB_CHUNK)


__all__ = ["apply_head", "unembed"]
