"""The machine's limit: the sustained float32 matrix-multiply rate, and a diagnosis's arithmetic.

``matmul_rate`` times ``torch.mm`` on the products of one GPT-2 block at the benchmark's shape
(``[tokens, d] x [d, 3d]``, ``[d, d]``, ``[d, 4d]``, ``[4d, d]``; their FLOPs are 24 d^2 per
token, the block's whole weight arithmetic), repeated until about ``seconds`` have passed, and
returns the median rate of the repeats in GFLOP/s at the given thread count: what the CPU
sustains on exactly the products a block pass needs, so no block pass can run faster.

``diagnosis_flops`` counts the arithmetic of contributions + skip effects + adjacent swaps at
the exact-resumption minimum (each variant resumed after its clean prefix, skip effects shared
with the whole-layer skips): per batch, the clean pass (L blocks), the L whole-layer skips
(L - 1 - i blocks each), the 2L sublayer ablations (L - i blocks each, the ablated block counted
whole) and the L - 1 adjacent swaps (L - i blocks each), 2L^2 + 2L - 1 block passes in all, and
4L output heads (clean, 3L ablations, L - 1 swaps). A block pass costs
``tokens * (24 d^2 + 4 T d)`` FLOPs (weights, then attention scores and values over all T
positions); a head ``2 * tokens * d * vocab``.

Run alone it prints, at 1 and 2 threads, the rate, one Hugging Face GPT-2 block pass, the same
block pass as probekit runs it (its Hugging Face copy with torch's fused tanh GELU; both timed
as ``--layers`` passes in a row, divided by their number) and one output head at the model's
shape (medians of 9 to 100 after a warm-up, each call timed in turn, inference mode), all in
CPU seconds of the process (``time.process_time``: on a shared machine the work done, not the
time other jobs held the cores); probekit's weight products and GELU timed alone on its
block's modules, which bound the fraction of the matmul limit a block pass with these kernels
reaches; and what the minimum work costs at the rate and in those block passes (probekit's
ceiling), with each peer's passes at the Hugging Face block time::

    python benchmarks/machine.py                    # bench24: 24 layers, d_model 256, 8 x 64
    python benchmarks/machine.py --layers 12 --d-model 768 --heads 12 --vocab 50257 --seq 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import settings_line, uptime  # noqa: E402


def block_products(d: int) -> list[tuple[int, int]]:
    """The (in, out) shapes of a GPT-2 block's four weight products."""
    return [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]


def matmul_rate(
    d: int,
    tokens: int,
    threads: int,
    seconds: float = 2.0,
    device: str = "cpu",
    clock: str = "wall",
) -> float:
    """Median GFLOP/s of ``torch.mm`` over a block's products at ``tokens`` rows, per wall
    second or (``clock="cpu"``) per CPU second of this process (on a shared machine the CPU
    rate is the core's own; at n threads it is per CPU second of all of them)."""
    import torch

    from benchmarks.common import sync

    now = time.perf_counter if clock == "wall" else time.process_time
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        pairs = [
            (
                torch.randn(tokens, a, generator=g).to(device),
                torch.randn(a, b, generator=g).to(device),
            )
            for a, b in block_products(d)
        ]
        flops = sum(2 * tokens * a * b for a, b in block_products(d))
        for x, w in pairs:  # warm-up
            torch.mm(x, w)
        rates, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(rates) < 5:
            sync(device)
            start = now()
            for _ in range(4):
                for x, w in pairs:
                    torch.mm(x, w)
            sync(device)
            rates.append(4 * flops / max(now() - start, 1e-9) / 1e9)
        return statistics.median(rates)
    finally:
        torch.set_num_threads(before)


@dataclass
class Arithmetic:
    """The FLOPs a diagnosis needs at the exact-resumption minimum."""

    block_passes: int
    heads: int
    block_flops: float
    head_flops: float

    @property
    def total(self) -> float:
        return self.block_passes * self.block_flops + self.heads * self.head_flops

    def describe(self) -> str:
        return (
            f"{self.block_passes} block passes x {self.block_flops / 1e9:.3f} GFLOP + "
            f"{self.heads} heads x {self.head_flops / 1e9:.3f} GFLOP = "
            f"{self.total / 1e9:.1f} GFLOP"
        )


def diagnosis_flops(layers: int, d: int, batch: int, seq: int, vocab: int) -> Arithmetic:
    """Contributions + skip effects + adjacent swaps at the exact-resumption minimum."""
    tokens = batch * seq
    L = layers
    return Arithmetic(
        block_passes=2 * L * L + 2 * L - 1,
        heads=4 * L,
        block_flops=tokens * (24 * d * d + 4 * seq * d),
        head_flops=2 * tokens * d * vocab,
    )


@dataclass
class BlockTimes:
    """Median CPU seconds at one shape: one Hugging Face GPT-2 block pass (``hf``), the same
    block as probekit runs it (``probekit``: its pure Hugging Face copy, whose tanh GELU is
    torch's fused kernel), one output head, and two parts of probekit's block pass timed
    alone on the block's own modules and shapes: its four weight products (``products``: the
    ``Conv1D`` layers, bias included) and its GELU."""

    hf: float
    probekit: float
    head: float
    products: float
    gelu: float


def _interleaved_medians(
    calls: dict, repeats: int, warm_seconds: float = 1.0, seconds: float = 3.0
) -> dict[str, float]:
    """Median CPU seconds of each call, the calls timed in turn (so every call meets the same
    state of the process's memory): rounds for at least ``warm_seconds`` (3 at least) as a
    warm-up, then at least ``repeats`` rounds and until ``seconds`` have passed (at most
    100)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    warm_end = time.perf_counter() + warm_seconds
    rounds = 0
    while rounds < 3 or time.perf_counter() < warm_end:
        for fn in calls.values():
            fn()
        rounds += 1
    end, done = time.perf_counter() + seconds, next(iter(times.values()))
    while len(done) < repeats or (time.perf_counter() < end and len(done) < 100):
        for name, fn in calls.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def block_times(
    d: int,
    heads: int,
    batch: int,
    seq: int,
    vocab: int,
    threads: int,
    layers: int = 1,
    repeats: int = 9,
) -> BlockTimes:
    """The :class:`BlockTimes` at this shape, in inference mode: what one block pass and one
    head cost a way that runs Hugging Face blocks, and probekit's block pass and its parts.
    The block passes are timed as they run, ``layers`` after one another (a Hugging Face
    ``transformer`` forward of that depth; probekit resuming its copies from the first block),
    and divided by ``layers``: a block timed alone, over and over, meets another state of the
    allocator's memory than a block between others (its temporaries' sizes repeat)."""
    import torch

    import probekit
    from benchmarks.common import random_gpt2
    from probekit.data import Batch

    torch.set_num_threads(threads)
    shape = dict(vocab=vocab, n_positions=max(seq, 64), d_model=d, layers=layers, heads=heads)
    model = random_gpt2(**shape)
    x = torch.randn(batch, seq, d)
    hidden = torch.randn(batch, seq, 4 * d)
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    handle = probekit.load(random_gpt2(**shape))
    [prepared] = handle.prepare(Batch(tokens), batch_size=batch)
    trace = handle.trace(prepared)
    if handle.block_path != "hf":
        raise SystemExit(f"probekit runs its blocks through the bridge: {handle.block_path}")
    copy = handle.hf_blocks.copies[id(handle.blocks[0])]

    def products() -> None:
        copy.attn.c_attn(x), copy.attn.c_proj(x), copy.mlp.c_fc(x), copy.mlp.c_proj(hidden)

    calls = {
        "hf": lambda: model.transformer(inputs_embeds=x, use_cache=False),
        "probekit": lambda: trace.resume_stacked([0], [x]),
        "head": lambda: model.lm_head(x),
        "products": products,
        "gelu": lambda: copy.mlp.act(hidden),
    }
    with torch.inference_mode():
        times = _interleaved_medians(calls, repeats)
    times["hf"] /= layers
    times["probekit"] /= layers
    return BlockTimes(**times)


def passes_of_each_way(layers: int) -> dict[str, tuple[int, int]]:
    """(block passes, heads) each way of ``bench_peers.py`` runs for one batch: probekit the
    exact-resumption minimum; plain hooks and nnsight one forward per variant (4L, a skipped
    block not computed, an ablated sublayer's block computed whole); the TransformerLens loop 5L
    full forwards (its skip hooks replace a block's output after computing it)."""
    L = layers
    hooks = L + L * (L - 1) + 2 * L * L + (L - 1) * L
    return {
        "probekit": (2 * L * L + 2 * L - 1, 4 * L),
        "hf": (hooks, 4 * L),
        "nnsight": (hooks, 4 * L),
        "tl": (5 * L * L, 5 * L),
    }


def ceiling_line(layers: int, times: BlockTimes) -> str:
    """What each way's passes cost at the measured times (probekit's blocks at its own block
    time, the peers' at the Hugging Face one), and probekit's largest ratio to each."""
    cost = {}
    for way, (passes, heads) in passes_of_each_way(layers).items():
        block = times.probekit if way == "probekit" else times.hf
        cost[way] = passes * block + heads * times.head
    return "; ".join(
        f"{way} {passes} passes + {heads} heads = {cost[way]:.1f} s"
        + (f" ({cost[way] / cost['probekit']:.2f}x)" if way != "probekit" else "")
        for way, (passes, heads) in passes_of_each_way(layers).items()
    )


def parts_line(times: BlockTimes, block_flops: float, rate: float) -> str:
    """probekit's block pass in parts, and the best fraction of the matmul limit a block pass
    with this GELU and the rest reaches when its products run at the limit."""
    at_limit = block_flops / rate / 1e9
    rest = times.probekit - times.products - times.gelu
    return (
        f"    probekit's block pass in parts (each timed alone): weight products "
        f"{times.products * 1e3:.2f} ms (at the matmul limit {at_limit * 1e3:.2f} ms), GELU "
        f"{times.gelu * 1e3:.2f} ms, attention, norms and the rest {rest * 1e3:.2f} ms: with "
        f"the products at the limit a block pass reaches at most "
        f"{at_limit / (at_limit + times.gelu + max(rest, 0.0)):.0%} of it"
    )


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    rows = args.batch * args.seq
    work = diagnosis_flops(args.layers, args.d_model, args.batch, args.seq, args.vocab)
    print(f"before: {uptime()}")
    print(f"arithmetic of the depth analyses at the exact-resumption minimum: {work.describe()}")
    for threads in (1, 2):
        rate = matmul_rate(args.d_model, rows, threads, device=args.device, clock="cpu")
        times = block_times(
            args.d_model, args.heads, args.batch, args.seq, args.vocab, threads, args.layers
        )
        floor = work.block_passes * times.probekit + work.heads * times.head
        print(
            f"{settings_line(threads, args.device)} float32 matmul, a block's products at "
            f"d_model {args.d_model}, {rows} rows: {rate:.1f} GFLOP per CPU second (median); "
            f"one block pass: Hugging Face {times.hf * 1e3:.2f} ms = "
            f"{work.block_flops / times.hf / 1e9 / rate:.0%} of it, probekit's "
            f"{times.probekit * 1e3:.2f} ms = {work.block_flops / times.probekit / 1e9 / rate:.0%}"
            f"; one head {times.head * 1e3:.2f} ms = "
            f"{work.head_flops / times.head / 1e9 / rate:.0%}; the minimum work at the matmul "
            f"limit {work.total / rate / 1e9:.1f} s, in probekit's block passes and heads "
            f"{floor:.1f} s ({work.total / floor / 1e9 / rate:.0%} of the limit: probekit's "
            "ceiling)"
        )
        print(parts_line(times, work.block_flops, rate))
        print(
            f"    at these block and head times (the ratio: probekit's ceiling over each peer): "
            f"{ceiling_line(args.layers, times)}"
        )
    print(f"after:  {uptime()}")


if __name__ == "__main__":
    main()
