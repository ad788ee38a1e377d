"""probekit's training machinery, shared by every task's trainer: GPT-2-style stacked models
(:mod:`~probekit.training.models`), the one training loop (:mod:`~probekit.training.loop`),
AdamW, schedules, precision, checkpoints, locks, memory checks and depth growth. A task's own
corpus, config and trainer live in the task's package, above this one: :mod:`probekit.anchor`
and :mod:`probekit.lm`.

Example:
    >>> from probekit.training import ModelConfig
    >>> ModelConfig(gamma=0.8).gammas()["qk"]
    0.8
"""

from probekit.training.loop import RunSettings, Trainer, run_loop, train_in_folder
from probekit.training.models import (
    ModelConfig,
    init_params,
    stacked_forward,
    to_hf_model,
)

__all__ = [
    "ModelConfig",
    "RunSettings",
    "Trainer",
    "init_params",
    "run_loop",
    "stacked_forward",
    "to_hf_model",
    "train_in_folder",
]
