"""probekit: how does a Transformer use its depth, and did it learn a rule or memorize?

The data's path: :func:`load` a model handle -> :mod:`probekit.interventions` ->
:mod:`probekit.analyses` (each returns a Result with ``.df``, ``.summary``, ``.figure()``) ->
figures and reports.

Example:
    >>> import probekit                                              # doctest: +SKIP
    >>> model = probekit.load("path/to/hf-checkpoint")               # doctest: +SKIP
    >>> probekit.contributions(model, tokens).summary["second_half_share"]  # doctest: +SKIP
"""

from probekit.analyses import (
    ContributionResult,
    GradientResult,
    LogitLensResult,
    ResidualResult,
    Result,
    SkipEffectResult,
    SwapResult,
    contributions,
    gradient_norms,
    layer_swaps,
    logit_lens,
    residual_stats,
    skip_effects,
)
from probekit.data import Batch, as_batches
from probekit.errors import (
    CheckpointError,
    ConfigError,
    InputError,
    NumericalError,
    ProbekitError,
    UnsupportedModelError,
)
from probekit.model import Model, Trace, load

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "CheckpointError",
    "ConfigError",
    "ContributionResult",
    "GradientResult",
    "InputError",
    "LogitLensResult",
    "Model",
    "NumericalError",
    "ProbekitError",
    "ResidualResult",
    "Result",
    "SkipEffectResult",
    "SwapResult",
    "Trace",
    "UnsupportedModelError",
    "__version__",
    "as_batches",
    "contributions",
    "gradient_norms",
    "layer_swaps",
    "load",
    "logit_lens",
    "residual_stats",
    "skip_effects",
]
