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
