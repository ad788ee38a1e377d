"""Benchmark: probekit's depth analyses against the naive loop of one hooked forward per variant.

Builds a random 24-layer GPT-2-style model (d_model 256) and, on the same batch, computes the
zero-ablation contributions (every layer, attention and MLP), the skip-effect matrix and all
adjacent layer swaps two ways:

- naive: a Python loop with one full ``bridge.run_with_hooks`` forward per variant (swaps run
  a full forward with the blocks reordered), every number computed from those logits;
- probekit: ``contributions`` + ``skip_effects`` + ``layer_swaps(pairs="adjacent")``, which
  cache the residual entering each block once and resume each variant after its clean prefix.

Each way runs in its own subprocess so peak memory (max RSS on CPU, max allocated on CUDA) is
its own. Prints the wall-clock ratio, the largest absolute difference between the two sets of
numbers, and peak memory.

Usage:
    python benchmarks/bench_depth.py [--layers 24] [--d-model 256] [--batch 8] [--seq 64]
                                     [--device cpu|cuda] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(args):
    import torch
    import transformers

    import probekit

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=max(args.seq, 64),
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=8,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    model = probekit.load(hf, device=args.device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, args.vocab, (args.batch, args.seq), generator=g).to(model.device)
    return model, tokens


def run_probekit(model, tokens) -> dict:
    import probekit

    numbers = {}
    res = probekit.contributions(model, tokens)
    for row in res.df.itertuples():
        numbers[f"contrib/{row.component}/{row.layer}/{row.measure}"] = row.value
    res = probekit.skip_effects(model, tokens)
    for row in res.df.itertuples():
        numbers[f"skip/{row.skipped_layer}/{row.target_layer}"] = row.value
    res = probekit.layer_swaps(model, tokens, pairs="adjacent", blocks=None, n_bootstrap=0)
    for row in res.df[res.df.kind == "layer_swap"].itertuples():
        numbers[f"swap/{row.first_start}/{row.second_start}"] = row.value
    return numbers


def run_naive(model, tokens) -> dict:
    """The way people write it by hand: one full hooked forward per variant."""
    import torch

    from probekit.analyses._common import output_change, token_loss
    from probekit.interventions import swap_layers

    bridge, n = model.bridge, model.n_layers
    [batch] = model.prepare(tokens)
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


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    model, tokens = build(args)
    # import every analysis module before timing: probekit imports its analyzers on first use
    from probekit import contributions, layer_swaps, skip_effects  # noqa: F401
    from probekit.interventions import swap_layers  # noqa: F401

    run = run_naive if args.worker == "naive" else run_probekit
    run(model, tokens) if args.warmup else None
    if model.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    numbers = run(model, tokens)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds = time.perf_counter() - start
    with open(args.out, "w") as handle:
        json.dump({"seconds": seconds, "peak_mib": peak, "numbers": numbers}, handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", action="store_true", help="run each way once before timing")
    parser.add_argument("--worker", choices=["naive", "probekit"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("naive", "probekit"):
            out = os.path.join(tmp, f"{way}.json")
            cmd = [sys.executable, __file__, "--worker", way, "--out", out] + sys.argv[1:]
            subprocess.run(cmd, check=True)
            with open(out) as handle:
                results[way] = json.load(handle)
    naive, fast = results["naive"], results["probekit"]
    missing = set(naive["numbers"]) ^ set(fast["numbers"])
    diffs = [abs(naive["numbers"][k] - fast["numbers"][k]) for k in naive["numbers"]]
    print(
        f"model: GPT-2-style, {args.layers} layers, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq} tokens; device {args.device}; threads {args.threads}"
    )
    print(f"variants compared: {len(diffs)} numbers ({len(missing)} unmatched)")
    print(f"naive    : {naive['seconds']:8.2f} s   peak memory {naive['peak_mib']:8.1f} MiB")
    print(f"probekit : {fast['seconds']:8.2f} s   peak memory {fast['peak_mib']:8.1f} MiB")
    print(f"speed-up : {naive['seconds'] / fast['seconds']:.2f}x")
    print(f"max |difference| between the two sets of numbers: {max(diffs):.2e}")


if __name__ == "__main__":
    main()
