"""Benchmark: probekit against the ways a researcher would write the same depth analyses.

On the same random model and tokens, the zero-ablation contributions (every layer, attention
and MLP; the four output measures), the skip-effect matrix (each later block's update change
and the output's ``prob_l2``) and every adjacent swap's loss change, computed four ways:

- ``probekit``: ``contributions`` + ``skip_effects`` + ``layer_swaps(pairs="adjacent")``
  sharing one cache, as ``diagnose`` does (``bench_depth.run_probekit``);
- ``hf``: plain Hugging Face ``GPT2LMHeadModel`` and torch forward hooks, written the fastest
  way a user would: ``torch.inference_mode``, one forward per variant (4L in all: the clean
  one, L whole-layer skips that also give the skip effects, 2L sublayer ablations, L - 1
  swaps), a skipped block taken out of the ``ModuleList`` (not computed), a swap as the
  ``ModuleList`` reordered, only the block updates the skip effects need kept;
- ``nnsight``: the same variants with nnsight 0.8's tracing on the same Hugging Face model
  (``NNsight(model).trace(tokens)``, ``.input`` / ``.output`` / ``.skip``, ``nnsight.save``);
- ``tl``: the TransformerLens bridge loop of ``bench_depth.run_naive`` (one
  ``run_with_hooks`` forward per variant, 5L forwards);
- ``stacked`` (not a peer, only when asked for): probekit with ``--stack`` hook-free variants
  stacked along the batch per pass (``variants_per_pass``), to choose that default.

The peers compute their measures with probekit's own measure functions from a clean side made
once (``output_change`` on ``clean_side``), so the comparison is of the forwards, not of the
formulas. Every way's numbers are checked against probekit's (same keys, max |difference|).

Method: the ways run interleaved (A B C D D C B A, ``--repeats`` rounds) in one process after
a warm-up of each, one torch thread by default, ``OMP_WAIT_POLICY=PASSIVE``; it prints every
run's wall and CPU seconds (``time.process_time``: on a shared CPU the work done, not the time
other jobs held the cores), the medians, each peer's ratio to probekit, ``uptime`` before and
after, the sustained float32 matmul rate at that thread count per wall and per CPU second
(``benchmarks/machine.py``; measured before and after the runs, the higher taken as the limit:
a loaded machine only lowers it), the arithmetic the analyses need at the exact-resumption
minimum and each way's achieved fraction of the matmul limit (that arithmetic / its median time
/ the rate, per wall and per CPU second). Peak memory (unless ``--no-memory``): each way run
once more in a fresh process (``MALLOC_MMAP_THRESHOLD_=131072``, so the resident set shows live
memory) that builds only that way's model; printed is ``ru_maxrss`` minus the resident set
after the build (the peak above the model), and ``ru_maxrss`` itself (on CUDA:
``torch.cuda.max_memory_allocated`` and the allocated memory after the build).

Models (``--model``): ``bench24`` (bench_depth's: 24 layers, d_model 256, 8 heads, vocabulary
512, 8 x 64 tokens), ``gpt2-small`` (GPT-2 small's config with random weights: nothing is
downloaded; 8 x 128 tokens), ``tiny`` (3 layers, d_model 64, 2 x 16 tokens: for the test).
``--batch`` / ``--seq`` change the tokens (printed). Without nnsight installed
(``pip install -e .[bench]``) the benchmark says so and runs the other ways.

``--parts`` times probekit's way alone, once after a warm-up, with a timer around every call
of its output heads, output measures, clean traces and clean output sides (:data:`PARTS`),
and prints each part and the rest (the block passes): where its time goes.

Usage:
    python benchmarks/bench_peers.py [--model bench24|gpt2-small|tiny] [--repeats 1]
        [--ways probekit,hf,nnsight,tl] [--threads 1] [--batch B] [--seq T] [--no-memory]
    python benchmarks/bench_peers.py --model gpt2-small --parts
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (benchmarks/common.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.common import (  # noqa: E402
    interleaved,
    max_difference,
    max_rss_mib,
    median,
    peak_in_subprocess,
    random_gpt2,
    rss_mib,
    runs_line,
    settings_line,
    timed_cpu,
    uptime,
)

MODELS = {
    "bench24": dict(layers=24, d_model=256, heads=8, vocab=512, batch=8, seq=64),
    "gpt2-small": dict(layers=12, d_model=768, heads=12, vocab=50257, batch=8, seq=128),
    "tiny": dict(layers=3, d_model=64, heads=4, vocab=128, batch=2, seq=16),
}
PEERS = ("hf", "nnsight", "tl")
ALL_WAYS = ("probekit", *PEERS, "stacked")
DEFAULT_WAYS = ("probekit", *PEERS)
LABELS = {
    "stacked": "probekit, stacked variants",
    "probekit": "probekit (shared cache, resumed variants)",
    "hf": "Hugging Face + torch hooks",
    "nnsight": "nnsight 0.8 tracing",
    "tl": "TransformerLens bridge loop",
}


def build_hf(spec: SimpleNamespace):
    """The random GPT-2-style model of ``spec`` (the same weights on every call)."""
    n_positions = max(spec.seq, 1024 if spec.vocab > 1000 else 64)
    return random_gpt2(spec.vocab, n_positions, spec.d_model, spec.layers, spec.heads, spec.device)


def make_tokens(spec: SimpleNamespace):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(1, spec.vocab, (spec.batch, spec.seq), generator=g).to(spec.device)


def next_token_labels(tokens):
    """Each position's target, the next token; -100 (no target) at the last position."""
    import torch

    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return labels


def record_measures(numbers: dict, key: str, side, changed, labels) -> dict:
    """Store the means of the output measures of ``changed`` against the clean ``side``."""
    from probekit.analyses.common import output_change

    has_target = labels != -100
    values = output_change(side, changed, labels)
    for name, per_token in values.items():
        sel = has_target if name == "loss_delta" else slice(None)
        numbers[f"{key}/{name}"] = float(per_token[sel].mean())
    return values


def record_skip(numbers: dict, skipped: int, updates: dict, clean_updates: dict, values) -> None:
    """The skip effects of ``skipped``: each later block's relative update change, and prob_l2."""
    for layer, update in updates.items():
        diff = (update - clean_updates[layer]).double().norm(dim=-1)
        ratio = diff / (clean_updates[layer].double().norm(dim=-1) + 1e-12)
        numbers[f"skip/{skipped}/{layer}"] = float(ratio.mean())
    numbers[f"skip/{skipped}/-1"] = float(values["prob_l2"].mean())


def record_swap(numbers: dict, i: int, side, changed, labels) -> None:
    from probekit.analyses.common import output_change

    loss = output_change(side, changed, labels, measures=("loss_delta",))["loss_delta"]
    numbers[f"swap/{i}/{i + 1}"] = float(loss[labels != -100].mean())


class Skip(torch.nn.Module):
    """A block taken out: returns the residual it is given."""

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def run_hf(hf, tokens, labels) -> dict:
    """Plain Hugging Face + torch forward hooks, one forward per variant."""
    import torch

    from probekit.analyses.common import clean_side

    blocks = hf.transformer.h
    n = len(blocks)

    def keep_updates(store: dict, layers) -> list:
        def hook(i):
            return lambda mod, args, out: store.__setitem__(i, out - args[0])

        return [blocks[i].register_forward_hook(hook(i)) for i in layers]

    def forward(handles=()) -> torch.Tensor:
        try:
            return hf(tokens, use_cache=False).logits
        finally:
            for handle in handles:
                handle.remove()

    numbers: dict[str, float] = {}
    with torch.inference_mode():
        clean_updates: dict = {}
        side = clean_side(forward(keep_updates(clean_updates, range(n))), labels)
        for i in range(n):
            updates: dict = {}
            handles = keep_updates(updates, range(i + 1, n))
            block, blocks[i] = blocks[i], Skip()
            try:
                changed = forward(handles)
            finally:
                blocks[i] = block
            values = record_measures(numbers, f"contrib/layer/{i}", side, changed, labels)
            record_skip(numbers, i, updates, clean_updates, values)
            attn = blocks[i].attn.register_forward_hook(
                lambda mod, args, out: (torch.zeros_like(out[0]), *out[1:])
            )
            record_measures(numbers, f"contrib/attn/{i}", side, forward([attn]), labels)
            mlp = blocks[i].mlp.register_forward_hook(lambda mod, args, out: torch.zeros_like(out))
            record_measures(numbers, f"contrib/mlp/{i}", side, forward([mlp]), labels)
        for i in range(n - 1):
            blocks[i], blocks[i + 1] = blocks[i + 1], blocks[i]
            try:
                changed = forward()
            finally:
                blocks[i], blocks[i + 1] = blocks[i + 1], blocks[i]
            record_swap(numbers, i, side, changed, labels)
    return numbers


def run_nnsight(nn, tokens, labels) -> dict:
    """nnsight 0.8 tracing: one trace per variant on the wrapped Hugging Face model."""
    import nnsight
    import torch

    from probekit.analyses.common import clean_side

    blocks, hf_blocks = nn.transformer.h, nn._module.transformer.h
    n = len(hf_blocks)
    numbers: dict[str, float] = {}
    with torch.inference_mode():
        with nn.trace(tokens, use_cache=False):
            clean_updates = nnsight.save({})
            for i in range(n):
                block_in = blocks[i].input
                clean_updates[i] = blocks[i].output - block_in
            clean = nn.lm_head.output.save()
        side = clean_side(clean, labels)
        for i in range(n):
            with nn.trace(tokens, use_cache=False):
                blocks[i].skip(blocks[i].input)
                updates = nnsight.save({})
                for j in range(i + 1, n):
                    block_in = blocks[j].input
                    updates[j] = blocks[j].output - block_in
                changed = nn.lm_head.output.save()
            values = record_measures(numbers, f"contrib/layer/{i}", side, changed, labels)
            record_skip(numbers, i, updates, clean_updates, values)
            with nn.trace(tokens, use_cache=False):
                out = blocks[i].attn.output
                blocks[i].attn.output = (torch.zeros_like(out[0]), *out[1:])
                changed = nn.lm_head.output.save()
            record_measures(numbers, f"contrib/attn/{i}", side, changed, labels)
            with nn.trace(tokens, use_cache=False):
                blocks[i].mlp.output = torch.zeros_like(blocks[i].mlp.output)
                changed = nn.lm_head.output.save()
            record_measures(numbers, f"contrib/mlp/{i}", side, changed, labels)
        for i in range(n - 1):
            hf_blocks[i], hf_blocks[i + 1] = hf_blocks[i + 1], hf_blocks[i]
            try:
                with nn.trace(tokens, use_cache=False):
                    changed = nn.lm_head.output.save()
            finally:
                hf_blocks[i], hf_blocks[i + 1] = hf_blocks[i + 1], hf_blocks[i]
            record_swap(numbers, i, side, changed, labels)
    return numbers


def nnsight_missing() -> str | None:
    """Why nnsight cannot run here, or None."""
    try:
        import nnsight
    except ImportError:
        return "nnsight is not installed (pip install -e .[bench])"
    if not nnsight.__version__.startswith("0.8"):
        return f"nnsight {nnsight.__version__} is installed; this benchmark is written for 0.8"
    return None


def setup(spec: SimpleNamespace, ways) -> dict:
    """Each way's callable (no arguments; returns its numbers), building only what it needs."""
    import torch

    torch.set_num_threads(spec.threads)
    tokens = make_tokens(spec)
    labels = next_token_labels(tokens)
    run = {}
    if {"probekit", "tl", "stacked"} & set(ways):
        import probekit
        from benchmarks.bench_depth import run_naive, run_probekit
        from probekit import contributions, layer_swaps, skip_effects  # noqa: F401
        from probekit.interventions import swap_layers  # noqa: F401

        model = probekit.load(build_hf(spec), device=spec.device)
        options = SimpleNamespace(variants_per_pass=spec.variants_per_pass, autocast=None)
        stacked = SimpleNamespace(variants_per_pass=spec.stack, autocast=None)
        run["probekit"] = lambda: run_probekit(model, tokens, options)
        run["stacked"] = lambda: run_probekit(model, tokens, stacked)
        run["tl"] = lambda: run_naive(model, tokens)
    if "hf" in ways:
        hf = build_hf(spec)
        run["hf"] = lambda: run_hf(hf, tokens, labels)
    if "nnsight" in ways:
        from nnsight import NNsight

        nn = NNsight(build_hf(spec))
        run["nnsight"] = lambda: run_nnsight(nn, tokens, labels)
    return {way: run[way] for way in ways}


def peak_memory(spec: SimpleNamespace, way: str) -> None:
    """One run of ``way`` in this fresh process; print its peak memory as one JSON line."""
    import torch

    fn = setup(spec, [way])[way]
    if spec.device.startswith("cuda"):  # device memory: the resident set says nothing of it
        base = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
        fn()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        base = rss_mib()
        fn()
        peak = max_rss_mib()
    print(json.dumps({"way": way, "model_rss_mib": round(base, 1), "peak_mib": round(peak, 1)}))


PARTS = (
    ("output heads", "probekit.model.output", "OutputHead", "__call__"),
    ("output measures", "probekit.analyses.common", None, "output_change"),
    ("clean traces", "probekit.model.handle", "Model", "trace"),
    ("clean output sides", "probekit.analyses.depth.shared", None, "clean_side"),
)
"""What ``--parts`` times in probekit's way: (name, module, class or None, function); none of
them calls another, so their times add up."""


def probekit_parts(run) -> None:
    """One warm-up, then one run of probekit's way with a timer around every call of each of
    :data:`PARTS`; print each part's seconds and calls, and the rest (block passes and
    bookkeeping)."""
    import importlib
    import time

    run()
    seconds = dict.fromkeys([name for name, *_ in PARTS], 0.0)
    calls = dict.fromkeys(seconds, 0)
    originals = []

    def timer(name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start
                calls[name] += 1

        return timed

    for name, module_name, class_name, attr in PARTS:
        owner = importlib.import_module(module_name)
        owner = getattr(owner, class_name) if class_name else owner
        originals.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, timer(name, getattr(owner, attr)))
    try:
        start = time.perf_counter()
        run()
        total = time.perf_counter() - start
    finally:
        for owner, attr, fn in originals:
            setattr(owner, attr, fn)
    parts = ", ".join(f"{name} {seconds[name]:.2f} s ({calls[name]} calls)" for name in seconds)
    rest = total - sum(seconds.values())
    print(
        f"probekit's time in parts (one run after a warm-up, a timer around each call): {parts}"
        f"; block passes and the rest {rest:.2f} s; total {total:.2f} s"
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=list(MODELS), default="bench24")
    p.add_argument("--batch", type=int, help="sequences (default: the model's)")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: the model's)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds")
    p.add_argument(
        "--ways",
        default=",".join(DEFAULT_WAYS),
        help=f"a comma-separated subset of {', '.join(ALL_WAYS)} (stacked: probekit with "
        "--stack variants per pass)",
    )
    p.add_argument("--stack", type=int, default=4, help="variants per pass of the stacked way")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--variants-per-pass",
        type=int,
        default=None,
        help="probekit's stacking (default: probekit's own, on a CPU enough variants for "
        "1024 token rows per block run; 1 reproduces the figures measured before that default)",
    )
    p.add_argument("--no-memory", action="store_true", help="leave out the peak-memory runs")
    p.add_argument("--no-warmup", action="store_true", help="no warm-up run of each way")
    p.add_argument(
        "--parts",
        action="store_true",
        help="time probekit's way alone, split into output heads, measures, clean traces and "
        "the rest (block passes)",
    )
    p.add_argument("--memory-only", choices=ALL_WAYS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = set(ways) - set(ALL_WAYS)
    if unknown or not ways:
        p.error(f"--ways: unknown {sorted(unknown)}; choose from {', '.join(ALL_WAYS)}")
    args.way_list = ways
    return args


def spec_of(args: argparse.Namespace) -> SimpleNamespace:
    spec = SimpleNamespace(**MODELS[args.model])
    spec.batch = args.batch or spec.batch
    spec.seq = args.seq or spec.seq
    spec.threads, spec.device = args.threads, args.device
    spec.variants_per_pass, spec.stack = args.variants_per_pass, args.stack
    return spec


def time_ways(run: dict, args: argparse.Namespace, device: str) -> tuple[dict, dict, dict]:
    """Warm-up, then the interleaved runs; every run printed. Wall and CPU seconds and the
    numbers, per way."""
    ways = list(run)
    numbers: dict[str, dict] = {}
    if not args.no_warmup:
        for way in ways:
            wall, cpu, numbers[way] = timed_cpu(run[way], device)
            print(f"  warm-up {way:9s} {wall:8.2f} s  (CPU {cpu:7.2f} s)", flush=True)
    times: dict[str, list[float]] = {way: [] for way in ways}
    cpus: dict[str, list[float]] = {way: [] for way in ways}
    for way in interleaved(ways, args.repeats):
        wall, cpu, numbers[way] = timed_cpu(run[way], device)
        times[way].append(wall)
        cpus[way].append(cpu)
        print(f"  {way:17s} {wall:8.2f} s  (CPU {cpu:7.2f} s)", flush=True)
    return times, cpus, numbers


def memory_text(mem: dict) -> str:
    if "peak_mib" in mem:
        return (
            f"; peak {mem['peak_mib'] - mem['model_rss_mib']:.0f} MiB above the model "
            f"(ru_maxrss {mem['peak_mib']:.0f} MiB)"
        )
    return f"; memory: {mem['error']}" if "error" in mem else ""


def report(spec, args, times: dict, cpus: dict, numbers: dict, limits: dict, memory: dict):
    """Per way: runs, medians, ratio to probekit, fraction of the limit, numbers, memory; then
    the ratio to the fastest peer (wall time; and CPU time on a CPU)."""
    from benchmarks.machine import diagnosis_flops

    work = diagnosis_flops(spec.layers, spec.d_model, spec.batch, spec.seq, spec.vocab)
    med = {way: median(t) for way, t in times.items()}
    med_cpu = {way: median(t) for way, t in cpus.items()}
    on_cpu = spec.device == "cpu"
    ref = "probekit" if "probekit" in numbers else next(iter(numbers))
    print(
        f"model {args.model}: {spec.layers} layers, d_model {spec.d_model}, vocab {spec.vocab}; "
        f"{spec.batch} x {spec.seq} tokens; {settings_line(spec.threads, spec.device)}; "
        f"{2 * args.repeats} runs each, interleaved {' '.join(list(times) + list(times)[::-1])}"
    )
    print(f"arithmetic needed (exact-resumption minimum): {work.describe()}")
    print(
        f"float32 matmul limit at {spec.threads} thread(s): {limits['wall']:.1f} GFLOP/s"
        + (f" per wall second, {limits['cpu']:.1f} per CPU second" if on_cpu else "")
    )
    for way in times:
        worst, unmatched = max_difference(numbers[ref], numbers[way])
        ratio = f"; {med[way] / med[ref]:.2f}x probekit's time" if way != ref else ""
        rate = work.total / med[way] / 1e9
        label = LABELS[way] + (f" ({spec.stack} per pass)" if way == "stacked" else "")
        print(
            f"{label:42s} {runs_line(times[way])}{ratio}; {rate:.1f} GFLOP/s = "
            f"{rate / limits['wall']:.0%} of the limit; {len(numbers[way])} numbers, max "
            f"|difference| {worst:.2e} ({unmatched} unmatched){memory_text(memory.get(way, {}))}"
        )
        if on_cpu:
            rate = work.total / med_cpu[way] / 1e9
            ratio = f"; {med_cpu[way] / med_cpu[ref]:.2f}x probekit's" if way != ref else ""
            print(
                f"{'':42s} CPU time: {runs_line(cpus[way])}{ratio}; {rate:.1f} GFLOP per CPU "
                f"second = {rate / limits['cpu']:.0%} of the limit"
            )
    peers = [w for w in times if w in PEERS]
    if "probekit" in times and peers:
        fastest = min(peers, key=med.get)
        worst = max(max_difference(numbers["probekit"], numbers[w])[0] for w in peers)
        print(f"fastest peer: {LABELS[fastest]}")
        if on_cpu:
            by_cpu = min(peers, key=med_cpu.get)
            print(
                f"in CPU time: probekit vs the fastest peer ({LABELS[by_cpu]}): "
                f"{med_cpu[by_cpu] / med_cpu['probekit']:.2f}x"
            )
        print(
            f"probekit vs the fastest peer: {med[fastest] / med['probekit']:.2f}x "
            f"(max |difference| {worst:.2e})"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = spec_of(args)
    if args.memory_only:
        peak_memory(spec, args.memory_only)
        return 0
    if args.parts:
        print(f"before: {uptime()}", flush=True)
        settings = settings_line(spec.threads, spec.device)
        print(f"model {args.model}: {spec.batch} x {spec.seq} tokens; {settings}")
        probekit_parts(setup(spec, ["probekit"])["probekit"])
        print(f"after:  {uptime()}")
        return 0
    ways = args.way_list
    if "nnsight" in ways and (why := nnsight_missing()):
        print(f"{why}: running {', '.join(w for w in ways if w != 'nnsight')}")
        ways = [w for w in ways if w != "nnsight"]
    print(f"before: {uptime()}", flush=True)
    from benchmarks.machine import matmul_rate

    seconds = 0.3 if args.model == "tiny" else 2.0
    rows = spec.batch * spec.seq
    clocks = ("wall", "cpu") if spec.device == "cpu" else ("wall",)

    def rates() -> dict:
        return {
            c: matmul_rate(spec.d_model, rows, spec.threads, seconds, spec.device, c)
            for c in clocks
        }

    before = rates()
    run = setup(spec, ways)
    times, cpus, numbers = time_ways(run, args, spec.device)
    print(f"after:  {uptime()}", flush=True)
    after = rates()
    for c in clocks:
        print(
            f"float32 matmul rate before / after the runs, per {c} second: {before[c]:.1f} / "
            f"{after[c]:.1f} GFLOP/s (a block's products, {rows} rows); the limit is the higher"
        )
    limits = {c: max(before[c], after[c]) for c in clocks}
    memory = {}
    if not args.no_memory:
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        base = [__file__, *(argv if argv is not None else sys.argv[1:])]
        for way in ways:
            memory[way] = peak_in_subprocess([*base, "--memory-only", way], env)
    report(spec, args, times, cpus, numbers, limits, memory)
    worst = max(max_difference(numbers[ways[0]], numbers[w])[0] for w in ways)
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
