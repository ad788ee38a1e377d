"""A live line for long work: what runs now, how far it is and when it ends, on stderr.

A command opens a :func:`phase` around each piece of work (an analysis of ``probekit
diagnose``, a phase of the demo). Two counts feed its line:

- **block passes**: every intervention's resumed blocks pass through
  :meth:`probekit.model.Trace.run_module`, which calls :func:`advance`, so each phase shows how
  many block passes it has done and at what rate, without an analyzer knowing about progress;
- **variants**: an analyzer that knows how much it will run says so once with :func:`expect`
  (``expect(30, "variants")``: 10 layers x 3 components) and counts each one done with
  :func:`step`; the line then reads ``12/30 variants [00:10<00:15 ...]``, that is done / total,
  the time so far and the estimated time left, with the block passes beside it.

Both cost one context-variable read when no phase is open. ``enabled=False`` (``--quiet``)
shows nothing. When stderr is no terminal (a log file, a pipe, a CI job) a line is not redrawn:
each phase writes one plain line as it ends, without carriage returns or cursor escapes
(:func:`bar` makes every progress bar of probekit, :class:`PlainBar` is that line).

Example:
    >>> with phase("counting", enabled=False) as line:
    ...     expect(2, "variants")
    ...     advance(3)
    ...     step()
    >>> line.done, line.steps, line.total
    (3, 1, 2)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")


def live(file: Any = None) -> bool:
    """Whether a progress bar on ``file`` (default stderr) can be redrawn in place: a terminal,
    or a Jupyter notebook (where tqdm draws a widget)."""
    file = sys.stderr if file is None else file
    if _notebook():
        return True
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


def _notebook() -> bool:
    """Whether tqdm.auto draws notebook widgets here (a Jupyter kernel with ipywidgets)."""
    if not {"ipykernel.zmqshell", "IPython.utils._process_emscripten"} & set(sys.modules):
        return False
    import tqdm.auto  # noqa: F401  (imports tqdm.autonotebook without its warning)
    from tqdm import autonotebook, std

    return autonotebook.tqdm is not std.tqdm


class PlainBar:
    """A tqdm bar's few methods that probekit uses, shown as one plain line when it closes
    (``desc: done/total unit, postfix (seconds)``) for output that is no terminal.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> with PlainBar(desc="steps", total=3, unit="step", file=out) as bar:
        ...     bar.update(3)
        >>> out.getvalue().split(" (")[0]
        'steps: 3/3 step'
    """

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        desc: str = "",
        total: int | None = None,
        unit: str = "it",
        initial: int = 0,
        disable: bool = False,
        file: Any = None,
        **_: Any,
    ) -> None:
        self.iterable, self.desc, self.unit, self.disable = iterable, desc or "", unit, disable
        if total is None and isinstance(iterable, Sequence):
            total = len(iterable)
        self.n, self.total, self.postfix = initial, total, ""
        self.file, self.start, self.closed = file, time.perf_counter(), False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update()
        self.close()

    def __enter__(self) -> PlainBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def reset(self, total: int | None = None) -> None:
        self.n, self.total = 0, total

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def set_postfix(self, refresh: bool = True, **numbers: Any) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in numbers.items())

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def close(self) -> None:
        """Write the one line (once; nothing when disabled)."""
        if self.closed or self.disable:
            self.closed = True
            return
        self.closed = True
        count = f"{self.n:,}" + (f"/{self.total:,}" if self.total is not None else "")
        words = [f"{count} {self.unit.strip()}"] + ([self.postfix] if self.postfix else [])
        seconds = time.perf_counter() - self.start
        text = f"{self.desc}: {', '.join(words)} ({seconds:.1f} s)"
        print(text, file=sys.stderr if self.file is None else self.file, flush=True)


def bar(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A progress bar: tqdm (``tqdm.auto``, with ``kwargs``) where it can redraw its line
    (:func:`live`), else a :class:`PlainBar` that writes one plain line when it closes."""
    if kwargs.get("disable") or not live(kwargs.get("file")):
        return PlainBar(iterable, **kwargs)
    from tqdm.auto import tqdm

    return tqdm(iterable, **kwargs)


class Line:
    """One phase's live line: a tqdm bar of block passes, or of variants once a total is
    expected (the block passes then stand beside it)."""

    def __init__(self, what: str, unit: str, enabled: bool, total: int | None) -> None:
        self.done = 0  # block passes (or the phase's own unit)
        self.steps = 0  # variants, once expected
        self.total: int | None = None
        self.unit = unit
        self.bar: Any = None
        if enabled:
            self.bar = bar(
                desc=what, unit=f" {unit}", total=total, leave=False, dynamic_ncols=True,
                mininterval=0.5,
            )  # fmt: skip

    def advance(self, n: int) -> None:
        """Count ``n`` more block passes."""
        self.done += n
        if self.bar is None:
            return
        if self.total is None:
            self.bar.update(n)
        else:
            self.bar.set_postfix_str(f"{self.done:,} {self.unit}", refresh=False)

    def expect(self, total: int, unit: str) -> None:
        """From now on the line counts ``total`` ``unit`` (done / total and the time left)."""
        self.total, self.steps = int(total), 0
        if self.bar is not None:
            self.bar.unit = f" {unit}"
            self.bar.reset(total=self.total)
            self.bar.set_postfix_str(f"{self.done:,} {self.unit}", refresh=False)

    def step(self, n: int) -> None:
        """Count ``n`` more of the expected variants."""
        self.steps += n
        if self.bar is not None and self.total is not None:
            self.bar.update(n)

    def close(self) -> None:
        """Take the line down."""
        if self.bar is not None:
            self.bar.close()


_OPEN: ContextVar[Line | None] = ContextVar("probekit_progress_line", default=None)
# whether the open line belongs to the innermost phase (a quiet phase inside a shown one counts
# its block passes on the outer line but must not set that line's total)
_OWNED: ContextVar[bool] = ContextVar("probekit_progress_owned", default=True)


@contextmanager
def phase(
    what: str, *, unit: str = "block passes", enabled: bool = True, total: int | None = None
) -> Iterator[Line]:
    """Show a live line naming ``what`` while the block runs; :func:`advance`, :func:`expect`
    and :func:`step` count on it. A phase that is not shown inside one that is counts its block
    passes on the outer line (the demo's "depth diagnosis" line counts the passes of the quiet
    diagnosis inside it) and leaves that line's total alone."""
    outer = _OPEN.get()
    if not enabled and outer is not None:
        quiet = _OWNED.set(False)
        try:
            yield outer
        finally:
            _OWNED.reset(quiet)
        return
    line = Line(what, unit, enabled, total)
    token, owned = _OPEN.set(line), _OWNED.set(True)
    try:
        yield line
    finally:
        _OWNED.reset(owned)
        _OPEN.reset(token)
        line.close()


def advance(n: int = 1) -> None:
    """Count ``n`` block passes on the open phase's line (nothing when none is open)."""
    line = _OPEN.get()
    if line is not None:
        line.advance(n)


def expect(total: int, unit: str = "variants") -> None:
    """Say that the open phase will run ``total`` ``unit`` (nothing when none is open or the
    line belongs to an outer phase)."""
    line = _OPEN.get()
    if line is not None and _OWNED.get():
        line.expect(total, unit)


def step(n: int = 1) -> None:
    """Count ``n`` of the expected variants done (nothing when none is open or expected)."""
    line = _OPEN.get()
    if line is not None and _OWNED.get():
        line.step(n)


def counted(items: Sequence[T], unit: str = "batches") -> Iterator[T]:
    """Iterate over ``items``, expecting ``len(items)`` ``unit`` on the open line and counting
    each one when the loop body has run (``for batch in counted(batches): ...``).

    Example:
        >>> with phase("batches", enabled=False) as line:
        ...     _ = [batch for batch in counted(["a", "b"])]
        >>> line.steps, line.total
        (2, 2)
    """
    expect(len(items), unit)
    for item in items:
        yield item
        step()


__all__ = ["Line", "PlainBar", "advance", "bar", "live", "counted", "expect", "phase", "step"]
