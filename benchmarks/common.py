"""What the benchmarks share: the machine's load, the A B B A order, timing, medians, memory.

Every side-by-side benchmark here runs its ways interleaved (A B B A, or A B C C B A for more
ways) in one process after a warm-up of each, prints every run, the medians and ``uptime``
before and after (the machine may be shared), and takes each way's peak memory from a fresh
process that runs that way once (:func:`peak_in_subprocess`).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# with OpenMP's default spinning wait, two threads on a busy machine can slow a forward several
# times (issue 16), which says nothing about the method; set before torch loads
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def uptime() -> str:
    """``uptime``'s line (the load averages), or the load averages alone."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return f"load average {os.getloadavg()}"


def interleaved(ways: Sequence[str], repeats: int) -> list[str]:
    """The run order: ``ways`` then the same reversed (A B B A), ``repeats`` times."""
    return [*ways, *ways[::-1]] * repeats


def sync(device: Any) -> None:
    """Wait for the device's queued work (CUDA), so a wall time covers it."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: Any = "cpu") -> tuple[float, Any]:
    """Seconds ``fn()`` took (device work included) and what it returned."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def timed_cpu(fn: Callable[[], Any], device: Any = "cpu") -> tuple[float, float, Any]:
    """Wall seconds, this process's CPU seconds (every thread; ``time.process_time``) and what
    ``fn()`` returned. On a shared CPU the CPU seconds count the work done, not the time the
    other jobs held the cores: at one thread they are the figure to compare under load."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu, out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def runs_line(values: Sequence[float]) -> str:
    """``median M s of a, b, c``."""
    return f"median {median(values):.2f} s of {', '.join(f'{v:.2f}' for v in values)}"


def settings_line(threads: int, device: str) -> str:
    return f"[{device}, {threads} thread(s), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}]"


def rss_mib() -> float:
    """This process's resident set now, MiB."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def max_rss_mib() -> float:
    """This process's peak resident set so far (``ru_maxrss``), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_in_subprocess(argv: Sequence[str], env: dict[str, str] | None = None) -> dict:
    """Run ``python argv`` (a script that prints one JSON line last) and return that line."""
    out = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env or dict(os.environ)
    )
    lines = out.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (out.stderr.strip() or out.stdout.strip())[-300:]}


def max_difference(a: dict[str, float], b: dict[str, float]) -> tuple[float, int]:
    """The largest ``|a[k] - b[k]|`` over the keys of both, and the number of keys in one only."""
    common = [k for k in a if k in b]
    worst = max((abs(a[k] - b[k]) for k in common), default=float("nan"))
    return worst, len(set(a) ^ set(b))


def random_gpt2(
    vocab: int, n_positions: int, d_model: int, layers: int, heads: int, device: Any = "cpu"
) -> Any:
    """The benchmarks' random GPT-2-style model (the trainers' :func:`gpt2_config`, no
    dropout), the same weights on every call (seed 0), in eval mode on ``device``."""
    import torch
    import transformers

    from probekit.training.models import gpt2_config

    torch.manual_seed(0)
    config = gpt2_config(
        vocab_size=vocab,
        n_positions=n_positions,
        d_model=d_model,
        n_layers=layers,
        n_heads=heads,
        d_mlp=None,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval().to(device)
