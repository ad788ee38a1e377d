"""Seed robustness of the anchor-task reproduction: per-seed solution fractions.

For every seed (each draws its own data *and* initialization: ``task_seed`` follows the seed)
the large- and small-init runs train as one stack of two (they share that seed's data); the
script prints one line per run (seen pairs on test keys, held-out inferential / symmetric /
other on all keys and on training-key cells, the solution) and, per gamma, the mean and the
spread (min..max) over seeds, and writes ``results.json`` in ``--out``. Resumable.

    OMP_NUM_THREADS=1 python -m benchmarks.anchor_seeds --out runs/seeds --seeds 0,1,2

Defaults are :func:`probekit.anchor.anchor_cpu_config`'s; flags override them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probekit.analyses.mechanisms.solutions import solution_types
from probekit.anchor import anchor_cpu_config, train_stack
from probekit.run_folders import load_run


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder of the runs and results.json")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="seeds, comma-separated")
    p.add_argument("--gammas", type=_floats, default=None, help="large,small init rates")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate")
    p.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay")
    p.add_argument("--n-train", type=int, default=None, help="training sequences")
    p.add_argument("--n-layers", type=int, default=None, help="layers")
    p.add_argument("--d-model", type=int, default=None, help="width")
    p.add_argument("--n-heads", type=int, default=None, help="attention heads")
    p.add_argument("--d-mlp", type=int, default=None, help="MLP width (default 4 * d_model)")
    p.add_argument("--init-scheme", default=None, help="fan_in or official")
    p.add_argument(
        "--architecture",
        default=None,
        help="gpt2 or post_ln_paper (the paper's post-LN, bias-free, ReLU model; its heads, "
        "activation and MLP width are the architecture's unless given)",
    )
    p.add_argument(
        "--init-ref-width",
        type=int,
        default=None,
        help="draw the init as a model of this width would (std = d_ref^-gamma)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step")
    p.add_argument(
        "--key-split",
        default="complexity_control",
        help="the task's key split (default: the official code's; anchor_cpu_config itself "
        "keeps probekit_v1, the rule the demo was measured with)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument(
        "--from-metrics",
        action="store_true",
        help="train nothing: report the last evaluation in each seed's metrics.jsonl "
        "(runs still training, or stopped; the trainer's numbers, all keys)",
    )
    return p.parse_args(argv)


def _overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any], dict]:
    """(TrainConfig, ModelConfig, AnchorTask) overrides from the flags that were given."""
    train = {
        k: v
        for k, v in (
            ("steps", args.steps),
            ("lr", args.lr),
            ("weight_decay", args.weight_decay),
            ("batch_size", args.batch_size),
        )
        if v is not None
    }
    model = {
        k: v
        for k, v in (
            ("n_layers", args.n_layers),
            ("d_model", args.d_model),
            ("n_heads", args.n_heads),
            ("d_mlp", args.d_mlp),
            ("init_scheme", args.init_scheme),
            ("architecture", args.architecture),
            ("init_ref_width", args.init_ref_width),
        )
        if v is not None
    }
    if "architecture" in model:  # 0, "" and None ask for the architecture's own defaults
        model.setdefault("n_heads", 0)
        model.setdefault("activation", "")
        model.setdefault("d_mlp", None)
    if "d_model" in model and "d_mlp" not in model:  # else replace() keeps 4 * the old width
        model["d_mlp"] = 4 * model["d_model"]
    task = {"n_train": args.n_train} if args.n_train is not None else {}
    task["key_split"] = args.key_split
    return train, model, task


def configs(args: argparse.Namespace, seed: int) -> list:
    """The stack of one seed: one run per gamma, sharing the seed's data."""
    from dataclasses import replace

    train, model, task = _overrides(args)
    out = []
    for gamma in args.gammas:
        cfg = anchor_cpu_config(gamma, seed=seed, **train)
        if model or task:
            cfg = replace(
                cfg,
                model=replace(cfg.model, **model),
                task=type(cfg.task).from_dict({**cfg.task.to_dict(), **task}),
            )
        out.append(cfg)
    return out


def run_seed(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    cfgs = configs(args, seed)
    t0 = time.perf_counter()
    outs = train_stack(cfgs, Path(args.out) / f"s{seed}", progress=False)
    elapsed = time.perf_counter() - t0
    rows = []
    for cfg, o in zip(cfgs, outs, strict=True):
        res = solution_types(o.checkpoint, load_run(o.checkpoint).task.solution_data())
        s = res.summary
        rows.append(
            {
                "seed": seed,
                "gamma": cfg.model.gamma,
                "data_seed": cfg.task.seed,
                "seen_test": s["seen_test_accuracy"],
                "inferential": s["heldout_inferential"],
                "symmetric": s["heldout_symmetric"],
                "other": s["heldout_other"],
                "inferential_train_keys": s.get("heldout_inferential_train_keys"),
                "symmetric_train_keys": s.get("heldout_symmetric_train_keys"),
                "solution": s["solution"],
                "stack_seconds": round(elapsed, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def from_metrics(args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    """The last evaluation of each run of one seed, read from its ``metrics.jsonl``."""
    lines = (Path(args.out) / f"s{seed}" / "metrics.jsonl").read_text().splitlines()
    last: dict[str, dict[str, Any]] = {}
    for line in lines:
        row = json.loads(line)
        last[row["run"]] = row
    rows = []
    for name, r in last.items():
        fr = {k: r[f"test_task_{k}"] for k in ("inferential", "symmetric", "other")}
        solution = "memorizing" if r["test_data_acc"] < 0.9 else max(fr, key=fr.get)
        rows.append(
            {
                "seed": seed,
                "run": name,
                "step": r["step"],
                "gamma": float(name.split("_")[0][1:]),
                "seen_test": r["test_data_acc"],
                **fr,
                "solution": solution,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def trained_settings(args: argparse.Namespace) -> str:
    """The settings the runs of ``--out`` were trained with (the first seed's first run, from
    its ``config.json``): with ``--from-metrics`` the flags are not the runs' settings."""
    path = Path(args.out) / f"s{args.seeds[0]}" / "config.json"
    try:
        configs = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"settings: unknown ({path} is missing or unreadable; the flags are not the runs')"
    first = configs[0] if isinstance(configs, list) and configs else configs
    return f"settings of the runs (first run of {path}): {json.dumps(first)}"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per gamma: mean, min and max over seeds of each fraction, and the solution counts."""
    out: dict[str, Any] = {}
    for gamma in sorted({r["gamma"] for r in rows}):
        sub = [r for r in rows if r["gamma"] == gamma]
        entry: dict[str, Any] = {"solutions": [r["solution"] for r in sub]}
        for k in ("seen_test", "inferential", "symmetric", "other"):
            v = np.array([r[k] for r in sub], dtype=float)
            entry[k] = {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}
        out[f"{gamma:g}"] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    if args.gammas is None:
        args.gammas = [0.3, 0.8]
    print(trained_settings(args) if args.from_metrics else f"settings: {vars(args)}", flush=True)
    one = from_metrics if args.from_metrics else run_seed
    rows = [r for seed in args.seeds for r in one(args, seed)]
    summary = summarize(rows)
    for gamma, e in summary.items():
        fr = ", ".join(
            f"{k} {e[k]['mean']:.3f} [{e[k]['min']:.3f}, {e[k]['max']:.3f}]"
            for k in ("seen_test", "inferential", "symmetric")
        )
        print(f"gamma {gamma}: {e['solutions']}; mean [min, max]: {fr}", flush=True)
    if args.from_metrics:
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(
        json.dumps(
            {"settings": {k: v for k, v in vars(args).items()}, "runs": rows, "summary": summary},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
