"""Synthetic tasks: the anchor-function compositional task.

Example:
    >>> from probekit.tasks import AnchorTask
    >>> AnchorTask().seq_len
    9
"""

from probekit.tasks.anchor import SPLITS, AnchorData, AnchorTask

__all__ = ["SPLITS", "AnchorData", "AnchorTask"]
