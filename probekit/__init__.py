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

from probekit.analyses import *  # noqa: F403  (the analyzers and their results)
from probekit.analyses import __all__ as _analyses
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
    *_analyses,
    "Batch",
    "CheckpointError",
    "ConfigError",
    "InputError",
    "Model",
    "NumericalError",
    "ProbekitError",
    "Trace",
    "UnsupportedModelError",
    "__version__",
    "as_batches",
    "load",
]
