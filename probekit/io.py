"""Atomic file writing: nothing probekit writes is ever left half-written.

Example:
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.json"
    >>> _ = atomic_write_text(p, "{}")
    >>> p.read_text()
    '{}'
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def read_regular_file(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path`` (after links), refusing a pipe, device or
    directory (reading one would block or never end) and a file over ``limit`` bytes, each
    with one :class:`~probekit.errors.CheckpointError` naming ``what`` the file should be.

    Example:
        >>> read_regular_file("/dev/zero", 10, "a result file")
        Traceback (most recent call last):
        ...
        probekit.errors.CheckpointError: /dev/zero is not a regular file (a pipe, device or \
folder), so it cannot be a result file. Fix: pass the file itself.
    """
    import stat

    from probekit.errors import CheckpointError

    try:
        info = os.stat(path)
    except OSError as err:
        raise CheckpointError(
            f"cannot read {path} ({err.strerror or err})",
            fix=f"check the path; it should be {what}",
        ) from err
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(
            f"{path} is not a regular file (a pipe, device or folder), so it cannot be {what}",
            fix="pass the file itself",
        )
    if info.st_size > limit:
        raise CheckpointError(
            f"{path} holds {info.st_size} bytes, more than {what} of probekit's can ({limit})",
            fix="pass the file probekit wrote",
        )
    with open(path, "rb") as handle:
        return handle.read(limit + 1)


def read_json(
    path: str | os.PathLike, limit: int, what: str, fix: str = "pass the file probekit wrote"
) -> Any:
    """The JSON value of the regular file ``path`` (read by :func:`read_regular_file`, so a
    pipe, device or oversized file is refused first). Text that does not parse, and JSON
    nested deeper than Python's parser recurses (``[[[...]]]`` 200,000 deep: a
    RecursionError), is one :class:`~probekit.errors.CheckpointError` naming the file, ``what``
    it should be and ``fix``.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "deep.json"
        >>> _ = p.write_text("[" * 200_000 + "]" * 200_000)
        >>> read_json(p, 1 << 20, "a config")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        probekit.errors.CheckpointError: ... is not valid JSON (nested too deep...
    """
    import json

    from probekit.errors import CheckpointError

    raw = read_regular_file(path, limit, what)
    try:
        return json.loads(raw)
    except RecursionError as err:
        reason = "nested too deep for a JSON reader"
        raise CheckpointError(
            f"{path} is not valid JSON ({reason}), so it cannot be {what}", fix=fix
        ) from err
    except ValueError as err:  # UnicodeDecodeError is a ValueError too
        raise CheckpointError(
            f"{path} is not valid JSON ({str(err)[:200]}), so it cannot be {what}", fix=fix
        ) from err


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, umask_mode("file"))  # mkstemp makes 0600; give the file normal permissions
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def umask_mode(kind: str = "folder") -> int:
    """The mode bits a new ``"folder"`` (``0o777``) or ``"file"`` (``0o666``) gets under the
    process's umask (read without changing it for long).

    Example:
        >>> umask_mode("file") & 0o600
        384
    """
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if kind == "folder" else 0o666) & ~umask


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2``); False if unsupported."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    errno_ = ctypes.get_errno()
    if errno_ in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: the filesystem cannot exchange
        return False
    raise OSError(errno_, os.strerror(errno_), os.fspath(b))


def _swap_in(new: Path, path: Path) -> None:
    """Put the folder ``new`` at ``path``; a folder already there is replaced whole.

    The old folder is exchanged atomically where the filesystem can, else moved aside first and
    moved back if the second rename fails; it is deleted only once ``new`` is in place.
    """
    if not os.path.lexists(path):
        os.replace(new, path)
        return
    if _exchange(new, path):
        shutil.rmtree(new, ignore_errors=True)  # ``new`` now holds the old folder
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
    os.replace(path, aside / "old")
    try:
        os.replace(new, path)
    except BaseException:
        os.replace(aside / "old", path)
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


def this_host() -> str:
    """The name of this machine (written into run-folder locks and temporary folder names)."""
    return socket.gethostname() or "localhost"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one we may not signal counts as alive).

    Example:
        >>> pid_alive(os.getpid()), pid_alive(0)
        (True, False)
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_tag() -> str:
    """``<host>.<pid>`` of this process, the host reduced to letters, digits and ``-``: the
    owner part of the name of a :func:`temp_folder`.

    Example:
        >>> import os
        >>> owner_tag().endswith(f".{os.getpid()}")
        True
    """
    return f"{re.sub(r'[^A-Za-z0-9-]', '-', this_host())}.{os.getpid()}"


def temp_folder(path: Path, suffix: str = ".tmp") -> Path:
    """A new empty ``.<name>.<host>.<pid>.XXXX<suffix>`` folder beside ``path``; the owner in
    its name lets :func:`remove_stale_temporaries` tell a dead process's folder from a live
    one's."""
    return Path(
        tempfile.mkdtemp(prefix=f".{path.name}.{owner_tag()}.", suffix=suffix, dir=path.parent)
    )


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Delete the ``.<name>.<host>.<pid>.*.tmp`` folders beside ``path`` that a process of this
    host left when it was killed (its pid no longer runs); returns them. A live process's
    folder, another host's (a shared filesystem) and names of another form are kept.

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "report"
        >>> mine = temp_folder(out)
        >>> remove_stale_temporaries(out), mine.is_dir()
        ([], True)
    """
    pattern = re.compile(
        rf"^\.{re.escape(path.name)}\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[^.]+\.tmp$"
    )
    host = owner_tag().rsplit(".", 1)[0]
    removed = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        match = pattern.match(tmp.name)
        if match is None or match["host"] != host or pid_alive(int(match["pid"])):
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


@contextmanager
def swapped_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it replaces ``path`` whole.

    The folder gets the permissions of the user's umask, and the previous ``path`` survives a
    failed swap. Its name carries this process's host and pid, and the folders a killed
    process left beside ``path`` are removed first (:func:`remove_stale_temporaries`). On an
    exception the temporary folder is removed and ``path`` is left as it was, so ``path`` always
    holds one complete set of files.

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "report"
        >>> with swapped_directory(out) as tmp:
        ...     _ = (tmp / "a.txt").write_text("new")
        >>> sorted(p.name for p in out.iterdir())
        ['a.txt']
    """
    path = Path(path)
    created = [p for p in [path.parent, *path.parent.parents] if not os.path.lexists(p)]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        remove_stale_temporaries(path)
        tmp = temp_folder(path)
        try:
            os.chmod(tmp, umask_mode())  # mkdtemp makes 0700
            yield tmp
            _swap_in(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except BaseException:
        for folder in created:  # deepest first: the parents this call made, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
