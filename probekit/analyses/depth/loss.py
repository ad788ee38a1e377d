"""The model's own loss on data: the perplexity of a language model.

Example:
    >>> from probekit.toy import TOY_VOCAB, toy_model, toy_tokens
    >>> ppl = perplexity(toy_model(n_layers=2), toy_tokens())
    >>> 1 < ppl < 3 * TOY_VOCAB      # a random model is close to uniform over the vocabulary
    True
"""

from __future__ import annotations

import math
from typing import Any

import torch

from probekit.analyses._common import TokenMeans, loss_mask, token_loss
from probekit.data import Data
from probekit.model import load


@torch.no_grad()
def perplexity(model: Any, data: Data, *, batch_size: int | None = 32) -> float:
    """exp of the mean cross-entropy over every position with a target, over all batches
    together (the next token for decoders, by default)."""
    model = load(model)
    model.require_vocabulary("perplexity")
    acc = TokenMeans()
    for batch in model.prepare(data, batch_size):
        losses = token_loss(model.forward(batch), batch.labels)
        acc.add("loss", losses, loss_mask(batch.labels, batch.valid))
    return math.exp(acc.mean("loss"))


__all__ = ["perplexity"]
