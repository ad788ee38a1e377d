"""Benchmark: fitting the tuned lens from one forward per batch versus one forward per layer.

Builds a random GPT-2-style model (default 12 layers, d_model 256) and fits all translators of
a tuned lens for a few steps two ways, with the same batches, settings and results:

- A, probekit: ``TunedLens.fit`` traces each batch once and trains every depth's translator
  from the residuals the trace keeps;
- B, per layer: the loop of one forward per layer per batch (each depth's residual taken from
  its own traced forward), the way a per-layer probe is usually trained.

Runs are interleaved A B B A, repeated ``--repeats`` times; prints the median seconds of each
way, their ratio (expect about ``L``x less the shared head/backward cost), the largest
difference between the two sets of translators, ``uptime`` before and after (the machine may
be shared), and the peak memory of each way, measured in its own subprocess (resident set on
CPU, max allocated on CUDA).

Usage:
    python benchmarks/bench_tuned_lens.py [--layers 12] [--d-model 256] [--vocab 512]
        [--batch 8] [--seq 64] [--steps 4] [--repeats 3] [--device cpu|cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(args):
    """The benchmark model of ``bench_depth.py`` and two batches of its tokens."""
    from bench_depth import build as build_depth_benchmark  # the sibling script

    model, tokens = build_depth_benchmark(
        argparse.Namespace(**{**vars(args), "batch": 2 * args.batch})
    )
    return model, [tokens[: args.batch], tokens[args.batch :]]


def fit_fused(model, data, steps: int):
    """A: probekit's fit, one traced forward per batch for all depths."""
    from probekit import TunedLens

    return TunedLens.fit(model, data, steps=steps, seed=0, progress=False)


def fit_per_layer(model, data, steps: int):
    """B: the same training with one traced forward per layer per batch."""
    import torch

    from probekit import TunedLens
    from probekit.analyses.depth.tuned_lens import FitSettings, batch_order, make_optimizer

    batches = model.prepare(data)
    order = batch_order(batches, 0, steps=steps)
    s = FitSettings(steps, 0.1, "sgd", 0.9, 1e-3, 0, 1.0, 0, None)
    lens = TunedLens.zeros(model)
    opt = make_optimizer(list(lens.parameters()), s)
    for step, index in enumerate(order):
        for group in opt.param_groups:
            group["lr"] = s.lr * (steps - step) / steps
        for depth in range(lens.n_layers):
            trace = model.trace(batches[index])  # a fresh forward for this depth alone
            lens.accumulate_grads(model, trace, trace.batch.valid, depths=[depth])
        torch.nn.utils.clip_grad_norm_(lens.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return lens


WAYS = {"A": fit_fused, "B": fit_per_layer}


def timed(way: str, model, data, steps: int) -> tuple[float, object]:
    import torch

    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    lens = WAYS[way](model, data, steps)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, lens


def _rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_memory(args, way: str) -> dict:
    """Run one way in this (fresh) process; its peak memory beyond what was held before (CUDA:
    max allocated; CPU: resident set sampled every 2 ms, as the process's max RSS is set by
    building the model)."""
    import threading

    import torch

    torch.set_num_threads(args.threads)
    model, data = build(args)
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        timed(way, model, data, args.steps)
        return {"way": way, "peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
    base, peak, done = _rss_mib(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    timed(way, model, data, args.steps)
    done.set()
    sampler.join()
    return {"way": way, "peak_mib": round(max(peak[0], _rss_mib()) - base, 1)}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 12), ("d-model", 256), ("vocab", 512), ("batch", 8)):
        parser.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("seq", 64), ("steps", 4), ("repeats", 3), ("threads", 1)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-only", choices=list(WAYS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_only:
        print(json.dumps(peak_memory(args, args.memory_only)))
        return

    import torch

    torch.set_num_threads(args.threads)
    print(f"before: {uptime()}")
    model, data = build(args)
    print(model)
    timed("A", model, data, 1)  # warm-up
    times: dict[str, list[float]] = {"A": [], "B": []}
    lenses = {}
    for _ in range(args.repeats):
        for way in "ABBA":
            seconds, lenses[way] = timed(way, model, data, args.steps)
            times[way].append(seconds)
    diff = max(
        float((a - b).abs().max())
        for a, b in zip(
            lenses["A"].state_dict().values(), lenses["B"].state_dict().values(), strict=True
        )
    )
    med = {way: statistics.median(t) for way, t in times.items()}
    print(f"after:  {uptime()}")
    print(
        f"{args.layers} layers, {args.steps} steps of {args.batch}x{args.seq} tokens, "
        f"{2 * args.repeats} runs each (A B B A)"
    )
    print(f"A one forward per batch (probekit): median {med['A']:.3f}s  {times['A']}")
    print(f"B one forward per layer per batch:  median {med['B']:.3f}s  {times['B']}")
    print(f"ratio B / A = {med['B'] / med['A']:.2f}x (L = {args.layers})")
    print(f"largest translator difference A vs B: {diff:.2e}")
    cmd = [sys.executable, __file__, *sys.argv[1:]]
    for way in WAYS:
        out = subprocess.run([*cmd, "--memory-only", way], capture_output=True, text=True)
        print(f"peak memory {way}: {out.stdout.strip() or out.stderr.strip()[-300:]}")


if __name__ == "__main__":
    main()
