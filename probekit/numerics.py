"""General numerics the model handle, the training loops and the analyses share.

Nothing here knows a model: finiteness tests, free memory, the relative tolerances of
comparisons between computations, the guard that turns torch's "not implemented for
Half" into one probekit error, and the one-thread setting of NumPy/SciPy's BLAS for the
scikit-learn fits.

Example:
    >>> import torch
    >>> all_finite(torch.tensor([1.0, float("inf")]))
    False
    >>> within_tolerance(torch.tensor([1.0]), torch.tensor([1.0005]), tolerance(torch.float32))
    True
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from probekit.errors import UnsupportedModelError


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is finite: its sum first (one pass, no boolean
    copy; a NaN or infinity makes it non-finite), the element-wise test only when the sum is
    not finite (a finite tensor whose sum overflows).

    Example:
        >>> all_finite(torch.tensor([1.0, 2.0])), all_finite(torch.tensor([1.0, float("nan")]))
        (True, False)
        >>> all_finite(torch.tensor([3e38, 3e38]))  # the sum overflows, every value is finite
        True
    """
    if not tensor.is_floating_point() and not tensor.is_complex():
        return True
    tensor = tensor.detach()
    if bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


def available_memory(device: torch.device | str = "cpu") -> int | None:
    """Bytes free on ``device`` now (CPU: MemAvailable of the host); None when unknown.

    Example:
        >>> (available_memory() or 1) > 0
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):  # pragma: no cover - CUDA broken
            return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # pragma: no cover - not POSIX
        return None


def tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of a comparison between two computations in ``dtype`` (the
    structure and replay checks of a model): 1e-3 from 32 bits up, else 5e-2."""
    return 1e-3 if torch.finfo(dtype).bits >= 32 else 5e-2


def within_tolerance(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    """max |got - want| <= tol * max |want| (float64)."""
    got, want = got.double(), want.double()
    return bool((got - want).abs().max() <= tol * want.abs().max().clamp_min(1e-12))


def relative_deviation(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(1, max |want|) in float64 (NaN if either is not finite)."""
    got, want = got.double(), want.double()
    if not (all_finite(got) and all_finite(want)):
        return math.nan
    return float((got - want).abs().max() / want.abs().max().clamp_min(1.0))


@contextmanager
def dtype_guard(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Turn torch's 'not implemented for Half/BFloat16' into one probekit error naming the fix."""
    try:
        yield
    except (RuntimeError, NotImplementedError) as err:
        if "not implemented for" not in str(err) and "not supported" not in str(err):
            raise
        raise UnsupportedModelError(
            f"torch on {device.type} cannot run this model in {dtype} ({err})",
            fix="load it in a dtype the device runs: probekit.load(..., dtype=torch.float32) "
            "(or bfloat16), or use a GPU",
        ) from err


@functools.cache
def _blas_pools() -> Any:
    """threadpoolctl's view of the loaded BLAS libraries (NumPy's and SciPy's), found once."""
    import scipy.linalg  # noqa: F401  (loads SciPy's BLAS, so the controller sees it too)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run NumPy/SciPy linear algebra (scikit-learn's fits) on one BLAS thread inside.

    The probes, maps and clusterings fit many small problems (hundreds to a few thousand rows,
    d_model columns). OpenBLAS's worker threads busy-wait between such calls: on two idle
    cores a logistic probe ran 1.3-3.6x faster on one thread, and beside another busy process
    the two-thread pool lost the cores it spun on (``benchmarks/bench_load.py`` prints the
    phases of the quick demo idle and beside a busy process). torch's own threads are not
    touched; the previous limits come back on exit.

    Example:
        >>> import numpy as np
        >>> with one_blas_thread():
        ...     float(np.linalg.norm(np.ones(4)))
        2.0
    """
    with _blas_pools().limit(limits=1, user_api="blas"):
        yield


__all__ = [
    "all_finite",
    "available_memory",
    "dtype_guard",
    "one_blas_thread",
    "relative_deviation",
    "tolerance",
    "within_tolerance",
]
