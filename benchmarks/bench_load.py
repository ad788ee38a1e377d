"""Benchmark: ``probekit demo --quick`` on an idle machine and beside a busy process.

Researchers run probekit in a notebook beside other work. This runs the quick demo
(``--no-images``) as a subprocess two ways, interleaved A B B A (``--repeats`` times):

1. ``idle`` (A): nothing else started by the benchmark;
2. ``busy`` (B): beside ``--busy-processes`` busy processes (default 1), each a torch
   matrix-product loop on ``--busy-threads`` threads (default 2: one alone can fill a 2-core
   machine), started before the demo and stopped after it.

``--launches`` says how the demo is started (default ``cli``; several, comma-separated, run
side by side, interleaved): ``cli`` is ``python -m probekit demo``; ``api`` is
``probekit.demo.run_demo`` from Python with probekit imported first, as a notebook that starts
with ``import probekit`` does; ``torch-first`` is the same after ``import torch``, so OpenMP
loads before probekit can choose its wait policy (:mod:`probekit.openmp`) and keeps its
default, spinning wait. The demo's process gets no ``OMP_WAIT_POLICY`` from the benchmark
(unless ``--wait-policy`` names one): probekit, or OpenMP's default, decides.

It parses the demo's phase lines (``probekit demo: [run: ]phase (N s)``) and prints, per phase,
the median seconds idle and busy and their ratio (the slowdown), the whole run's wall and CPU
seconds (the demo's own, from its resource usage), and ``uptime`` before and after. Training is
the work itself: a phase that slows down much more than training under the same load has a
problem of its own (spinning thread pools were one: ``probekit.numerics.one_blas_thread``).

Example (from the repository root; about 3 minutes on 2 cores at the defaults)::

    python benchmarks/bench_load.py
    python benchmarks/bench_load.py --repeats 2 --busy-processes 4
    python benchmarks/bench_load.py --launches api,torch-first   # a notebook's two orders
    PYTHONPATH=/path/to/older/checkout python benchmarks/bench_load.py   # an older probekit
"""

from __future__ import annotations

import argparse
import os
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


RUN_API = "import probekit.demo as d, sys; d.run_demo(sys.argv[1], quick=True, images=False)"
LAUNCHES = {
    "cli": ["-m", "probekit", "demo", "--quick", "--no-images", "--out"],
    "api": ["-c", RUN_API],
    "torch-first": ["-c", f"import torch; {RUN_API}"],
}
"""How the demo is started: the interpreter's arguments before the output folder."""


def demo_environment(wait_policy: str | None) -> dict[str, str]:
    """The demo's environment: this one without the ``OMP_WAIT_POLICY`` that
    ``benchmarks.common`` sets for the benchmarks themselves, or with ``wait_policy``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if wait_policy:
        env["OMP_WAIT_POLICY"] = wait_policy
    return env


def run_demo(
    busy_threads: int, busy_processes: int, launch: str = "cli", wait_policy: str | None = None
) -> tuple[float, float, dict[str, float]]:
    """One quick demo, started as ``launch`` says, beside ``busy_processes`` busy processes
    (0: none): its wall seconds, its own CPU seconds (read before the busy processes are
    reaped) and phase times."""
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
                [sys.executable, *LAUNCHES[launch], str(Path(tmp) / "demo")],
                capture_output=True,
                text=True,
                check=True,
                env=demo_environment(wait_policy),
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
    parser.add_argument(
        "--launches", default="cli", help=f"how the demo starts, comma-separated: {list(LAUNCHES)}"
    )
    parser.add_argument("--wait-policy", help="OMP_WAIT_POLICY for the demo (default: unset)")
    args = parser.parse_args()
    launches = args.launches.split(",")
    if unknown := set(launches) - set(LAUNCHES):
        parser.error(f"unknown launch {sorted(unknown)}; choose from {list(LAUNCHES)}")
    print(f"uptime before: {uptime()}")
    walls, cpus = defaultdict(list), defaultdict(list)
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    ways = [f"{load} {launch}" for launch in launches for load in ("idle", "busy")]
    for way in interleaved(ways, args.repeats):
        load, launch = way.split(" ")
        processes = args.busy_processes if load == "busy" else 0
        wall, cpu, times = run_demo(args.busy_threads, processes, launch, args.wait_policy)
        walls[way].append(wall)
        cpus[way].append(cpu)
        for what, seconds in times.items():
            phases[what][way].append(seconds)
        print(f"{way}: {wall:.1f} s wall, {cpu:.1f} s CPU (the demo's own)", flush=True)
    print(f"uptime after: {uptime()}")
    for launch in launches:
        print(
            f"\nquick demo started as {launch!r} (OMP_WAIT_POLICY {args.wait_policy or 'unset'});"
            f" beside the 'busy' runs {args.busy_processes} busy process(es) of "
            f"{args.busy_threads} torch thread(s) each"
        )
        print_slowdowns(launch, phases, walls, cpus)


def print_slowdowns(
    launch: str,
    phases: dict[str, dict[str, list[float]]],
    walls: dict[str, list[float]],
    cpus: dict[str, list[float]],
) -> None:
    """One launch's table: per phase the median seconds idle and busy and their ratio."""
    idle_way, busy_way = f"idle {launch}", f"busy {launch}"
    print(f"{'phase':<28}{'idle s':>9}{'busy s':>9}{'slowdown':>10}")
    for what, by_way in phases.items():
        idle, busy = median(by_way[idle_way]), median(by_way[busy_way])
        ratio = f"{busy / idle:>9.1f}x" if idle > 0 else f"{'n/a':>10}"
        print(f"{what:<28}{idle:>9.1f}{busy:>9.1f}{ratio}")
    idle, busy = median(walls[idle_way]), median(walls[busy_way])
    print(f"{'whole run (wall)':<28}{idle:>9.1f}{busy:>9.1f}{busy / idle:>9.1f}x")
    print(f"CPU seconds: idle {runs_line(cpus[idle_way])}; busy {runs_line(cpus[busy_way])}")


if __name__ == "__main__":
    main()
