"""Benchmark: ``probekit demo --quick`` on an idle machine and beside a busy process.

Researchers run probekit in a notebook beside other work. This runs the quick demo
(``--no-images``) as a subprocess two ways, interleaved A B B A (``--repeats`` times):

1. ``idle`` (A): nothing else started by the benchmark;
2. ``busy`` (B): beside ``--busy-processes`` busy processes (default 1), each a torch
   matrix-product loop on ``--busy-threads`` threads (default 2: one alone can fill a 2-core
   machine), started before the demo and stopped after it.

It parses the demo's phase lines (``probekit demo: [run: ]phase (N s)``) and prints, per phase,
the median seconds idle and busy and their ratio (the slowdown), the whole run's wall and CPU
seconds (the demo's own, from its resource usage), and ``uptime`` before and after. Training is
the work itself: a phase that slows down much more than training under the same load has a
problem of its own (spinning thread pools were one: ``probekit.numerics.one_blas_thread``).

Example (from the repository root; about 3 minutes on 2 cores at the defaults)::

    python benchmarks/bench_load.py
    python benchmarks/bench_load.py --repeats 2 --busy-processes 4
    PYTHONPATH=/path/to/older/checkout python benchmarks/bench_load.py   # an older probekit
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import interleaved, median, runs_line, uptime  # noqa: E402

PHASE_LINE = re.compile(r"^probekit demo: (?:(?P<run>[\w.-]+): )?(?P<what>.+) \((?P<s>[\d.]+) s\)$")
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BUSY = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(512, 512)
while True:
    a = torch.tanh(a @ a)
"""


def phase_times(stderr: str) -> dict[str, float]:
    """Seconds per phase from the demo's progress lines; a phase run per model is summed.

    Example:
        >>> phase_times("probekit demo: training (14.0 s)\\nprobekit demo: a: probes (2.5 s)\\n"
        ...             "probekit demo: b: probes (4.5 s)\\n")
        {'training': 14.0, 'probes': 7.0}
    """
    times: dict[str, float] = defaultdict(float)
    for raw in re.split(r"[\r\n]", ESCAPES.sub("", stderr)):
        match = PHASE_LINE.match(raw.strip())
        if match:
            times[match["what"]] += float(match["s"])
    return dict(times)


def run_demo(busy_threads: int, busy_processes: int) -> tuple[float, float, dict[str, float]]:
    """One quick demo beside ``busy_processes`` busy processes (0: none): its wall seconds,
    its own CPU seconds (read before the busy processes are reaped) and phase times."""
    busy = [
        subprocess.Popen([sys.executable, "-c", BUSY, str(busy_threads)])
        for _ in range(busy_processes)
    ]
    if busy:
        time.sleep(2.0)  # let them import torch and start working
    cpu_before = _children_cpu()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "probekit", "demo", "--quick", "--no-images"]
                + ["--out", str(Path(tmp) / "demo")],
                capture_output=True,
                text=True,
                check=True,
            )
            wall = time.perf_counter() - start
            cpu = _children_cpu() - cpu_before  # the demo's alone: no busy process reaped yet
    finally:
        for process in busy:
            process.kill()
            process.wait()
    return wall, cpu, phase_times(done.stderr)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="A B B A rounds (default 1)")
    parser.add_argument("--busy-threads", type=int, default=2, help="each busy process's threads")
    parser.add_argument(
        "--busy-processes", type=int, default=1, help="busy processes beside the 'busy' runs"
    )
    args = parser.parse_args()
    print(f"uptime before: {uptime()}")
    walls, cpus = defaultdict(list), defaultdict(list)
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for way in interleaved(["idle", "busy"], args.repeats):
        wall, cpu, times = run_demo(args.busy_threads, args.busy_processes if way == "busy" else 0)
        walls[way].append(wall)
        cpus[way].append(cpu)
        for what, seconds in times.items():
            phases[what][way].append(seconds)
        print(f"{way}: {wall:.1f} s wall, {cpu:.1f} s CPU (the demo's own)", flush=True)
    print(f"uptime after: {uptime()}")
    print(
        f"\nquick demo; beside the 'busy' runs {args.busy_processes} busy process(es) of "
        f"{args.busy_threads} torch thread(s) each"
    )
    print(f"{'phase':<28}{'idle s':>9}{'busy s':>9}{'slowdown':>10}")
    for what, by_way in phases.items():
        idle, busy = median(by_way["idle"]), median(by_way["busy"])
        ratio = f"{busy / idle:>9.1f}x" if idle > 0 else f"{'n/a':>10}"
        print(f"{what:<28}{idle:>9.1f}{busy:>9.1f}{ratio}")
    idle, busy = median(walls["idle"]), median(walls["busy"])
    print(f"{'whole run (wall)':<28}{idle:>9.1f}{busy:>9.1f}{busy / idle:>9.1f}x")
    print(f"CPU seconds: idle {runs_line(cpus['idle'])}; busy {runs_line(cpus['busy'])}")


if __name__ == "__main__":
    main()
