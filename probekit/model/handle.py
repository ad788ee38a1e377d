"""The model handle: one object over a TransformerLens 4 ``TransformerBridge``.

All architecture-specific knowledge in probekit lives in this module: how to find the blocks,
the names of the residual / attention / MLP hook points, how the final residual becomes logits,
and whether the model predicts the next token (decoder) or the token itself (masked LM).
Analyzers only use the handle's methods and the canonical hook names it returns.

Example:
    >>> import probekit, transformers
    >>> hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    ...     vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4))
    >>> model = probekit.load(hf)
    >>> model.n_layers, model.d_model, model.is_causal
    (2, 32, True)
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from probekit.data import Batch, Data, as_batches
from probekit.errors import (
    CheckpointError,
    InputError,
    NumericalError,
    ProbekitError,
    UnsupportedModelError,
)

log = logging.getLogger(__name__)

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
"""Token ids, labels and masks may have any of these dtypes (they become long)."""

HookList = Sequence[tuple[Any, Callable]]
"""TransformerLens-style forward hooks: ``[(hook_name_or_filter, fn(tensor, hook))]``."""

# Masked-LM encoders: loss targets are the input tokens, not the next ones, and the
# prediction head is the HF model's own ``cls`` module (dense -> act -> LayerNorm -> decoder).
_MASKED_LM_SUFFIXES = ("ForMaskedLM", "ForPreTraining")

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
"""Per-layer weight matrices :meth:`Model.weights` returns (W_gate only in gated MLPs)."""

_POST_NORM_SITES = {
    "attn_post_norm": "blocks.{layer}.ln1_post.hook_out",
    "mlp_post_norm": "blocks.{layer}.ln2_post.hook_out",
}
"""Outputs of the norms that sandwich-norm blocks (Gemma 2/3, OLMo 2) apply to each sublayer's
output before adding it to the stream."""

BLOCK_KINDS = ("sum", "sandwich", "stream")
"""How a block's sublayers write to the residual stream (see :attr:`Model.structure`):

- ``sum``: ``h_out = h_in + attn_out + mlp_out`` (pre-norm blocks, sequential or parallel),
- ``sandwich``: ``h_out = h_in + norm(attn_out) + norm(mlp_out)`` (post-sublayer norms),
- ``stream``: post-norm blocks (BERT), where the attention hook holds the normalised mid-block
  stream ``h_mid`` and the updates are ``h_mid - h_in`` and ``h_out - h_mid``.
"""

_UPDATE_SITES = {"sum": ("attn_out", "mlp_out"), "sandwich": tuple(_POST_NORM_SITES)}

RAW_BLOCKS_ENV = "PROBEKIT_RAW_BLOCKS"
"""Environment variable: ``0`` turns the Hugging Face block path of hook-free resumes off for
models loaded afterwards (the default :attr:`Model.raw_blocks` is True)."""

RAW_BLOCKS_TOLERANCE = 1e-6
"""The pure Hugging Face blocks replace the bridge's only where, on the check batches, every
block output satisfies ``max |hf - bridge| <= 1e-6 * max(1, max |bridge|)`` (float64)."""

OUTPUT_KINDS = ("logits", "hidden", "embedding")
"""What a model's forward returns and its output measures compare (:attr:`Model.output_kind`):

- ``logits``: a model with its LM head, logits ``[B, T, vocab]``;
- ``hidden``: a base model without a head (``GPT2Model``, ``BertModel``, ...), its final hidden
  state per token ``[B, T, d_model]`` (the ``last_hidden_state`` Hugging Face returns);
- ``embedding``: a sentence-transformers model, whose output is the pooled embedding per
  sequence (:meth:`Model.pool` of the final hidden state, see :class:`Pooling`).
"""

POOLING_MODES = ("mean", "cls", "lasttoken")
"""The sentence-transformers pooling modes probekit reads: the mean over real tokens, the first
token (CLS), or the last real token."""

OUTPUT_BATCH_BYTES = 64 * 2**20
"""The most bytes one batch's float32 output ``[sequences, tokens, vocabulary or width]`` takes
when no ``batch_size`` is given: :meth:`Model.prepare` splits larger batches so. Every
analysis holds a few output-sized tensors per batch (the clean side, a variant's logits, a
lens layer's logits), so at a real vocabulary this, not the residuals, sets the peak memory;
the per-token numbers do not depend on the split. A backward (``prepare(...,
backward=True)``) counts the output three times and :data:`BACKWARD_FLOATS_PER_LAYER` floats
per token and layer besides."""

BACKWARD_FLOATS_PER_LAYER = 24
"""Floats per token, in units of d_model, that a backward keeps per block (the activations
autograd saves: norms, attention projections and probabilities, the MLP's hidden layer), for
the backward's default batch size."""

VOCAB_CHUNK = 2048
"""Rows of the unembedding per matrix product in :meth:`Model.head` on a CPU: a ``[256,
50257]`` product in one call took 1.5x the time of the same product in blocks of 2048 output
columns (measured interleaved at 2 threads: its output does not stay in cache). The blocks give
the one product's logits to float32 rounding (bit-identical in every case measured here;
tests/test_fast_paths.py checks 1e-6)."""


@dataclass(frozen=True)
class Pooling:
    """How a sentence-transformers model pools its final hidden states into one embedding:
    ``mode`` (one of :data:`POOLING_MODES`) and ``normalize`` (a ``Normalize`` module follows:
    the embedding is scaled to unit L2 norm)."""

    mode: str
    normalize: bool = False


@dataclass(frozen=True)
class Headless:
    """A model loaded without its LM head: ``architecture`` is the base class (``GPT2Model``),
    ``final_norm`` whether the base model applies the final norm itself (decoders: yes, BERT:
    no), ``pooling`` the sentence-transformers pooling, if any."""

    architecture: str
    final_norm: bool
    pooling: Pooling | None = None


@dataclass(frozen=True)
class BlockStructure:
    """A model's block structure: ``kind`` (one of :data:`BLOCK_KINDS`) and ``parallel``
    (attention and MLP both read the block input)."""

    kind: str
    parallel: bool


def _tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of the structure checks for computations in ``dtype``."""
    return 1e-3 if torch.finfo(dtype).bits >= 32 else 5e-2


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    """max |got - want| <= tol * max |want| (float64)."""
    got, want = got.double(), want.double()
    return bool((got - want).abs().max() <= tol * want.abs().max().clamp_min(1e-12))


@contextmanager
def _dtype_guard(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Turn torch's 'not implemented for Half/BFloat16' into one probekit error naming the fix."""
    try:
        yield
    except (RuntimeError, NotImplementedError) as err:
        if "not implemented for" not in str(err) and "not supported" not in str(err):
            raise
        raise UnsupportedModelError(
            f"torch on {device.type} cannot run this model in {dtype} ({err})",
            fix="load it in a dtype the device runs: probekit.load(..., dtype=torch.float32) "
            "(or bfloat16), or use a GPU",
        ) from err


class Model:
    """A loaded model: the bridge plus what analyzers need to know about it.

    Build one with :func:`load`. Attributes: ``bridge`` (the TransformerBridge), ``hf_model``
    (the wrapped Hugging Face module), ``n_layers``, ``d_model``, ``d_vocab``, ``n_ctx``,
    ``device``, ``dtype``, ``architecture``, ``is_causal``, ``blocks``. The wrapped model is
    put in eval mode (no dropout): every analysis needs a deterministic forward.

    Every block is read as h_{l+1} = h_l + a_l + m_l, with a_l the attention and m_l the MLP
    update (see :attr:`structure`, read from the model at load, and :data:`BLOCK_KINDS`):

    - pre-norm blocks (GPT-2, Llama, ...): a_l = attn(norm(h_l)), m_l = mlp(norm(h_l + a_l));
    - parallel blocks (GPT-J, GPT-NeoX with parallel residual, Falcon, Phi; detected because
      zeroing a_l leaves m_l unchanged, :attr:`parallel_blocks`): both read the same h_l,
      a_l = attn(norm(h_l)), m_l = mlp(norm'(h_l)), so ablating one leaves the other as it was;
    - sandwich-norm blocks (Gemma 2/3, OLMo 2): a_l and m_l are the normed sublayer outputs;
    - post-norm blocks (BERT, RoBERTa): a_l = h_mid - h_l and m_l = h_{l+1} - h_mid, with h_mid
      the stream after the attention's add-norm.

    Example:
        >>> from probekit.toy import toy_model
        >>> model = toy_model("bert")
        >>> model.structure.kind, model.post_norm, model.parallel_blocks
        ('stream', True, False)
    """

    def __init__(
        self, bridge: Any, source: str | None = None, headless: Headless | None = None
    ) -> None:
        self.bridge = bridge
        self.source = source
        self.headless = headless
        self.hf_model: nn.Module = bridge.original_model
        if headless is not None:
            _stop_at_base_output(self.hf_model)
        if not hasattr(bridge, "blocks") or len(bridge.blocks) == 0:
            raise UnsupportedModelError(
                f"the {self.architecture} bridge exposes no 'blocks' stack",
                fix="use a standard decoder (GPT-2, Llama, ...) or encoder (BERT) architecture",
            )
        missing = [
            name
            for site in REQUIRED_SITES
            if (name := self.hook_name(0, site)) not in bridge.hook_dict
        ]
        if missing:
            raise UnsupportedModelError(
                f"the {self.architecture} bridge lacks the hook points {missing}",
                fix="use an architecture with separate attention and MLP sublayers",
            )
        self.hf_model.eval()
        self.raw_blocks: bool = os.environ.get(RAW_BLOCKS_ENV, "1") != "0"
        """Run hook-free blocks of :meth:`Trace.resume` / :meth:`Trace.resume_stacked` through
        pure Hugging Face copies of the blocks (see :attr:`block_path`); False: always the
        bridge. Default from the ``PROBEKIT_RAW_BLOCKS`` environment variable (``0``: off)."""
        self._hf_blocks: _HFBlocks | None = None

    # ---- what the model is -------------------------------------------------------------
    @property
    def architecture(self) -> str:
        """The Hugging Face class loaded (the base class, e.g. ``GPT2Model``, for a model
        without a head)."""
        if self.headless is not None:
            return self.headless.architecture
        return self._bridged_architecture

    @property
    def _bridged_architecture(self) -> str:
        return str(getattr(self.bridge.cfg, "architecture", type(self.hf_model).__name__))

    @property
    def output_kind(self) -> str:
        """What the forward returns and output changes compare (one of :data:`OUTPUT_KINDS`)."""
        if self.headless is None:
            return "logits"
        return "hidden" if self.headless.pooling is None else "embedding"

    @property
    def output_description(self) -> str:
        """The model's output in words, for reports and summaries."""
        if self.headless is None:
            return "logits over the vocabulary, per token"
        pooling = self.headless.pooling
        if pooling is None:
            return f"final hidden state per token ({self.architecture} has no LM head)"
        norm = ", L2-normalised" if pooling.normalize else ""
        return f"{pooling.mode}-pooled sentence embedding per sequence{norm}"

    def require_vocabulary(self, what: str) -> None:
        """Refuse, with :class:`UnsupportedModelError`, an analysis ``what`` that needs logits
        over a vocabulary on a model loaded without its LM head."""
        if self.headless is not None:
            raise UnsupportedModelError(
                f"{what} needs the model's logits over its vocabulary, but {self.architecture} "
                f"is loaded without an LM head (its output is the {self.output_description})",
                fix="use contributions, skip_effects, layer_swaps or residual_stats, which "
                "measure the output in hidden space, or load the checkpoint with its LM head",
            )

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The sentence embedding ``[B, d_model]`` of final hidden states ``[B, T, d_model]``
        (right padding, as :meth:`prepare` guarantees): the pooling of the checkpoint's
        ``1_Pooling/config.json``, then unit L2 norm when a ``Normalize`` module follows."""
        pooling = self.headless.pooling if self.headless is not None else None
        if pooling is None:
            raise InputError(
                f"{self.architecture} has no pooling (it is not a sentence-transformers model)",
                fix="pool only models loaded from a sentence-transformers folder",
            )
        mask = (
            torch.ones(hidden.shape[:2], device=hidden.device)
            if attention_mask is None
            else attention_mask.to(hidden.device)
        ).to(hidden.dtype)
        if pooling.mode == "mean":
            out = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)
        elif pooling.mode == "cls":
            out = hidden[:, 0]
        else:
            last = mask.sum(1).long().clamp_min(1) - 1
            out = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return torch.nn.functional.normalize(out, dim=-1) if pooling.normalize else out

    @property
    def n_layers(self) -> int:
        return len(self.bridge.blocks)

    @property
    def d_model(self) -> int:
        return int(self.bridge.cfg.d_model)

    @property
    def d_vocab(self) -> int:
        return int(self.bridge.cfg.d_vocab)

    @property
    def n_ctx(self) -> int:
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
        return next(self.hf_model.parameters()).dtype

    @property
    def is_causal(self) -> bool:
        """True for decoders (targets are next tokens), False for masked-LM encoders."""
        return not self._bridged_architecture.endswith(_MASKED_LM_SUFFIXES)

    @property
    def blocks(self) -> nn.ModuleList:
        """The ModuleList of blocks that the model's forward iterates over, in run order."""
        return self.bridge.blocks

    @property
    def n_heads(self) -> int:
        """Number of attention (query) heads per layer."""
        return int(self.bridge.cfg.n_heads)

    @cached_property
    def structure(self) -> BlockStructure:
        """How every block writes to the residual stream, read from the model (once).

        One probe forward records each block's input, sublayer outputs and output; the first
        :data:`BLOCK_KINDS` entry whose definition of the attention and MLP updates ``a``, ``m``
        gives ``h_out = h_in + a + m`` in every layer (``sum``, ``sandwich``), or whose
        mid-block state fully determines the block output (``stream``), is the structure, and
        a second forward checks that replacing those updates through the hooks is honoured.
        ``parallel`` is True when the MLP reads the block input rather than ``h_in + a``
        (zeroing ``a`` leaves layer 0's MLP output unchanged). Raises
        :class:`UnsupportedModelError` when no definition fits: never wrong numbers.
        """
        clean = self._probe_record()
        needed = [(site, i) for site in REQUIRED_SITES for i in range(self.n_layers)]
        if any(key not in clean for key in needed):
            raise UnsupportedModelError(
                f"the {self.architecture} forward does not pass through every block's "
                "residual, attention and MLP hooks",
                fix="use an architecture listed as supported in the README's architecture table",
            )
        if not all(all_finite(t) for t in clean.values()):
            raise NumericalError(
                f"the {self.architecture} forward overflows (NaN or infinite activations), so "
                "its block structure cannot be read",
                fix="check the checkpoint's weights and the dtype (float16 overflows above "
                "65504; load with dtype=torch.float32)",
            )
        tol = _tolerance(self.dtype)
        layers = range(self.n_layers)
        for kind in ("sum", "sandwich"):
            attn, mlp = _UPDATE_SITES[kind]
            if (attn, 0) not in clean or (mlp, 0) not in clean:
                continue
            if all(
                _close(
                    clean["resid_in", i] + clean[attn, i] + clean[mlp, i],
                    clean["resid_out", i],
                    tol,
                )
                for i in layers
            ) and self._edits_honoured(kind, clean, tol):
                return BlockStructure(kind, self._reads_block_input(kind, clean, tol))
        if self._mid_is_state(clean, tol):
            return BlockStructure("stream", False)
        raise UnsupportedModelError(
            f"the {self.architecture} blocks do not write to the residual stream in a way "
            "probekit can read from the bridge's hooks (neither h_out = h_in + attn + mlp, nor "
            "with post-sublayer norms, nor a post-norm mid-block state)",
            fix="use an architecture listed as supported in the README's architecture table",
        )

    @property
    def post_norm(self) -> bool:
        """True for post-LayerNorm blocks (BERT-style, ``structure.kind == 'stream'``), whose
        attention hook holds the normalised mid-block stream rather than the update added to
        it. Read from the blocks themselves (see :attr:`structure`), not from the name."""
        return self.structure.kind == "stream"

    @property
    def parallel_blocks(self) -> bool:
        """True when attention and MLP both read the block input (GPT-J, Falcon, Phi, GPT-NeoX
        with parallel residual): ``h_out = h_in + attn(h_in) + mlp(h_in)``."""
        return self.structure.parallel

    def _probe_batch(self) -> Batch:
        n = max(2, min(6, self.n_ctx))
        tokens = ((torch.arange(n) * 7 + 3) % self.d_vocab).view(1, n).to(self.device)
        return Batch(tokens, torch.ones_like(tokens))

    def _probe_record(
        self, edits: HookList = (), before: Sequence[tuple[str, int]] = ()
    ) -> dict[tuple[str, int], torch.Tensor]:
        """One probe forward with ``edits``; float64 copies of every update site keyed
        ``(site, layer)``: after the edits, except the ``before`` ones (as computed)."""
        held: dict[tuple[str, int], torch.Tensor] = {}

        def keep(key: tuple[str, int]) -> Callable:
            def fn(tensor: torch.Tensor, hook: Any) -> None:
                held[key] = tensor.detach().double()

            return fn

        sites = ("resid_in", "attn_out", "mlp_out", "resid_out", *_POST_NORM_SITES)
        names = {
            (site, i): name
            for site in sites
            for i in range(self.n_layers)
            if (name := self.hook_name(i, site)) in self.bridge.hook_dict
        }
        first = [(names[key], keep(key)) for key in before if key in names]
        last = [(name, keep(key)) for key, name in names.items() if key not in before]
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with _dtype_guard(self.dtype, self.device):
                self.forward(self._probe_batch(), first + list(edits) + last)
        return held

    def _edits_honoured(self, kind: str, clean: dict, tol: float) -> bool:
        """Whether zeroing both updates of every block through the hooks leaves h_out = h_in."""
        edits = [
            hook
            for i in range(self.n_layers)
            for sub in ("attn", "mlp")
            for hook in self._replace_hooks(kind, i, sub, None)
        ]
        got = self._probe_record(edits)
        return all(
            _close(got["resid_in", i], got["resid_out", i], tol) for i in range(self.n_layers)
        )

    def _reads_block_input(self, kind: str, clean: dict, tol: float) -> bool:
        """Whether layer 0's MLP update is unchanged when its attention update is zeroed."""
        mlp = _UPDATE_SITES[kind][1]
        got = self._probe_record(self._replace_hooks(kind, 0, "attn", None), before=[(mlp, 0)])
        return _close(got[mlp, 0], clean[mlp, 0], tol)

    def _mid_is_state(self, clean: dict, tol: float) -> bool:
        """Post-norm check: with every block input perturbed but the attention hook given its
        clean value, every block output is the clean one (the hook holds the whole stream)."""
        if ("attn_out", 0) not in clean:
            return False
        g = torch.Generator().manual_seed(0)

        def value(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            return tensor.to(like.device, like.dtype)

        edits = []
        for i in range(self.n_layers):
            h = clean["resid_in", i]
            noise = torch.randn(h.shape, generator=g, dtype=h.dtype) * h.std()
            edits += [
                (self.hook_name(i, "resid_in"), lambda t, hook, v=h + noise: value(v, t)),
                (
                    self.hook_name(i, "attn_out"),
                    lambda t, hook, v=clean["attn_out", i]: value(v, t),
                ),
            ]
        before = [("attn_out", i) for i in range(self.n_layers)]
        got = self._probe_record(edits, before=before)
        layers = range(self.n_layers)
        moved = all(not _close(got["attn_out", i], clean["attn_out", i], tol) for i in layers)
        return moved and all(
            _close(got["resid_out", i], clean["resid_out", i], tol) for i in layers
        )

    @cached_property
    def supports_pattern_edits(self) -> bool:
        """Whether editing ``attn_pattern`` changes the output (False where the bridge only
        observes an attention computed inside the wrapped module, e.g. BERT). Tested once."""
        if self.hook_name(0, "attn_pattern") not in self.bridge.hook_dict:
            return False
        tokens = torch.ones(1, 3, dtype=torch.long, device=self.device)
        batch = Batch(tokens, torch.ones_like(tokens))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clean = self.forward(batch)
            zeroed = self.forward(
                batch, [(self.hook_name(0, "attn_pattern"), lambda t, hook: torch.zeros_like(t))]
            )
        return not torch.equal(clean, zeroed)

    def check_layer(self, layer: Any, what: str = "layer") -> int:
        """``layer`` as an int in ``0..n_layers-1``, or :class:`InputError` naming the problem
        (other types, ``True``/``False`` and floats included)."""
        n = self.n_layers
        if isinstance(layer, bool) or not hasattr(layer, "__index__"):
            raise InputError(
                f"{what} {layer!r} is a {type(layer).__name__}, not an integer",
                fix=f"pass a {what} index in 0..{n - 1}",
            )
        if not 0 <= int(layer) < n:
            raise InputError(
                f"{what} {layer!r} is outside the model's {n} layers",
                fix=f"use a {what} index in 0..{n - 1}",
            )
        return int(layer)

    def check_head(self, head: Any) -> int | None:
        """``head`` as an int in ``0..n_heads-1``, ``None`` (all heads), or :class:`InputError`."""
        if head is None:
            return None
        if isinstance(head, bool) or not hasattr(head, "__index__"):
            raise InputError(
                f"head {head!r} is a {type(head).__name__}, not an integer",
                fix=f"pass a head index in 0..{self.n_heads - 1}, or head=None for all heads",
            )
        if not 0 <= int(head) < self.n_heads:
            raise InputError(
                f"head {head} is outside the model's {self.n_heads} heads",
                fix=f"use a head index in 0..{self.n_heads - 1}, or head=None for all heads",
            )
        return int(head)

    @torch.no_grad()
    def weights(self, names: Sequence[str] = WEIGHT_NAMES) -> dict[tuple[int, str], torch.Tensor]:
        """Every per-layer weight as a 2-D float64 CPU tensor ``[d_in, n_out]`` (columns are
        neurons), keyed ``(layer, name)`` with names from :data:`WEIGHT_NAMES`.

        W_Q/W_K/W_V are ``[d_model, heads * d_head]`` (grouped K/V keep their own number of
        heads), W_O ``[heads * d_head, d_model]``, W_in/W_gate ``[d_model, d_mlp]``, W_out
        ``[d_mlp, d_model]``. Names a model lacks (W_gate in a non-gated MLP) are left out.
        """
        unknown = set(names) - set(WEIGHT_NAMES)
        if unknown:
            raise InputError(
                f"unknown weight matrices {sorted(unknown)}", fix=f"use {list(WEIGHT_NAMES)}"
            )
        out: dict[tuple[int, str], torch.Tensor] = {}
        for name in names:
            try:
                stacked = getattr(self.bridge, name)
            except AttributeError:
                continue
            if stacked is None:
                continue
            stacked = stacked.detach().to("cpu", torch.float64)
            for layer in range(stacked.shape[0]):
                w = stacked[layer]
                if name in ("W_Q", "W_K", "W_V"):  # [heads, d_model, d_head]
                    w = w.permute(1, 0, 2).reshape(w.shape[1], -1)
                elif name == "W_O":  # [heads, d_head, d_model]
                    w = w.reshape(-1, w.shape[-1])
                out[(layer, name)] = w
        return out

    @property
    def embedding(self) -> torch.Tensor:
        """Token embedding ``W_E`` ``[d_vocab, d_model]`` as a float64 CPU tensor."""
        return self.bridge.W_E.detach().to("cpu", torch.float64)

    @property
    def unembedding(self) -> torch.Tensor:
        """Unembedding ``W_U`` ``[d_model, d_vocab]`` as a float64 CPU tensor (refused for a
        model loaded without its head: see :meth:`require_vocabulary`)."""
        self.require_vocabulary("the unembedding W_U")
        return self.bridge.W_U.detach().to("cpu", torch.float64)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer saved with the checkpoint, or ``None``."""
        return getattr(self.bridge, "tokenizer", None)

    def tokenize(self, texts: Sequence[str], max_length: int | None = None) -> Batch:
        """``texts`` as one right-padded batch, each text tokenized on its own by the
        checkpoint's tokenizer with its special tokens (BERT's ``[CLS]`` ... ``[SEP]``, a BOS)
        and cut at ``max_length`` (default and at most the context), with the attention mask
        of its real tokens. A tokenizer that pads on the left (embedding models that pool the
        last token) pads on the right here, as :meth:`prepare` requires; one without a pad token
        pads with its EOS / UNK id (masked out, never read)."""
        tok = self.tokenizer
        if tok is None:
            raise InputError(
                f"the {self.architecture} checkpoint has no tokenizer to tokenize text with",
                fix="save a tokenizer beside the weights, or pass token ids",
            )
        if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
            raise InputError("texts must be a non-empty list of strings", fix='pass ["...", ...]')
        length = min(max_length or self.n_ctx, self.n_ctx)
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

    def update_hooks(
        self,
        layer: int,
        on_layer: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
    ) -> list[tuple[str, Callable]]:
        """Hooks that call ``on_layer(h_in, a, m, h_out)`` once block ``layer`` has run.

        ``a`` and ``m`` are the attention and MLP updates, ``h_out = h_in + a + m`` (see
        :attr:`structure`): the sublayer outputs in pre-norm and parallel blocks, the
        post-sublayer-normed outputs in sandwich-norm blocks (Gemma 2/3, OLMo 2), and in
        post-norm blocks (BERT) the change each sublayer, with its add-norm, makes to the stream.
        """
        kind = self.structure.kind
        held: dict[str, torch.Tensor] = {}

        def keep(key: str) -> Callable:
            def fn(tensor: torch.Tensor, hook: Any) -> None:
                held[key] = tensor.detach().clone()  # blocks may add to it in place (Falcon)

            return fn

        def finish(tensor: torch.Tensor, hook: Any) -> None:
            h_in, h_out = held.pop("in"), tensor.detach()
            if kind == "stream":
                mid = held.pop("mid")
                on_layer(h_in, mid - h_in, h_out - mid, h_out)
            else:
                on_layer(h_in, held.pop("attn"), held.pop("mlp"), h_out)

        hooks = [(self.hook_name(layer, "resid_in"), keep("in"))]
        if kind == "stream":
            hooks.append((self.hook_name(layer, "attn_out"), keep("mid")))
        else:
            attn, mlp = _UPDATE_SITES[kind]
            hooks += [
                (self.hook_name(layer, attn), keep("attn")),
                (self.hook_name(layer, mlp), keep("mlp")),
            ]
        return hooks + [(self.hook_name(layer, "resid_out"), finish)]

    def replace_update_hooks(
        self, layer: int, sublayer: str, value: torch.Tensor | None = None
    ) -> list[tuple[str, Callable]]:
        """Hooks that replace the ``sublayer`` ('attn' or 'mlp') update of ``layer`` by
        ``value`` (broadcast; ``None`` = zero), with updates as in :meth:`update_hooks`."""
        if sublayer not in ("attn", "mlp"):
            raise InputError(f"unknown sublayer {sublayer!r}", fix="use 'attn' or 'mlp'")
        return self._replace_hooks(self.structure.kind, layer, sublayer, value)

    def _replace_hooks(
        self, kind: str, layer: int, sublayer: str, value: torch.Tensor | None
    ) -> list[tuple[str, Callable]]:
        def update(like: torch.Tensor) -> torch.Tensor:
            if value is None:
                return torch.zeros_like(like)
            return value.to(like.device, like.dtype).expand_as(like)

        if kind != "stream":
            site = _UPDATE_SITES[kind][0 if sublayer == "attn" else 1]
            return [(self.hook_name(layer, site), lambda t, hook: update(t).clone())]
        held: dict[str, torch.Tensor] = {}

        def keep(tensor: torch.Tensor, hook: Any) -> None:
            held["base"] = tensor

        def replace(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
            base = held.pop("base")
            return base + update(base)

        before, at = ("resid_in", "attn_out") if sublayer == "attn" else ("attn_out", "resid_out")
        return [(self.hook_name(layer, before), keep), (self.hook_name(layer, at), replace)]

    def hook_name(self, layer: int, site: str) -> str:
        """Canonical hook name of ``site`` (one of :data:`SITES`) in block ``layer``."""
        return {**SITES, **_POST_NORM_SITES}[site].format(layer=layer)

    def layer_weights(self, layer: int) -> list[list[nn.Parameter]]:
        """The weight tensors of block ``layer`` as the original model defines them.

        The bridge may expose one stored weight as several parameters (GPT-2's fused ``c_attn``
        appears as views ``q``, ``k``, ``v``); parameters sharing storage form one group here,
        so a layer has as many groups as the Hugging Face model has weight tensors.
        """
        groups: dict[int, list[nn.Parameter]] = {}
        for param in self.blocks[layer].parameters():
            groups.setdefault(param.untyped_storage().data_ptr(), []).append(param)
        return list(groups.values())

    def __repr__(self) -> str:
        return (
            f"Model({self.architecture}, n_layers={self.n_layers}, d_model={self.d_model}, "
            f"d_vocab={self.d_vocab}, device={self.device}, dtype={self.dtype})"
        )

    # ---- checks -----------------------------------------------------------------------
    def check_finite(self) -> None:
        """Raise :class:`NumericalError` if any weight is NaN or infinite (weights offloaded
        to disk by a ``device_map`` are read from the offload folder to be checked)."""
        for name, param in _named_weights(self.hf_model):
            if not all_finite(param):
                raise NumericalError(
                    f"weight {name} contains NaN or infinite values",
                    fix="load an earlier checkpoint or retrain with a lower learning rate",
                )

    def prepare(
        self, data: Data, batch_size: int | None = None, backward: bool = False
    ) -> list[Batch]:
        """Validate ``data`` against this model and return batches on its device with labels.

        Without a ``batch_size``, a batch whose output would exceed :data:`OUTPUT_BATCH_BYTES`
        is split (:meth:`default_batch_size`; smaller for a ``backward``); pass ``batch_size``
        to choose.

        Raises :class:`InputError` for empty data, token ids that are not integers or lie
        outside the vocabulary, sequences longer than the context, masks that are not right
        padding of 0/1 values (left padding, holes, other values, an all-padding row), labels
        that are not integer token ids or -100, masks and labels of the wrong shape, and data
        with no position to predict at all.
        """
        out = []
        for batch in self.split_batches(as_batches(data, batch_size), batch_size, backward):
            _check_tokens(batch.tokens, self.d_vocab, self.n_ctx)
            for what, t in (("attention_mask", batch.attention_mask), ("labels", batch.labels)):
                if t is not None and t.shape != batch.tokens.shape:
                    raise InputError(
                        f"{what} has shape {tuple(t.shape)} but tokens have "
                        f"{tuple(batch.tokens.shape)}",
                        fix=f"give {what} the same [batch, pos] shape as the tokens",
                    )
            if batch.attention_mask is not None:
                _check_mask(batch.attention_mask)
            if batch.labels is not None:
                _check_labels(batch.labels, self.d_vocab)
            batch = batch.to(self.device)
            tokens = batch.tokens.long()
            mask = None if batch.attention_mask is None else batch.attention_mask.long()
            labels = batch.labels.long() if batch.labels is not None else None
            if labels is None:
                labels = self.default_labels(tokens, mask)
            out.append(Batch(tokens, mask, labels))
        if self.headless is None and all(bool((b.labels == -100).all()) for b in out):
            raise InputError(
                "no position of the data has a target (every label is -100; a decoder's "
                "one-token sequences have no next token)",
                fix="pass sequences of at least two tokens, or labels with token ids",
            )
        return out

    def default_batch_size(self, seq_len: int, backward: bool = False) -> int:
        """Sequences of ``seq_len`` tokens per batch when none is given: as many as keep one
        batch's float32 output within :data:`OUTPUT_BATCH_BYTES` (at least one); for a
        ``backward``, with the gradients and saved activations counted too.

        Example:
            >>> from probekit.toy import toy_model
            >>> model = toy_model(n_layers=2, vocab_size=50257)
            >>> model.default_batch_size(128)   # 64 MiB / (128 tokens x 50257 x 4 bytes)
            2
        """
        width = self.d_vocab if self.output_kind == "logits" else self.d_model
        floats = width
        if backward:
            floats = 3 * width + BACKWARD_FLOATS_PER_LAYER * self.d_model * self.n_layers
        return max(1, OUTPUT_BATCH_BYTES // (4 * max(1, seq_len) * floats))

    def split_batches(
        self, batches: list[Batch], batch_size: int | None, backward: bool = False
    ) -> list[Batch]:
        """``batches`` as they are when a ``batch_size`` was given, else each split to
        :meth:`default_batch_size` (what :meth:`prepare` runs, before validating)."""
        if batch_size is not None:
            return batches
        return [
            part
            for batch in batches
            for part in as_batches(batch, self.default_batch_size(batch.tokens.shape[-1], backward))
        ]

    def default_labels(self, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Targets per position: the next real token (decoders) or the token itself (encoders)."""
        valid = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()
        if not self.is_causal:
            return torch.where(valid, tokens, torch.full_like(tokens, -100))
        labels = torch.full_like(tokens, -100)
        ok = valid[:, :-1] & valid[:, 1:]
        labels[:, :-1] = torch.where(ok, tokens[:, 1:], labels[:, :-1])
        return labels

    # ---- running ------------------------------------------------------------------------
    @contextmanager
    def hooks(self, fwd_hooks: HookList = (), bwd_hooks: HookList = ()) -> Iterator[Model]:
        """Attach TransformerLens hooks for the duration of the block; always removed after."""
        with self.bridge.hooks(fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks)):
            yield self

    def forward(self, batch: Batch, fwd_hooks: HookList = ()) -> torch.Tensor:
        """Full forward of one prepared batch through the bridge; returns logits ``[B, T, V]``."""
        with self.hooks(fwd_hooks):
            return self.bridge(batch.tokens, attention_mask=batch.attention_mask, use_cache=False)

    @torch.no_grad()
    def logits(self, tokens: Any, attention_mask: Any = None) -> torch.Tensor:
        """Logits ``[batch, pos, vocab]`` of the model on ``tokens`` (validated)."""
        [batch] = self.prepare((tokens, attention_mask) if attention_mask is not None else tokens)
        return self.forward(batch)

    def head(self, residual: torch.Tensor) -> torch.Tensor:
        """Map a final-layer residual ``[B, T, d_model]`` to logits: the masked-LM prediction
        head (BERT's ``cls``, RoBERTa's ``lm_head``) of encoders; for decoders the final norm
        and unembedding, then the logit soft-capping (Gemma 2/3) or scaling (Granite, Cohere) the
        model's config defines. :meth:`check_structure` checks it against the model's forward.

        A model without a head (:attr:`output_kind` ``hidden`` / ``embedding``) returns its
        final hidden state: the base model's final norm (decoders) or the residual itself
        (post-norm encoders such as BERT, whose last block ends in its norm); pooling is
        :meth:`pool`'s, applied where outputs are compared."""
        if self.headless is not None:
            return self.bridge.ln_final(residual) if self.headless.final_norm else residual
        for name in ("cls",) if self.is_causal else ("cls", "lm_head"):
            prediction_head = getattr(self.hf_model, name, None)
            if prediction_head is not None:
                return prediction_head(residual)
        logits = self._unembed(self.bridge.ln_final(residual))
        config = self.hf_model.config
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

    def _unembed(self, normed: torch.Tensor) -> torch.Tensor:
        """The bridge's unembedding of ``normed``; on a CPU, when it is a plain
        ``nn.Linear`` with no hook anywhere on it and no gradient is taken, the same product
        computed :data:`VOCAB_CHUNK` rows of the weight at a time (the same logits, faster)."""
        unembed = self.bridge.unembed
        linear = getattr(unembed, "original_component", None)
        if type(linear) is not nn.Linear:
            return unembed(normed)
        grad = torch.is_grad_enabled() and (normed.requires_grad or linear.weight.requires_grad)
        plain = (
            normed.device.type == "cpu"
            and linear.out_features > 2 * VOCAB_CHUNK
            and not grad
            and not hasattr(linear, "_hf_hook")
            and not _global_hooks()
            and not any(_hook_registries(unembed))
        )
        if not plain:
            return unembed(normed)
        return _blocked_linear(normed, linear.weight, linear.bias)

    @torch.no_grad()
    def check_structure(self) -> None:
        """Refuse, with :class:`UnsupportedModelError`, a model whose numbers probekit would get
        wrong: blocks whose updates cannot be read (:attr:`structure`), or a forward that
        resuming from the first block or applying :meth:`head` to the last residual does not
        reproduce. Runs a few forwards of 6 tokens; :func:`load` calls it.
        """
        try:
            self._check_replay()
        except NumericalError:
            return  # an overflowing forward: the analyses name the first non-finite layer
        except ProbekitError:
            raise
        except Exception as err:  # the bridge's own forward fails on this architecture
            raise UnsupportedModelError(
                f"TransformerLens' bridge cannot run a {self.architecture} forward "
                f"({type(err).__name__}: {err})",
                fix="use an architecture listed as supported in the README's architecture table",
            ) from err

    def _check_replay(self) -> None:
        self.structure  # noqa: B018  (raises when no block structure fits)
        with _dtype_guard(self.dtype, self.device):
            trace = self.trace(self._probe_batch())
            for start, what in ((0, "the blocks replayed"), (self.n_layers, "the output head")):
                if not _close(trace.resume(start), trace.logits, _tolerance(self.dtype)):
                    raise UnsupportedModelError(
                        f"probekit cannot reproduce the {self.architecture} forward from "
                        f"{what} (resumed logits differ from the model's own)",
                        fix="use an architecture listed as supported in the README's "
                        "architecture table",
                    )

    @torch.no_grad()
    def trace(self, batch: Batch, fwd_hooks: HookList = ()) -> Trace:
        """Clean forward that keeps only each block's input residual and its call arguments.

        The returned :class:`Trace` resumes the forward from any layer without recomputing the
        blocks before it (see :meth:`Trace.resume`).
        """
        residuals: list[torch.Tensor | None] = [None] * (self.n_layers + 1)
        calls: list[tuple[tuple, dict] | None] = [None] * self.n_layers
        hf_calls: list[tuple[tuple, dict] | None] = [None] * self.n_layers

        def keep(layer: int) -> Callable:
            def fn(tensor: torch.Tensor, hook: Any) -> None:
                residuals[layer] = tensor.detach()

            return fn

        def record(layer: int, into: list) -> Callable:
            def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                into[layer] = (args, dict(kwargs))

            return pre_hook

        hooks = [(self.hook_name(i, "resid_in"), keep(i)) for i in range(self.n_layers)]
        hooks.append((self.hook_name(self.n_layers - 1, "resid_out"), keep(self.n_layers)))
        handles = []
        for i, block in enumerate(self.blocks):
            handles.append(block.register_forward_pre_hook(record(i, calls), with_kwargs=True))
            inner = getattr(block, "original_component", None)
            if isinstance(inner, nn.Module):  # what the bridge passes the HF block
                hook = record(i, hf_calls)
                handles.append(inner.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            logits = self.forward(batch, list(fwd_hooks) + hooks)
        finally:
            for handle in handles:
                handle.remove()
        if any(r is None for r in residuals) or any(c is None for c in calls):
            raise UnsupportedModelError(
                f"the {self.architecture} forward did not pass through every block hook",
                fix="use a standard architecture whose forward runs each block once",
            )
        _check_finite_stream(residuals, logits)  # type: ignore[arg-type]
        return Trace(self, batch, residuals, logits, calls, hf_calls)  # type: ignore[arg-type]

    # ---- the Hugging Face block path of hook-free resumes -------------------------------
    @property
    def block_path(self) -> str:
        """Which module a hook-free block run of a :class:`Trace` calls under the current
        precision (autocast or not): ``"hf"``, a pure Hugging Face copy of the block sharing
        its weights (none of TransformerLens' components, whose Python norms and attention
        rebuild cost time), or ``"bridge (<why>)"``, the bridge's block.

        The copies are used when :attr:`raw_blocks` is on, the model has no accelerate
        ``device_map`` / offload hooks, and a one-time check (per precision) on two probe
        batches (with and without padding) finds every copy's output equal to the bridge
        block's within :data:`RAW_BLOCKS_TOLERANCE`, run alone and stacked; even then a block
        with a hook in it (a TransformerLens hook or any torch hook on its modules), in
        training mode, or any global torch forward hook, runs through the bridge.

        Example:
            >>> from probekit.toy import toy_model
            >>> model = toy_model(n_layers=2)
            >>> model.block_path
            'hf'
            >>> model.raw_blocks = False
            >>> model.block_path
            'bridge (Model.raw_blocks is False)'
        """
        why = self._raw_refusal()
        return "hf" if why is None else f"bridge ({why})"

    def _raw_refusal(self, device_type: str | None = None) -> str | None:
        """Why hook-free blocks on ``device_type`` (default: the model's) do not run through
        the HF copies now (None: they do)."""
        if not self.raw_blocks:
            return "Model.raw_blocks is False"
        if self._hf_blocks is None:
            self._hf_blocks = _HFBlocks.build(self)
        hf = self._hf_blocks
        if hf.refusal is not None:
            return hf.refusal
        key = _precision_key(device_type or self.device.type)
        if key not in hf.checks:
            if any(hf.foreign_hooks(block) for block in self.blocks):
                return "not checked yet (hooks are active in the blocks)"
            hf.checks[key] = self._check_raw_blocks(hf)
        return hf.checks[key]

    def _raw_block(self, block: nn.Module, device_type: str | None = None) -> nn.Module | None:
        """The pure HF copy to run instead of bridge ``block`` now on ``device_type`` (the
        device of the residual; default the model's), or None (the bridge). Called per block
        run, so the checked case costs a few microseconds."""
        hf = self._hf_blocks
        key = _precision_key(device_type or self.device.type)
        if hf is None or key not in hf.checks:
            if self._raw_refusal(device_type) is not None:
                return None
            hf = self._hf_blocks
            assert hf is not None
        if not self.raw_blocks or hf.refusal is not None or hf.checks[key] is not None:
            return None
        if block.training or _global_hooks() or hf.foreign_hooks(block):
            return None
        return hf.copies.get(id(block))

    @torch.no_grad()
    def _check_raw_blocks(self, hf: _HFBlocks) -> str | None:
        """Compare every HF copy with its bridge block on the probe batch and a padded one,
        alone and stacked; None when all agree within :data:`RAW_BLOCKS_TOLERANCE`."""
        probe = self._probe_batch()
        mask = torch.cat([probe.attention_mask, probe.attention_mask])
        n = mask.shape[1]
        mask[1, n - n // 2 :] = 0
        try:
            return self._compare_raw_blocks(hf, [probe, Batch(probe.tokens.repeat(2, 1), mask)])
        except Exception as err:  # a call the copies (or stacked bridge blocks) cannot run
            return f"the check of the Hugging Face copies failed ({type(err).__name__}: {err})"

    def _compare_raw_blocks(self, hf: _HFBlocks, batches: list[Batch]) -> str | None:
        for batch in batches:
            trace = self.trace(batch)
            for layer, block in enumerate(self.blocks):
                if trace.hf_calls[layer] is None:
                    return f"the bridge block {layer} never called its Hugging Face block"
                h, other = trace.residuals[layer], trace.residuals[layer + 1]
                for variants in ([h], [h, other]):
                    want = trace._call(block, trace.calls[layer], variants)
                    got = trace._call(hf.copies[id(block)], trace.hf_calls[layer], variants)
                    worst = max(_deviation(g, w) for g, w in zip(got, want, strict=True))
                    if not worst <= RAW_BLOCKS_TOLERANCE:  # NaN fails too
                        return (
                            f"the Hugging Face copy of block {layer} differs from the bridge's "
                            f"by {worst:.1e} (relative to max(1, max |output|)) on a probe batch"
                        )
        return None


@dataclass
class Trace:
    """The residual stream of one clean forward, ready to resume from any layer.

    ``residuals[l]`` is the input of block ``l`` (``residuals[n_layers]`` the final residual),
    ``logits`` the clean output and ``calls[l]`` the arguments the model passed to block ``l``
    (attention mask, position embeddings, ...), replayed by :meth:`resume`; ``hf_calls[l]``
    those the bridge block passed on to the Hugging Face block inside it, replayed when a
    hook-free block runs through the pure Hugging Face copy (:attr:`Model.block_path`).
    """

    model: Model
    batch: Batch
    residuals: list[torch.Tensor]
    logits: torch.Tensor
    calls: list[tuple[tuple, dict]] = field(repr=False)
    hf_calls: list[tuple[tuple, dict] | None] = field(default_factory=list, repr=False)

    def _route(self, layer: int) -> tuple[nn.Module, tuple[tuple, dict]]:
        """The module to run for block ``layer`` and its clean call: the pure HF copy with
        the HF block's arguments where :meth:`Model._raw_block` allows it, else the bridge."""
        block = self.model.blocks[layer]
        call = self.hf_calls[layer] if layer < len(self.hf_calls) else None
        device = self.residuals[layer].device.type
        raw = None if call is None else self.model._raw_block(block, device)
        return (block, self.calls[layer]) if raw is None else (raw, call)  # type: ignore[return-value]

    def run_block(self, layer: int, residual: torch.Tensor) -> torch.Tensor:
        """Run block ``layer`` on ``residual`` with the arguments of the clean forward."""
        module, call = self._route(layer)
        return self._call(module, call, [residual])[0]

    def _call(
        self, module: nn.Module, call: tuple[tuple, dict], residuals: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """``module`` run once on ``residuals`` stacked along the batch dimension with the
        clean ``call`` (its batch-sized tensors repeated); each variant's output."""
        args, kwargs = call if len(residuals) == 1 else self._stacked(call, len(residuals))
        stacked = residuals[0] if len(residuals) == 1 else torch.cat(list(residuals))
        if args:
            out = module(stacked, *args[1:], **kwargs)
        else:
            out = module(**{**kwargs, "hidden_states": stacked})
        out = out[0] if isinstance(out, tuple) else out
        return [out] if len(residuals) == 1 else list(out.split(residuals[0].shape[0]))

    def _stacked(self, call: tuple[tuple, dict], copies: int) -> tuple[tuple, dict]:
        """The clean ``call`` with every tensor that has the batch dimension first repeated
        ``copies`` times along it (masks, position ids, ...); BLOOM's ``alibi``, whose first
        dimension is batch x heads (batch-major), is repeated per sequence the same way."""
        size = self.batch.tokens.shape[0]

        def tile(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[0] == size:
                return torch.cat([value] * copies)
            if isinstance(value, tuple | list):
                return type(value)(tile(v) for v in value)
            return value

        def tile_alibi(value: Any) -> Any:
            heads = self.model.n_heads
            if not isinstance(value, torch.Tensor) or value.shape[0] != size * heads:
                return tile(value)
            per_sequence = value.reshape(size, heads, *value.shape[1:])
            return torch.cat([per_sequence] * copies).flatten(0, 1)

        args, kwargs = call
        return tile(args), {
            key: tile_alibi(value) if key == "alibi" else tile(value)
            for key, value in kwargs.items()
        }

    def run_stacked(self, layer: int, residuals: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run block ``layer`` once on several variants' residuals stacked along the batch
        dimension (the clean call's arguments repeated); returns each variant's output."""
        module, call = self._route(layer)
        return self._call(module, call, residuals)

    @torch.no_grad()
    def resume_stacked(
        self,
        starts: Sequence[int],
        residuals: Sequence[torch.Tensor | None] | None = None,
        orders: Sequence[Sequence[int] | None] | None = None,
        observe: Callable[[int, int, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> list[torch.Tensor]:
        """The final residuals of several hook-free variants resumed together.

        Variant v resumes at block ``starts[v]`` from ``residuals[v]`` (default: the clean
        one) and runs ``orders[v]`` (default ``start .. n_layers-1``; a permutation of the
        remaining positions, as in :meth:`resume`). Step by step, the variants that run the
        same block at the same position are stacked along the batch dimension and the block
        runs once for all of them (one variant alone runs exactly as :meth:`resume` does).
        ``observe(v, layer, h_in, h_out)`` sees every block run. Apply :meth:`Model.head` to
        each returned residual for its logits.

        Example:
            >>> from probekit.toy import toy_model, toy_tokens
            >>> model = toy_model(n_layers=3)
            >>> trace = model.trace(model.prepare(toy_tokens())[0])
            >>> a, b = trace.resume_stacked([1, 2], [trace.residuals[0], trace.residuals[1]])
            >>> bool(torch.allclose(model.head(a), trace.resume(1, trace.residuals[0]), atol=1e-5))
            True
        """
        n, k = self.model.n_layers, len(starts)
        residuals = [None] * k if residuals is None else list(residuals)
        orders = [None] * k if orders is None else list(orders)
        plan = []
        for start, order in zip(starts, orders, strict=True):
            if not 0 <= start <= n:
                raise InputError(f"start layer {start} outside [0, {n}]", fix=f"use 0..{n}")
            plan.append(list(range(start, n)) if order is None else list(order))
            if len(plan[-1]) != n - start:
                raise InputError(
                    f"a stacked variant starting at {start} lists {len(plan[-1])} blocks",
                    fix=f"give the order of the {n - start} remaining positions",
                )
        hs = [self.residuals[s] if r is None else r for s, r in zip(starts, residuals, strict=True)]
        for pos in range(min(starts, default=n), n):
            groups: dict[int, list[int]] = {}
            for v in range(k):
                if starts[v] <= pos:
                    groups.setdefault(plan[v][pos - starts[v]], []).append(v)
            for layer, members in groups.items():
                outs = self.run_stacked(layer, [hs[v] for v in members])
                for v, h_out in zip(members, outs, strict=True):
                    if observe is not None:
                        observe(v, layer, hs[v], h_out)
                    hs[v] = h_out
        return hs

    @torch.no_grad()
    def resume(
        self,
        start: int,
        residual: torch.Tensor | None = None,
        order: Sequence[int] | None = None,
        fwd_hooks: HookList = (),
        observe: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """Logits of the forward resumed at block ``start`` (``start == n_layers``: head only).

        ``residual`` replaces the cached input of block ``start`` (default: the clean one);
        ``order`` lists the blocks to run from there on (default ``start .. n_layers-1``), so a
        swap of layers i < j is ``resume(i, order=[j, i+1, ..., i, ...])``; ``fwd_hooks`` are
        active during the resumed part; ``observe(layer, h_in, h_out)`` sees every block run.

        Example:
            >>> from probekit.toy import toy_model, toy_tokens
            >>> model = toy_model(n_layers=4)
            >>> [batch] = model.prepare(toy_tokens())
            >>> trace = model.trace(batch)
            >>> skipped = trace.resume(4, trace.residuals[3])   # skip layer 3
            >>> bool(torch.allclose(trace.resume(0), trace.logits, atol=1e-5))
            True
        """
        n = self.model.n_layers
        if not 0 <= start <= n:
            raise InputError(f"start layer {start} outside [0, {n}]", fix=f"use 0..{n}")
        h = self.residuals[start] if residual is None else residual
        order = list(range(start, n)) if order is None else list(order)
        with self.model.hooks(fwd_hooks):
            for layer in order:
                h_out = self.run_block(layer, h)
                if observe is not None:
                    observe(layer, h, h_out)
                h = h_out
            return self.model.head(h)


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
"""A module's hook registries (a pure copy starts with empty ones)."""


def _hf_module(module: nn.Module) -> nn.Module:
    """The Hugging Face module a TransformerLens component wraps (``module`` itself if none)."""
    while "_original_component" in module._modules:
        inner = module._modules["_original_component"]
        if inner is None:
            raise UnsupportedModelError(
                f"a {type(module).__name__} of the bridge wraps no Hugging Face module",
                fix="nothing to do: hook-free blocks run through the bridge",
            )
        module = inner
    return module


def _pure_copy(module: nn.Module, memo: dict[int, nn.Module]) -> nn.Module:
    """A copy of the Hugging Face module tree under ``module`` with every TransformerLens
    component replaced by the module it wraps: each copied module shares its original's
    parameter and buffer dictionaries (the same tensors, later moves and edits included) and
    attributes, but has no hooks, no instance-level ``forward`` patch, and copied children."""
    module = _hf_module(module)
    if id(module) in memo:
        return memo[id(module)]
    clone = copy.copy(module)
    clone.__dict__.pop("forward", None)  # a patch bound to the original would run it instead
    for name in _HOOK_DICTS:
        if name in clone.__dict__:
            clone.__dict__[name] = type(module.__dict__[name])()
    memo[id(module)] = clone
    clone.__dict__["_modules"] = {
        name: None if child is None else _pure_copy(child, memo)
        for name, child in module._modules.items()
    }
    return clone


def _hook_registries(module: nn.Module) -> list[dict]:
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


def _mirror_hooks(modules: Sequence[nn.Module]) -> int:
    """How many of the forward hooks on ``modules`` are the permanent ones TransformerLens'
    ``_wire_symbolic_hooks`` adds (they re-fire a placeholder sublayer's own hook points)."""
    return sum(
        "_wire_symbolic_hooks" in getattr(fn, "__name__", "")
        for m in modules
        for fn in m._forward_hooks.values()
    )


def _blocked_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed :data:`VOCAB_CHUNK` output features at a time
    into one output tensor (same dtype and autocast behaviour as one call)."""
    rows = x.reshape(-1, x.shape[-1])
    out: torch.Tensor | None = None
    for start in range(0, weight.shape[0], VOCAB_CHUNK):
        part = slice(start, start + VOCAB_CHUNK)
        block = nn.functional.linear(rows, weight[part], None if bias is None else bias[part])
        if out is None:
            out = block.new_empty(rows.shape[0], weight.shape[0])
        out[:, part] = block
    assert out is not None
    return out.view(*x.shape[:-1], weight.shape[0])


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite: its sum first (one pass, no boolean
    copy; a NaN or infinity makes it non-finite), the element-wise test only when the sum is
    not finite (a finite tensor whose sum overflows).

    Example:
        >>> all_finite(torch.tensor([1.0, 2.0])), all_finite(torch.tensor([1.0, float("nan")]))
        (True, False)
        >>> all_finite(torch.tensor([3e38, 3e38]))  # the sum overflows, every value is finite
        True
    """
    if not tensor.is_floating_point() and not tensor.is_complex():
        return True
    tensor = tensor.detach()
    if bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


def _global_hooks() -> bool:
    """True when a global torch module hook is registered (it would see other modules)."""
    registry = torch.nn.modules.module
    return bool(
        registry._global_forward_hooks
        or registry._global_forward_pre_hooks
        or registry._global_backward_hooks
        or registry._global_backward_pre_hooks
    )


def _precision_key(device_type: str) -> tuple[str, bool, torch.dtype | None]:
    """The device type and its autocast state, which a block check holds for."""
    on = torch.is_autocast_enabled(device_type)
    return device_type, on, torch.get_autocast_dtype(device_type) if on else None


def _deviation(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(1, max |want|) in float64 (NaN if either is not finite)."""
    got, want = got.double(), want.double()
    if not (all_finite(got) and all_finite(want)):
        return math.nan
    return float((got - want).abs().max() / want.abs().max().clamp_min(1.0))


@dataclass
class _HFBlocks:
    """Pure Hugging Face copies of a model's bridge blocks (see :attr:`Model.block_path`),
    keyed by ``id`` of the bridge block (a reordered block list keeps each copy with its
    block), with each bridge block's hook registries for the hook test (and the hook counter
    at which it last found none) and the outcome of the per-precision checks. ``refusal``
    says why there are no copies (None: there are)."""

    copies: dict[int, nn.Module] = field(default_factory=dict)
    watched: dict[int, list[dict]] = field(default_factory=dict)
    own_hooks: dict[int, int] = field(default_factory=dict)
    hook_free: dict[int, int] = field(default_factory=dict)
    checks: dict[tuple, str | None] = field(default_factory=dict)
    refusal: str | None = None

    @classmethod
    def build(cls, model: Model) -> _HFBlocks:
        if any(hasattr(m, "_hf_hook") for m in model.hf_model.modules()):
            return cls(refusal="accelerate device_map / offload hooks on the model")
        out = cls()
        try:
            for block in model.blocks:
                out.copies[id(block)] = _pure_copy(block.original_component, {})
                out.watched[id(block)] = _hook_registries(block)
                out.own_hooks[id(block)] = _mirror_hooks(list(block.modules()))
        except (UnsupportedModelError, AttributeError) as err:
            return cls(refusal=f"no pure Hugging Face copy of the blocks ({err})")
        return out

    def foreign_hooks(self, block: nn.Module) -> bool:
        """True when a hook other than the bridge's own sits in ``block``: its capture hooks
        (for hook_mlp_in and split-QKV inputs) and the permanent hooks that mirror a
        placeholder sublayer's hooks (OPT's and BERT's MLP); anything else, or fewer of
        those, reads as a hook to honour."""
        if id(block) not in self.watched:
            return True
        stamp = torch.utils.hooks.RemovableHandle.next_id  # grows with every hook registered
        if self.hook_free.get(id(block)) == stamp:
            return False
        own = len(getattr(block, "_capture_hook_handles", ())) + self.own_hooks[id(block)]
        if sum(map(len, self.watched[id(block)])) != own:
            return True
        self.hook_free[id(block)] = stamp
        return False


def _check_finite_stream(residuals: list[torch.Tensor], logits: torch.Tensor) -> None:
    """Raise :class:`NumericalError` naming where a clean forward first turns non-finite."""
    if all_finite(logits) and all(all_finite(r) for r in residuals):
        return
    first = next((i for i, r in enumerate(residuals) if not all_finite(r)), None)
    where = (
        "the output head (the residual stream is finite)"
        if first is None
        else "the embeddings"
        if first == 0
        else f"the output of layer {first - 1}"
    )
    raise NumericalError(
        f"the clean forward has NaN or infinite values, first in {where}",
        fix="check the checkpoint's weights (too large weights overflow) and the dtype "
        "(float16 overflows above 65504; load with dtype=torch.float32)",
    )


def _check_tokens(tokens: torch.Tensor, d_vocab: int, n_ctx: int) -> None:
    if tokens.dtype not in _INTEGER_DTYPES:
        raise InputError(
            f"token ids have dtype {tokens.dtype}", fix="pass integer (long) token ids"
        )
    if tokens.ndim != 2:
        raise InputError(
            f"tokens have shape {tuple(tokens.shape)}", fix="pass tokens as [batch, pos]"
        )
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


def _check_mask(mask: torch.Tensor) -> None:
    """A mask must be right padding: per row 1 ... 1 0 ... 0, with at least one 1.

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
        kind = "left padding" if not bool(real[row, 0]) else "a hole (0 between 1s)"
        raise InputError(
            f"row {row} of the attention mask has {kind}; probekit handles right padding only",
            fix="pad on the right (tokenizer.padding_side = 'right') and keep real tokens "
            "contiguous from position 0",
        )


def _check_labels(labels: torch.Tensor, d_vocab: int) -> None:
    if labels.dtype not in _INTEGER_DTYPES:
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


def _check_safetensors(path: Path) -> int:
    """Check that a .safetensors file has a readable header and all the data it declares;
    return the number of values it stores."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError(f"header length {header_len} exceeds file size {size}")
            header = json.loads(handle.read(header_len))
        if not isinstance(header, dict):
            raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        if 8 + header_len + max(ends, default=0) > size:
            raise ValueError("the file is shorter than its header says (truncated)")
        return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
        raise CheckpointError(
            f"corrupt safetensors file {path} ({err})",
            fix="re-save the checkpoint with save_pretrained(safe_serialization=True)",
        ) from err


def _check_checkpoint_dir(path: Path) -> tuple[dict, int]:
    """The checkpoint's config, and the number of values its safetensors files store."""
    if not path.exists():
        raise CheckpointError(
            f"checkpoint path {path} does not exist", fix="pass a Hugging Face model directory"
        )
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint path {path} is a file, not a directory",
            fix="pass the directory holding config.json and *.safetensors",
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{path} has no config.json",
            fix="pass a directory written by save_pretrained() (config.json + safetensors)",
        )
    _check_regular_file(config_path)
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{config_path} is not valid JSON ({err})", fix="re-save the model's config"
        ) from err
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{config_path} holds a JSON {type(config).__name__}, not an object",
            fix="re-save the model's config with save_pretrained()",
        )
    archs = config.get("architectures")
    if archs is not None and not (
        isinstance(archs, list) and all(isinstance(a, str) for a in archs)
    ):
        raise CheckpointError(
            f"'architectures' in {config_path} is {archs!r}, not a list of class names",
            fix='write e.g. "architectures": ["GPT2LMHeadModel"]',
        )
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        fix = (
            "convert the weights to safetensors (probekit never unpickles checkpoint files)"
            if pickled
            else "save the weights with save_pretrained(safe_serialization=True)"
        )
        raise CheckpointError(f"{path} has no *.safetensors weights", fix=fix)
    stored = 0
    for weight_file in weights:
        _check_regular_file(weight_file)
        stored += _check_safetensors(weight_file)
    return config, stored


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


def stored_dtype(path: str | os.PathLike, config: dict | None = None) -> torch.dtype:
    """The floating dtype a checkpoint directory stores its weights in: the one holding most
    values in the safetensors headers, else the config's ``dtype`` / ``torch_dtype``, else
    float32.

    Example:
        >>> import tempfile, torch
        >>> from probekit.toy import toy_hf_model
        >>> folder = tempfile.mkdtemp()
        >>> toy_hf_model("llama").to(torch.bfloat16).save_pretrained(folder)
        >>> stored_dtype(folder)
        torch.bfloat16
    """
    counts: dict[torch.dtype, int] = {}
    for weight_file in sorted(Path(path).glob("*.safetensors")):
        try:
            with weight_file.open("rb") as handle:
                (header_len,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(header_len))
            for key, info in header.items():
                dtype = (
                    _SAFETENSORS_DTYPES.get(info.get("dtype")) if key != "__metadata__" else None
                )
                if dtype is not None:
                    counts[dtype] = counts.get(dtype, 0) + math.prod(info["shape"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
            continue  # _check_safetensors names a corrupt file
    if counts:
        return max(counts, key=lambda d: counts[d])
    named = (config or {}).get("dtype") or (config or {}).get("torch_dtype")
    dtype = getattr(torch, named, None) if isinstance(named, str) else None
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _config_int(config: dict, *keys: str, default: int = 0) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def estimate_parameters(config: dict) -> int:
    """An estimate of the parameter count a Hugging Face config describes, from its
    sizes alone (no model is built): per layer 4 d² attention and 2-3 d·d_ff MLP weights,
    the token embedding, and learned position embeddings where the config has them.

    Example:
        >>> estimate_parameters({"n_layer": 12, "n_embd": 768, "vocab_size": 50257,
        ...                      "n_positions": 1024}) // 10**6
        124
    """
    layers = _config_int(config, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    d = _config_int(config, "hidden_size", "n_embd", "d_model")
    d_ff = _config_int(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * d) or 4 * d
    gated = 3 if config.get("hidden_act") in ("silu", "swiglu", "gelu_pytorch_tanh") else 2
    vocab = _config_int(config, "vocab_size")
    positions = _config_int(config, "n_positions")
    if config.get("position_embedding_type") == "absolute":
        positions = _config_int(config, "max_position_embeddings")
    return layers * (4 * d * d + gated * d * d_ff) + (vocab + positions) * d


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes free on ``device`` now (CPU: MemAvailable of the host); None when unknown.

    Example:
        >>> (available_memory() or 1) > 0
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):  # pragma: no cover - CUDA broken
            return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _check_fits(path: Path, config: dict, stored: int, dtype: torch.dtype) -> None:
    """Refuse, before anything is built, a config far bigger than its weights or than memory."""
    estimate = estimate_parameters(config)
    if estimate > 8 * max(stored, 1) and estimate > 10**6:
        raise CheckpointError(
            f"config.json in {path} describes about {estimate:.3g} parameters but the weights "
            f"hold {stored:.3g} values",
            fix="fix config.json (layers, sizes, vocabulary, positions) to match the weights",
        )
    need = estimate * torch.empty((), dtype=dtype).element_size()
    available = available_memory("cpu")  # weights are read into host memory first
    if available is not None and need > available:
        raise CheckpointError(
            f"the model in {path} needs about {need / 2**30:.3g} GiB of memory for its "
            f"{estimate:.3g} parameters; {available / 2**30:.3g} GiB are available",
            fix="free memory, load in half precision (dtype=torch.bfloat16), or use a "
            "machine with more memory",
        )


def _check_regular_file(path: Path) -> None:
    """Refuse anything but a regular file (after symlinks): a FIFO or device would hang."""
    if not path.resolve().is_file():
        raise CheckpointError(
            f"{path} is not a regular file (a pipe, device or dangling link)",
            fix="point the checkpoint at real files written by save_pretrained()",
        )


def from_pretrained_complete(klass: Any, path: str | os.PathLike, **kwargs: Any) -> nn.Module:
    """``klass.from_pretrained(path)`` from safetensors, refusing incomplete weights.

    Raises :class:`CheckpointError` when loading fails or when the checkpoint's tensors do not
    match the model its config describes (see :func:`_check_complete`).
    """
    path = Path(path)
    try:
        hf_model, loading_info = klass.from_pretrained(
            str(path), use_safetensors=True, output_loading_info=True, **kwargs
        )
    except Exception as err:  # HF raises many types; name the folder and the cause
        raise CheckpointError(
            f"could not load the checkpoint in {path}: {type(err).__name__}: {err}",
            fix="check that config.json matches the safetensors weights",
        ) from err
    _check_complete(path, loading_info)
    return hf_model


def _check_complete(path: Path, loading_info: dict) -> None:
    """Refuse a checkpoint whose tensors do not match the model its config describes.

    Hugging Face fills missing weights with a random initialisation and drops unexpected ones,
    so numbers computed after such a load would not be the checkpoint's. Weights that the model
    ties to others (GPT-2's unembedding) are not reported missing by transformers and load.
    """
    problems = []
    for what in ("missing", "unexpected", "mismatched"):
        names = sorted(str(n) for n in loading_info.get(f"{what}_keys") or ())
        if names:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            problems.append(f"{len(names)} {what} tensor(s): {shown}")
    if problems:
        raise CheckpointError(
            f"the weights in {path} do not match its config.json ({'; '.join(problems)})",
            fix="re-save the complete model with save_pretrained(safe_serialization=True), or "
            "fix config.json (number of layers, sizes, architectures) to match the weights",
        )


def _supported_architectures() -> set[str]:
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    return set(SUPPORTED_ARCHITECTURES)


def _unsupported(arch: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"architecture {arch!r} is not supported by TransformerLens 4's TransformerBridge",
        fix="use a supported architecture such as GPT2LMHeadModel, LlamaForCausalLM or "
        "BertForMaskedLM",
    )


def _tokenizer(path: Path) -> Any:
    """The tokenizer saved beside the weights, if any (probekit itself needs none)."""
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:  # a broken tokenizer must not block the analyses
        reason = " ".join(str(err).split())[:300]  # one line on the CLI
        log.warning("ignoring the tokenizer in %s: %s: %s", path, type(err).__name__, reason)
        return None


def _bridge(hf_model: nn.Module, arch: str, tokenizer: Any = None) -> Any:
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    try:
        return build_bridge_from_module(
            hf_model, arch, hf_config=hf_model.config, tokenizer=tokenizer
        )
    except Exception as err:  # the bridge raises many types for configs it cannot wrap
        raise UnsupportedModelError(
            f"TransformerLens could not attach to this {arch} ({type(err).__name__}: {err})",
            fix="use a supported architecture such as GPT2LMHeadModel or LlamaForCausalLM",
        ) from err


def _named_weights(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of ``module`` with its name; weights a ``device_map`` offloaded to disk
    (meta tensors in the module) are read from the offload folder instead."""
    for name, param in module.named_parameters():
        if not param.is_meta:
            yield name, param
    seen: set[int] = set()
    for sub in module.modules():
        hooks = getattr(sub, "_hf_hook", None)
        for hook in getattr(hooks, "hooks", None) or ([hooks] if hooks is not None else []):
            stored = getattr(getattr(hook, "weights_map", None), "dataset", None)
            if not getattr(hook, "offload", False) or stored is None or id(stored) in seen:
                continue
            seen.add(id(stored))
            for name in stored:
                yield name, stored[name]


def _stop_at_base_output(wrapper: nn.Module) -> None:
    """Make the forward of a headless model end at its base model's output: permanent forward
    hooks hand ``last_hidden_state`` to the bridge, which returns it (TransformerLens' own
    early exit), so the unread wrapper head never runs. The hooks sit on the base model and
    on its direct children that return a model output (OPT's head class calls the base
    model's ``decoder`` directly); :meth:`Model.check_structure` checks the result."""
    from transformer_lens.model_bridge.exceptions import StopAtLayerException

    def stop(module: nn.Module, args: Any, output: Any) -> None:
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and module is wrapper.base_model:
            hidden = output[0] if isinstance(output, tuple) else output
        if hidden is not None:
            raise StopAtLayerException(hidden)

    base = wrapper.base_model
    for module in (base, *base.children()):
        module.register_forward_hook(stop)


def _head_class_for(arch: str) -> str | None:
    """The LM-head class the bridge supports for the base model class ``arch`` (GPT2Model ->
    GPT2LMHeadModel, BertModel -> BertForMaskedLM), from transformers' auto mappings; None when
    ``arch`` is no base model or no head class of its family is supported."""
    from transformers.models.auto import modeling_auto as auto

    supported = _supported_architectures()
    for model_type, names in auto.MODEL_MAPPING_NAMES.items():
        if arch not in ((names,) if isinstance(names, str) else tuple(names)):
            continue
        for mapping in (
            auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        ):
            head = mapping.get(model_type)
            heads = (head,) if isinstance(head, str) else tuple(head or ())
            for name in heads:
                if name in supported:
                    return name
    return None


def _wrap_headless(base: nn.Module, head_name: str) -> nn.Module:
    """``base`` inside its ``head_name`` class, for the bridge to attach to: the head class is
    built on the meta device (no random weights), its base model is ``base`` itself, and its
    head weights are tied to the input embeddings or zeros. The head is never run or read
    (:func:`_stop_at_base_output`, :meth:`Model.head`)."""
    import transformers

    with torch.device("meta"):
        wrapper = getattr(transformers, head_name)(base.config)
    setattr(wrapper, wrapper.base_model_prefix, base)
    weight = next((p for p in base.parameters() if not p.is_meta), None)
    device = weight.device if weight is not None else torch.device("cpu")
    dtype = next(base.parameters()).dtype
    out, inp = wrapper.get_output_embeddings(), base.get_input_embeddings()
    if out is not None and getattr(out, "weight", None) is not None and inp is not None:
        if out.weight.is_meta and out.weight.shape == inp.weight.shape:
            out.weight = inp.weight
    for module in wrapper.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                zeros = torch.zeros(param.shape, dtype=dtype, device=device)
                setattr(module, name, nn.Parameter(zeros, requires_grad=False))
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(name, torch.zeros(buf.shape, dtype=buf.dtype, device=device))
    return wrapper.eval()


def _has_final_norm(bridge: Any, base: nn.Module) -> bool:
    """Whether the bridge's final norm is a module of the base model (decoders: ``ln_f``,
    ``norm``) rather than of the head (BERT's prediction-head LayerNorm)."""
    norm = getattr(bridge, "ln_final", None)
    if norm is None:
        return False
    inner = getattr(norm, "original_component", None)
    return any(m is norm or (inner is not None and m is inner) for m in base.modules())


def _headless_model(
    base: nn.Module, head_name: str, tokenizer: Any, source: str | None, pooling: Pooling | None
) -> Model:
    """A :class:`Model` over the base model ``base`` (no LM head), wrapped for the bridge."""
    arch = type(base).__name__
    wrapper = _wrap_headless(base, head_name)
    bridge = _bridge(wrapper, head_name, tokenizer)
    headless = Headless(arch, _has_final_norm(bridge, wrapper.base_model), pooling)
    return Model(bridge, source=source, headless=headless)


_ST_POOLING_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
"""sentence-transformers' pooling flags (``1_Pooling/config.json``) and the modes they name."""

_ST_OTHER_MODES = ("max", "mean_sqrt_len_tokens", "weightedmean")


def _read_json(path: Path, what: str) -> Any:
    _check_regular_file(path)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{what} {path} is not valid JSON ({err})",
            fix="re-save the model with sentence-transformers' save()",
        ) from err


def _pooling_mode(config: Any, path: Path) -> str:
    """The one pooling mode a sentence-transformers pooling config names."""
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{path} holds no JSON object", fix="re-save the model with sentence-transformers"
        )
    unknown = sorted(
        key
        for key, value in config.items()
        if key.startswith("pooling_mode_") and key not in _ST_POOLING_KEYS and value
    )
    named = config.get("pooling_mode")
    if isinstance(named, str):
        modes = [named]
    else:
        modes = [mode for key, mode in _ST_POOLING_KEYS.items() if config.get(key)]
    known = (*POOLING_MODES, *_ST_OTHER_MODES)
    bad = unknown + [m for m in modes if m not in known]
    if bad or not modes:
        raise CheckpointError(
            f"the pooling config {path} names "
            + (f"the unknown pooling mode(s) {bad}" if bad else "no pooling mode"),
            fix="set exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token, "
            "pooling_mode_lasttoken to true",
        )
    if len(modes) > 1 or modes[0] not in POOLING_MODES:
        raise UnsupportedModelError(
            f"the pooling config {path} asks for {modes} pooling; probekit reads one of "
            f"{list(POOLING_MODES)}",
            fix="pool with one mode: mean, cls or lasttoken",
        )
    return modes[0]


def _sentence_transformers(path: Path) -> tuple[Path, Pooling]:
    """The transformer folder and the pooling of the sentence-transformers folder ``path``
    (``modules.json``: a Transformer, a Pooling and optionally a Normalize module)."""
    modules = _read_json(path / "modules.json", "the sentence-transformers module list")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(
            f"{path / 'modules.json'} is not a list of modules",
            fix="re-save the model with sentence-transformers' save()",
        )
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    other = sorted({k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")})
    if other or kinds[:2] != ["Transformer", "Pooling"] or kinds.count("Normalize") > 1:
        raise UnsupportedModelError(
            f"the sentence-transformers model in {path} has the modules {kinds}; probekit reads "
            "Transformer, Pooling and an optional Normalize, in that order"
            + (f" (not {other})" if other else ""),
            fix="diagnose the transformer folder itself as a base model (no pooling)",
        )
    folder = path / str(modules[0].get("path", ""))
    pooling_config = path / str(modules[1].get("path", "1_Pooling")) / "config.json"
    if not pooling_config.is_file():
        raise CheckpointError(
            f"{path} has no pooling config {pooling_config}",
            fix="re-save the model with sentence-transformers' save() (it writes 1_Pooling/)",
        )
    mode = _pooling_mode(_read_json(pooling_config, "the pooling config"), pooling_config)
    return folder, Pooling(mode, normalize="Normalize" in kinds)


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load(
    source: Any,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    copy_model: bool = True,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> Model:
    """Attach probekit to a model and return its :class:`Model` handle.

    ``source`` is a Hugging Face model directory on disk (config.json + safetensors), an
    in-memory Hugging Face ``PreTrainedModel``, a ``TransformerBridge``, or an existing
    :class:`Model` (returned as is). An in-memory model is copied first, so the caller's object
    keeps its modules, parameter names, device and dtype (``save_pretrained`` still works);
    ``copy_model=False`` skips the copy for a model too large to hold twice, and then the
    bridge replaces its submodules in place: use the returned handle, not the original.
    Directories load onto CUDA when present, else the CPU, in the dtype their weights are
    stored in (bf16 / fp16 / fp32, see :func:`stored_dtype`) unless ``dtype`` is set; every
    measure is accumulated in float64 whatever the model's dtype.

    Base models without an LM head (``GPT2Model``, ``LlamaModel``, ``BertModel``, ... of every
    family whose head class the bridge supports, found from transformers' auto mappings) and
    sentence-transformers folders (``modules.json``, ``1_Pooling/config.json``: mean, CLS or
    last-token pooling, optional ``Normalize``) load too: their output is the final hidden
    state per token or the pooled embedding per sequence (:attr:`Model.output_kind`). The
    bridge attaches to the base model wrapped in its head class whose head is never run or
    read (weights tied to the embeddings or zeros, never random).

    ``device_map`` (``"auto"``, or a dict as accelerate takes it), with ``max_memory`` and
    ``offload_folder``, spreads a checkpoint folder's layers over GPUs, the CPU and the disk
    (accelerate); a trace's cached residuals stay on the device of the block that wrote them.

    Example:
        >>> import tempfile
        >>> from probekit.toy import toy_hf_model
        >>> folder = tempfile.mkdtemp()
        >>> toy_hf_model("llama", n_layers=2).save_pretrained(folder)
        >>> load(folder, device="cpu").architecture
        'LlamaForCausalLM'
    """
    if isinstance(source, Model):
        return source
    placement = _placement(source, device, device_map, max_memory, offload_folder)
    if isinstance(source, str | os.PathLike):  # checked before transformers is imported
        model = _load_folder(Path(source).expanduser(), device, dtype, placement)
    else:
        model = _load_object(source, device, dtype, copy_model)
    model.check_finite()
    model.check_structure()
    return model


def _placement(
    source: Any, device: Any, device_map: Any, max_memory: Any, offload_folder: Any
) -> dict:
    """The accelerate placement arguments of :func:`load`, checked before any work."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise InputError(
                "max_memory and offload_folder only apply with a device_map",
                fix='pass device_map="auto" as well',
            )
        return {}
    if not isinstance(source, str | os.PathLike):
        raise InputError(
            "device_map applies to a checkpoint folder, not to a model already in memory",
            fix="pass the folder's path, or place the in-memory model yourself",
        )
    if device is not None:
        raise InputError("device and device_map were both given", fix="pass only one of them")
    if not (device_map in ("auto", "balanced", "sequential") or isinstance(device_map, dict)):
        raise InputError(
            f"device_map={device_map!r} is neither 'auto', 'balanced', 'sequential' nor a dict",
            fix='pass device_map="auto" (with max_memory={0: "20GiB", "cpu": "60GiB"})',
        )
    if max_memory is not None and not isinstance(max_memory, dict):
        raise InputError(
            f"max_memory={max_memory!r} is not a dict", fix='pass e.g. {0: "20GiB", "cpu": "60GiB"}'
        )
    out: dict[str, Any] = {"device_map": device_map}
    if max_memory is not None:
        out["max_memory"] = max_memory
    if offload_folder is not None:
        out["offload_folder"] = str(offload_folder)
    return out


def _load_object(source: Any, device: Any, dtype: torch.dtype | None, copy_model: bool) -> Model:
    """A handle on an in-memory Hugging Face model (copied unless told not to) or a bridge."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel

    if isinstance(source, TransformerBridge):
        return Model(source)
    if not isinstance(source, PreTrainedModel):
        raise InputError(
            f"cannot load a model from a {type(source).__name__}",
            fix="pass a model directory path, a Hugging Face model or a TransformerBridge",
        )
    arch = type(source).__name__
    head = _head_class_for(arch)  # base classes, even those the bridge lists
    if arch not in _supported_architectures() and head is None:
        raise _unsupported(arch)
    hf_model = copy.deepcopy(source) if copy_model else source
    if device is not None or dtype is not None:
        hf_model.to(device=device, dtype=dtype)
    if head is not None:
        return _headless_model(hf_model, head, None, None, None)
    return Model(_bridge(hf_model, arch))


def _load_folder(
    path: Path, device: Any, dtype: torch.dtype | None, placement: dict | None = None
) -> Model:
    """A handle on the checkpoint folder ``path``, every file checked before it is read."""
    pooling = None
    if (path / "modules.json").exists() and path.is_dir():
        folder, pooling = _sentence_transformers(path)
    else:
        folder = path
    if not (folder / "config.json").exists() and path.is_dir() and folder == path:
        _check_not_a_checkpoint(path)
    config, stored = _check_checkpoint_dir(folder)
    dtype = dtype or stored_dtype(folder, config)
    if not placement:
        _check_fits(folder, config, stored, dtype)
    archs = config.get("architectures") or []
    arch = archs[0] if archs else config.get("model_type", "<unknown>")
    head = _head_class_for(arch)  # base classes, even those the bridge lists
    if arch not in _supported_architectures() and head is None:
        raise _unsupported(arch)
    if pooling is not None and head is None:
        raise UnsupportedModelError(
            f"the transformer of the sentence-transformers model in {path} is a {arch}, a "
            "model with an LM head, not a base model",
            fix="save the sentence-transformers model with its base (AutoModel) transformer",
        )
    hf_model = _from_folder(folder, arch, dtype, placement or {})
    if not placement:
        hf_model.to(device or _default_device())
    if head is not None:
        return _headless_model(hf_model, head, _tokenizer(folder), str(path), pooling)
    return Model(_bridge(hf_model, arch, _tokenizer(path)), source=str(path))


def _check_not_a_checkpoint(path: Path) -> None:
    """Name a folder that is neither a transformers nor a sentence-transformers checkpoint."""
    raise CheckpointError(
        f"{path} is neither a transformers checkpoint (no config.json) nor a "
        "sentence-transformers one (no modules.json)",
        fix="pass a folder written by save_pretrained() (config.json + *.safetensors) or by "
        "sentence-transformers' save() (modules.json, 1_Pooling/)",
    )


def _from_folder(folder: Path, arch: str, dtype: torch.dtype, placement: dict) -> nn.Module:
    """The Hugging Face model ``arch`` from ``folder`` (eager attention, no progress bars)."""
    import transformers
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one line per problem on the CLI, no HF bars
    try:
        return from_pretrained_complete(
            getattr(transformers, arch),
            folder,
            dtype=dtype,
            attn_implementation="eager",
            **placement,
        )
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()


__all__ = [
    "OUTPUT_KINDS",
    "POOLING_MODES",
    "SITES",
    "WEIGHT_NAMES",
    "Headless",
    "Model",
    "Pooling",
    "Trace",
    "available_memory",
    "estimate_parameters",
    "from_pretrained_complete",
    "load",
    "stored_dtype",
]
