"""Shared fixtures: tiny GPT-2, Llama and BERT models built from configs (no downloads), and
plain Hugging Face references that tests use to check probekit independently of the bridge."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves a core free

VOCAB = 50
ARCHS = ("gpt2", "llama", "bert")


def hf_config(arch: str, n_layers: int = 4, d_model: int = 32):
    if arch == "gpt2":
        return transformers.GPT2Config(
            vocab_size=VOCAB,
            n_positions=16,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    if arch == "llama":
        return transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=d_model,
            intermediate_size=2 * d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=16,
            bos_token_id=0,
            eos_token_id=0,
        )
    if arch == "bert":
        return transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=d_model,
            intermediate_size=2 * d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            max_position_embeddings=16,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    raise ValueError(arch)


HF_CLASSES = {
    "gpt2": transformers.GPT2LMHeadModel,
    "llama": transformers.LlamaForCausalLM,
    "bert": transformers.BertForMaskedLM,
}


def make_hf(arch: str, n_layers: int = 4, seed: int = 0, scale: float = 1.0):
    """A tiny random HF model in eval mode; ``scale`` multiplies all weights (bigger effects)."""
    torch.manual_seed(seed)
    config = hf_config(arch, n_layers)
    config._attn_implementation = "eager"
    model = HF_CLASSES[arch](config).eval()
    if scale != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 2 and "embed" not in name and "wte" not in name:
                    p.mul_(scale)
    return model


def twin(hf_model):
    """An independent copy (the original will be wrapped by the bridge in place)."""
    return copy.deepcopy(hf_model).eval()


def hf_blocks(hf_model) -> torch.nn.ModuleList:
    if hasattr(hf_model, "transformer"):
        return hf_model.transformer.h
    if hasattr(hf_model, "model"):
        return hf_model.model.layers
    return hf_model.bert.encoder.layer


def set_blocks(hf_model, blocks: list) -> None:
    """Replace the block list of a plain HF model (for physically deleted / swapped layers)."""
    owner = (
        hf_model.transformer
        if hasattr(hf_model, "transformer")
        else hf_model.model
        if hasattr(hf_model, "model")
        else hf_model.bert.encoder
    )
    name = (
        "h"
        if hasattr(hf_model, "transformer")
        else "layers"
        if hasattr(hf_model, "model")
        else "layer"
    )
    setattr(owner, name, torch.nn.ModuleList(blocks))
    hf_model.config.num_hidden_layers = len(blocks)


def sample_tokens(batch: int = 6, length: int = 10, seed: int = 1, pad: bool = True):
    """Random tokens with right padding in some rows (pad id 0, mask 0 there)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(tokens)
    if pad:
        mask[1, length - 3 :] = 0
        mask[3, length - 5 :] = 0
        tokens = tokens * mask
    return tokens, mask


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    return request.param
