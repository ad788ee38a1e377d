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
- :mod:`~probekit.model.output`: the output head (prediction head or norm + unembedding);
- :mod:`~probekit.model.runtime`: the runtime core: the bridge, its blocks and sizes, the output
  head, the forward with hooks; what every module above takes (none of them knows the handle);
- :mod:`~probekit.model.trace`: a clean forward kept for resuming from any layer;
- :mod:`~probekit.model.hf_blocks`: pure Hugging Face block copies for hook-free resumes;
- :mod:`~probekit.model.structure`: how blocks write to the stream, update hooks, replay check;
- :mod:`~probekit.model.handle`: :class:`Model`, the public surface composed of all of them;
- :mod:`~probekit.model.hub`: Hugging Face Hub names resolved to a local snapshot folder;
- :mod:`~probekit.model.loading`: :func:`load` and device placement.

Example:
    >>> import probekit, transformers
    >>> hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    ...     vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4))
    >>> model = probekit.load(hf)
    >>> model.n_layers, model.d_model, model.is_causal
    (2, 32, True)
"""

from typing import TYPE_CHECKING

from probekit.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, so a type checker sees them as they are, not as Any
    from probekit.model.checkpoint import (  # noqa: F401
        estimate_parameters,
        from_pretrained_complete,
        largest_weight,
        stored_dtype,
        weights_bytes,
    )
    from probekit.model.handle import Model  # noqa: F401
    from probekit.model.headless import POOLING_MODES, Headless, Pooling  # noqa: F401
    from probekit.model.hf_blocks import RAW_BLOCKS_ENV, RAW_BLOCKS_TOLERANCE  # noqa: F401
    from probekit.model.hub import hub_name  # noqa: F401
    from probekit.model.loading import check_loadable, load  # noqa: F401
    from probekit.model.sites import OUTPUT_KINDS, SITES, WEIGHT_NAMES, HookList  # noqa: F401
    from probekit.model.storage import STORAGE_CHOICES, storage_dtypes  # noqa: F401
    from probekit.model.structure import BLOCK_KINDS, BlockStructure  # noqa: F401
    from probekit.model.trace import Trace  # noqa: F401
    from probekit.numerics import all_finite, available_memory  # noqa: F401

_MODULES: dict[str, str] = {
    "estimate_parameters": "checkpoint",
    "from_pretrained_complete": "checkpoint",
    "stored_dtype": "checkpoint",
    "largest_weight": "checkpoint",
    "weights_bytes": "checkpoint",
    "Model": "handle",
    "POOLING_MODES": "headless",
    "Headless": "headless",
    "Pooling": "headless",
    "RAW_BLOCKS_ENV": "hf_blocks",
    "RAW_BLOCKS_TOLERANCE": "hf_blocks",
    "hub_name": "hub",
    "check_loadable": "loading",
    "load": "loading",
    "OUTPUT_KINDS": "sites",
    "SITES": "sites",
    "WEIGHT_NAMES": "sites",
    "HookList": "sites",
    "BLOCK_KINDS": "structure",
    "BlockStructure": "structure",
    "Trace": "trace",
    "STORAGE_CHOICES": "storage",
    "storage_dtypes": "storage",
}

_EXPORTS: dict[str, str] = {
    **{name: f"probekit.model.{module}" for name, module in _MODULES.items()},
    # general numerics live in probekit.numerics; kept here for callers that imported them
    # from probekit.model before it became a package
    "all_finite": "probekit.numerics",
    "available_memory": "probekit.numerics",
}
"""Public name -> the module it lives in, imported on first use: importing one light module
(:mod:`~probekit.model.hub`, whose Hub names the command line resolves before torch loads)
does not import torch and transformers."""

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
    "check_loadable",
    "estimate_parameters",
    "hub_name",
    "from_pretrained_complete",
    "load",
    "stored_dtype",
    # --- storage dtype apart from compute dtype ---
    "STORAGE_CHOICES",
    "largest_weight",
    "storage_dtypes",
    "weights_bytes",
]
