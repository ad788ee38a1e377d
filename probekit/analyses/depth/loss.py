"""The model's own loss on data: the mean cross-entropy and perplexity of a language model.

:func:`model_loss` is the analyzer (a :class:`LossResult`: the loss per sequence, and the
token mean and its perplexity as headline numbers); :func:`perplexity` is a helper that returns
that one number.

Example:
    >>> from probekit.toy import TOY_VOCAB, toy_model, toy_tokens
    >>> res = model_loss(toy_model(n_layers=2), toy_tokens())
    >>> 1 < res.summary["perplexity"] < 3 * TOY_VOCAB   # a random model: near uniform
    True
    >>> perplexity(toy_model(n_layers=2), toy_tokens()) == res.summary["perplexity"]
    True
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import (
    TokenMeans,
    labels_of,
    loss_mask,
    result_meta,
    token_loss,
)
from probekit.data import Data, position_mask
from probekit.model import Model, load
from probekit.progress import counted
from probekit.result import Result
from probekit.words import figure_words


class LossResult(Result):
    """The model's loss on data.

    ``df`` columns: ``sequence`` (row of the data), ``loss`` (mean cross-entropy in nats over
    the sequence's selected positions with a target; NaN where it has none), ``n_tokens``.
    ``summary``: ``loss`` (the mean over every such token of all sequences together),
    ``perplexity`` (its exp), ``n_tokens``, ``n_sequences``.
    """

    kind = "model_loss"

    def figure(self) -> go.Figure:
        """The loss of each sequence, titled with the perplexity over all of them."""
        return figures.bars(
            self.df,
            "sequence",
            "loss",
            None,
            figure_words("model_loss", perplexity=self.summary["perplexity"]),
            figure_words("model_loss", "x"),
            figure_words("model_loss", "y"),
        )


@torch.no_grad()
def model_loss(
    model: Model, data: Data, *, positions: str = "all", batch_size: int | None = None
) -> LossResult:
    """The mean cross-entropy over every selected position with a target, over all batches
    together (the next token for decoders, by default), and per sequence.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data (see :mod:`probekit.data`); padding never enters the means.
        positions: 'all' real tokens, or only the 'last' real token of each sequence.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
    """
    model = load(model)
    model.require_vocabulary("the model's loss")
    total = TokenMeans()
    sums: list[float] = []
    counts: list[int] = []
    for batch in counted(model.prepare(data, batch_size)):
        labels = labels_of(batch)
        losses = token_loss(model.forward(batch), labels)
        mask = loss_mask(labels, position_mask(batch, positions))
        total.add("loss", losses, mask)
        sums += losses.masked_fill(~mask, 0.0).sum(-1).tolist()
        counts += mask.sum(-1).tolist()
    loss = total.mean("loss")
    df = pd.DataFrame(
        {
            "sequence": range(len(sums)),
            "loss": [s / c if c else math.nan for s, c in zip(sums, counts, strict=True)],
            "n_tokens": counts,
        }
    )
    summary = {
        "loss": loss,
        "perplexity": math.exp(loss),
        "n_tokens": total.counts["loss"],
        "n_sequences": len(sums),
    }
    meta = result_meta(model, positions=positions, batch_size=batch_size)
    return LossResult(df, summary, meta)


def perplexity(model: Model, data: Data, *, batch_size: int | None = None) -> float:
    """A helper, not an analyzer: the number ``exp(mean cross-entropy)`` over every position
    with a target (``model_loss(model, data).summary["perplexity"]``)."""
    return model_loss(model, data, batch_size=batch_size).summary["perplexity"]


__all__ = ["LossResult", "model_loss", "perplexity"]
