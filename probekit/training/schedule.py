"""The learning-rate schedule both trainers use: linear warmup, then cosine decay.

Example:
    >>> warmup_cosine(0, steps=100, warmup_steps=10)
    0.1
    >>> warmup_cosine(100, steps=100, warmup_steps=10, min_lr_ratio=0.1)
    0.1
"""

from __future__ import annotations

import math

import torch

from probekit.errors import ConfigError


def warmup_cosine(step: int, steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """The multiplier of the peak learning rate at update ``step`` (0-based).

    ``(step + 1) / warmup_steps`` during warmup, then a cosine from 1 down to ``min_lr_ratio``
    at ``steps`` (held there after it).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def resolve_device(name: str | None = "auto") -> torch.device:
    """``"auto"`` (or None): CUDA when present, else CPU; a named CUDA device must exist.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"unknown device {name!r}", fix="use auto, cpu or cuda") from err
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device {name!r}", fix="use auto, cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device cuda requested but CUDA is not available", fix="use --device cpu or auto"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device {name} requested but only {torch.cuda.device_count()} CUDA device(s) exist",
            fix="use cuda:0 .. cuda:<count - 1>, or auto",
        )
    return dev


__all__ = ["resolve_device", "warmup_cosine"]
