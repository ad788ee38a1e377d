"""One split of the anchor task: :class:`AnchorData`, the :class:`~probekit.data.TaskData` that
the analyzers, the solution types and the report ask.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> data = AnchorTask(n_train=64, n_test=16).dataset("test_data")
    >>> data.description(), data.group_label, data.groups()[0] == str(data.pair(0)).replace(" ", "")
    ("the anchor task's test split", 'anchor pair', True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from probekit.anchor import solutions
from probekit.data import SolutionWording
from probekit.errors import InputError

Pair = tuple[int, int]
Chain = tuple[int, ...]
"""A chain of anchors ``(a1, ..., ak)`` (a :data:`Pair` at chain length 2)."""

SPLIT_WORDS = {"train": "training split", "test_data": "test split", "test_task": "held-out split"}
"""Each split in words, for :meth:`AnchorData.description`."""

ROLE_OFFSETS = {"key": 0, "anchor1": 1, "anchor2": 2}
"""Position of each role relative to the key."""


@dataclass
class AnchorData:
    """One split of the task: token ids and the bookkeeping needed to score predictions.

    ``tokens`` is ``[n, seq_len]`` (long), ``targets`` the label the split is scored against (the
    trained target for seen pairs, the composite for held-out pairs), ``composite`` the composite
    ``g(g(x; a1); a2)``, ``symmetric`` the trained target of the mirrored pair (``-1`` where the
    mirrored pair is not trained), ``pairs`` ``[n, 2]`` (``[n, k]``: the chain of ``k``
    anchors of a task of chain length ``k``), ``keys`` and ``positions`` ``[n]``,
    ``intermediate`` the first step ``g(x; a1)`` and ``is_heldout`` ``[n]`` bool. ``item_range``
    is the task's ``(item_low, item_high)``, ``vocab_size`` the task's vocabulary (the model
    that reads the data must have it), ``key_modulus`` the modulus of the key split.

    It implements :class:`probekit.data.TaskData`, the protocol task-aware analyzers ask.
    """

    split: str
    tokens: torch.Tensor
    targets: torch.Tensor
    composite: torch.Tensor
    symmetric: torch.Tensor
    pairs: torch.Tensor
    keys: torch.Tensor
    positions: torch.Tensor
    intermediate: torch.Tensor
    is_heldout: torch.Tensor
    item_range: tuple[int, int] = (20, 100)
    vocab_size: int | None = None
    key_modulus: int | None = None
    group_label: ClassVar[str] = "anchor pair"

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def on_training_keys(self) -> torch.Tensor:
        """Bool ``[n]``: the sequence's key is a training key at its position
        (``key mod m != position mod m``), the cells the official code evaluates held-out
        pairs on.

        Example:
            >>> from probekit.anchor import AnchorTask
            >>> d = AnchorTask(n_train=64, n_test=200).dataset("test_task")
            >>> 0 < int(d.on_training_keys().sum()) < len(d)
            True
        """
        if self.key_modulus is None:
            raise InputError(
                "these task data do not record their key split",
                fix="generate them with AnchorTask.generate / dataset",
            )
        m = self.key_modulus
        return self.keys % m != self.positions % m

    def pair(self, i: int) -> Chain:
        """The anchor pair (the chain) of sample ``i`` as a tuple."""
        return tuple(int(a) for a in self.pairs[i].tolist())

    # ---- the TaskData protocol ------------------------------------------------------------
    @property
    def resample_range(self) -> tuple[int, int]:
        """Token ids a resampled position draws from: the item range."""
        return self.item_range

    def groups(self) -> list[str]:
        """The anchor pair of every sequence, as ``"(a1,a2)"`` (a chain: ``"(a1,a2,a3)"``)."""
        return ["(" + ",".join(map(str, p)) + ")" for p in self.pairs.tolist()]

    def heldout(self) -> torch.Tensor:
        return self.is_heldout

    def answers(self) -> dict[str, torch.Tensor]:
        """``inferential`` (the composite) and ``symmetric`` (mirrored pair's trained target)."""
        return {"inferential": self.composite, "symmetric": self.symmetric}

    def categories(self) -> dict[str, str]:
        """inferential, symmetric, other (:data:`probekit.anchor.solutions.CATEGORIES`)."""
        return dict(solutions.CATEGORIES)

    def classify(self, predictions: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per category, whether each prediction is in it (NaN: no symmetric answer), by
        :func:`probekit.anchor.solutions.classify`."""
        return solutions.classify(predictions, self.composite, self.symmetric)

    def subsets(self) -> dict[str, torch.Tensor]:
        """``train_keys``: the sequences on training keys (:meth:`on_training_keys`), where
        the data know their key split."""
        return {} if self.key_modulus is None else {"train_keys": self.on_training_keys()}

    def solution_wording(self) -> SolutionWording:
        """The anchor task's words (:data:`probekit.anchor.solutions.WORDING`)."""
        return solutions.WORDING

    def description(self) -> str:
        """The split in words, e.g. ``"the anchor task's test split"``."""
        parts = [SPLIT_WORDS.get(name, name) for name in self.split.split("+")]
        return f"the anchor task's {' and '.join(parts)}"

    def roles(self) -> dict[str, torch.Tensor]:
        """Bool ``[n, seq_len]`` masks of the key, the two anchors (``anchor3`` ... of a
        chain) and the noise positions."""
        n, t = self.tokens.shape
        at = torch.arange(t)[None]
        offsets = {**ROLE_OFFSETS, **{f"anchor{j}": j for j in range(3, self.pairs.shape[1] + 1)}}
        out = {role: at == (self.positions[:, None] + off) for role, off in offsets.items()}
        noise = torch.zeros_like(out["key"])
        for mask in out.values():
            noise |= mask
        out["noise"] = ~noise
        return out

    def variables(self) -> dict[str, np.ndarray]:
        """key, a1, a2 (a3, ... of a chain), g1 = g(key; a1) and the target of every
        sequence."""
        as_np = lambda t: t.numpy().astype(np.int64)  # noqa: E731
        anchors = {f"a{j + 1}": as_np(self.pairs[:, j]) for j in range(self.pairs.shape[1])}
        return {
            "key": as_np(self.keys),
            "a1": anchors.pop("a1"),
            "a2": anchors.pop("a2"),
            "g1": as_np(self.intermediate),
            "target": as_np(self.targets),
            **anchors,
        }

    def mirror_groups(self) -> list[tuple[str, str]]:
        """Each held-out pair (chain) with its mirror (the first two anchors swapped), where
        both are present."""
        present = set(self.groups())
        out = []
        for chain in sorted({tuple(p) for p in self.pairs[self.is_heldout].tolist()}):
            a, b, *rest = chain
            held, mirror = ("(" + ",".join(map(str, c)) + ")" for c in (chain, (b, a, *rest)))
            if mirror in present and mirror != held:
                out.append((held, mirror))
        return out

    def concat(self, others: Sequence[AnchorData]) -> AnchorData:
        """One data set of this split followed by ``others`` (e.g. seen and held-out pairs)."""
        parts = [self, *others]
        fields = (
            "tokens",
            "targets",
            "composite",
            "symmetric",
            "pairs",
            "keys",
            "positions",
            "intermediate",
            "is_heldout",
        )
        joined = {f: torch.cat([getattr(d, f) for d in parts]) for f in fields}
        return AnchorData(
            "+".join(d.split for d in parts),
            **joined,
            item_range=self.item_range,
            vocab_size=self.vocab_size,
            key_modulus=self.key_modulus,
        )


__all__ = ["ROLE_OFFSETS", "SPLIT_WORDS", "AnchorData", "Chain", "Pair"]
