"""The anchor task's answer categories, the rule that sorts predictions into them, their words.

On a held-out pair ``(a1, a2)`` with key ``x`` a model's answer is

* ``inferential``: the composite ``g(g(x; a1); a2)``, the generalizing solution;
* ``symmetric``: the trained target of the mirrored pair ``(a2, a1)``, e.g. ``x - 6`` on the
  held-out pair ``(4, 3)`` because ``(3, 4)`` is trained on it (no such answer where the
  mirror is not trained: the share is then NaN, never a 0);
* ``other``: neither.

A model is ``memorizing`` when it answers the seen pairs on test keys wrongly (below
:func:`~probekit.analyses.mechanisms.solutions.solution_types`' ``memorizing_threshold``, 90%):
it learned the training sequences, not the anchors' shifts, and its held-out answers tell no
solution. :class:`~probekit.anchor.data.AnchorData` hands :data:`CATEGORIES`, :func:`classify`
and :data:`WORDING` to the analyzers and the report through the
:class:`~probekit.data.TaskData` protocol.

Example:
    >>> import torch
    >>> composite, symmetric = torch.tensor([40, 40, 40]), torch.tensor([44, 44, -1])
    >>> shares = classify(torch.tensor([40, 44, 7]), composite, symmetric)
    >>> {name: share.tolist() for name, share in shares.items()}
    {'inferential': [1.0, 0.0, 0.0], 'symmetric': [0.0, 1.0, nan], 'other': [0.0, 0.0, 1.0]}
"""

from __future__ import annotations

import torch

from probekit.data import SolutionWording

CATEGORIES: dict[str, str] = {
    "inferential": "inferential (composite)",
    "symmetric": "symmetric (mirrored pair's target)",
    "other": "other",
}
"""The answer categories in the order they are reported, each with its description."""

WORDING = SolutionWording(
    groups="pairs",
    reference="composite",
    seen_scope="test keys",
    heldout_scope="all keys",
    target="trained target",
    memorizing="memorizing",
    title="Solution type on the held-out pair",
    explain="The figure shows, for each anchor pair, the share of outputs that follow each "
    "candidate shift; the held-out pair tells the inferential solution (the composite) from "
    "the symmetric one.",
    conclusion="Solution: {solution}; on the held-out pair {heldout_inferential:.1%} of outputs "
    "are inferential and {heldout_symmetric:.1%} symmetric.",
)
"""How figures and reports speak of the anchor task's solutions."""


def classify(
    predictions: torch.Tensor, composite: torch.Tensor, symmetric: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Sort ``predictions`` ``[n]`` into :data:`CATEGORIES`: per category a float ``[n]``,
    1 where the prediction is in it, 0 where not, NaN where the category has no answer
    (``symmetric == -1``: the mirrored pair is not trained).

    ``composite`` and ``symmetric`` are the sequences' inferential and symmetric answers.
    """
    inferential = predictions == composite
    has_mirror = symmetric != -1
    mirrored = (predictions == symmetric) & has_mirror
    return {
        "inferential": inferential.float(),
        "symmetric": torch.where(has_mirror, mirrored.float(), float("nan")),
        "other": (~(inferential | mirrored)).float(),
    }


__all__ = ["CATEGORIES", "WORDING", "classify"]
