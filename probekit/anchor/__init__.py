"""The anchor-function compositional task, in one place: what a model learns, how its answers
are named, and how probekit trains, sweeps and evaluates models on it.

* :mod:`probekit.anchor.task`: :class:`AnchorTask`, the task's settings, data generation
  and per-pair scoring;
* :mod:`probekit.anchor.data`: :class:`AnchorData`, one split, the
  :class:`~probekit.data.TaskData` the analyzers and the report ask;
* :mod:`probekit.anchor.solutions`: the answer categories (inferential, symmetric, other;
  memorizing), the rule that sorts predictions into them, and their words in figures and
  reports;
* :mod:`probekit.anchor.config`: :class:`TrainConfig` (a run's settings) and the presets
  (:func:`anchor_cpu_config`);
* :mod:`probekit.anchor.training`: :func:`train` and :func:`train_stack`, the anchor runs on
  the shared training loop (:mod:`probekit.training.loop`);
* :mod:`probekit.anchor.evaluation` and :mod:`probekit.anchor.stack_io`: a stack's scores on
  every split, its checkpoints;
* :mod:`probekit.anchor.curves`: :func:`pair_curves`, every pair's accuracy over training
  (the per-pair convergence curves of the run's report);
* :mod:`probekit.anchor.sweep`: :func:`run_sweep` over gamma x weight decay x depth x seeds,
  and the phase diagrams.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> data = AnchorTask(n_train=64, n_test=16).dataset("test_task")
    >>> data.classify(data.composite)["inferential"].mean().item()
    1.0
"""

from typing import TYPE_CHECKING

from probekit.anchor.config import PRESETS, TrainConfig, anchor_cpu_config
from probekit.anchor.data import AnchorData
from probekit.anchor.solutions import CATEGORIES, WORDING
from probekit.anchor.task import KEY_SPLITS, SPECIAL_FORMS, SPLITS, AnchorTask
from probekit.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, so a type checker sees them as they are, not as Any
    from probekit.anchor.curves import PairCurvesResult, pair_curves  # noqa: F401
    from probekit.anchor.sweep import SweepConfig, SweepResult, run_sweep  # noqa: F401
    from probekit.anchor.training import RunOutput, train, train_stack  # noqa: F401

_TRAINING: dict[str, str] = {
    "RunOutput": "probekit.anchor.training",
    "train": "probekit.anchor.training",
    "train_stack": "probekit.anchor.training",
    "SweepConfig": "probekit.anchor.sweep",
    "SweepResult": "probekit.anchor.sweep",
    "run_sweep": "probekit.anchor.sweep",
    # --- per-pair convergence curves ---
    "PairCurvesResult": "probekit.anchor.curves",
    "pair_curves": "probekit.anchor.curves",
}
"""Training and sweep names -> their module, imported on first use: the task alone (what the
analyzers ask) does not wait for pandas and plotly."""

__all__ = [
    "CATEGORIES",
    "KEY_SPLITS",
    "PRESETS",
    "SPECIAL_FORMS",
    "SPLITS",
    "WORDING",
    "AnchorData",
    "AnchorTask",
    "PairCurvesResult",
    "RunOutput",
    "SweepConfig",
    "SweepResult",
    "TrainConfig",
    "anchor_cpu_config",
    "pair_curves",
    "run_sweep",
    "train",
    "train_stack",
]


__getattr__, __dir__ = lazy_exports(__name__, _TRAINING)
