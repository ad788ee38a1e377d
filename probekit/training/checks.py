"""Checks of single settings shared by the trainers' configs: each raises one ConfigError.

Booleans are not integers here (``steps=True`` is refused), floats are not integers
(``steps=2.0`` is refused), and every real-valued setting must be finite.

Example:
    >>> check_int("steps", 3)
    >>> try:
    ...     check_int("steps", True)
    ... except ConfigError as err:
    ...     print(err)
    steps = True must be a positive integer. Fix: set steps to a positive integer.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, TypeGuard

from probekit.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

#: seeds are drawn into 32 bits by numpy and torch alike
SEED_LIMIT = 2**32

MAX_LAYERS = 4096
"""The deepest model the trainers build. Every layer is a step of a Python loop in each forward
and backward and costs about 128 KiB whatever its width
(:data:`~probekit.training.memory.LAYER_OVERHEAD_BYTES`): ``--n-layers 100000`` ran for 300 s
with its memory past 6 GB (issue 25); at width 8 it had not finished a step after 60 s here
(3.4 GB), and 2000 layers of width 8 took 165 s for two steps with their evaluations and
checkpoints."""

MAX_STEPS = 10**8
"""The most optimizer steps a run takes: 10**8 steps are days even at a millisecond a step
(the smallest anchor runs take a few milliseconds a step on CPU), so a larger count is a typo,
not a plan; below it the progress bar shows the time left."""

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def is_int(value: Any) -> TypeGuard[int | np.integer]:
    """True for a Python or numpy integer that is not a bool."""
    import numpy as np

    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def is_real(value: Any) -> bool:
    """True for a finite int or float that is not a bool."""
    import numpy as np

    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


def check_int(name: str, value: Any, low: int = 1, high: int | None = None) -> None:
    """``value`` is an integer in ``[low, high)`` (no upper bound when ``high`` is None)."""
    if high is not None:
        want = f"an integer in [{low}, {high})"
    else:
        want = "a positive integer" if low == 1 else f"an integer >= {low}"
    if not is_int(value) or value < low or (high is not None and value >= high):
        raise ConfigError(f"{name} = {value!r} must be {want}", fix=f"set {name} to {want}")


def check_optional_int(name: str, value: Any, low: int = 1) -> None:
    """``value`` is None or an integer >= ``low``."""
    if value is not None:
        check_int(name, value, low)


def check_real(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    positive: bool = False,
    example: str = "",
) -> None:
    """``value`` is a finite number in ``[low, high]`` (``> 0`` when ``positive``)."""
    ok = is_real(value)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    ok = ok and (not positive or value > 0)
    if not ok:
        parts = ["a finite number"]
        parts += ["> 0"] if positive else []
        parts += [f">= {low}"] if low is not None and not positive else []
        parts += [f"<= {high}"] if high is not None else []
        want = " ".join(parts)
        raise ConfigError(
            f"{name} = {value!r} must be {want}",
            fix=f"set {name} to {example or 'a number ' + want.replace('a finite number ', '')}",
        )


#: why :data:`MAX_STEPS` bounds ``steps`` and :data:`MAX_LAYERS` the depth (their refusals say it)
STEPS_WHY = "steps a run takes (days even at a millisecond a step)"
DEPTH_WHY = (
    "layers the trainers build (each layer is a pass of a Python loop in every step and about "
    "128 KiB of memory)"
)


def check_bounded(name: str, value: Any, limit: int, why: str) -> None:
    """``value`` is an integer in ``[1, limit]``; above it, a :class:`ConfigError` saying
    ``why`` the bound exists."""
    check_int(name, value)
    if value > limit:
        raise ConfigError(
            f"{name} = {value} is more than the {limit} {why}", fix=f"use {name} <= {limit}"
        )


def check_seed(name: str, value: Any) -> None:
    """A seed: an integer in ``[0, 2**32)``."""
    check_int(name, value, 0, SEED_LIMIT)


def check_device_name(value: Any) -> None:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:<index>`` (whether CUDA exists is checked when a
    run starts, so a GPU run's settings still load on a CPU machine)."""
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise ConfigError(f"unknown device {value!r}", fix="use auto, cpu, cuda or cuda:<index>")


def check_flag(name: str, value: Any) -> None:
    """``value`` is a bool."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} = {value!r} must be true or false", fix=f"set {name} to a bool")


def check_mapping(what: str, value: Any) -> dict:
    """``value`` is a JSON object (a dict); returns a copy."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"the {what} settings are {type(value).__name__} {value!r:.60}, not an object",
            fix=f"write the {what} settings as a JSON object of name: value",
        )
    return dict(value)


def check_str(name: str, value: Any, optional: bool = False) -> None:
    """``value`` is a string (or None when ``optional``)."""
    if not (isinstance(value, str) or (optional and value is None)):
        raise ConfigError(f"{name} = {value!r} must be a string", fix=f"set {name} to a string")


__all__ = [
    "MAX_LAYERS",
    "MAX_STEPS",
    "SEED_LIMIT",
    "DEPTH_WHY",
    "STEPS_WHY",
    "check_bounded",
    "check_device_name",
    "check_flag",
    "check_int",
    "check_mapping",
    "check_optional_int",
    "check_real",
    "check_seed",
    "check_str",
    "is_int",
    "is_real",
]
