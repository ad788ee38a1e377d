"""The runtime core the model package is built from: the bridge over the Hugging Face model,
its blocks and sizes, the output head (resolved once), and the forward with hooks.

:class:`Runtime` is what the parts of a model handle take: a :class:`~probekit.model.Trace`
records and resumes its forward, the structure probes (:mod:`probekit.model.structure`) and the
Hugging Face block copies (:mod:`probekit.model.hf_blocks`) run it; the model handle
(:mod:`probekit.model.handle`) composes them into the public surface. None of them, and nothing
here, knows the handle.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model(n_layers=2)
    >>> model.runtime
    Runtime(GPT2LMHeadModel, n_layers=2)
    >>> [batch] = model.prepare(toy_tokens(2, 5))
    >>> runtime = model.runtime
    >>> runtime.forward(batch).shape[:2]
    torch.Size([2, 5])
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probekit.data import Batch
from probekit.errors import UnsupportedModelError
from probekit.model.headless import Headless, stop_at_base_output
from probekit.model.output import OutputHead, resolve_head
from probekit.model.sites import MASKED_LM_SUFFIXES, REQUIRED_SITES, HookList, hook_name
from probekit.model.storage import saved_as_stored, storage_dtypes
from probekit.progress import advance

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Runtime:
    """A TransformerBridge ready to run: ``bridge``, the wrapped ``hf_model`` (put in eval
    mode: every analysis needs a deterministic forward) and, for a model loaded without its LM
    head, ``headless``. Raises :class:`UnsupportedModelError` for a bridge without a block
    stack or without the hook points of :data:`~probekit.model.sites.REQUIRED_SITES`."""

    def __init__(self, bridge: Any, headless: Headless | None = None) -> None:
        self.bridge = bridge
        self.headless = headless
        self.hf_model: PreTrainedModel = bridge.original_model
        if headless is not None:
            stop_at_base_output(self.hf_model)
        if not hasattr(bridge, "blocks") or len(bridge.blocks) == 0:
            raise UnsupportedModelError(
                f"the {self.architecture} bridge exposes no 'blocks' stack",
                fix="use a standard decoder (GPT-2, Llama, ...) or encoder (BERT) architecture",
            )
        missing = [
            name for site in REQUIRED_SITES if (name := hook_name(0, site)) not in bridge.hook_dict
        ]
        if missing:
            raise UnsupportedModelError(
                f"the {self.architecture} bridge lacks the hook points {missing}",
                fix="use an architecture with separate attention and MLP sublayers",
            )
        self.hf_model.eval()

    # ---- what the model is -------------------------------------------------------------
    @property
    def architecture(self) -> str:
        """The Hugging Face class loaded (the base class for a model without a head)."""
        if self.headless is not None:
            return self.headless.architecture
        return self.bridged_architecture

    @property
    def bridged_architecture(self) -> str:
        """The class the bridge wraps (the head class of a model loaded without a head)."""
        return str(getattr(self.bridge.cfg, "architecture", type(self.hf_model).__name__))

    @property
    def is_causal(self) -> bool:
        """True for decoders (targets are next tokens), False for masked-LM encoders."""
        return not self.bridged_architecture.endswith(MASKED_LM_SUFFIXES)

    @property
    def blocks(self) -> nn.ModuleList:
        """The ModuleList of blocks the forward iterates over, in run order."""
        return self.bridge.blocks

    @property
    def n_layers(self) -> int:
        """Number of blocks."""
        return len(self.bridge.blocks)

    @property
    def n_heads(self) -> int:
        """Number of attention (query) heads per layer."""
        return int(self.bridge.cfg.n_heads)

    @property
    def d_model(self) -> int:
        """Width of the residual stream."""
        return int(self.bridge.cfg.d_model)

    @property
    def d_vocab(self) -> int:
        """Size of the vocabulary."""
        return int(self.bridge.cfg.d_vocab)

    @property
    def n_ctx(self) -> int:
        """The longest sequence the model takes (its context)."""
        return int(self.bridge.cfg.n_ctx)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the first device of a ``device_map`` that is not the disk (the CPU
        when every layer is offloaded), else the device of the weights."""
        placed = getattr(self.hf_model, "hf_device_map", None)
        if not placed:
            placed = getattr(getattr(self.hf_model, "base_model", None), "hf_device_map", None)
        if placed:
            devices = [d for d in placed.values() if d != "disk"]
            first = devices[0] if devices else "cpu"
            return torch.device(f"cuda:{first}" if isinstance(first, int) else first)
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model computes in: its weights' dtype, or for weights kept in their
        stored dtype apart (:func:`~probekit.model.storage.compute_in`), the dtype each is
        read in."""
        apart = storage_dtypes(self.hf_model)
        return apart[1] if apart is not None else next(self.hf_model.parameters()).dtype

    def __repr__(self) -> str:
        return f"Runtime({self.architecture}, n_layers={self.n_layers})"

    # ---- running ------------------------------------------------------------------------
    @cached_property
    def head(self) -> OutputHead:
        """The output head (:func:`~probekit.model.output.resolve_head`), resolved on first use
        (the load's replay check) and kept: ``head(residual, out=None)`` maps a final-layer
        residual to the model's output. A bridge without a final norm raises its
        ``AttributeError`` at every use, as running it would."""
        return resolve_head(self.bridge, self.hf_model, self.headless, self.is_causal)

    @contextmanager
    def hooks(self, fwd_hooks: HookList = (), bwd_hooks: HookList = ()) -> Iterator[None]:
        """Attach TransformerLens hooks for the duration of the block; always removed after."""
        with self.bridge.hooks(fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks)):
            yield

    def forward(self, batch: Batch, fwd_hooks: HookList = ()) -> torch.Tensor:
        """Full forward of one prepared batch through the bridge with ``fwd_hooks`` active:
        the model's output (logits ``[B, T, V]``, or the final hidden state)."""
        advance(self.n_layers)  # its block passes, on a command's live progress line
        with self.hooks(fwd_hooks), saved_as_stored(self.hf_model):
            return self.bridge(batch.tokens, attention_mask=batch.attention_mask, use_cache=False)


__all__ = ["Runtime"]
