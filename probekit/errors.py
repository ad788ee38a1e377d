"""probekit's error hierarchy.

Every problem probekit detects in its input raises a subclass of :class:`ProbekitError` whose
message names the problem *and* the fix. The CLI catches :class:`ProbekitError`, prints its
message on one line and exits with status 2.

Example:
    >>> from probekit.errors import InputError
    >>> try:
    ...     raise InputError("token id 300 >= vocabulary size 201", fix="map tokens into [0, 201)")
    ... except InputError as err:
    ...     print(err)
    token id 300 >= vocabulary size 201. Fix: map tokens into [0, 201).
"""

from __future__ import annotations


class ProbekitError(Exception):
    """Base class of every error probekit raises on bad input or impossible requests."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. Fix: {fix}." if fix else problem)


class CheckpointError(ProbekitError):
    """A checkpoint path is missing, incomplete or corrupt."""


class UnsupportedModelError(ProbekitError):
    """The model's architecture is not one probekit can attach to."""


class InputError(ProbekitError):
    """Data handed to an analyzer is malformed (token ids, shapes, masks, empty data)."""


class ConfigError(ProbekitError):
    """A configuration (task, training run, analysis option) is invalid or impossible."""


class NumericalError(ProbekitError):
    """NaN or infinite values in weights, activations or losses."""


class ProbekitWarning(UserWarning):
    """Something the user should know that is no error (data other than they may think); the
    CLI prints it as one line, ``probekit: warning: ...``, even with ``--quiet``."""


def check_known_keys(settings: dict, known: set[str], what: str) -> None:
    """Raise :class:`ConfigError` naming any key of ``settings`` outside ``known``.

    Example:
        >>> check_known_keys({"steps": 3}, {"steps", "lr"}, "training")
    """
    unknown = set(settings) - set(known)
    if unknown:
        raise ConfigError(
            f"unknown {what} settings {sorted(unknown)}", fix=f"use only {sorted(known)}"
        )


__all__ = [
    "check_known_keys",
    "ProbekitError",
    "CheckpointError",
    "UnsupportedModelError",
    "InputError",
    "ConfigError",
    "NumericalError",
]
