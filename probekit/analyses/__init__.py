"""Analyzers, grouped by the question they answer; each returns a Result (tidy ``.df``,
``.summary``, ``.figure()``, save/load).

- :mod:`~probekit.analyses.depth`: how a model uses its depth (contributions, residual
  similarity, skip effects, gradients, layer swaps, logit lens);
- :mod:`~probekit.analyses.mechanisms`: which solution it found and what carries it (solution
  types, probes, token masking, attention knockout, information flow, hidden-state maps);
- :mod:`~probekit.analyses.weights`: the weights alone (condensation, spectra, embedding maps);
- :mod:`~probekit.analyses.timeline`: any analyzer across checkpoints.

Names are imported from their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES: dict[str, tuple[str, ...]] = {
    "depth.contributions": ("ContributionResult", "contributions"),
    "depth.gradients": ("GradientResult", "gradient_norms"),
    "depth.lens": ("LogitLensResult", "logit_lens"),
    "depth.loss": ("perplexity",),
    "depth.residual": ("ResidualResult", "residual_stats"),
    "depth.skips": ("SkipEffectResult", "skip_effects"),
    "depth.swaps": ("SwapResult", "layer_swaps"),
    "depth.tuned_lens": ("TunedLens", "TunedLensResult", "tuned_lens"),
    "mechanisms.flow": ("FlowResult", "information_flow"),
    "mechanisms.knockout": ("KnockoutResult", "attention_knockout"),
    "mechanisms.maps": ("HiddenMapResult", "PairCosineResult", "hidden_state_map", "pair_cosines"),
    "mechanisms.masking": ("MaskingResult", "token_masking"),
    "mechanisms.probes": ("ProbeResult", "linear_probes"),
    "mechanisms.solutions": ("SolutionResult", "solution_types"),
    "timeline": ("DepthTimelineResult", "TimelineResult", "depth_timeline", "timeline"),
    "weights.condensation": (
        "CondensationResult",
        "CondensationTimelineResult",
        "condensation",
        "condensation_timeline",
    ),
    "weights.embeddings": ("EmbeddingMapResult", "embedding_map"),
    "weights.spectra": ("SpectraResult", "spectra"),
}

_WHERE = {
    name: f"probekit.analyses.{module}" for module, names in _MODULES.items() for name in names
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'probekit.analyses' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
