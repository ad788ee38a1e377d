"""Memory estimates of training runs, checked before anything is built.

A run needs its parameters, their gradients and two AdamW moments (4 float32 copies), the task's
token tensors, the activations of one batch and a fixed cost per layer
(:data:`LAYER_OVERHEAD_BYTES`). :func:`check_fits` compares that estimate with
the memory available on the run's device (``MemAvailable`` of ``/proc/meminfo`` on CPU, the free
memory on CUDA) and refuses what cannot fit, naming both numbers.

Example:
    >>> check_fits(1000, torch.device("cpu"), "a tiny run")
    >>> try:
    ...     check_fits(2**80, torch.device("cpu"), "an impossible run")
    ... except ConfigError as err:
    ...     print(str(err)[:40])
    an impossible run needs about 1208925819
"""

from __future__ import annotations

import torch

from probekit.errors import ConfigError
from probekit.numerics import available_memory

#: bytes per parameter while training: float32 weights, gradients and two AdamW moments
TRAIN_BYTES_PER_PARAM = 16

LAYER_OVERHEAD_BYTES = 128 * 1024
"""Bytes a layer costs while training whatever its width: the autograd graph's nodes of one
step, the tensor and module objects, the Hugging Face model a checkpoint is written through.
Measured on CPU (anchor trainer, ``d_model`` 8, one sequence per batch): peak memory grew by
143 KB per layer from 500 to 2000 layers, of which the parameters and activations counted above
make 22 KB. At small widths this term dominates: 100000 layers of width 8 need 13 GB for it
alone, where the parameters, moments and activations came to 1.5 GB (issue 25)."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def check_fits(needed: int, device: torch.device, what: str) -> None:
    """Raise :class:`ConfigError` when ``needed`` bytes exceed what ``device`` has free."""
    free = available_memory(device)
    if free is not None and needed > free:
        raise ConfigError(
            f"{what} needs about {needed} bytes ({_gib(needed)}) on {device}, but only "
            f"{free} bytes ({_gib(free)}) are available",
            fix="use a smaller model, fewer or shorter sequences, a smaller batch or fewer "
            "stacked runs (--max-stack)",
        )


__all__ = [
    "LAYER_OVERHEAD_BYTES",
    "TRAIN_BYTES_PER_PARAM",
    "available_memory",
    "check_fits",
]
