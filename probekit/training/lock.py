"""An exclusive lock on a run folder: one writer per ``--out`` at a time.

The lock is the file ``<folder>/.lock`` holding the owner's pid, created atomically
(``O_CREAT | O_EXCL``). A lock whose pid no longer runs (a killed run) is taken over; a live
owner makes a second writer fail with :class:`~probekit.errors.ConfigError`. The file is removed
when the owner is done, and so is the folder if the lock created it and it is still empty.

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> with run_folder_lock(out):
    ...     (out / LOCK_NAME).is_file()
    True
    >>> out.exists()
    False
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from probekit.errors import ConfigError

LOCK_NAME = ".lock"


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(lock: Path) -> int | None:
    """The pid written in ``lock``; None when the file is gone or holds no pid."""
    try:
        return int(lock.read_text().strip() or "0")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0


def _try_create(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    return True


def acquire(folder: Path) -> Path:
    """Take the lock of ``folder`` (created if needed); returns the lock file."""
    lock = folder / LOCK_NAME
    for _ in range(5):
        if _try_create(lock):
            return lock
        pid = _owner(lock)
        if pid is None:
            continue  # released between our two looks
        if _pid_alive(pid):
            raise ConfigError(
                f"{folder} is in use by another training process (pid {pid}, lock file {lock})",
                fix="wait for it to finish, or pass another --out; delete the lock file only if "
                f"no process {pid} is training there",
            )
        stale = lock.with_name(f"{LOCK_NAME}.{os.getpid()}.stale")
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
        yield lock
    finally:
        if _owner(lock) == os.getpid():
            lock.unlink(missing_ok=True)
        if created:
            try:
                folder.rmdir()  # only when empty: nothing was written
            except OSError:
                pass


__all__ = ["LOCK_NAME", "acquire", "run_folder_lock"]
