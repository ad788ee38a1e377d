"""The model handle: one object over a TransformerLens 4 ``TransformerBridge``.

:class:`Model` is what analyzers hold: the model's sizes and weights, its tokenizer, its
validated batches, its forward and output head, the hooks that read or replace each block's
updates, and the clean :class:`~probekit.model.Trace` that resumes the forward from any layer.
The handle is composed of parts that take its :class:`~probekit.model.runtime.Runtime` (the
bridge, blocks, output head and forward with hooks): the Hugging Face block copies
(:class:`~probekit.model.hf_blocks.BlockCopies`), the structure probes
(:class:`~probekit.model.structure.StructureProbes`) and the traces; none of them knows the
handle. The methods here are the public surface over them. Analyzers only use the handle's
methods and the canonical hook names it returns.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model("llama", n_layers=2)
    >>> [batch] = model.prepare(toy_tokens(2, 5))
    >>> model.architecture, model.forward(batch).shape[-1] == model.d_vocab
    ('LlamaForCausalLM', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from probekit.data import Batch, Data, as_batches, check_one_length, right_padded
from probekit.errors import InputError, NumericalError, UnsupportedModelError
from probekit.model import inputs
from probekit.model import structure as block_structure
from probekit.model.checkpoint import named_weights
from probekit.model.headless import Headless, pool
from probekit.model.hf_blocks import BlockCopies, HFBlocks
from probekit.model.runtime import Runtime
from probekit.model.sites import WEIGHT_NAMES, HookList, hook_name
from probekit.model.structure import BlockStructure, StructureProbes
from probekit.model.trace import Trace, record_trace
from probekit.numerics import all_finite

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Model:
    """A loaded model: the bridge plus what analyzers need to know about it.

    Build one with :func:`~probekit.model.load` (which builds its ``runtime``, the
    :class:`~probekit.model.runtime.Runtime`; ``source`` is the folder it was loaded from).
    Attributes: ``bridge`` (the TransformerBridge), ``hf_model`` (the wrapped Hugging Face
    module), ``n_layers``, ``d_model``, ``d_vocab``, ``n_ctx``, ``device``, ``dtype``,
    ``architecture``, ``is_causal``, ``blocks``. The wrapped model is put in eval mode (no
    dropout): every analysis needs a deterministic forward.

    Every block is read as h_{l+1} = h_l + a_l + m_l, with a_l the attention and m_l the MLP
    update (see :attr:`structure`, read from the model at load, and
    :data:`~probekit.model.structure.BLOCK_KINDS`):

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

    def __init__(self, runtime: Runtime, source: str | None = None) -> None:
        self.runtime = runtime
        self.source = source
        self._copies = BlockCopies(runtime)
        self._probes = StructureProbes(runtime, route=self._copies.block_for)

    @property
    def bridge(self) -> Any:
        """The TransformerBridge over the Hugging Face model."""
        return self.runtime.bridge

    @property
    def hf_model(self) -> PreTrainedModel:
        """The Hugging Face module the bridge wraps (in eval mode)."""
        return self.runtime.hf_model

    @property
    def headless(self) -> Headless | None:
        """How the model was loaded without its LM head (None: with it)."""
        return self.runtime.headless

    @property
    def raw_blocks(self) -> bool:
        """Run hook-free blocks of :meth:`Trace.resume` / :meth:`Trace.resume_stacked` through
        pure Hugging Face copies of the blocks (see :attr:`block_path`); False: always the
        bridge. Default from the ``PROBEKIT_RAW_BLOCKS`` environment variable (``0``: off)."""
        return self._copies.enabled

    @raw_blocks.setter
    def raw_blocks(self, on: bool) -> None:
        self._copies.enabled = on

    @property
    def hf_blocks(self) -> HFBlocks | None:
        """The pure Hugging Face copies of the blocks and their checks, built the first time
        :attr:`block_path` or a hook-free block run asks (None before)."""
        return self._copies.hf_blocks

    @hf_blocks.setter
    def hf_blocks(self, copies: HFBlocks | None) -> None:
        self._copies.hf_blocks = copies

    # ---- what the model is -------------------------------------------------------------
    @property
    def architecture(self) -> str:
        """The Hugging Face class loaded (the base class, e.g. ``GPT2Model``, for a model
        without a head)."""
        return self.runtime.architecture

    @property
    def output_kind(self) -> str:
        """What the forward returns and output changes compare (one of
        :data:`~probekit.model.OUTPUT_KINDS`)."""
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
        return pool(pooling, hidden, attention_mask)

    @property
    def n_layers(self) -> int:
        """Number of blocks."""
        return self.runtime.n_layers

    @property
    def d_model(self) -> int:
        """Width of the residual stream."""
        return self.runtime.d_model

    @property
    def d_vocab(self) -> int:
        """Size of the vocabulary."""
        return self.runtime.d_vocab

    @property
    def n_ctx(self) -> int:
        """The longest sequence the model takes (its context)."""
        return self.runtime.n_ctx

    @property
    def device(self) -> torch.device:
        """Where inputs go: the first device of a ``device_map`` that is not the disk (the CPU
        when every layer is offloaded), else the device of the weights."""
        return self.runtime.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's weights."""
        return self.runtime.dtype

    @property
    def is_causal(self) -> bool:
        """True for decoders (targets are next tokens), False for masked-LM encoders."""
        return self.runtime.is_causal

    @property
    def blocks(self) -> nn.ModuleList:
        """The ModuleList of blocks that the model's forward iterates over, in run order."""
        return self.runtime.blocks

    @property
    def n_heads(self) -> int:
        """Number of attention (query) heads per layer."""
        return self.runtime.n_heads

    # ---- how the blocks write to the stream (probekit.model.structure) -------------------
    @property
    def structure(self) -> BlockStructure:
        """How every block writes to the residual stream, read from the model (once).

        One probe forward records each block's input, sublayer outputs and output; the first
        :data:`~probekit.model.structure.BLOCK_KINDS` entry whose definition of the attention
        and MLP updates ``a``, ``m`` gives ``h_out = h_in + a + m`` in every layer (``sum``,
        ``sandwich``), or whose mid-block state fully determines the block output
        (``stream``), is the structure, and a second forward checks that replacing those
        updates through the hooks is honoured. ``parallel`` is True when the MLP reads the
        block input rather than ``h_in + a`` (zeroing ``a`` leaves layer 0's MLP output
        unchanged). Raises :class:`UnsupportedModelError` when no definition fits: never wrong
        numbers.
        """
        return self._probes.structure

    @property
    def post_norm(self) -> bool:
        """True for post-LayerNorm blocks (BERT-style, ``structure.kind == 'stream'``, whose
        attention hook holds the normalised mid-block stream rather than the update added to
        it; post-LN OPT, ``'post_ln'``, whose first LayerNorm's output holds it). Read from the
        blocks themselves (see :attr:`structure`), not from the name."""
        return self.structure.kind in ("stream", "post_ln")

    @property
    def parallel_blocks(self) -> bool:
        """True when attention and MLP both read the block input (GPT-J, Falcon, Phi, GPT-NeoX
        with parallel residual): ``h_out = h_in + attn(h_in) + mlp(h_in)``."""
        return self.structure.parallel

    @property
    def supports_pattern_edits(self) -> bool:
        """Whether editing ``attn_pattern`` changes the output (False where the bridge only
        observes an attention computed inside the wrapped module, e.g. BERT). Tested once."""
        return self._probes.pattern_edits

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
        return block_structure.update_hooks(self.structure.kind, layer, on_layer)

    def replace_update_hooks(
        self,
        layer: int,
        sublayer: str,
        value: torch.Tensor | None = None,
        at: torch.Tensor | None = None,
    ) -> list[tuple[str, Callable]]:
        """Hooks that replace the ``sublayer`` ('attn' or 'mlp') update of ``layer`` by
        ``value`` (broadcast; ``None`` = zero), with updates as in :meth:`update_hooks`, at
        the positions of the bool ``[batch, pos]`` mask ``at`` (``None``: everywhere)."""
        if sublayer not in ("attn", "mlp"):
            raise InputError(f"unknown sublayer {sublayer!r}", fix="use 'attn' or 'mlp'")
        return block_structure.replace_hooks(self.structure.kind, layer, sublayer, value, at)

    def hook_name(self, layer: int, site: str) -> str:
        """Canonical hook name of ``site`` (one of :data:`~probekit.model.SITES`) in block
        ``layer``."""
        return hook_name(layer, site)

    # ---- indices, weights and tokens ----------------------------------------------------
    def check_layer(self, layer: Any, what: str = "layer") -> int:
        """``layer`` as an int in ``0..n_layers-1``, or :class:`InputError` naming the problem
        (other types, ``True``/``False`` and floats included)."""
        return inputs.check_layer(layer, self.n_layers, what)

    def check_head(self, head: Any) -> int | None:
        """``head`` as an int in ``0..n_heads-1``, ``None`` (all heads), or :class:`InputError`."""
        return inputs.check_head(head, self.n_heads)

    @torch.no_grad()
    def weights(self, names: Sequence[str] = WEIGHT_NAMES) -> dict[tuple[int, str], torch.Tensor]:
        """Every per-layer weight as a 2-D float64 CPU tensor ``[d_in, n_out]`` (columns are
        neurons), keyed ``(layer, name)`` with names from :data:`~probekit.model.WEIGHT_NAMES`.

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
        length = min(max_length or self.n_ctx, self.n_ctx)
        return inputs.tokenize(self.tokenizer, texts, length, self.architecture)

    def __repr__(self) -> str:
        return (
            f"Model({self.architecture}, n_layers={self.n_layers}, d_model={self.d_model}, "
            f"d_vocab={self.d_vocab}, device={self.device}, dtype={self.dtype})"
        )

    # ---- checks and batches (probekit.model.inputs) ---------------------------------------
    def check_finite(self) -> None:
        """Raise :class:`NumericalError` if any weight is NaN or infinite (weights offloaded
        to disk by a ``device_map`` are read from the offload folder to be checked)."""
        for name, param in named_weights(self.hf_model):
            if not all_finite(param):
                raise NumericalError(
                    f"weight {name} contains NaN or infinite values",
                    fix="load an earlier checkpoint or retrain with a lower learning rate",
                )

    def prepare(
        self, data: Data, batch_size: int | None = None, backward: bool = False
    ) -> list[Batch]:
        """Validate ``data`` against this model and return batches on its device with labels.

        Left-padded rows are moved to right padding first (:func:`~probekit.data.right_padded`:
        the numbers of the right-padded input, positions counted from the first real token).
        Without a ``batch_size``, a batch whose output would exceed
        :data:`~probekit.model.inputs.OUTPUT_BATCH_BYTES` is split (:meth:`default_batch_size`;
        smaller for a ``backward``); pass ``batch_size`` to choose.

        Raises :class:`InputError` for empty data, token ids that are not integers or lie
        outside the vocabulary, sequences longer than the context, masks that are not padding
        of 0/1 values (holes, other values, an all-padding row), labels
        that are not integer token ids or -100, masks and labels of the wrong shape, and data
        with no position to predict at all.
        """
        out = []
        for batch in self.split_batches(as_batches(data, batch_size), batch_size, backward):
            batch = right_padded(batch)  # left padding: the same numbers as right padding
            inputs.check_batch(batch, self.d_vocab, self.n_ctx)
            batch = batch.to(self.device)
            tokens = batch.tokens.long()
            mask = None if batch.attention_mask is None else batch.attention_mask.long()
            labels = batch.labels.long() if batch.labels is not None else None
            if labels is None:
                labels = self.default_labels(tokens, mask)
            out.append(Batch(tokens, mask, labels))
        if self.headless is None:
            inputs.require_targets(out)
        return out

    def default_batch_size(
        self, seq_len: int, backward: bool = False, sequences: int | None = None
    ) -> int:
        """Sequences of ``seq_len`` tokens per batch when none is given: as many as keep one
        batch's float32 output within :data:`~probekit.model.inputs.OUTPUT_BATCH_BYTES` (at
        least one); for a ``backward``, with the gradients and saved activations counted too,
        and all ``sequences`` at once when their backward takes no more memory than the
        blocks' gradient sums that several batches would hold
        (:func:`~probekit.model.inputs.default_batch_size`).

        Example:
            >>> from probekit.toy import toy_model
            >>> model = toy_model(n_layers=2, vocab_size=50257)
            >>> model.default_batch_size(128)   # 64 MiB / (128 tokens x 50257 x 4 bytes)
            2
        """
        width = self.d_vocab if self.output_kind == "logits" else self.d_model
        sums = None
        if backward and sequences is not None:  # as the weights are kept: as stored or not
            sums = sum(p.numel() * p.element_size() for p in self.blocks.parameters())
        return inputs.default_batch_size(
            seq_len, width, self.d_model, self.n_layers, backward, sequences, sums
        )

    def split_batches(
        self, batches: list[Batch], batch_size: int | None, backward: bool = False
    ) -> list[Batch]:
        """``batches`` as they are when a ``batch_size`` was given, else each split to
        :meth:`default_batch_size` (what :meth:`prepare` runs, before validating)."""
        if batch_size is not None:
            return batches
        for batch in batches:
            inputs.check_token_shape(batch.tokens)
        return [
            part
            for batch in batches
            for part in as_batches(batch, self._split_size(batch, backward))
        ]

    def _split_size(self, batch: Batch, backward: bool) -> int:
        rows, seq_len = batch.tokens.shape
        return self.default_batch_size(seq_len, backward, rows if backward else None)

    def default_labels(self, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Targets per position: the next real token (decoders) or the token itself (encoders)."""
        return inputs.default_labels(tokens, mask, self.is_causal)

    # ---- running ------------------------------------------------------------------------
    @contextmanager
    def hooks(self, fwd_hooks: HookList = (), bwd_hooks: HookList = ()) -> Iterator[Model]:
        """Attach TransformerLens hooks for the duration of the block; always removed after."""
        with self.runtime.hooks(fwd_hooks, bwd_hooks):
            yield self

    def forward(self, batch: Batch, fwd_hooks: HookList = ()) -> torch.Tensor:
        """Full forward of one prepared batch through the bridge; returns logits ``[B, T, V]``."""
        return self.runtime.forward(batch, fwd_hooks)

    @torch.no_grad()
    def logits(self, tokens: Any, attention_mask: Any = None) -> torch.Tensor:
        """Logits ``[batch, pos, vocab]`` of the model on ``tokens`` (validated; any data form
        :meth:`prepare` takes, its sequences of one length).

        A model loaded without its LM head has no logits: refused with
        :class:`UnsupportedModelError` (its output, the final hidden state, is :meth:`forward`'s
        on a prepared batch)."""
        self.require_vocabulary("Model.logits")
        batches = self.prepare((tokens, attention_mask) if attention_mask is not None else tokens)
        check_one_length(batches, "Model.logits (one tensor of logits)")
        if len(batches) == 1:
            return self.forward(batches[0])
        return torch.cat([self.forward(batch) for batch in batches])

    def head(self, residual: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Map a final-layer residual ``[B, T, d_model]`` to logits: the masked-LM prediction
        head (BERT's ``cls``, RoBERTa's ``lm_head``) of encoders; for decoders the final norm
        and unembedding, then the logit soft-capping (Gemma 2/3) or scaling (Granite, Cohere) the
        model's config defines (:class:`~probekit.model.output.OutputHead`, resolved once).
        :meth:`check_structure` checks it against the model's forward.

        ``out``: a tensor of the logits' shape and dtype that a plain unembedding on a CPU
        writes them into (:func:`~probekit.model.output.unembed`), for callers that measure
        each output before making the next; always use the returned tensor.

        A model without a head (:attr:`output_kind` ``hidden`` / ``embedding``) returns its
        final hidden state: the base model's final norm (decoders) or the residual itself
        (post-norm encoders such as BERT, whose last block ends in its norm); pooling is
        :meth:`pool`'s, applied where outputs are compared."""
        return self.runtime.head(residual, out)

    @torch.no_grad()
    def check_structure(self) -> None:
        """Refuse, with :class:`UnsupportedModelError`, a model whose numbers probekit would get
        wrong: blocks whose updates cannot be read (:attr:`structure`), or a forward that
        resuming from the first block or applying :meth:`head` to the last residual does not
        reproduce. Runs a few forwards of 6 tokens; :func:`~probekit.model.load` calls it.
        """
        self._probes.check()

    @torch.no_grad()
    def trace(self, batch: Batch, fwd_hooks: HookList = ()) -> Trace:
        """Clean forward that keeps only each block's input residual and its call arguments.

        The returned :class:`Trace` resumes the forward from any layer without recomputing the
        blocks before it (see :meth:`Trace.resume`).
        """
        return record_trace(self.runtime, batch, fwd_hooks, self._copies.block_for)

    # ---- the Hugging Face block path of hook-free resumes (probekit.model.hf_blocks) -----
    @property
    def block_path(self) -> str:
        """Which module a hook-free block run of a :class:`Trace` calls under the current
        precision (autocast or not): ``"hf"``, a pure Hugging Face copy of the block sharing
        its weights (none of TransformerLens' components, whose Python norms and attention
        rebuild cost time), or ``"bridge (<why>)"``, the bridge's block.

        The copies are used when :attr:`raw_blocks` is on, the model has no accelerate
        ``device_map`` / offload hooks, and a one-time check (per precision) on two probe
        batches (with and without padding) finds every copy's output equal to the bridge
        block's within :data:`~probekit.model.hf_blocks.RAW_BLOCKS_TOLERANCE`, run alone and
        stacked; even then a block with a hook in it (a TransformerLens hook or any torch hook
        on its modules), in training mode, or any global torch forward hook, runs through the
        bridge.

        Example:
            >>> from probekit.toy import toy_model
            >>> model = toy_model(n_layers=2)
            >>> model.block_path
            'hf'
            >>> model.raw_blocks = False
            >>> model.block_path
            'bridge (Model.raw_blocks is False)'
        """
        why = self._copies.refusal()
        return "hf" if why is None else f"bridge ({why})"

    def raw_block(self, block: nn.Module, device_type: str | None = None) -> nn.Module | None:
        """The pure HF copy a :class:`Trace` runs instead of bridge ``block`` now on
        ``device_type`` (the device of the residual; default the model's), or None (the
        bridge): what the route of the model's traces gives per block run
        (:meth:`~probekit.model.hf_blocks.BlockCopies.block_for`), so the checked case costs a
        few microseconds."""
        return self._copies.block_for(block, device_type)


__all__ = ["Model"]
