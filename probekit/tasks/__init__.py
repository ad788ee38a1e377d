"""Task data sources: the byte corpus of the LM runs (:mod:`probekit.tasks.corpus`).

The anchor-function task lives in :mod:`probekit.anchor`; ``probekit.tasks.AnchorTask`` and
``probekit.tasks.AnchorData`` (and the module ``probekit.tasks.anchor``) name it still.

Example:
    >>> from probekit.tasks import AnchorTask
    >>> AnchorTask().seq_len
    9
"""

from probekit.anchor import SPLITS, AnchorData, AnchorTask

__all__ = ["SPLITS", "AnchorData", "AnchorTask"]
