"""Slow, plain references computed on un-bridged Hugging Face models.

Nothing here imports probekit: layers are physically deleted or reordered in a copy of the
model, sublayers are silenced with ordinary torch forward hooks, and every measure is written
out from its definition, so the tests compare probekit against an independent computation.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from tests.conftest import hf_blocks, set_blocks


def logits(hf, tokens, mask):
    with torch.no_grad():
        return hf(input_ids=tokens, attention_mask=mask, use_cache=False).logits


def labels_for(arch: str, tokens, mask):
    """Next real token for decoders, the token itself for BERT; -100 where there is none."""
    out = torch.full_like(tokens, -100)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            if arch == "bert":
                if mask[b, t]:
                    out[b, t] = tokens[b, t]
            elif t + 1 < tokens.shape[1] and mask[b, t] and mask[b, t + 1]:
                out[b, t] = tokens[b, t + 1]
    return out


def without_layer(hf, layer: int):
    model = copy.deepcopy(hf)
    blocks = list(hf_blocks(model))
    del blocks[layer]
    set_blocks(model, blocks)
    return model


def with_order(hf, order):
    model = copy.deepcopy(hf)
    blocks = list(hf_blocks(model))
    set_blocks(model, [blocks[i] for i in order])
    return model


@contextmanager
def silenced(hf, arch: str, layer: int, sublayer: str):
    """Remove one sublayer's update with a plain torch forward hook."""
    block = hf_blocks(hf)[layer]
    if arch == "bert":
        if sublayer == "attn":
            module = block.attention

            def hook(mod, args, kwargs, output):
                hidden = args[0] if args else kwargs["hidden_states"]
                return (hidden,) + tuple(output[1:]) if isinstance(output, tuple) else hidden
        else:
            module = block.output

            def hook(mod, args, kwargs, output):
                return args[1] if len(args) > 1 else kwargs["input_tensor"]
    else:
        module = {
            "attn": getattr(block, "attn", None) or getattr(block, "self_attn", None),
            "mlp": block.mlp,
        }[sublayer]

        def hook(mod, args, kwargs, output):
            if isinstance(output, tuple):
                return (torch.zeros_like(output[0]),) + tuple(output[1:])
            return torch.zeros_like(output)

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        yield hf
    finally:
        handle.remove()


def block_io(hf, tokens, mask):
    """Inputs and outputs of every block of a plain HF model, from ordinary torch hooks."""
    ins, outs = {}, {}
    handles = []
    for i, block in enumerate(hf_blocks(hf)):

        def pre(mod, args, kwargs, i=i):
            ins[i] = (args[0] if args else kwargs["hidden_states"]).detach()

        def post(mod, args, kwargs, output, i=i):
            outs[i] = (output[0] if isinstance(output, tuple) else output).detach()

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post, with_kwargs=True))
    try:
        z = logits(hf, tokens, mask)
    finally:
        for h in handles:
            h.remove()
    return ins, outs, z


def final_head(hf, arch: str, residual):
    """Logits from a final residual of a plain HF model."""
    with torch.no_grad():
        if arch == "gpt2":
            return hf.lm_head(hf.transformer.ln_f(residual))
        if arch == "llama":
            return hf.lm_head(hf.model.norm(residual))
        return hf.cls(residual)


def mean_over(values, mask):
    """Plain mean of a [B, T] tensor over the True entries of mask."""
    total, count = 0.0, 0
    for b in range(values.shape[0]):
        for t in range(values.shape[1]):
            if mask[b, t]:
                total += float(values[b, t])
                count += 1
    return total / count


def measures(clean, changed, labels):
    """Per-token output measures written from their definitions."""
    p = torch.softmax(clean.double(), -1)
    q = torch.softmax(changed.double(), -1)
    ce = torch.nn.functional.cross_entropy
    flat_labels = labels.reshape(-1)
    loss_clean = ce(
        clean.double().reshape(-1, clean.shape[-1]), flat_labels.clamp(min=0), reduction="none"
    ).reshape(labels.shape)
    loss_changed = ce(
        changed.double().reshape(-1, clean.shape[-1]), flat_labels.clamp(min=0), reduction="none"
    ).reshape(labels.shape)
    return {
        "logit_l2": torch.sqrt(((changed.double() - clean.double()) ** 2).sum(-1)),
        "kl": (p * (torch.log(p) - torch.log(q))).sum(-1),
        "prob_l2": torch.sqrt(((q - p) ** 2).sum(-1)),
        "loss_delta": loss_changed - loss_clean,
    }
