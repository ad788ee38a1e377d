"""How the ``probekit`` command ends when it is stopped from outside, without a traceback.

Two things can stop a command before it returns, and :func:`graceful_shutdown` handles both
for the length of a command:

- **the reader of its output goes away** (``probekit diagnose ... | head -1``): Python ignores
  ``SIGPIPE``, so the next write to the closed pipe raises :class:`BrokenPipeError`. The streams
  ``sys.stdout`` and ``sys.stderr`` are wrapped so that this error points the stream at
  ``os.devnull`` (the recipe of the Python documentation, "Note on SIGPIPE") and the command
  goes on: its files are written in full and its exit status is its own (0 when it succeeded);
  only the lines nobody reads any more are dropped;
- **SIGTERM** (``kill PID``, a job scheduler's stop): it raises :class:`Terminated` in the main
  thread, as SIGINT raises :class:`KeyboardInterrupt`, so every ``finally`` and
  ``except BaseException`` clean-up runs (a report's hidden ``.OUT.*.tmp`` folder is removed;
  an older report stays as it was) and the command exits with :data:`EXIT_TERMINATED`, 143
  (128 + 15, the status a shell reports for a process killed by SIGTERM).

Example:
    >>> import io, sys
    >>> with graceful_shutdown():
    ...     isinstance(sys.stdout, ReaderSafeStream)
    True
    >>> isinstance(sys.stdout, ReaderSafeStream)
    False
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit status of a command stopped by SIGTERM (143)."""


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread by :func:`graceful_shutdown`'s handler.

    A :class:`BaseException`, like :class:`KeyboardInterrupt`, so that ``except Exception``
    does not swallow it and every clean-up on the way out runs."""


class ReaderSafeStream:
    """A text stream whose writes survive the reader closing the pipe.

    The first :class:`BrokenPipeError` points the stream's file descriptor at ``os.devnull``
    (so Python's own flush at exit succeeds too) and every later write is dropped; everything
    else is the wrapped stream's.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        """Write ``text``; nothing (and no error) once the reader is gone."""
        if self.reader_gone:
            return len(text)
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def writelines(self, lines: Any) -> None:
        """Write each of ``lines``."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush the wrapped stream; nothing once the reader is gone."""
        if self.reader_gone:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        """Send the stream's descriptor to ``os.devnull``: the reader is gone."""
        self.reader_gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _raise_terminated(signum: int, frame: Any) -> None:
    """The SIGTERM handler: stop the command the way Ctrl-C does."""
    raise Terminated(f"terminated by signal {signum}")


@contextmanager
def graceful_shutdown() -> Iterator[None]:
    """For the ``with`` block: SIGTERM raises :class:`Terminated` (in the main thread only;
    elsewhere Python cannot set handlers), and ``sys.stdout`` / ``sys.stderr`` are
    :class:`ReaderSafeStream` s. Everything is put back as it was afterwards."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (
        s if s is None or isinstance(s, ReaderSafeStream) else ReaderSafeStream(s) for s in streams
    )
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):  # what is still buffered, while wrapped
            if stream is not None:
                stream.flush()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        sys.stdout, sys.stderr = streams


__all__ = ["EXIT_TERMINATED", "ReaderSafeStream", "Terminated", "graceful_shutdown"]
