"""Where probekit reads and edits a model: the canonical hook names of TransformerLens 4's
``TransformerBridge``, the per-layer weight names, the kinds of output a model has, and the torch
hook registries that tell whether anyone else hooks a module (the fast paths then step aside).

Only the modules of :mod:`probekit.model` spell hook names; every other layer asks the handle
(:meth:`probekit.model.Model.hook_name`, :meth:`probekit.model.Model.update_hooks`).

Example:
    >>> hook_name(3, "attn_out")
    'blocks.3.attn.hook_out'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

HookList = Sequence[tuple[Any, Callable]]
"""TransformerLens-style forward hooks: ``[(hook_name_or_filter, fn(tensor, hook))]``."""

MASKED_LM_SUFFIXES = ("ForMaskedLM", "ForPreTraining")
"""Masked-LM encoders: loss targets are the input tokens, not the next ones, and the
prediction head is the HF model's own ``cls`` module (dense -> act -> LayerNorm -> decoder)."""

SITES = {
    "resid_in": "blocks.{layer}.hook_in",
    "resid_out": "blocks.{layer}.hook_out",
    "attn_out": "blocks.{layer}.attn.hook_out",
    "mlp_out": "blocks.{layer}.mlp.hook_out",
    "attn_pattern": "blocks.{layer}.attn.hook_pattern",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
}
"""Canonical TransformerBridge hook names of the sites probekit reads and edits.

``attn_pattern`` holds the attention weights ``[B, heads, query, source]`` after the softmax,
``attn_scores`` the scores before it (with the causal / padding mask applied)."""

REQUIRED_SITES = ("resid_in", "resid_out", "attn_out", "mlp_out")
"""The sites every model must have; attention sites are checked where they are used."""

WEIGHT_NAMES = ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out")
"""Per-layer weight matrices :meth:`probekit.model.Model.weights` returns (W_gate only in gated
MLPs)."""

POST_NORM_SITES = {
    "attn_post_norm": "blocks.{layer}.ln1_post.hook_out",
    "mlp_post_norm": "blocks.{layer}.ln2_post.hook_out",
}
"""Outputs of the norms that sandwich-norm blocks (Gemma 2/3, OLMo 2) apply to each sublayer's
output before adding it to the stream."""

OUTPUT_KINDS = ("logits", "hidden", "embedding")
"""What a model's forward returns and its output measures compare
(:attr:`probekit.model.Model.output_kind`):

- ``logits``: a model with its LM head, logits ``[B, T, vocab]``;
- ``hidden``: a base model without a head (``GPT2Model``, ``BertModel``, ...), its final hidden
  state per token ``[B, T, d_model]`` (the ``last_hidden_state`` Hugging Face returns);
- ``embedding``: a sentence-transformers model, whose output is the pooled embedding per
  sequence (:meth:`probekit.model.Model.pool` of the final hidden state, see
  :class:`probekit.model.Pooling`).
"""


# --- paper architecture (post-LN blocks whose sublayer hooks hold the raw updates) ---
POST_LN_SITES = {"mid_post_ln": "blocks.{layer}.ln1.hook_out"}
"""The mid-block stream ``h_mid = LN1(h_in + attn)`` of a post-LN block whose attention hook
holds the raw attention output (post-LN OPT, probekit's ``post_ln_paper`` model): the output
of the block's first LayerNorm."""


def hook_name(layer: int, site: str) -> str:
    """Canonical hook name of ``site`` (one of :data:`SITES`, :data:`POST_NORM_SITES` or
    :data:`POST_LN_SITES`) in block ``layer``."""
    return {**SITES, **POST_NORM_SITES, **POST_LN_SITES}[site].format(layer=layer)


def hook_registries(module: nn.Module) -> list[dict]:
    """The hook dictionaries of every module under ``module`` (torch never replaces them)."""
    return [
        registry
        for m in module.modules()
        for registry in (
            m._forward_hooks,
            m._forward_pre_hooks,
            m._backward_hooks,
            m._backward_pre_hooks,
        )
    ]


def global_hooks() -> bool:
    """True when a global torch module hook is registered (it would see other modules)."""
    registry = torch.nn.modules.module
    return bool(
        registry._global_forward_hooks
        or registry._global_forward_pre_hooks
        or registry._global_backward_hooks
        or registry._global_backward_pre_hooks
    )


__all__ = [
    "MASKED_LM_SUFFIXES",
    "OUTPUT_KINDS",
    "POST_LN_SITES",
    "POST_NORM_SITES",
    "REQUIRED_SITES",
    "SITES",
    "WEIGHT_NAMES",
    "HookList",
    "global_hooks",
    "hook_name",
    "hook_registries",
]
