"""probekit: how does a Transformer use its depth, and did it learn a rule or memorize?

The data's path: :func:`load` a model handle -> :mod:`probekit.interventions` ->
:mod:`probekit.analyses` (each returns a Result with ``.df``, ``.summary``, ``.figure()``) ->
figures and reports.

Example:
    >>> import probekit
    >>> from probekit.toy import toy_hf_model, toy_tokens
    >>> model = probekit.load(toy_hf_model("gpt2", n_layers=2))   # or a checkpoint folder
    >>> res = probekit.contributions(model, toy_tokens())
    >>> 0 <= res.summary["second_half_share"] <= 1
    True
"""

from typing import TYPE_CHECKING

from probekit import analyses as _analyses
from probekit.errors import (
    CheckpointError,
    ConfigError,
    InputError,
    NumericalError,
    ProbekitError,
    UnsupportedModelError,
)
from probekit.lazy import lazy_exports
from probekit.openmp import wait_passively

if TYPE_CHECKING:  # the same names, so a type checker sees them as they are, not as Any
    from probekit.analyses import (  # noqa: F401
        AttributionResult,
        CondensationResult,
        CondensationTimelineResult,
        ContributionResult,
        DepthTimelineResult,
        EmbeddingMapResult,
        FlowResult,
        GradientResult,
        HiddenMapResult,
        KnockoutResult,
        LogitLensResult,
        LossResult,
        MaskingResult,
        PairCosineResult,
        PatchingResult,
        ProbeResult,
        ResidualResult,
        SimilarityResult,
        SkipEffectResult,
        SolutionResult,
        SpectraResult,
        SwapResult,
        TimelineResult,
        TokenLensResult,
        TunedLens,
        TunedLensResult,
        activation_patching,
        attention_knockout,
        condensation,
        condensation_timeline,
        contributions,
        depth_timeline,
        direct_logit_attribution,
        embedding_map,
        gradient_norms,
        hidden_state_map,
        information_flow,
        layer_similarity,
        layer_swaps,
        linear_probes,
        logit_lens,
        model_loss,
        pair_cosines,
        perplexity,
        residual_stats,
        skip_effects,
        solution_types,
        spectra,
        timeline,
        token_lens,
        token_masking,
        tuned_lens,
    )
    from probekit.anchor import AnchorData, AnchorTask, train  # noqa: F401
    from probekit.data import Batch, TaskData  # noqa: F401
    from probekit.interventions import InterventionSetting  # noqa: F401
    from probekit.lm import train_lm  # noqa: F401
    from probekit.model.handle import Model  # noqa: F401
    from probekit.model.loading import load  # noqa: F401
    from probekit.report import diagnose  # noqa: F401
    from probekit.result import Result  # noqa: F401
    from probekit.run_folders import load_run  # noqa: F401

__version__ = "0.1.0"

wait_passively()  # before torch loads OpenMP, where probekit is imported first (probekit.openmp)

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(_analyses.__all__, "probekit.analyses"),
    "load": "probekit.model",
    "Model": "probekit.model",
    "Batch": "probekit.data",
    "TaskData": "probekit.data",
    "Result": "probekit.result",
    "AnchorTask": "probekit.anchor",
    "AnchorData": "probekit.anchor",
    "train": "probekit.anchor",
    "train_lm": "probekit.lm",
    "load_run": "probekit.run_folders",
    "diagnose": "probekit.report",
    "InterventionSetting": "probekit.interventions",
}
"""Public name -> the module it lives in; imported on first use, so ``import probekit`` (and
the CLI's argument errors) do not wait for torch, transformers and scikit-learn."""

__all__ = [
    *_EXPORTS,
    "CheckpointError",
    "ConfigError",
    "InputError",
    "NumericalError",
    "ProbekitError",
    "UnsupportedModelError",
    "__version__",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
