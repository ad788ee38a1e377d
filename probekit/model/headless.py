"""Models without an LM head: base models (``GPT2Model``, ``BertModel``, ...) and
sentence-transformers folders, whose output is the final hidden state per token or the pooled
embedding per sequence.

The bridge only attaches to a model with a head, so a base model is wrapped in its family's
head class (:func:`head_class_for`, :func:`wrap_headless`) whose head is never run
(:func:`stop_at_base_output`); a sentence-transformers folder names its transformer and its
pooling (:func:`read_sentence_transformers`), which :func:`pool` applies.

Example:
    >>> head_class_for("BertModel")
    'BertForMaskedLM'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from probekit.errors import CheckpointError, UnsupportedModelError
from probekit.io import read_json
from probekit.model.bridge import supported_architectures
from probekit.model.checkpoint import check_regular_file

POOLING_MODES = ("mean", "cls", "lasttoken")
"""The sentence-transformers pooling modes probekit reads: the mean over real tokens, the first
token (CLS), or the last real token."""


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


def stop_at_base_output(wrapper: nn.Module) -> None:
    """Make the forward of a headless model end at its base model's output: permanent forward
    hooks hand ``last_hidden_state`` to the bridge, which returns it (TransformerLens' own
    early exit), so the unread wrapper head never runs. The hooks sit on the base model and
    on its direct children that return a model output (OPT's head class calls the base
    model's ``decoder`` directly); the replay check at load
    (:meth:`~probekit.model.structure.StructureProbes.check`) checks the result."""
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


def head_class_for(arch: str) -> str | None:
    """The LM-head class the bridge supports for the base model class ``arch`` (GPT2Model ->
    GPT2LMHeadModel, BertModel -> BertForMaskedLM), from transformers' auto mappings; None when
    ``arch`` is no base model or no head class of its family is supported."""
    from transformers.models.auto import modeling_auto as auto

    supported = supported_architectures()
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


def wrap_headless(base: nn.Module, head_name: str) -> nn.Module:
    """``base`` inside its ``head_name`` class, for the bridge to attach to: the head class is
    built on the meta device (no random weights), its base model is ``base`` itself, and its
    head weights are tied to the input embeddings or zeros. The head is never run or read
    (:func:`stop_at_base_output`, :func:`~probekit.model.output.resolve_head`)."""
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


def has_final_norm(bridge: Any, base: nn.Module) -> bool:
    """Whether the bridge's final norm is a module of the base model (decoders: ``ln_f``,
    ``norm``) rather than of the head (BERT's prediction-head LayerNorm)."""
    norm = getattr(bridge, "ln_final", None)
    if norm is None:
        return False
    inner = getattr(norm, "original_component", None)
    return any(m is norm or (inner is not None and m is inner) for m in base.modules())


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


ST_JSON_BYTES = 16 * 2**20
"""The largest ``modules.json`` or pooling config read (sentence-transformers writes a few
hundred bytes)."""


def _read_json(path: Path, what: str) -> Any:
    """The JSON file ``path`` of a sentence-transformers folder (``what`` names it in errors):
    a pipe, device, file over :data:`ST_JSON_BYTES`, text that does not parse or JSON nested
    past the parser's recursion limit is one :class:`CheckpointError`."""
    check_regular_file(path)
    return read_json(
        path, ST_JSON_BYTES, what, fix="re-save the model with sentence-transformers' save()"
    )


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


def read_sentence_transformers(path: Path) -> tuple[Path, Pooling]:
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


def pool(
    pooling: Pooling, hidden: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """The sentence embedding ``[B, d_model]`` of final hidden states ``[B, T, d_model]``
    (right padding) pooled as ``pooling`` says: the mean over real tokens, the first token or
    the last real token, then unit L2 norm when ``pooling.normalize``."""
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


__all__ = [
    "POOLING_MODES",
    "Headless",
    "Pooling",
    "has_final_norm",
    "head_class_for",
    "pool",
    "read_sentence_transformers",
    "stop_at_base_output",
    "wrap_headless",
]
