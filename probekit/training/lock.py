"""An exclusive lock on a run folder: one writer per ``--out`` at a time, across machines.

The lock is the file ``<folder>/.lock`` holding the owner's pid and host name, created
atomically (``O_CREAT | O_EXCL``). While it holds the lock the owner touches the file every
:data:`HEARTBEAT_S` seconds. Whether an owner still runs is decided where it can be:

- on this host, by its pid (a killed run's lock is taken over at once);
- on another host sharing the folder (a cluster filesystem), by the heartbeat: a lock not
  touched for :data:`STALE_AFTER_S` seconds belongs to a dead run (a lost node) and is taken
  over. A second writer waits that long for a foreign lock to go stale before it refuses, so
  a task that Ray retries on another node after its node died resumes instead of failing.

A live owner makes a second writer fail with :class:`~probekit.errors.ConfigError`. The file is
removed when the owner is done, and so is the folder if the lock created it and it is still
empty. A lock file of an older probekit (a pid alone) reads as this host's.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> with run_folder_lock(out):
    ...     holder = lock_holder(out)
    ...     holder.is_self(), holder.alive()
    (True, True)
    >>> out.exists()
    False
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from probekit.errors import ConfigError
from probekit.io import pid_alive, this_host

LOCK_NAME = ".lock"

HEARTBEAT_S = 10.0
"""Seconds between the owner's touches of its lock file."""

STALE_AFTER_S = 120.0
"""A lock of another host untouched this long belongs to a dead run (generous against clocks
that differ between nodes and a busy filesystem)."""


_pid_alive = pid_alive


@dataclass(frozen=True)
class Holder:
    """The owner written in a lock file: ``pid`` on ``host``, and the file's age in seconds
    since its last heartbeat."""

    pid: int
    host: str
    age_s: float

    def is_self(self) -> bool:
        """Whether the lock is this process's."""
        return self.host == this_host() and self.pid == os.getpid()

    def alive(self) -> bool:
        """Whether the owner still runs: its pid on this host, its heartbeat on another."""
        if self.host == this_host():
            return _pid_alive(self.pid)
        return self.age_s < STALE_AFTER_S

    def describe(self) -> str:
        where = "" if self.host == this_host() else f" on host {self.host}"
        return f"pid {self.pid}{where}"


def _read(lock: Path) -> Holder | None:
    """The holder written in ``lock``; None when the file is gone. An unreadable or empty
    file reads as a dead holder of this host (pid 0)."""
    try:
        text = lock.read_text().split()
        age = max(0.0, time.time() - lock.stat().st_mtime)
    except FileNotFoundError:
        return None
    except OSError:
        return Holder(0, this_host(), 0.0)
    try:
        pid = int(text[0]) if text else 0
    except ValueError:
        pid = 0
    return Holder(pid, text[1] if len(text) > 1 else this_host(), age)


def lock_holder(folder: str | os.PathLike) -> Holder | None:
    """Who holds the lock of ``folder`` (None: nobody)."""
    return _read(Path(folder) / LOCK_NAME)


def _try_create(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()} {this_host()}\n")
    return True


def _wait_while_foreign(lock: Path, holder: Holder | None) -> Holder | None:
    """Wait while a live lock of another host keeps its heartbeat, up to the time it would
    take to go stale; the holder then (None: released)."""
    deadline = time.monotonic() + STALE_AFTER_S + HEARTBEAT_S
    while holder is not None and holder.host != this_host() and holder.alive():
        if time.monotonic() > deadline:
            break
        time.sleep(min(1.0, STALE_AFTER_S / 10))
        holder = _read(lock)
    return holder


def acquire(folder: Path) -> Path:
    """Take the lock of ``folder`` (created if needed); returns the lock file."""
    lock = folder / LOCK_NAME
    for _ in range(5):
        if _try_create(lock):
            return lock
        holder = _wait_while_foreign(lock, _read(lock))
        if holder is None:
            continue  # released between our two looks
        if holder.alive():
            raise ConfigError(
                f"{folder} is in use by another training process ({holder.describe()}, lock "
                f"file {lock})",
                fix="wait for it to finish, or pass another --out; delete the lock file only if "
                f"no process {holder.pid} is training there",
            )
        stale = lock.with_name(f"{LOCK_NAME}.{this_host()}.{os.getpid()}.stale")
        try:
            os.replace(lock, stale)  # one of several racing takers wins the stale file
            stale.unlink()
        except FileNotFoundError:
            pass
    raise ConfigError(
        f"could not take the lock {lock} (other processes keep taking it)",
        fix="run one training process per output folder",
    )


@contextmanager
def _heartbeat(lock: Path) -> Iterator[None]:
    """Touch ``lock`` every :data:`HEARTBEAT_S` seconds in a daemon thread while the body
    runs (stopped in ``finally``)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                os.utime(lock)
            except OSError:
                return

    thread = threading.Thread(target=beat, name="probekit-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def run_folder_lock(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold the lock of ``folder`` for the duration of the ``with`` block."""
    folder = Path(folder)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        raise ConfigError(
            f"the output folder {folder} is a file or lies under one ({err})",
            fix="pass a folder path for --out",
        ) from err
    except OSError as err:
        raise ConfigError(
            f"cannot create the output folder {folder} ({err.strerror})",
            fix="pass a writable folder for --out",
        ) from err
    lock = acquire(folder)
    try:
        with _heartbeat(lock):
            yield lock
    finally:
        holder = _read(lock)
        if holder is not None and holder.is_self():
            lock.unlink(missing_ok=True)
        if created:
            try:
                folder.rmdir()  # only when empty: nothing was written
            except OSError:
                pass


__all__ = [
    "HEARTBEAT_S",
    "LOCK_NAME",
    "STALE_AFTER_S",
    "Holder",
    "acquire",
    "lock_holder",
    "run_folder_lock",
    "this_host",
]
