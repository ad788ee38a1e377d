"""Text for any task: the standard library, a text file or a data set, read lazily for a
model's tokenizer (:mod:`probekit.tasks.text`).

A task's own data lives in its package: the anchor-function task in :mod:`probekit.anchor`,
the language-model task's byte corpus in :mod:`probekit.lm`. Built-in generated tasks:
:mod:`probekit.tasks.compositions` (compositions of primitive operations with held-out
combinations, for fine-tuning byte-level LMs).

Example:
    >>> from probekit.tasks.text import VALIDATION_FRACTION
    >>> VALIDATION_FRACTION
    0.05
"""
