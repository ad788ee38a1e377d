"""Tiny random models and token batches for examples, quick tries and tests (no downloads).

Every docstring example in probekit builds what it needs from here, so the examples run as
written (the test suite runs them with ``--doctest-modules``).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model("gpt2", n_layers=2)
    >>> model.n_layers, toy_tokens(batch=3, length=5).shape
    (2, torch.Size([3, 5]))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from probekit.errors import InputError
from probekit.model import Model, load

if TYPE_CHECKING:
    import transformers

TOY_VOCAB = 50
"""Vocabulary size of the toy models."""

_ARCHS = ("gpt2", "llama", "bert", "post_ln_paper")


def toy_hf_model(
    arch: str = "gpt2",
    n_layers: int = 2,
    d_model: int = 32,
    seed: int = 0,
    vocab_size: int = TOY_VOCAB,
) -> transformers.PreTrainedModel:
    """A tiny random Hugging Face model (``gpt2``, ``llama``, ``bert`` or ``post_ln_paper``: the
    anchor paper's post-LN, bias-free, one-head ReLU block as a post-LN OPT) in eval mode.

    Example:
        >>> toy_hf_model("post_ln_paper").config.do_layer_norm_before
        False
    """
    import transformers

    if arch not in _ARCHS:
        raise InputError(f"unknown toy architecture {arch!r}", fix=f"use one of {_ARCHS}")
    common: dict[str, Any] = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0)
    # the sizes Llama and BERT name alike
    sizes: dict[str, Any] = dict(
        hidden_size=d_model,
        intermediate_size=2 * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        max_position_embeddings=16,
    )
    if arch == "gpt2":
        gpt2 = transformers.GPT2Config(
            n_positions=16, n_embd=d_model, n_layer=n_layers, n_head=4, **common
        )
        return _built(transformers.GPT2LMHeadModel, gpt2, seed)
    if arch == "llama":
        llama = transformers.LlamaConfig(num_key_value_heads=2, **sizes, **common)
        return _built(transformers.LlamaForCausalLM, llama, seed)
    if arch == "post_ln_paper":
        return _built(transformers.OPTForCausalLM, _post_ln_opt(n_layers, d_model, common), seed)
    bert = transformers.BertConfig(vocab_size=vocab_size, **sizes)
    return _built(transformers.BertForMaskedLM, bert, seed)


def _post_ln_opt(n_layers: int, d_model: int, common: dict[str, Any]) -> Any:
    """The ``OPTConfig`` of a toy post_ln_paper model (probekit's trainer writes the same
    settings, :func:`probekit.training.models.post_ln_config`)."""
    import transformers

    return transformers.OPTConfig(
        hidden_size=d_model,
        ffn_dim=3 * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=1,
        max_position_embeddings=16,
        word_embed_proj_dim=d_model,
        do_layer_norm_before=False,
        enable_bias=False,
        activation_function="relu",
        dropout=0.0,
        attention_dropout=0.0,
        pad_token_id=0,
        **common,
    )


_ConfigT = TypeVar("_ConfigT", bound="transformers.PretrainedConfig")


def _built(
    klass: Callable[[_ConfigT], transformers.PreTrainedModel], config: _ConfigT, seed: int
) -> transformers.PreTrainedModel:
    """``klass(config)`` with eager attention, its weights drawn from ``seed``, in eval mode."""
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return klass(config).eval()


def toy_model(
    arch: str = "gpt2",
    n_layers: int = 2,
    d_model: int = 32,
    seed: int = 0,
    vocab_size: int = TOY_VOCAB,
) -> Model:
    """:func:`toy_hf_model` attached as a probekit :class:`~probekit.model.Model`."""
    return load(toy_hf_model(arch, n_layers, d_model, seed, vocab_size), copy_model=False)


def toy_tokens(batch: int = 4, length: int = 8, seed: int = 0) -> torch.Tensor:
    """Random token ids ``[batch, length]`` in ``1..TOY_VOCAB-1``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, TOY_VOCAB, (batch, length), generator=g)


__all__ = ["TOY_VOCAB", "toy_hf_model", "toy_model", "toy_tokens"]
