"""Analyzers: each a function ``(model, data, ...) -> Result`` (tidy ``.df``, ``.summary``,
``.figure()``, save/load)."""

from probekit.analyses.contributions import ContributionResult, contributions
from probekit.analyses.gradients import GradientResult, gradient_norms
from probekit.analyses.lens import LogitLensResult, logit_lens
from probekit.analyses.residual import ResidualResult, residual_stats
from probekit.analyses.result import Result
from probekit.analyses.skips import SkipEffectResult, skip_effects
from probekit.analyses.swaps import SwapResult, contiguous_blocks, layer_swaps

__all__ = [
    "ContributionResult",
    "GradientResult",
    "LogitLensResult",
    "ResidualResult",
    "Result",
    "SkipEffectResult",
    "SwapResult",
    "contiguous_blocks",
    "contributions",
    "gradient_norms",
    "layer_swaps",
    "logit_lens",
    "residual_stats",
    "skip_effects",
]
