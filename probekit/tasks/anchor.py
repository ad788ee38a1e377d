"""The anchor task's former home: its names, re-exported from :mod:`probekit.anchor.task`
(where it lives now) so that ``from probekit.tasks.anchor import AnchorTask`` keeps working.

Example:
    >>> from probekit.tasks.anchor import AnchorTask
    >>> AnchorTask.__module__
    'probekit.anchor.task'
"""

from probekit.anchor.data import ROLE_OFFSETS, AnchorData, Pair
from probekit.anchor.task import KEY_SPLITS, LEGACY_FIELDS, SPECIAL_FORMS, SPLITS, AnchorTask

__all__ = [
    "KEY_SPLITS",
    "LEGACY_FIELDS",
    "ROLE_OFFSETS",
    "SPECIAL_FORMS",
    "SPLITS",
    "AnchorData",
    "AnchorTask",
    "Pair",
]
