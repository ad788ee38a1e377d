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

from probekit.anchor import (
    AnchorTask,  # noqa: E402
    TrainConfig,  # noqa: E402
)
from probekit.training import ModelConfig  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves a core free

VOCAB = 50

TINY_LM = dict(
    d_model=16,
    n_heads=2,
    n_layers=2,
    seq_len=16,
    batch_size=2,
    steps=4,
    eval_every=2,
    eval_sequences=2,
    corpus_max_files=30,
    warmup_steps=1,
)
"""LMConfig settings of a byte-level LM that trains in a second (the trainer fault tests)."""


TINY_ANCHOR_TASK = AnchorTask(n_train=256, n_test=64, seed=5)
"""The anchor task of :func:`tiny_anchor` (one instance, so its generated data are shared)."""


def tiny_anchor(**overrides) -> TrainConfig:
    """A TrainConfig of a 2-layer, d_model 16 anchor model on 256 sequences that trains in a
    second (8 steps, evaluated and checkpointed every 2); ``overrides`` replace any field."""
    settings = dict(
        model=ModelConfig(n_layers=2, d_model=16, n_heads=2, gamma=0.5),
        task=TINY_ANCHOR_TASK,
        steps=8,
        batch_size=32,
        lr=3e-3,
        warmup_steps=2,
        eval_every=2,
        checkpoint_every=2,
        eval_train_samples=64,
        device="cpu",
    )
    settings.update(overrides)
    return TrainConfig(**settings)


ARCHS = ("gpt2", "llama", "bert", "post_ln_paper")


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
    if arch == "post_ln_paper":  # --- paper architecture: probekit's post_ln_paper model ---
        return ModelConfig(
            architecture="post_ln_paper",
            n_layers=n_layers,
            d_model=d_model,
            d_mlp=3 * d_model,
            vocab_size=VOCAB,
            n_positions=16,
        ).to_hf_config()
    raise ValueError(arch)


def anchor_gpt2(
    n_layers: int = 2, seed: int = 0, vocab_size: int = 201, n_positions: int = 9
) -> transformers.GPT2LMHeadModel:
    """A random GPT-2 (d_model 32, 4 heads) with the anchor task's vocabulary and sequence
    length (by default the published task's, 201 and 9)."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=32,
        n_layer=n_layers,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    cfg._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(cfg).eval()


HF_CLASSES = {
    "gpt2": transformers.GPT2LMHeadModel,
    "llama": transformers.LlamaForCausalLM,
    "bert": transformers.BertForMaskedLM,
    "post_ln_paper": transformers.OPTForCausalLM,
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


_BLOCK_PATHS = (
    ("transformer", "h"),
    ("gpt_neox", "layers"),
    ("model", "decoder", "layers"),
    ("model", "layers"),
    ("bert", "encoder", "layer"),
    ("roberta", "encoder", "layer"),
)


def _block_owner(hf_model):
    """The module holding the block list of a plain HF model, and the list's attribute name."""
    for *path, name in _BLOCK_PATHS:
        owner = hf_model
        for attr in path:
            owner = getattr(owner, attr, None)
        if owner is not None and isinstance(getattr(owner, name, None), torch.nn.ModuleList):
            return owner, name
    raise ValueError(f"no block list found in {type(hf_model).__name__}")


def hf_blocks(hf_model) -> torch.nn.ModuleList:
    owner, name = _block_owner(hf_model)
    return getattr(owner, name)


def set_blocks(hf_model, blocks: list) -> None:
    """Replace the block list of a plain HF model (for physically deleted / swapped layers)."""
    owner, name = _block_owner(hf_model)
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


# ---- every architecture family (tests/test_architectures.py) ----------------------------------
FAMILY_VOCAB = 64
ENCODERS = ("bert", "roberta")
"""Masked-LM families: the target of a position is its own token."""


def _decoder(**sizes) -> dict:
    """Llama-style sizes shared by most decoder configs."""
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        **sizes,
    )


FAMILIES = {
    "gpt2": ("GPT2", dict(n_positions=16, n_embd=32, n_head=4)),
    "gpt_neox": (
        "GPTNeoX",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=16,
            use_parallel_residual=True,
        ),
    ),
    "gpt_neox_sequential": (
        "GPTNeoX",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=16,
            use_parallel_residual=False,
        ),
    ),
    "gptj": ("GPTJ", dict(n_embd=32, n_head=4, n_positions=16, rotary_dim=4)),
    "opt": (
        "OPT",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=16,
            word_embed_proj_dim=32,
        ),
    ),
    "llama": ("Llama", _decoder()),
    "mistral": ("Mistral", _decoder()),
    "qwen2": ("Qwen2", _decoder()),
    "qwen3": ("Qwen3", _decoder(head_dim=8)),
    "gemma": ("Gemma", _decoder(head_dim=8)),
    "gemma2": ("Gemma2", _decoder(head_dim=8, sliding_window=16, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3Text", _decoder(head_dim=8, sliding_window=16, final_logit_softcapping=3.0)),
    "phi": (
        "Phi",
        dict(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, max_position_embeddings=16
        ),
    ),
    "phi3": ("Phi3", _decoder(pad_token_id=0)),
    "falcon": ("Falcon", dict(hidden_size=32, num_attention_heads=4)),
    "bert": (
        "Bert",
        dict(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, max_position_embeddings=16
        ),
    ),
    "roberta": (
        "Roberta",
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            max_position_embeddings=20,
            pad_token_id=1,
        ),
    ),
    "gpt_neo": (
        "GPTNeo",
        dict(
            hidden_size=32,
            num_heads=4,
            max_position_embeddings=16,
            window_size=16,
            attention_types=[[["global", "local"], 1], [["global"], 1]],
        ),
    ),
    "bloom": ("Bloom", dict(hidden_size=32, n_head=4)),
    "stablelm": ("StableLm", _decoder()),
    "olmo": ("Olmo", _decoder()),
    "olmo2": ("Olmo2", _decoder()),
    "gpt_bigcode": ("GPTBigCode", dict(n_embd=32, n_head=4, n_positions=16)),
    "starcoder2": ("Starcoder2", _decoder()),
    "cohere": ("Cohere", _decoder(logit_scale=0.5)),
    "mixtral": ("Mixtral", _decoder(num_local_experts=2, num_experts_per_tok=1)),
    # --- paper architecture: post-LN OPT (probekit's post_ln_paper model) ---
    "opt_post_norm": (
        "OPT",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=16,
            word_embed_proj_dim=32,
            do_layer_norm_before=False,
        ),
    ),
    "post_ln_paper": (
        "OPT",
        dict(
            hidden_size=32,
            num_attention_heads=1,
            ffn_dim=96,
            max_position_embeddings=16,
            word_embed_proj_dim=32,
            do_layer_norm_before=False,
            enable_bias=False,
            activation_function="relu",
        ),
    ),
}
"""family -> (transformers class prefix, config sizes); ``{prefix}Config`` and the head class
``{prefix}ForCausalLM`` / ``ForMaskedLM`` / ``LMHeadModel``, 3 layers unless told."""

REFUSED = {
    "codegen": ("CodeGen", dict(n_embd=32, n_head=4, n_positions=16, rotary_dim=4)),
    "mamba": ("Mamba", dict(hidden_size=32, state_size=4)),
    "openai_gpt": ("OpenAIGPT", dict(n_embd=32, n_head=4, n_positions=16)),
    "mpt": ("Mpt", dict(d_model=32, n_heads=4, max_seq_len=16)),
    "falcon_new_decoder": (
        "Falcon",
        dict(hidden_size=32, num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2),
    ),
    "opt_projected": (
        "OPT",
        dict(
            hidden_size=32,
            num_attention_heads=4,
            ffn_dim=64,
            max_position_embeddings=16,
            word_embed_proj_dim=16,
        ),
    ),
    "granite_multipliers": ("Granite", _decoder(residual_multiplier=0.22, logits_scaling=8.0)),
}
"""Families the TransformerLens 4 bridge lists but probekit refuses at load
(docs/architectures.md)."""

_HEADS = ("ForCausalLM", "ForMaskedLM", "LMHeadModel")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def family_class(prefix: str, encoder: bool):
    """The head class of a family: masked-LM for encoders, else the causal-LM one."""
    names = [f"{prefix}ForMaskedLM"] if encoder else [prefix + h for h in _HEADS]
    if prefix == "Gemma3Text":
        names = ["Gemma3ForCausalLM"]
    return next(getattr(transformers, n) for n in names if hasattr(transformers, n))


def make_family(name: str, n_layers: int = 3, seed: int = 0, scale: float = 1.0):
    """A tiny random model of family ``name`` (FAMILIES or REFUSED) in eval mode, float32."""
    prefix, sizes = FAMILIES.get(name) or REFUSED[name]
    config_class = getattr(transformers, f"{prefix}Config")
    layer_key = next(k for k in _LAYER_KEYS if k in config_class().to_dict())
    ids = dict(bos_token_id=0, eos_token_id=0)
    config = config_class(vocab_size=FAMILY_VOCAB, **{layer_key: n_layers}, **ids, **sizes)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = family_class(prefix, name in ENCODERS)(config).eval()
    if scale != 1.0:
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if p.ndim == 2 and "embed" not in pname and "wte" not in pname:
                    p.mul_(scale)
    return model


def family_tokens(batch: int = 4, length: int = 8, seed: int = 1):
    """Random tokens of the family vocabulary (ids >= 2), right padding in rows 1 and 3."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, FAMILY_VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(tokens)
    mask[1, length - 2 :] = 0
    mask[3, length - 3 :] = 0
    return tokens * mask, mask
