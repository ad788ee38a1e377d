"""Pieces shared by the analyzers: per-token output measures and masked token averages."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from probekit.errors import NumericalError

OUTPUT_MEASURES = ("logit_l2", "kl", "prob_l2", "loss_delta")
"""How an intervention's output is compared with the clean output, per token:

- ``logit_l2``: ||z' - z||_2 over the vocabulary,
- ``kl``: KL(p || p'), clean distribution first,
- ``prob_l2``: ||softmax(z') - softmax(z)||_2,
- ``loss_delta``: CE(z', y) - CE(z, y) at positions that have a target y.
"""


def check_finite(logits: torch.Tensor, what: str = "the model's outputs") -> None:
    """Raise :class:`NumericalError` if ``logits`` hold NaN or infinities."""
    if not torch.isfinite(logits).all():
        raise NumericalError(
            f"{what} contain NaN or infinite values",
            fix="check the checkpoint's weights (probekit.load checks them) and the input data",
        )


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per position ``[B, T]`` (0 where ``labels == -100``), in float64."""
    flat = F.cross_entropy(
        logits.double().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none"
    )
    return flat.view(labels.shape)


def output_change(
    clean: torch.Tensor, changed: torch.Tensor, labels: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-token measures (see :data:`OUTPUT_MEASURES`) of ``changed`` logits against ``clean``."""
    clean = clean.double()
    changed = changed.double()
    logp, logq = clean.log_softmax(-1), changed.log_softmax(-1)
    p, q = logp.exp(), logq.exp()
    return {
        "logit_l2": (changed - clean).norm(dim=-1),
        "kl": (p * (logp - logq)).sum(-1),
        "prob_l2": (q - p).norm(dim=-1),
        "loss_delta": token_loss(changed, labels) - token_loss(clean, labels),
    }


HIDDEN_MEASURES = ("rel_l2", "cos_dist")
"""How an intervention's output is compared with the clean output in a model without an LM
head, whose output ``z`` is the final hidden state per token or the pooled embedding per
sequence (:attr:`probekit.model.Model.output_kind`):

- ``rel_l2``: ||z' - z||_2 / ||z||_2, the relative change (the hidden-space substitute of
  ``prob_l2`` and of the loss change: shares, skip output effects and swap costs use it),
- ``cos_dist``: 1 - cos(z', z).

Measures that need a vocabulary (KL, Δsoftmax, Δloss, the logit and tuned lenses, gradient
norms of the loss) have no hidden-space counterpart here and are refused for such models.
"""


def output_measures(model: Any) -> tuple[str, ...]:
    """The output measures of ``model``: :data:`OUTPUT_MEASURES` for logits, else
    :data:`HIDDEN_MEASURES`."""
    return OUTPUT_MEASURES if model.output_kind == "logits" else HIDDEN_MEASURES


def headline_measure(model: Any) -> str:
    """The measure behind shares, skip output effects and verdicts: ``prob_l2`` for logits,
    ``rel_l2`` for hidden states and embeddings."""
    return "prob_l2" if model.output_kind == "logits" else "rel_l2"


def output_note(model: Any) -> dict[str, str]:
    """``{"output": ..., "measure": ...}``: which output an analyzer compared and its headline
    measure, for summaries and reports."""
    return {"output": model.output_description, "measure": headline_measure(model)}


def hidden_change(clean: torch.Tensor, changed: torch.Tensor) -> dict[str, torch.Tensor]:
    """:data:`HIDDEN_MEASURES` of ``changed`` against ``clean`` over the last dimension, in
    float64 (``[..., d] -> [...]``).

    Example:
        >>> out = hidden_change(torch.tensor([[3.0, 4.0]]), torch.tensor([[3.0, 0.0]]))
        >>> round(float(out["rel_l2"][0]), 4), round(float(out["cos_dist"][0]), 4)
        (0.8, 0.4)
    """
    clean = clean.double()
    changed = changed.double().to(clean.device)
    norm = clean.norm(dim=-1)
    return {
        "rel_l2": (changed - clean).norm(dim=-1) / norm.clamp_min(1e-300),
        "cos_dist": 1 - F.cosine_similarity(changed, clean, dim=-1, eps=1e-300),
    }


def sequence_mask(mask: torch.Tensor) -> torch.Tensor:
    """One position (the first) per sequence with any position in ``mask``: per-sequence
    values spread over ``[B, T]`` then count once per sequence."""
    out = torch.zeros_like(mask, dtype=torch.bool)
    out[:, 0] = mask.bool().any(-1)
    return out


def measured_changes(
    model: Any, batch: Any, clean: torch.Tensor, changed: torch.Tensor, mask: torch.Tensor
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Every output measure of ``model`` (:func:`output_measures`) for one variant, as
    ``(measure, values [B, T], positions to average over [B, T])``: :func:`output_change` for
    logits (``loss_delta`` where there is a target); :func:`hidden_change` per token for a
    hidden state; for an embedding, :func:`hidden_change` of the pooled embeddings
    (:meth:`~probekit.model.Model.pool`), one value per sequence that has a position in
    ``mask`` (:func:`sequence_mask`)."""
    kind = model.output_kind
    if kind == "logits":
        labels = batch.labels
        return [
            (name, values, loss_mask(labels, mask) if name == "loss_delta" else mask)
            for name, values in output_change(clean, changed, labels).items()
        ]
    if kind == "hidden":
        return [(name, v, mask) for name, v in hidden_change(clean, changed).items()]
    attention = batch.attention_mask
    pooled = hidden_change(
        model.pool(clean.double(), attention), model.pool(changed.double(), attention)
    )
    rows = sequence_mask(mask)
    return [(name, v[:, None].expand(mask.shape), rows) for name, v in pooled.items()]


class TokenMeans:
    """Accumulate masked sums over batches and return exact means over all selected tokens.

    Example:
        >>> acc = TokenMeans()
        >>> acc.add("x", torch.tensor([[1.0, 3.0]]), torch.tensor([[True, True]]))
        >>> acc.mean("x")
        2.0
    """

    def __init__(self) -> None:
        self.sums: dict[object, float] = defaultdict(float)
        self.counts: dict[object, int] = defaultdict(int)

    def add(self, key: object, values: torch.Tensor, mask: torch.Tensor) -> None:
        self.sums[key] += float(values.double()[mask].sum())
        self.counts[key] += int(mask.sum())

    def mean(self, key: object) -> float:
        count = self.counts.get(key, 0)
        return self.sums[key] / count if count else float("nan")


def loss_mask(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Positions in ``mask`` that also have a target."""
    return mask & (labels != -100)


def add_output_change(
    acc: TokenMeans,
    key: tuple,
    clean: torch.Tensor,
    changed: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Add every output measure of one variant to ``acc`` under ``key + (measure,)``."""
    check_finite(changed, "the outputs of an intervened forward")
    for name, values in output_change(clean, changed, labels).items():
        acc.add(key + (name,), values, loss_mask(labels, mask) if name == "loss_delta" else mask)


def second_half(n_layers: int) -> range:
    """Indices of the layers in the second half: ``l >= n_layers / 2``."""
    return range((n_layers + 1) // 2, n_layers)


def cosine_matrix(vectors: Any) -> np.ndarray:
    """Cosine similarity between the rows of ``vectors`` ``[n, d]`` (zero rows give 0).

    Example:
        >>> cosine_matrix(np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])).round(3).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    v = np.asarray(vectors.numpy() if isinstance(vectors, torch.Tensor) else vectors, dtype=float)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    unit = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    cos = np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(cos, np.where(norms[:, 0] > 0, 1.0, 0.0))
    return cos
