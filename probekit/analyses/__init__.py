"""Analyzers: each a function ``(model, data, ...) -> Result`` (tidy ``.df``, ``.summary``,
``.figure()``, save/load)."""

from probekit.analyses.condensation import (
    CondensationResult,
    SpectraResult,
    TimelineResult,
    condensation,
    condensation_timeline,
    spectra,
    stable_rank,
    weight_matrices,
)
from probekit.analyses.contributions import ContributionResult, contributions
from probekit.analyses.gradients import GradientResult, gradient_norms
from probekit.analyses.lens import LogitLensResult, logit_lens
from probekit.analyses.maps import (
    EmbeddingMapResult,
    HiddenMapResult,
    PairCosineResult,
    embedding_map,
    hidden_state_map,
    pair_cosines,
)
from probekit.analyses.masking import (
    FlowResult,
    KnockoutResult,
    MaskingResult,
    attention_knockout,
    information_flow,
    knock_out,
    knockout_hooks,
    token_masking,
)
from probekit.analyses.probes import ProbeResult, linear_probes
from probekit.analyses.residual import ResidualResult, residual_stats
from probekit.analyses.result import Result
from probekit.analyses.skips import SkipEffectResult, skip_effects
from probekit.analyses.solutions import SolutionResult, solution_types
from probekit.analyses.swaps import SwapResult, contiguous_blocks, layer_swaps
from probekit.analyses.timeline import DepthTimelineResult, depth_timeline

__all__ = [
    "CondensationResult",
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
    "contiguous_blocks",
    "contributions",
    "depth_timeline",
    "embedding_map",
    "gradient_norms",
    "hidden_state_map",
    "information_flow",
    "knock_out",
    "knockout_hooks",
    "layer_swaps",
    "linear_probes",
    "logit_lens",
    "pair_cosines",
    "residual_stats",
    "skip_effects",
    "solution_types",
    "spectra",
    "stable_rank",
    "token_masking",
    "weight_matrices",
]
