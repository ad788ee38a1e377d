"""The model layer: one handle over a TransformerLens 4 ``TransformerBridge``.

All architecture-specific knowledge in probekit lives in this package: how to find the blocks,
the names of the residual / attention / MLP hook points, how the final residual becomes logits,
and whether the model predicts the next token (decoder) or the token itself (masked LM).
Analyzers only use the handle's methods and the canonical hook names it returns.

One job per module, from the bottom up:

- :mod:`~probekit.model.sites`: hook names, weight names, output kinds;
- :mod:`~probekit.model.inputs`: token, mask, label, layer and head checks; batch sizes;
- :mod:`~probekit.model.checkpoint`: a checkpoint folder's files, dtype and size, checked;
- :mod:`~probekit.model.bridge`: TransformerLens' supported architectures and the bridge;
- :mod:`~probekit.model.headless`: models without an LM head, sentence-transformers pooling;
- :mod:`~probekit.model.hf_blocks`: pure Hugging Face block copies for hook-free resumes;
- :mod:`~probekit.model.output`: the output head (prediction head or norm + unembedding);
- :mod:`~probekit.model.structure`: how blocks write to the stream, update hooks, replay check;
- :mod:`~probekit.model.trace`: a clean forward kept for resuming from any layer;
- :mod:`~probekit.model.handle`: :class:`Model`, the public surface over all of them;
- :mod:`~probekit.model.loading`: :func:`load` and device placement.

Example:
    >>> import probekit, transformers
    >>> hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    ...     vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4))
    >>> model = probekit.load(hf)
    >>> model.n_layers, model.d_model, model.is_causal
    (2, 32, True)
"""

from probekit.model.checkpoint import estimate_parameters, from_pretrained_complete, stored_dtype
from probekit.model.handle import Model
from probekit.model.headless import POOLING_MODES, Headless, Pooling
from probekit.model.hf_blocks import RAW_BLOCKS_ENV, RAW_BLOCKS_TOLERANCE
from probekit.model.loading import load
from probekit.model.sites import OUTPUT_KINDS, SITES, WEIGHT_NAMES, HookList
from probekit.model.structure import BLOCK_KINDS, BlockStructure
from probekit.model.trace import Trace

# General numerics live in probekit.numerics; these two names are kept here for callers that
# imported them from probekit.model before it became a package.
from probekit.numerics import all_finite, available_memory

__all__ = [
    "BLOCK_KINDS",
    "OUTPUT_KINDS",
    "POOLING_MODES",
    "RAW_BLOCKS_ENV",
    "RAW_BLOCKS_TOLERANCE",
    "SITES",
    "WEIGHT_NAMES",
    "BlockStructure",
    "Headless",
    "HookList",
    "Model",
    "Pooling",
    "Trace",
    "all_finite",
    "available_memory",
    "estimate_parameters",
    "from_pretrained_complete",
    "load",
    "stored_dtype",
]
