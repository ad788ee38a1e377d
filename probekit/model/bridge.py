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

    try:
        return build_bridge_from_module(
            hf_model, arch, hf_config=hf_model.config, tokenizer=tokenizer
        )
    except Exception as err:  # the bridge raises many types for configs it cannot wrap
        raise UnsupportedModelError(
            f"TransformerLens could not attach to this {arch} ({type(err).__name__}: {err})",
            fix="use a supported architecture such as GPT2LMHeadModel or LlamaForCausalLM",
        ) from err


__all__ = ["attach_bridge", "supported_architectures", "unsupported"]
