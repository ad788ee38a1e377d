"""Analyzers: each a function ``(model, data, ...) -> Result`` (tidy ``.df``, ``.summary``,
``.figure()``, save/load)."""

from probekit.analyses.depth.contributions import ContributionResult, contributions
from probekit.analyses.depth.gradients import GradientResult, gradient_norms
from probekit.analyses.depth.lens import LogitLensResult, logit_lens
from probekit.analyses.depth.residual import ResidualResult, residual_stats
from probekit.analyses.depth.skips import SkipEffectResult, skip_effects
from probekit.analyses.depth.swaps import SwapResult, layer_swaps
from probekit.analyses.mechanisms.flow import FlowResult, information_flow
from probekit.analyses.mechanisms.knockout import KnockoutResult, attention_knockout
from probekit.analyses.mechanisms.maps import (
    HiddenMapResult,
    PairCosineResult,
    hidden_state_map,
    pair_cosines,
)
from probekit.analyses.mechanisms.masking import MaskingResult, token_masking
from probekit.analyses.mechanisms.probes import ProbeResult, linear_probes
from probekit.analyses.mechanisms.solutions import SolutionResult, solution_types
from probekit.analyses.timeline import (
    DepthTimelineResult,
    TimelineResult,
    depth_timeline,
    timeline,
)
from probekit.analyses.weights.condensation import (
    CondensationResult,
    CondensationTimelineResult,
    condensation,
    condensation_timeline,
)
from probekit.analyses.weights.embeddings import EmbeddingMapResult, embedding_map
from probekit.analyses.weights.spectra import SpectraResult, spectra
from probekit.result import Result

__all__ = [
    "CondensationResult",
    "CondensationTimelineResult",
    "ContributionResult",
    "DepthTimelineResult",
    "EmbeddingMapResult",
    "FlowResult",
    "GradientResult",
    "HiddenMapResult",
    "KnockoutResult",
    "LogitLensResult",
    "MaskingResult",
    "PairCosineResult",
    "ProbeResult",
    "ResidualResult",
    "Result",
    "SkipEffectResult",
    "SolutionResult",
    "SpectraResult",
    "SwapResult",
    "TimelineResult",
    "attention_knockout",
    "condensation",
    "condensation_timeline",
    "contributions",
    "depth_timeline",
    "embedding_map",
    "gradient_norms",
    "hidden_state_map",
    "information_flow",
    "layer_swaps",
    "linear_probes",
    "logit_lens",
    "pair_cosines",
    "residual_stats",
    "skip_effects",
    "solution_types",
    "spectra",
    "timeline",
    "token_masking",
]
