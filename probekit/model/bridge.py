"""TransformerLens 4 in one place: the architectures its ``TransformerBridge`` supports, and
the bridge attached to a Hugging Face model.

Example:
    >>> "GPT2LMHeadModel" in supported_architectures()
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from probekit.errors import UnsupportedModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def supported_architectures() -> set[str]:
    """The Hugging Face class names TransformerLens' bridge can attach to."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    return set(SUPPORTED_ARCHITECTURES)


def unsupported(arch: str) -> UnsupportedModelError:
    """The error for an architecture the bridge does not support."""
    return UnsupportedModelError(
        f"architecture {arch!r} is not supported by TransformerLens 4's TransformerBridge",
        fix="use a supported architecture such as GPT2LMHeadModel, LlamaForCausalLM or "
        "BertForMaskedLM",
    )


def attach_bridge(hf_model: PreTrainedModel, arch: str, tokenizer: Any = None) -> Any:
    """A ``TransformerBridge`` over ``hf_model`` read as the class ``arch`` (the bridge
    replaces the model's submodules in place)."""
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    register_adapters()
    try:
        return build_bridge_from_module(
            hf_model, arch, hf_config=hf_model.config, tokenizer=tokenizer
        )
    except Exception as err:  # the bridge raises many types for configs it cannot wrap
        raise UnsupportedModelError(
            f"TransformerLens could not attach to this {arch} ({type(err).__name__}: {err})",
            fix="use a supported architecture such as GPT2LMHeadModel or LlamaForCausalLM",
        ) from err


# --- paper architecture (post-LN OPT) ---
def post_ln_opt_adapter() -> type:
    """TransformerLens' OPT adapter, with the final LayerNorm optional: a post-LN OPT
    (``do_layer_norm_before=False``, the anchor paper's block that probekit trains as
    ``architecture="post_ln_paper"``) has no ``model.decoder.final_layer_norm`` (Hugging Face
    builds it only for pre-LN OPT), but TransformerLens' adapter maps ``ln_final`` to it
    whenever the embedding is not projected, so its forward fails ("Original component not
    set"). This subclass drops that mapping for post-LN OPT without an embedding projection
    only; for every other OPT it is TransformerLens' adapter unchanged. :func:`attach_bridge`
    registers it for ``OPTForCausalLM`` (:func:`register_adapters`).

    Example:
        >>> from transformer_lens.model_bridge.supported_architectures.opt import (
        ...     OptArchitectureAdapter)
        >>> issubclass(post_ln_opt_adapter(), OptArchitectureAdapter)
        True
    """
    from transformer_lens.model_bridge.supported_architectures.opt import (
        OptArchitectureAdapter,
    )

    class PostLnOptAdapter(OptArchitectureAdapter):
        """OPT without a final LayerNorm when post-LN (see :func:`post_ln_opt_adapter`)."""

        def __init__(self, cfg: Any) -> None:
            super().__init__(cfg)
            projected = getattr(self.cfg, "word_embed_proj_dim", self.cfg.d_model) != (
                self.cfg.d_model
            )  # OPT-350m: project_out before the head, left as TransformerLens maps it
            post_ln = not getattr(self.cfg, "do_layer_norm_before", True)
            self.no_final_norm = post_ln and not projected
            if self.no_final_norm and self.component_mapping is not None:
                self.component_mapping.pop("ln_final", None)

    return PostLnOptAdapter


def lacks_final_norm(bridge: Any) -> bool:
    """Whether ``bridge``'s model has no final norm by design (post-LN OPT under
    :func:`post_ln_opt_adapter`): its last block's output goes to the unembedding as it is."""
    return bool(getattr(getattr(bridge, "adapter", None), "no_final_norm", False))


_REGISTERED: list[bool] = []


def register_adapters() -> None:
    """Register probekit's adapters with TransformerLens' factory, once per process: OPT with
    an optional final LayerNorm (:func:`post_ln_opt_adapter`)."""
    if _REGISTERED:
        return
    from transformer_lens.factories.architecture_adapter_factory import (
        ArchitectureAdapterFactory,
    )

    ArchitectureAdapterFactory.register_adapter("OPTForCausalLM", post_ln_opt_adapter())
    _REGISTERED.append(True)


__all__ = [
    "attach_bridge",
    "lacks_final_norm",
    "post_ln_opt_adapter",
    "register_adapters",
    "supported_architectures",
    "unsupported",
]
