"""The anchor-function compositional task, in one place: what a model learns and how its
answers are named.

* :mod:`probekit.anchor.task`: :class:`AnchorTask`, the task's settings, data generation
  and per-pair scoring;
* :mod:`probekit.anchor.data`: :class:`AnchorData`, one split, the
  :class:`~probekit.data.TaskData` the analyzers and the report ask;
* :mod:`probekit.anchor.solutions`: the answer categories (inferential, symmetric, other;
  memorizing), the rule that sorts predictions into them, and their words in figures and
  reports.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> data = AnchorTask(n_train=64, n_test=16).dataset("test_task")
    >>> data.classify(data.composite)["inferential"].mean().item()
    1.0
"""

from probekit.anchor.data import AnchorData
from probekit.anchor.solutions import CATEGORIES, WORDING
from probekit.anchor.task import KEY_SPLITS, SPECIAL_FORMS, SPLITS, AnchorTask

__all__ = [
    "CATEGORIES",
    "KEY_SPLITS",
    "SPECIAL_FORMS",
    "SPLITS",
    "WORDING",
    "AnchorData",
    "AnchorTask",
]
