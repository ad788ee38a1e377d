"""Where independent pieces of work run: in this process (``"local"``) or as Ray tasks.

A sweep's stacks, the checkpoints of a depth timeline and the
checkpoints of a many-model diagnosis (:mod:`probekit.cluster`) are independent pieces of
work. :func:`run_tasks` runs a function on each of them, one after another in this process or,
with ``executor="ray"``, each as one `Ray <https://docs.ray.io>`_ core task, and hands every
finished piece to a callback as soon as it ends (a progress line; the results stream to disk).

Why Ray core tasks and not Ray Tune: the grid is fixed in advance (no search algorithm, no
early stopping of trials), one task trains a whole *stack* of runs (Tune's unit is one trial,
one run), and probekit already resumes a run bit-identically from its own checkpoints, which
is all a retried task needs. Tasks keep that model exact and small: ``max_retries`` makes Ray
run a task again when its worker process or node dies, and the retried task resumes from the
run's last checkpoint on the shared filesystem. Exceptions raised by the work itself (a NaN
loss, a run that does not fit its device) are not retried: the piece is recorded as failed
with its error, and the other pieces go on.

Ray is an optional extra (``pip install -e ".[ray]"``), imported only when ``executor="ray"``.

Example:
    >>> run_tasks(lambda x: x * x, [1, 2, 3], executor="local", progress=False)
    [1, 4, 9]
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.errors import ConfigError
from probekit.ray_address import check_ray_address, loopback_join

EXECUTORS = ("local", "ray")
RAY_INSTALL = 'pip install -e ".[ray]"'
#: how often Ray runs a task again after its worker process or node died
MAX_RETRIES = 3


@dataclass
class Failed:
    """A piece of work that raised instead of returning: its error as text (one line)."""

    error: str

    @classmethod
    def of(cls, err: BaseException) -> Failed:
        text = " ".join(str(err).split()) or type(err).__name__
        return cls(f"{type(err).__name__}: {text}"[:500])


def check_executor(executor: str, out_dir: str | os.PathLike | None = None) -> None:
    """``executor`` is one of :data:`EXECUTORS`; under Ray, Ray imports and ``out_dir`` (if
    any) is an absolute path (every node must see the same folder)."""
    if executor not in EXECUTORS:
        raise ConfigError(
            f"unknown executor {executor!r}", fix=f"use one of {', '.join(EXECUTORS)}"
        )
    if executor != "ray":
        return
    import_ray()
    if out_dir is not None and not Path(out_dir).is_absolute():
        raise ConfigError(
            f"the output folder {os.fspath(out_dir)!r} is a relative path; under Ray every "
            "node writes there and a relative path differs between nodes",
            fix="pass an absolute path on a filesystem every node mounts (e.g. /shared/sweep)",
        )


def import_ray() -> Any:
    """The ``ray`` module, or one :class:`ConfigError` naming the install command."""
    try:
        import ray
    except ImportError as err:
        raise ConfigError(
            f"executor 'ray' needs Ray, which is not installed ({err})",
            fix=f"install the extra: {RAY_INSTALL}",
        ) from err
    return ray


PENDING_SECONDS = 20.0
"""How long Ray tasks may sit unstarted before probekit says what the cluster lacks."""


@contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Ray, connected: an already initialised Ray is used as it is (and left running);
    otherwise connect to ``address`` (a running cluster: checked first with
    :func:`~probekit.ray_address.check_ray_address`, joined on loopback where its head
    is, :func:`~probekit.ray_address.loopback_join`) or, with none, start a local Ray
    sized to this machine, and shut it down at the end."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    check_ray_address(address)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    try:
        with loopback_join(address):
            ray.init(address=address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as err:
        raise ConfigError(
            f"cannot connect to the Ray cluster at {address!r} ({err})",
            fix="start one with `ray start --head` and pass the address it prints "
            "(e.g. --ray-address 10.0.0.1:6379), or leave --ray-address out for a local Ray",
        ) from err
    try:
        yield ray
    finally:
        ray.shutdown()


def task_resources(device: str, cpus: int = 1, ray: Any = None) -> dict[str, float]:
    """What one task asks Ray for: a GPU when CUDA is asked for (``"cuda"``, or ``"auto"`` on a
    cluster with GPUs), otherwise ``cpus`` CPU cores."""
    wants_gpu = device.startswith("cuda")
    if device == "auto" and ray is not None:
        wants_gpu = ray.cluster_resources().get("GPU", 0) > 0
    return {"num_gpus": 1, "num_cpus": 1} if wants_gpu else {"num_cpus": cpus}


def _guarded(fn: Callable[[Any], Any], threads: int | None) -> Callable[[Any], Any]:
    """``fn`` with its own errors returned as :class:`Failed` (a worker's death still raises,
    so Ray retries it)."""

    def call(item: Any) -> Any:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        try:
            return fn(item)
        except Exception as err:  # the piece's own failure: recorded, the others go on
            return Failed.of(err)

    return call


def run_tasks(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    *,
    executor: str = "local",
    ray_address: str | None = None,
    device: str = "cpu",
    cpus_per_task: int = 1,
    on_done: Callable[[int, Any], None] | None = None,
    progress: bool = True,
    desc: str = "tasks",
    sizes: Sequence[int] | None = None,
    done_before: int = 0,
) -> list[Any]:
    """``[fn(item) for item in items]``, each call one task; a call that raises gives a
    :class:`Failed` in its place. ``on_done(index, result)`` runs in this process as each
    finishes (in order of finishing under Ray). One progress bar (finished / total, ETA)
    advances by ``sizes[index]`` per finished task (default 1), from ``done_before``."""
    check_executor(executor)
    from probekit.progress import bar as progress_bar

    results: list[Any] = [None] * len(items)
    sizes = list(sizes) if sizes is not None else [1] * len(items)
    total = done_before + sum(sizes)
    bar = progress_bar(
        total=total, initial=done_before, desc=desc, disable=not progress, dynamic_ncols=True
    )
    with bar:

        def finished(i: int, value: Any) -> None:
            results[i] = value
            if on_done is not None:
                on_done(i, value)
            bar.update(sizes[i])

        if executor == "local":
            call = _guarded(fn, None)
            for i, item in enumerate(items):
                finished(i, call(item))
        elif items:  # nothing left to do needs no Ray
            _run_on_ray(fn, items, ray_address, device, cpus_per_task, finished)
    return results


def _run_on_ray(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    address: str | None,
    device: str,
    cpus: int,
    finished: Callable[[int, Any], None],
) -> None:
    """Each item one Ray task (retried after a worker's death); ``finished`` as each ends."""
    with ray_session(address) as ray:
        resources = task_resources(device, cpus, ray)
        threads = int(resources["num_cpus"])
        remote = ray.remote(_guarded(fn, threads)).options(
            max_retries=MAX_RETRIES, retry_exceptions=False, **resources
        )
        pending = {remote.remote(item): i for i, item in enumerate(items)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=PENDING_SECONDS)
            if not done:
                _say_what_is_missing(ray, resources, len(pending))
            for ref in done:
                i = pending.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.RayError as err:  # retries used up, or unpicklable
                    value = Failed.of(err)
                finished(i, value)


def _say_what_is_missing(ray: Any, resources: dict[str, float], n_pending: int) -> None:
    """No task finished for :data:`PENDING_SECONDS`: refuse a cluster that can never run one
    (too few CPUs or GPUs in all), else say what is busy and go on waiting."""
    total, free = ray.cluster_resources(), ray.available_resources()
    wanted = {"CPU": resources.get("num_cpus", 0), "GPU": resources.get("num_gpus", 0)}
    for kind, need in wanted.items():
        if need and total.get(kind, 0) < need:
            raise ConfigError(
                f"the Ray cluster has {total.get(kind, 0):g} {kind}(s) in all and each task "
                f"needs {need:g}: the {n_pending} pending task(s) can never start",
                fix=f"add nodes with {kind}s (`ray start --address HEAD --num-cpus N`), or run "
                "with --device cpu / --executor local",
            )
    log(
        f"waiting: {n_pending} task(s) pending for {PENDING_SECONDS:g}+ s; the cluster has "
        f"{free.get('CPU', 0):g} of {total.get('CPU', 0):g} CPUs and {free.get('GPU', 0):g} of "
        f"{total.get('GPU', 0):g} GPUs free (each task needs {wanted['CPU']:g} CPU, "
        f"{wanted['GPU']:g} GPU)"
    )


def log(line: str) -> None:
    """One line for the person watching, above the progress bar (stderr)."""
    from tqdm.auto import tqdm

    tqdm.write(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr)


__all__ = [
    "EXECUTORS",
    "MAX_RETRIES",
    "RAY_INSTALL",
    "Failed",
    "check_executor",
    "check_ray_address",
    "import_ray",
    "log",
    "ray_session",
    "run_tasks",
    "task_resources",
]
