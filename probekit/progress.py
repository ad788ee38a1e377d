"""A live line for long work: what runs now and how far it is, on stderr.

A command opens a :func:`phase` around each piece of work (an analysis of ``probekit
diagnose``, a phase of the demo); the work counts its steps with :func:`advance`, which costs
one context-variable read when no phase is open. Every intervention's resumed blocks pass
through :meth:`probekit.model.Trace.run_module`, which advances by the block passes it runs, so
each analysis shows how many block passes it has done and at what rate while it runs, without
an analyzer knowing about progress. ``enabled=False`` (``--quiet``) shows nothing.

Example:
    >>> with phase("counting", enabled=False) as line:
    ...     advance(3)
    ...     advance()
    >>> line.done
    4
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


class Line:
    """One phase's live line (a tqdm bar without a total unless one is known)."""

    def __init__(self, what: str, unit: str, enabled: bool, total: int | None) -> None:
        self.done = 0
        self.bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                desc=what, unit=f" {unit}", total=total, leave=False, dynamic_ncols=True,
                mininterval=0.5,
            )  # fmt: skip

    def advance(self, n: int) -> None:
        """Count ``n`` more steps."""
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        """Take the line down."""
        if self.bar is not None:
            self.bar.close()


_OPEN: ContextVar[Line | None] = ContextVar("probekit_progress_line", default=None)


@contextmanager
def phase(
    what: str, *, unit: str = "block passes", enabled: bool = True, total: int | None = None
) -> Iterator[Line]:
    """Show a live line naming ``what`` while the block runs; :func:`advance` counts on it.
    A phase that is not shown inside one that is counts on the outer line (the demo's
    "depth diagnosis" line counts the passes of the quiet diagnosis inside it)."""
    outer = _OPEN.get()
    if not enabled and outer is not None:
        yield outer
        return
    line = Line(what, unit, enabled, total)
    token = _OPEN.set(line)
    try:
        yield line
    finally:
        _OPEN.reset(token)
        line.close()


def advance(n: int = 1) -> None:
    """Count ``n`` steps on the open phase's line (nothing when none is open)."""
    line = _OPEN.get()
    if line is not None:
        line.advance(n)


__all__ = ["Line", "advance", "phase"]
