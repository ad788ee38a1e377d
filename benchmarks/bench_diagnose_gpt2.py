"""Benchmark: a full ``diagnose`` at GPT-2-small size, its time per analysis and its peak memory.

Builds GPT-2 small from its config with random weights (12 layers, d_model 768, vocabulary
50257; nothing is downloaded), then on ``--batch`` x ``--seq`` random tokens (default 8 x 128):

- ``diagnose`` mode runs :func:`probekit.report.diagnose` (adjacent swaps, ``--bootstrap``
  replicates) and prints its wall time, the seconds of each analysis, and the peak resident
  set beyond what the process held after building the model (sampled every 2 ms);
- ``cache`` mode runs one ``bridge.run_with_cache`` of every hook on the same batch and prints
  the bytes the cache holds and the same peak, the memory a full cache needs.

Each mode runs in its own process (``--mode``; the default runs both, one after the other) so
each peak is its own, with ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc's default threshold grows
after each large free, so later tensors come from a heap it keeps: the resident set would show
memory retained, not live). ``diagnose`` uses its default batching (the memory-bounded
:meth:`probekit.model.Model.default_batch_size`, 2 sequences of 128 tokens here) unless
``--batch-size`` is given. ``uptime`` is printed before and after: the machine may be shared.

``--baseline DIR`` compares this checkout's code with the probekit in ``DIR`` (another checkout,
e.g. ``git worktree add /tmp/before <commit>``): the diagnoses run interleaved, baseline, this,
this, baseline (``--repeats`` rounds), each in its own process with ``PYTHONPATH`` at its code,
and the medians of the wall times and peaks of each are printed with their ratio.

Usage:
    python benchmarks/bench_diagnose_gpt2.py [--batch 8] [--seq 128] [--threads 1]
        [--bootstrap 100] [--mode both|diagnose|cache] [--layers 12] [--batch-size N]
        [--device cpu|cuda]
        [--baseline DIR [--repeats 1]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import timed, uptime  # noqa: E402  (sets OMP_WAIT_POLICY first)

# A fixed mmap threshold: glibc otherwise raises it after each large free, later tensors come
# from the heap it never returns, and the resident set shows memory retained, not memory live.
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")


def build(args):
    import torch
    import transformers

    import probekit

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=args.layers, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    model = probekit.load(hf, device=args.device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, config.vocab_size, (args.batch, args.seq), generator=g)
    return model, tokens.to(model.device)


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRSS:
    """The peak resident set while the ``with`` body runs, beyond the one at its start."""

    def __enter__(self) -> PeakRSS:
        self.base, self.peak, self.done = _rss_mib(), 0.0, threading.Event()

        def sample() -> None:
            while not self.done.is_set():
                self.peak = max(self.peak, _rss_mib())
                time.sleep(0.002)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, _rss_mib())

    @property
    def extra_mib(self) -> float:
        return round(self.peak - self.base, 1)


def run_diagnose(args) -> dict:
    from probekit import report

    model, tokens = build(args)
    times: dict[str, float] = {}
    original = report.run_analyses

    def timed_run(steps, progress):
        results, not_defined = {}, {}
        for name, step in steps.items():
            start = time.perf_counter()
            done, undefined = original({name: step}, progress)
            results.update(done)
            not_defined.update(undefined)
            times[name] = round(time.perf_counter() - start, 2)
        return results, not_defined

    report.run_analyses = timed_run
    try:
        with PeakRSS() as peak:
            seconds, _ = timed(
                lambda: report.diagnose(
                    model, tokens, n_bootstrap=args.bootstrap, batch_size=args.batch_size
                ),
                model.device,
            )
    finally:
        report.run_analyses = original
    return {
        "mode": "diagnose",
        "device": str(model.device),
        **cuda_peak(model.device),
        "seconds": round(seconds, 1),
        "per_analysis_s": times,
        "base_rss_mib": round(peak.base, 1),
        "peak_extra_mib": peak.extra_mib,
    }


def run_cache(args) -> dict:
    import torch

    model, tokens = build(args)
    with PeakRSS() as peak, torch.no_grad():
        _, cache = model.bridge.run_with_cache(tokens, use_cache=False)
        held = sum(t.numel() * t.element_size() for t in cache.values())
    return {
        "mode": "cache",
        "n_hooks": len(cache),
        "cache_mib": round(held / 2**20, 1),
        "base_rss_mib": round(peak.base, 1),
        "peak_extra_mib": peak.extra_mib,
    }


def cuda_peak(device) -> dict:
    """``torch.cuda.max_memory_allocated`` in MiB on a CUDA device (the resident set says
    nothing of device memory); nothing elsewhere."""
    import torch

    if device.type != "cuda":
        return {}
    return {"cuda_peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1)}


def _run_mode(mode: str, code_root: str | None = None) -> dict | str:
    """One ``--mode`` run in its own process (its code from ``code_root`` when given): its
    JSON line, or the end of its error output."""
    cmd = [sys.executable, __file__, *_without_compare(sys.argv[1:]), "--mode", mode]
    env = dict(os.environ)
    if code_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code_root, env.get("PYTHONPATH")]))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return out.stdout.strip() or out.stderr.strip()[-2000:]


def _without_compare(argv: list[str]) -> list[str]:
    """``argv`` less ``--baseline DIR``, ``--repeats N`` and ``--mode M``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--baseline", "--repeats", "--mode"):
            skip = True
            continue
        if arg.split("=")[0] not in ("--baseline", "--repeats", "--mode"):
            out.append(arg)
    return out


def compare(baseline: str, repeats: int) -> None:
    """Baseline and this code interleaved A B B A, ``repeats`` rounds; medians and ratio."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs: dict[str, list[dict]] = {"baseline": [], "this": []}
    for _ in range(repeats):
        for who in ("baseline", "this", "this", "baseline"):
            result = _run_mode("diagnose", baseline if who == "baseline" else here)
            print(f"{who:8s} {json.dumps(result) if isinstance(result, dict) else result}")
            if not isinstance(result, dict):
                raise SystemExit(f"the {who} run failed")
            runs[who].append(result)
    medians = {
        who: {key: statistics.median(r[key] for r in rows) for key in ("seconds", "peak_extra_mib")}
        for who, rows in runs.items()
    }
    for who, m in medians.items():
        seconds = [r["seconds"] for r in runs[who]]
        peaks = [r["peak_extra_mib"] for r in runs[who]]
        print(
            f"{who:8s}: median {m['seconds']:.1f} s (runs {seconds}), median peak "
            f"{m['peak_extra_mib']:.1f} MiB (runs {peaks})"
        )
    ratio = medians["baseline"]["seconds"] / medians["this"]["seconds"]
    print(f"speed-up: {ratio:.2f}x (ratio of the median wall times)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per forward")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--mode", choices=["both", "diagnose", "cache"], default="both")
    parser.add_argument("--baseline", default=None, help="a checkout to compare with")
    parser.add_argument("--repeats", type=int, default=1, help="A B B A rounds (--baseline)")
    args = parser.parse_args()
    if args.mode != "both":
        import torch

        torch.set_num_threads(args.threads)
        run = run_diagnose if args.mode == "diagnose" else run_cache
        print(json.dumps(run(args)), flush=True)
        return
    print(f"before: {uptime()}", flush=True)
    print(
        f"GPT-2 small config, {args.layers} layers, random weights; {args.batch} x {args.seq} "
        f"tokens; device {args.device}; threads {args.threads}; "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
        f"MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']}",
        flush=True,
    )
    cache = _run_mode("cache")
    print(json.dumps(cache) if isinstance(cache, dict) else cache, flush=True)
    if args.baseline is not None:
        compare(args.baseline, args.repeats)
    else:
        result = _run_mode("diagnose")
        print(json.dumps(result) if isinstance(result, dict) else result, flush=True)
    print(f"after:  {uptime()}", flush=True)


if __name__ == "__main__":
    main()
