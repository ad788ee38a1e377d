"""Analyzers, grouped by the question they answer; each returns a Result (tidy ``.df``,
``.summary``, ``.figure()``, save/load).

- :mod:`~probekit.analyses.depth`: how a model uses its depth (contributions, residual
  similarity, skip effects, gradients, layer swaps, logit lens);
- :mod:`~probekit.analyses.mechanisms`: which solution it found and what carries it (solution
  types, probes, token masking, attention knockout, information flow, hidden-state maps);
- :mod:`~probekit.analyses.weights`: the weights alone (condensation, spectra, embedding maps);
- :mod:`~probekit.analyses.across_checkpoints`: any analyzer across checkpoints.

One shape for every analyzer of data::

    analyzer(model: Model, data: Data, *, positions=..., batch_size: int | None = None, ...)
        -> SomeResult

``model`` is a :class:`probekit.Model` or anything :func:`probekit.load` accepts; the mechanism
analyzers also read task data (:class:`probekit.data.TaskData`). ``positions`` defaults to
``"all"`` where an analyzer averages over tokens (the depth analyzers, the probes) and to
``"last"`` where it reads the one position a task's answer is predicted at (token masking,
attention knockout, hidden-state maps, pair cosines). ``batch_size=None`` is the automatic,
memory-bounded choice (:meth:`probekit.Model.default_batch_size`); it changes no number beyond
float rounding (except where draws follow the batches: token masking's ``mode="resample"``,
the layer swaps' ``bootstrap_unit="batch"``). Every result's ``meta`` holds ``model`` and the
``positions`` and ``batch_size`` it was run with. Analyzers of the weights alone take
``(model, *, ...)``.

Names are imported from their modules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probekit.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, so a type checker sees them as they are, not as Any
    from probekit.analyses.across_checkpoints import (  # noqa: F401
        DepthTimelineResult,
        TimelineResult,
        depth_timeline,
        timeline,
    )
    from probekit.analyses.depth.contributions import ContributionResult, contributions  # noqa: F401
    from probekit.analyses.depth.gradients import GradientResult, gradient_norms  # noqa: F401
    from probekit.analyses.depth.lens import LogitLensResult, logit_lens  # noqa: F401
    from probekit.analyses.depth.loss import LossResult, model_loss, perplexity  # noqa: F401
    from probekit.analyses.depth.residual import ResidualResult, residual_stats  # noqa: F401
    from probekit.analyses.depth.similarity import (  # noqa: F401
        SimilarityResult,
        layer_similarity,
    )
    from probekit.analyses.depth.skips import SkipEffectResult, skip_effects  # noqa: F401
    from probekit.analyses.depth.swaps import SwapResult, layer_swaps  # noqa: F401
    from probekit.analyses.depth.token_lens import TokenLensResult, token_lens  # noqa: F401
    from probekit.analyses.depth.tuned_lens import TunedLens, TunedLensResult, tuned_lens  # noqa: F401
    from probekit.analyses.mechanisms.flow import FlowResult, information_flow  # noqa: F401
    from probekit.analyses.mechanisms.knockout import KnockoutResult, attention_knockout  # noqa: F401
    from probekit.analyses.mechanisms.maps import (  # noqa: F401
        HiddenMapResult,
        PairCosineResult,
        hidden_state_map,
        pair_cosines,
    )
    from probekit.analyses.mechanisms.masking import MaskingResult, token_masking  # noqa: F401
    from probekit.analyses.mechanisms.patching import (  # noqa: F401
        AttributionResult,
        PatchingResult,
        activation_patching,
        direct_logit_attribution,
    )
    from probekit.analyses.mechanisms.probes import ProbeResult, linear_probes  # noqa: F401
    from probekit.analyses.mechanisms.solutions import SolutionResult, solution_types  # noqa: F401
    from probekit.analyses.weights.condensation import (  # noqa: F401
        CondensationResult,
        CondensationTimelineResult,
        condensation,
        condensation_timeline,
    )
    from probekit.analyses.weights.embeddings import EmbeddingMapResult, embedding_map  # noqa: F401
    from probekit.analyses.weights.spectra import SpectraResult, spectra  # noqa: F401

_MODULES: dict[str, tuple[str, ...]] = {
    "across_checkpoints": ("DepthTimelineResult", "TimelineResult", "depth_timeline", "timeline"),
    "depth.contributions": ("ContributionResult", "contributions"),
    "depth.gradients": ("GradientResult", "gradient_norms"),
    "depth.lens": ("LogitLensResult", "logit_lens"),
    "depth.loss": ("LossResult", "model_loss", "perplexity"),
    "depth.residual": ("ResidualResult", "residual_stats"),
    "depth.similarity": ("SimilarityResult", "layer_similarity"),
    "depth.skips": ("SkipEffectResult", "skip_effects"),
    "depth.swaps": ("SwapResult", "layer_swaps"),
    "depth.tuned_lens": ("TunedLens", "TunedLensResult", "tuned_lens"),
    "depth.token_lens": ("TokenLensResult", "token_lens"),
    "mechanisms.flow": ("FlowResult", "information_flow"),
    "mechanisms.knockout": ("KnockoutResult", "attention_knockout"),
    "mechanisms.maps": ("HiddenMapResult", "PairCosineResult", "hidden_state_map", "pair_cosines"),
    "mechanisms.masking": ("MaskingResult", "token_masking"),
    "mechanisms.probes": ("ProbeResult", "linear_probes"),
    # --- activation patching and direct logit attribution ---
    "mechanisms.patching": (
        "AttributionResult",
        "PatchingResult",
        "activation_patching",
        "direct_logit_attribution",
    ),
    "mechanisms.solutions": ("SolutionResult", "solution_types"),
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


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
