"""Task data sources: the byte corpus of the LM runs (:mod:`probekit.tasks.corpus`).

The anchor-function task, with its trainer, lives in :mod:`probekit.anchor`.

Example:
    >>> from probekit.tasks.corpus import VOCAB_SIZE
    >>> VOCAB_SIZE
    259
"""
