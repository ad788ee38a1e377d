"""Benchmark: a 24-run anchor sweep, probekit's stacked sweep versus a plain sequential loop.

The sweep is 4 gammas x 2 weight decays x 3 seeds of the CPU-sized anchor model (2 layers,
d_model 64), a fixed number of steps. It is trained two ways:

1. ``probekit`` (A): :func:`probekit.anchor.sweep.run_sweep` (the 24 runs stacked into one
   batched model; checkpoints and the final evaluation included);
2. ``loop`` (B): each run alone, the fastest plain way: a Hugging Face ``GPT2LMHeadModel`` with
   ``torch.optim.AdamW(fused=True)`` where the device has fused AdamW kernels for float32 (CPU
   and CUDA in torch 2.13; else ``foreach=True``; the one used is printed), ``clip_grad_norm_``
   (foreach) and a ``LambdaLR`` warmup + cosine schedule, the same initial weights and the same
   batches (their indices sent to the device once per run), bf16 autocast on CUDA as probekit's
   ``precision="auto"``, no host read of the loss, then the same final evaluation and a
   ``save_pretrained``.

The two ways run interleaved A B B A, ``--repeats`` times; it prints every repetition, the
medians, their ratio loop / probekit, ``uptime`` before and after, and the largest difference
in the final metrics between the two ways. Then the steady state: each way's run-steps per
second over its training steps alone (probekit: each stack's ``elapsed_s``, the time in its
step loop; the loop: the time of its step loop, per run), the start-up, evaluation and
checkpoint time left over, the achieved FLOP rate (``step_flops``: forward and backward of the
blocks and the trained position's head) as a fraction of the float32 matmul limit measured on a
block's products at the model's shape (``benchmarks/machine.py``), and the per-step ratio.
Use ``--steps 500`` or more for a steady-state figure; ``--loop-runs N`` trains only the first
N runs in the loop (every run costs the same per step) to keep that affordable. One torch
thread by default (``--threads``), with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
it. Goals: on CPU >= 1.5x at batch 64 and never below 1x, 4x per step at steady state; on a GPU
>= 15x (``--device cuda``).

With ``--executor ray`` it times instead the same 24-run sweep (split into stacks of
``--max-stack`` runs, 12 by default: one stack per task) on the local executor (A) and on a
local Ray (B) started once beforehand with every CPU (its start-up is printed, not timed),
interleaved A B B A ``--repeats`` times, and prints the medians, their ratio, ``uptime``'s load
and the largest difference of the final metrics between the two executors. The local executor
runs at as many torch threads as Ray has CPUs (``--local-threads``), each Ray task at one
thread per CPU it holds; different thread counts may change the last float bits, so the final
metrics are bit-identical only at ``--local-threads 1``.

Usage::

    python benchmarks/bench_sweep.py                      # batch 64 and 256, 100 steps
    python benchmarks/bench_sweep.py --steps 20 --batch-sizes 64 --repeats 1
    python benchmarks/bench_sweep.py --single --steps 200 --batch-sizes 256 --repeats 2
    python benchmarks/bench_sweep.py --steps 200 --batch-sizes 256 --device cuda --repeats 2
    python benchmarks/bench_sweep.py --executor ray --steps 30 --batch-sizes 64
    python benchmarks/bench_sweep.py --steps 500 --batch-sizes 64 --loop-runs 4  # steady state
    python benchmarks/bench_sweep.py --steps 40 --batch-sizes 64 --profile  # where time goes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (benchmarks/common.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import interleaved, timed, uptime  # noqa: E402
from probekit.anchor import (
    AnchorTask,  # noqa: E402
    TrainConfig,  # noqa: E402
)
from probekit.anchor.sweep import SweepConfig, run_sweep  # noqa: E402
from probekit.anchor.training import batch_indices  # noqa: E402
from probekit.training import ModelConfig, init_params, to_hf_model  # noqa: E402
from probekit.training.checkpoint import save_quietly  # noqa: E402
from probekit.training.models import decays  # noqa: E402

GAMMAS = [0.3, 0.5, 0.8, 1.0]
WEIGHT_DECAYS = [0.1, 1.0]
SEEDS = [0, 1, 2]
METRICS = (
    "train_acc",
    "test_data_acc",
    "test_task_acc",
    "test_task_inferential",
    "test_task_symmetric",
    "test_data_loss",
)


def base_config(steps: int, batch: int, device: str) -> TrainConfig:
    """The CPU-sized anchor configuration of docs/anchor-training.md, with ``steps`` steps."""
    return TrainConfig(
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4),
        task=AnchorTask(n_train=20000),
        steps=steps,
        batch_size=batch,
        lr=2e-3,
        warmup_steps=min(10, steps),
        eval_every=steps,
        checkpoint_every=steps,
        eval_at_start=False,
        device=device,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def _evaluate(model, cfg: TrainConfig, device: torch.device) -> dict[str, float]:
    task = cfg.task
    train = task.dataset("train")
    sets = {
        "train": (
            train.tokens[: cfg.eval_train_samples],
            train.targets[: cfg.eval_train_samples],
            None,
            None,
        ),
        "test_data": (
            task.dataset("test_data").tokens,
            task.dataset("test_data").targets,
            None,
            None,
        ),
        "test_task": (
            task.dataset("test_task").tokens,
            task.dataset("test_task").targets,
            task.dataset("test_task").composite,
            task.dataset("test_task").symmetric,
        ),
    }
    out = {}
    for split, (tok, tgt, comp, sym) in sets.items():
        logits = torch.cat(
            [
                model(tok[i : i + 4096].to(device)).logits[:, -1].float()
                for i in range(0, len(tok), 4096)
            ]
        )
        pred = logits.argmax(-1).cpu()
        out[f"{split}_acc"] = float((pred == tgt).float().mean())
        out[f"{split}_loss"] = float(F.cross_entropy(logits.cpu(), tgt))
        if comp is not None:
            out["test_task_inferential"] = float((pred == comp).float().mean())
            out["test_task_symmetric"] = float((pred == sym).float().mean())
    return out


def adamw_kind(device: torch.device) -> str:
    """ "fused" where torch has fused AdamW kernels for float32 on ``device``, else
    "foreach"."""
    try:
        p = torch.nn.Parameter(torch.zeros(2, device=device))
        p.grad = torch.ones_like(p)
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, ValueError):
        return "foreach"
    return "fused"


def loop_run(
    cfg: TrainConfig, out_dir: Path, device: torch.device, kind: str
) -> tuple[dict[str, float], float]:
    """Train one run the plain way: HF GPT-2, torch AdamW (``kind``), one model at a time.
    Returns the final metrics and the seconds of the training steps alone."""
    params = {k: v[None] for k, v in init_params(cfg.model, cfg.seed).items()}
    model = to_hf_model(cfg.model, params).to(device).train()
    named = list(model.named_parameters())
    groups = [
        {"params": [p for n, p in named if decays(n)], "weight_decay": cfg.weight_decay},
        {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **{kind: True}
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cfg.schedule)
    data = cfg.task.dataset("train")
    tokens, targets = data.tokens.to(device), data.targets.to(device)
    order = torch.stack(
        [batch_indices(cfg.seed, step, len(data), cfg.batch_size) for step in range(cfg.steps)]
    ).to(device)
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    _sync(device)
    start = time.perf_counter()
    for step in range(cfg.steps):
        idx = order[step]
        with autocast:
            logits = model(tokens[idx]).logits[:, -1]
        loss = F.cross_entropy(logits.float(), targets[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        sched.step()
    _sync(device)
    train_seconds = time.perf_counter() - start
    model.eval()
    metrics = _evaluate(model, cfg, device)
    save_quietly(model, out_dir / cfg.name)  # save_pretrained, as probekit, without the bar
    return metrics, train_seconds


def stack_train_seconds(out: Path) -> float:
    """The training steps' seconds of a finished sweep: each stack's last ``elapsed_s`` (the
    time in its step loop, evaluations and checkpoints excluded), summed over the stacks."""
    total = 0.0
    for metrics in sorted(out.glob("stacks/*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        total += max(float(row.get("elapsed_s", 0.0)) for row in rows)
    return total


def step_flops(cfg: TrainConfig) -> float:
    """FLOPs one training step of one run needs: 3x a forward (forward + backward) over
    batch x T tokens through the blocks (24 d^2 + 4 T d per token and layer, MLP 4d) and the
    head at the one position that is trained (the last)."""
    m = cfg.model
    d, T = m.d_model, cfg.task.dataset("train").tokens.shape[1]
    blocks = cfg.batch_size * T * m.n_layers * (24 * d * d + 4 * T * d)
    head = cfg.batch_size * 2 * d * m.vocab_size
    return 3.0 * (blocks + head)


def _time_probekit(sweep: SweepConfig, out: Path, device: torch.device):
    seconds, res = timed(lambda: run_sweep(sweep, out, resume=False, progress=False), device)
    return seconds, stack_train_seconds(out), res.df.set_index("run")


def _time_loop(sweep: SweepConfig, out: Path, device: torch.device, kind: str, runs: int):
    def loop():
        return {cfg.name: loop_run(cfg, out, device, kind) for cfg in sweep.runs()[:runs]}

    seconds, done = timed(loop, device)
    return seconds, sum(t for _, t in done.values()), {k: m for k, (m, _) in done.items()}


def bench(
    batch: int,
    steps: int,
    device_name: str,
    repeats: int,
    single: bool = False,
    loop_runs: int | None = None,
) -> dict[str, object]:
    """Both ways, A B B A ``repeats`` times; every time (whole and training steps alone), and
    the final metrics' difference. ``loop_runs`` trains only the first runs in the loop."""
    base = base_config(steps, batch, device_name)
    device = torch.device(
        "cuda"
        if device_name == "auto" and torch.cuda.is_available()
        else ("cpu" if device_name == "auto" else device_name)
    )
    grid = ([0.5], [0.1], [0]) if single else (GAMMAS, WEIGHT_DECAYS, SEEDS)
    sweep = SweepConfig(base, gammas=grid[0], weight_decays=grid[1], seeds=grid[2])
    for split in ("train", "test_data", "test_task"):
        base.task.dataset(split)  # data generation is not what we time
    kind = adamw_kind(device)
    runs = len(sweep.runs())
    loop_runs = min(loop_runs or runs, runs)
    times: dict[str, list[float]] = {"probekit": [], "loop": []}
    train: dict[str, list[float]] = {"probekit": [], "loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k, way in enumerate(interleaved(["probekit", "loop"], repeats)):
            out = Path(tmp) / f"{way}{k}"
            if way == "probekit":
                t, steps_s, table = _time_probekit(sweep, out, device)
            else:
                t, steps_s, loop = _time_loop(sweep, out, device, kind, loop_runs)
            times[way].append(t)
            train[way].append(steps_s)
    worst = {m: 0.0 for m in METRICS}
    for name, met in loop.items():
        for m in METRICS:
            worst[m] = max(worst[m], abs(float(table.loc[name, f"final_{m}"]) - met[m]))
    return {
        "batch": batch,
        "runs": runs,
        "loop_runs": loop_runs,
        "train": train,
        "step_flops": step_flops(base),
        "rows": batch * base.task.dataset("train").tokens.shape[1],
        "steps": steps,
        "device": str(device),
        "adamw": kind,
        **times,
        **{f"max_diff_{m}": v for m, v in worst.items()},
    }


def bench_executors(
    batch: int,
    steps: int,
    device_name: str,
    max_stack: int,
    repeats: int,
    local_threads: int | None,
) -> dict[str, object]:
    """The 24-run sweep on the local executor (A) and on Ray (B), A B B A per repeat."""
    import ray

    t0 = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    startup = time.perf_counter() - t0
    cpus = int(ray.cluster_resources().get("CPU", 1))
    threads = local_threads or cpus
    torch.set_num_threads(threads)
    base = base_config(steps, batch, device_name)
    sweep = SweepConfig(
        base, gammas=GAMMAS, weight_decays=WEIGHT_DECAYS, seeds=SEEDS, max_stack=max_stack
    )
    for split in ("train", "test_data", "test_task"):
        base.task.dataset(split)
    times: dict[str, list[float]] = {"local": [], "ray": []}
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for k, executor in enumerate(["local", "ray", "ray", "local"] * repeats):
                out = Path(tmp).resolve() / f"{executor}{k}"
                t0 = time.perf_counter()
                results[executor] = run_sweep(
                    sweep, out, resume=False, progress=False, executor=executor
                )
                times[executor].append(time.perf_counter() - t0)
    finally:
        ray.shutdown()
    a, b = (results[e].df.set_index("run") for e in ("local", "ray"))
    cols = [f"final_{m}" for m in METRICS]
    worst = float((a[cols] - b.loc[a.index, cols]).abs().max().max())
    return {
        "batch": batch,
        "steps": steps,
        "runs": len(a),
        "stacks": len(sweep.groups()),
        "cpus": cpus,
        "threads": threads,
        "startup_s": startup,
        "local": times["local"],
        "ray": times["ray"],
        "worst": worst,
        "equal": bool(a[cols].equals(b.loc[a.index, cols])),
    }


def main_executors(args: argparse.Namespace) -> int:
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        print(f"before: {uptime()}")
        r = bench_executors(
            batch, args.steps, args.device, args.max_stack, args.repeats, args.local_threads
        )
        loc, ray_ = statistics.median(r["local"]), statistics.median(r["ray"])
        print(
            f"{r['runs']} runs x {r['steps']} steps, batch {batch}, {r['stacks']} stacks; "
            f"local Ray with {r['cpus']} CPUs (start-up {r['startup_s']:.1f} s, not timed)"
        )
        print(
            f"    local executor ({r['threads']} torch threads): median {loc:.1f} s of "
            f"{', '.join(f'{t:.1f}' for t in r['local'])}"
        )
        print(
            f"    ray executor ({r['stacks']} tasks x 1 CPU): median {ray_:.1f} s of "
            f"{', '.join(f'{t:.1f}' for t in r['ray'])}"
        )
        print(
            f"    ratio local / ray {loc / ray_:.2f}x; final metrics identical: {r['equal']} "
            f"(largest |difference| {r['worst']:.3g})"
        )
        print(f"after: {uptime()}")
        if not math.isfinite(loc / ray_):
            return 1
    return 0


def steady_state(r: dict, threads: int) -> None:
    """Run-steps per second of the training steps alone, their ratio, the matmul fraction."""
    from benchmarks.machine import matmul_rate

    limit = matmul_rate(64, r["rows"], threads, device=r["device"])
    rates = {}
    for way, runs in (("probekit", r["runs"]), ("loop", r["loop_runs"])):
        train = r["train"][way]
        rates[way] = runs * r["steps"] / statistics.median(train)
        fixed = statistics.median(r[way]) - statistics.median(train)
        achieved = rates[way] * r["step_flops"] / 1e9
        print(
            f"    steady state, {way}: {rates[way]:.1f} run-steps/s ({runs} runs x "
            f"{r['steps']} steps in a median {statistics.median(train):.1f} s of training "
            f"steps, of {', '.join(f'{t:.1f}' for t in train)}); start-up, evaluation and "
            f"checkpoints {fixed:.1f} s; {achieved:.2f} GFLOP/s = {achieved / limit:.1%} of "
            f"the matmul limit"
        )
    print(
        f"    per step: probekit stacked / loop {rates['probekit'] / rates['loop']:.2f}x; "
        f"matmul limit {limit:.1f} GFLOP/s (a block's products at d_model 64, {r['rows']} rows, "
        f"{threads} thread(s)); one run-step needs {r['step_flops'] / 1e6:.1f} MFLOP"
    )


MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")


def profile_ways(batch: int, steps: int, device_name: str, loop_runs: int) -> None:
    """Profile one probekit sweep and ``loop_runs`` loop runs (torch.profiler, CPU): each way's
    operator CPU time per run (Python between operators is not in it), its share in matrix
    products, and its most expensive operators."""
    from torch.profiler import ProfilerActivity, profile

    base = base_config(steps, batch, device_name)
    device = torch.device("cpu" if device_name == "auto" else device_name)
    sweep = SweepConfig(base, gammas=GAMMAS, weight_decays=WEIGHT_DECAYS, seeds=SEEDS)
    for split in ("train", "test_data", "test_task"):
        base.task.dataset(split)
    kind = adamw_kind(device)
    with tempfile.TemporaryDirectory() as tmp:
        runs = len(sweep.runs())
        ways = {
            f"probekit stacked sweep ({runs} runs)": (
                runs,
                lambda: run_sweep(sweep, Path(tmp) / "a", resume=False, progress=False),
            ),
            f"sequential loop ({loop_runs} runs)": (
                loop_runs,
                lambda: [
                    loop_run(cfg, Path(tmp) / "b", device, kind) for cfg in sweep.runs()[:loop_runs]
                ],
            ),
        }
        for name, (count, fn) in ways.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn()
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events)
            mm = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
            top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
            print(
                f"    profile, {name} x {steps} steps (evaluation and checkpoints included): "
                f"{total / 1e6:.1f} s of operator CPU time ({total / 1e6 / count:.2f} s per run), "
                f"{mm / total:.0%} in matrix products; "
                "most: " + ", ".join(f"{e.key} {e.self_cpu_time_total / total:.0%}" for e in top)
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100, help="steps per run")
    p.add_argument(
        "--batch-sizes",
        default="64,256",
        help="per-run batch sizes to time, comma-separated (256 is the documented)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (loop mode; 1 by default)"
    )
    p.add_argument(
        "--executor",
        choices=["loop", "ray"],
        default="loop",
        help="loop: probekit's sweep versus a sequential loop; ray: the local "
        "executor versus a local Ray",
    )
    p.add_argument(
        "--max-stack",
        type=int,
        default=12,
        help="(--executor ray) runs per stack, i.e. per Ray task",
    )
    p.add_argument(
        "--local-threads",
        type=int,
        default=None,
        help="(--executor ray) torch threads of the local executor (default: as "
        "many as Ray has CPUs; 1 makes its numbers bit-identical to Ray's tasks)",
    )
    p.add_argument("--repeats", type=int, default=1, help="times A B B A is repeated")
    p.add_argument(
        "--single",
        action="store_true",
        help="(loop mode) one run (gamma 0.5, weight decay 0.1, seed 0) instead of "
        "the 24: probekit's single-run trainer against one plain run",
    )
    p.add_argument(
        "--loop-runs",
        type=int,
        default=None,
        help="(loop mode) train only the first N of the runs in the sequential loop (every "
        "run costs the same per step); whole times are then compared per run",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="(loop mode) profile one sweep and --loop-runs loop runs instead of timing them: "
        "the share of CPU time in matrix products",
    )
    args = p.parse_args(argv)
    if args.profile:
        torch.set_num_threads(args.threads)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            print(f"before: {uptime()}")
            profile_ways(batch, args.steps, args.device, args.loop_runs or 2)
            print(f"after: {uptime()}")
        return 0
    if args.executor == "ray":
        return main_executors(args)
    torch.set_num_threads(args.threads)
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        print(f"before: {uptime()}")
        r = bench(batch, args.steps, args.device, args.repeats, args.single, args.loop_runs)
        a, b = statistics.median(r["probekit"]), statistics.median(r["loop"])
        b *= r["runs"] / r["loop_runs"]  # per the same number of runs
        print(
            f"[{r['device']}, {args.threads} thread(s), OMP_WAIT_POLICY="
            f"{os.environ.get('OMP_WAIT_POLICY')}] {r['runs']} runs x {r['steps']} steps, "
            f"batch {batch}, A B B A x {args.repeats}"
        )
        print(
            f"    probekit stacked sweep: median {a:.1f} s of "
            f"{', '.join(f'{t:.1f}' for t in r['probekit'])}"
        )
        print(
            f"    sequential loop (HF GPT-2 + torch AdamW {r['adamw']}, {r['loop_runs']} of "
            f"the runs): median {statistics.median(r['loop']):.1f} s of "
            f"{', '.join(f'{t:.1f}' for t in r['loop'])}"
        )
        diffs = ", ".join(f"{k[9:]} {v:.4f}" for k, v in r.items() if k.startswith("max_diff"))
        print(f"    ratio loop / probekit {b / a:.2f}x (of the medians, per run)")
        print(f"    largest |difference| of final metrics: {diffs}")
        print(f"after: {uptime()}")
        steady_state(r, args.threads)
        if not math.isfinite(b / a):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
