"""Benchmark: probekit's depth analyses against the naive loop of one hooked forward per variant.

Builds a random 24-layer GPT-2-style model (d_model 256) and, on the same batch, computes the
zero-ablation contributions (every layer, attention and MLP), the skip-effect matrix and all
adjacent layer swaps two ways:

- naive: a Python loop with one full ``bridge.run_with_hooks`` forward per variant (swaps run
  a full forward with the blocks reordered), every number computed from those logits;
- probekit: ``contributions`` + ``skip_effects`` + ``layer_swaps(pairs="adjacent")`` sharing
  one :class:`~probekit.analyses.depth.shared.Shared` cache, as ``diagnose`` does (a fresh one
  per run): the residual entering each block is kept once, each variant resumes after its
  clean prefix, and the whole-layer skips run once for both analyses.

``--block-paths`` adds a third way, ``probekit_bridge``: probekit with
``Model.raw_blocks = False``, so every hook-free block runs through the TransformerBridge block
instead of the pure Hugging Face copy that shares its weights (``Model.block_path``; the
default ``probekit`` way uses the copies where they pass their check). The environment variable
``PROBEKIT_RAW_BLOCKS=0`` turns the copies off for the ``probekit`` way as well.

``--no-naive`` (with ``--block-paths``) times only the two probekit ways, A B B A.

Method: the two ways run interleaved A B B A (naive, probekit, probekit, naive; with
``--block-paths`` naive, probekit, probekit_bridge, probekit_bridge, probekit, naive),
``--repeats`` times, in one process after a warm-up of each; the script prints every repetition, the
medians and their ratio, ``uptime`` before and after (the machine may be shared), and the
largest absolute difference between the two sets of numbers. ``--memory`` also runs each way
once in its own subprocess for its peak memory (max RSS on CPU, max allocated on CUDA).

Threads: one by default (``--threads``). ``OMP_WAIT_POLICY`` is set to ``PASSIVE`` unless
already set: with OpenMP's default spinning wait, two threads on a busy machine can slow
either way several times, which says nothing about the method. ``--variants-per-pass`` and
``--autocast`` pass to the cache (stacked variants and autocast, for accelerators).

Usage:
    python benchmarks/bench_depth.py [--layers 24] [--d-model 256] [--batch 8] [--seq 64]
        [--repeats 1] [--threads 1] [--device cpu|cuda] [--variants-per-pass 1]
        [--autocast bf16|fp16] [--memory] [--block-paths [--no-naive]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402  (env first)
    interleaved,
    max_rss_mib,
    random_gpt2,
    timed,
    uptime,
)


def build(args):
    import torch

    import probekit

    hf = random_gpt2(args.vocab, max(args.seq, 64), args.d_model, args.layers, heads=8)
    model = probekit.load(hf, device=args.device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, args.vocab, (args.batch, args.seq), generator=g).to(model.device)
    return model, tokens


def run_probekit(model, tokens, args) -> dict:
    import probekit
    from probekit.analyses.depth.shared import Shared

    cache = Shared(model, variants_per_pass=args.variants_per_pass, autocast=args.autocast)
    numbers = {}
    res = probekit.contributions(model, tokens, cache=cache)
    for row in res.df.itertuples():
        numbers[f"contrib/{row.component}/{row.layer}/{row.measure}"] = row.value
    res = probekit.skip_effects(model, tokens, cache=cache)
    for row in res.df.itertuples():
        numbers[f"skip/{row.skipped_layer}/{row.target_layer}"] = row.value
    res = probekit.layer_swaps(
        model, tokens, pairs="adjacent", blocks=None, n_bootstrap=0, cache=cache
    )
    for row in res.df[res.df.kind == "layer_swap"].itertuples():
        numbers[f"swap/{row.first_start}/{row.second_start}"] = row.value
    return numbers


def run_naive(model, tokens, args=None) -> dict:
    """The way people write it by hand: one full hooked forward per variant."""
    import torch

    from probekit.analyses.common import output_change, token_loss
    from probekit.interventions import swap_layers

    bridge, n = model.bridge, model.n_layers
    [batch] = model.prepare(tokens, batch_size=len(tokens))  # one forward of every sequence
    labels = batch.labels
    has_target = labels != -100

    def forward(hooks=()):
        with torch.no_grad():
            return bridge.run_with_hooks(tokens, fwd_hooks=list(hooks), use_cache=False)

    def keep_update(layer, updates):
        """Hooks that store block ``layer``'s update (output - input) in ``updates``."""
        store = {}

        def grab_in(t, hook):
            store["in"] = t

        def grab_out(t, hook):
            updates[layer] = t - store["in"]

        return [(f"blocks.{layer}.hook_in", grab_in), (f"blocks.{layer}.hook_out", grab_out)]

    clean_updates = {}
    clean = forward([h for i in range(n) for h in keep_update(i, clean_updates)])
    clean_loss = token_loss(clean, labels)[has_target].mean()
    numbers = {}

    def skip(layer):
        store = {}
        return [
            (f"blocks.{layer}.hook_in", lambda t, hook: store.__setitem__("h", t)),
            (f"blocks.{layer}.hook_out", lambda t, hook: store["h"]),
        ]

    def zero(t, hook):
        return torch.zeros_like(t)

    for layer in range(n):
        variants = {
            "layer": skip(layer),
            "attn": [(f"blocks.{layer}.attn.hook_out", zero)],
            "mlp": [(f"blocks.{layer}.mlp.hook_out", zero)],
        }
        for component, hooks in variants.items():
            changed = forward(hooks)
            for name, values in output_change(clean, changed, labels).items():
                sel = has_target if name == "loss_delta" else torch.ones_like(has_target)
                numbers[f"contrib/{component}/{layer}/{name}"] = float(values[sel].mean())
    for skipped in range(n):
        new_updates = {}
        hooks = skip(skipped) + [
            h for i in range(skipped + 1, n) for h in keep_update(i, new_updates)
        ]
        changed = forward(hooks)
        for layer in range(skipped + 1, n):
            diff = (new_updates[layer] - clean_updates[layer]).double().norm(dim=-1)
            ratio = diff / (clean_updates[layer].double().norm(dim=-1) + 1e-12)
            numbers[f"skip/{skipped}/{layer}"] = float(ratio.mean())
        prob = output_change(clean, changed, labels)["prob_l2"]
        numbers[f"skip/{skipped}/-1"] = float(prob.mean())
    for i in range(n - 1):
        with swap_layers(model, i, i + 1):
            changed = forward()
        numbers[f"swap/{i}/{i + 1}"] = float(
            token_loss(changed, labels)[has_target].mean() - clean_loss
        )
    return numbers


def run_probekit_bridge(model, tokens, args) -> dict:
    """probekit with every block run through the bridge (no pure Hugging Face copies)."""
    before = model.raw_blocks
    model.raw_blocks = False
    try:
        return run_probekit(model, tokens, args)
    finally:
        model.raw_blocks = before


WAYS = {"naive": run_naive, "probekit": run_probekit, "probekit_bridge": run_probekit_bridge}


def timed_way(way: str, model, tokens, args) -> tuple[float, dict]:
    return timed(lambda: WAYS[way](model, tokens, args), model.device)


def setup(args):
    import torch

    torch.set_num_threads(args.threads)
    model, tokens = build(args)
    # import every analysis module before timing: probekit imports its analyzers on first use
    from probekit import contributions, layer_swaps, skip_effects  # noqa: F401
    from probekit.interventions import swap_layers  # noqa: F401

    return model, tokens


def peak_memory(args) -> None:
    """One run of ``args.memory_only`` in this fresh process; print its peak memory."""
    import torch

    model, tokens = setup(args)
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timed_way(args.memory_only, model, tokens, args)
    if model.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = max_rss_mib()
    print(json.dumps({"way": args.memory_only, "peak_mib": round(peak, 1)}))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="A B B A rounds")
    parser.add_argument("--variants-per-pass", type=int, default=1)
    parser.add_argument("--autocast", choices=["bf16", "fp16"], default=None)
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument(
        "--block-paths",
        action="store_true",
        help="also time probekit with every block through the bridge (Model.raw_blocks off)",
    )
    parser.add_argument(
        "--no-naive", action="store_true", help="leave the naive loop out (with --block-paths)"
    )
    parser.add_argument("--memory-only", choices=list(WAYS), help=argparse.SUPPRESS)
    return parser.parse_args()


def report_naive(numbers: dict, times: dict, med: dict) -> None:
    naive, fast = numbers["naive"], numbers["probekit"]
    missing = set(naive) ^ set(fast)
    diffs = [abs(naive[k] - fast[k]) for k in naive if k in fast]
    print(f"variants compared: {len(diffs)} numbers ({len(missing)} unmatched)")
    print(f"naive    : median {med['naive']:8.2f} s   runs {times['naive']}")
    print(f"probekit : median {med['probekit']:8.2f} s   runs {times['probekit']}")
    print(f"speed-up : {med['naive'] / med['probekit']:.2f}x (ratio of the medians)")
    print(f"max |difference| between the two sets of numbers: {max(diffs):.2e}")


def report_block_paths(numbers: dict, times: dict, med: dict) -> None:
    fast, bridge = numbers["probekit"], numbers["probekit_bridge"]
    print(f"probekit (HF blocks)    : median {med['probekit']:8.2f} s   runs {times['probekit']}")
    print(
        f"probekit (bridge blocks): median {med['probekit_bridge']:8.2f} s   "
        f"runs {times['probekit_bridge']}"
    )
    print(
        f"HF blocks vs bridge blocks: {med['probekit_bridge'] / med['probekit']:.2f}x "
        "(ratio of the medians); max |difference| of their numbers: "
        f"{max(abs(fast[k] - bridge[k]) for k in fast):.2e}"
    )
    # each A B B A round's ratio, robust to a load that drifts between rounds
    hf, br = times["probekit"], times["probekit_bridge"]
    rounds = [(br[i] + br[i + 1]) / (hf[i] + hf[i + 1]) for i in range(0, len(hf), 2)]
    print(
        f"per-round ratios (bridge / HF): {[round(r, 2) for r in rounds]}, median "
        f"{statistics.median(rounds):.2f}x"
    )


def main() -> None:
    args = parse_args()
    if args.no_naive and not args.block_paths:
        raise SystemExit("--no-naive needs --block-paths (there is nothing to compare)")
    if args.memory_only:
        peak_memory(args)
        return
    print(f"before: {uptime()}", flush=True)
    model, tokens = setup(args)
    ways = [] if args.no_naive else ["naive"]
    ways += ["probekit"] + (["probekit_bridge"] if args.block_paths else [])
    print(f"block path of hook-free resumes (probekit): {model.block_path}")
    for way in ways:  # warm-up
        timed_way(way, model, tokens, args)
    times: dict[str, list[float]] = {way: [] for way in ways}
    numbers: dict[str, dict] = {}
    for way in interleaved(ways, args.repeats):
        seconds, numbers[way] = timed_way(way, model, tokens, args)
        times[way].append(round(seconds, 2))
        print(f"  {way:15s} {seconds:8.2f} s", flush=True)
    print(f"after:  {uptime()}")
    med = {way: statistics.median(t) for way, t in times.items()}
    order = "ABC"[: len(ways)]
    print(
        f"model: GPT-2-style, {args.layers} layers, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq} tokens; device {args.device}; threads {args.threads}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}; variants per pass "
        f"{args.variants_per_pass}; autocast {args.autocast}; {2 * args.repeats} runs each "
        f"({' '.join(order + order[::-1])} = {', '.join(ways)})"
    )
    if not args.no_naive:
        report_naive(numbers, times, med)
    if args.block_paths:
        report_block_paths(numbers, times, med)
    if args.memory:
        cmd = [sys.executable, __file__, *sys.argv[1:]]
        for way in ways:
            out = subprocess.run([*cmd, "--memory-only", way], capture_output=True, text=True)
            print(f"peak memory {way}: {out.stdout.strip() or out.stderr.strip()[-300:]}")


if __name__ == "__main__":
    main()
