"""probekit's trainer for the anchor-function tasks: models, training runs, stacked sweeps.

Example:
    >>> from probekit.training import ModelConfig, TrainConfig
    >>> TrainConfig(model=ModelConfig(gamma=0.8)).model.gammas()["qk"]
    0.8
"""

from probekit.training.models import (
    ModelConfig,
    init_params,
    stacked_forward,
    to_hf_model,
)
from probekit.training.runs import RunInfo, load_run
from probekit.training.trainer import (
    RunOutput,
    TrainConfig,
    anchor_cpu_config,
    train,
    train_stack,
)

__all__ = [
    "ModelConfig",
    "RunInfo",
    "RunOutput",
    "TrainConfig",
    "anchor_cpu_config",
    "init_params",
    "load_run",
    "stacked_forward",
    "to_hf_model",
    "train",
    "train_stack",
]
