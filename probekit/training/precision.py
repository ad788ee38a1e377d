"""Precision and determinism of both trainers, and moving host data onto the device.

``precision`` (a setting of every trainer's config,
:class:`~probekit.training.loop.RunSettings`):

- ``"auto"`` (default): bf16 autocast on CUDA, float32 on CPU;
- ``"fp32"``: float32 everywhere (no autocast);
- ``"bf16"``: forwards under ``torch.autocast(device, bfloat16)``, on CUDA and on CPU alike
  (CPU autocast runs the matrix products in bf16; it is slower than float32 on most CPUs and
  is there to check a bf16 run without a GPU).

Master weights, gradients and the AdamW moments are float32 in every mode; only the forward's
matrix products run in bf16 under autocast, and the losses are taken in float32.

Determinism (``deterministic=True``): :func:`deterministic_mode` turns on
``torch.use_deterministic_algorithms(True)`` while the run trains (restored afterwards). On
CPU the trainers are deterministic without it: the same settings, thread count and machine
give bit-identical weights, and a resumed run ends bit-identical to an uninterrupted one.
On CUDA, bit-identical results are not expected by default (atomics in some backward
kernels, cuBLAS workspace choices); with ``deterministic=True`` a run repeats bit for bit on
the same GPU, driver and torch build, which needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (or
``:16:8``) in the environment before the process starts (refused with a ConfigError when it
is not set). Results still differ between CPU and CUDA and between GPU models. Not run on a
GPU yet: an op without a deterministic CUDA kernel makes torch raise a RuntimeError naming it.

Example:
    >>> resolve_precision("auto", torch.device("cpu"))
    'fp32'
    >>> with autocast(torch.device("cpu"), "bf16"):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from probekit.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16")
#: values of CUBLAS_WORKSPACE_CONFIG under which cuBLAS is deterministic
_CUBLAS = (":4096:8", ":16:8")


def check_precision(value: object) -> None:
    """``value`` is one of :data:`PRECISIONS`."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ConfigError(
            f"precision {value!r} is not one of {list(PRECISIONS)}",
            fix="use auto (bf16 autocast on CUDA, fp32 on CPU), fp32 or bf16",
        )


def resolve_precision(precision: str, device: torch.device) -> str:
    """``"fp32"`` or ``"bf16"``: what ``precision`` means on ``device``."""
    check_precision(precision)
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def autocast(device: torch.device, precision: str = "auto") -> AbstractContextManager:
    """The forward's autocast context: bf16 when ``precision`` resolves to it, else none."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def check_deterministic(deterministic: object, device: torch.device) -> None:
    """``deterministic`` is a bool, and on CUDA cuBLAS can be made deterministic."""
    if not isinstance(deterministic, bool):
        raise ConfigError(
            f"deterministic = {deterministic!r} must be true or false", fix="use True or False"
        )
    if deterministic and device.type == "cuda":
        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in _CUBLAS:
            raise ConfigError(
                "deterministic training on CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8)"
                " in the environment",
                fix="export CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting Python",
            )


@contextmanager
def deterministic_mode(enabled: bool, device: torch.device) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` inside the block when ``enabled``;
    the previous setting is restored on exit."""
    check_deterministic(enabled, device)
    if not enabled:
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (host data) on ``device`` without a host sync: on CUDA through pinned memory
    with ``non_blocking=True``; on CPU ``t`` itself."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


__all__ = [
    "PRECISIONS",
    "autocast",
    "check_deterministic",
    "check_precision",
    "deterministic_mode",
    "resolve_precision",
    "to_device",
]
