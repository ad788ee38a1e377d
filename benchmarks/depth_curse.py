"""The curse of depth, shown and cured: deep static pre-LN vs LayerNorm Scaling vs MIDAS.

Trains three byte-level LMs of equal final depth on the offline byte corpus (the Python
standard library) with the same token budget (steps x batch x sequence length):

- ``static``: a deep, narrow pre-LN GPT-2;
- ``lns``: the same with LayerNorm Scaling (Sun et al. 2025: the outputs of layer l's
  pre-attention and pre-MLP LayerNorms are multiplied by 1/sqrt(l), l = 1 .. L);
- ``midas``: grown to the same depth with MIDAS (Saunshi et al. 2024) in blocks.

and diagnoses each with probekit on held-out validation sequences: the zero-ablation
second-half share, the skip-effect depth score and matrix, the permutable blocks of adjacent
swaps, the residual update size per layer, and the logit and tuned lens (a lens fit on training
sequences, measured on the validation ones; the logit lens is the zero-translator lens, so both
give the same measures: KL per depth and the first depth whose top-1 agrees with the final one
on half of the tokens). Writes ``results.json`` (all numbers, per-layer profiles included),
``contributions.png`` and ``lens.png`` into ``--out`` and prints the table.

Usage:
    python benchmarks/depth_curse.py --out runs/depth-curse --threads 1      # the docs' run
    python benchmarks/depth_curse.py --device cuda --layers 48 --d-model 256 --steps 20000 \\
        --batch-size 64 --seq-len 256 --out runs/depth-curse-gpu             # full size
    python benchmarks/depth_curse.py --quick --out /tmp/curse                # tiny smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

RUNS = ("static", "lns", "midas")


def _args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/depth-curse")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=480)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--initial-layers", type=int, default=4, help="MIDAS start depth")
    parser.add_argument("--block-size", type=int, default=4, help="MIDAS layers per stage")
    parser.add_argument("--eval-sequences", type=int, default=32, help="diagnosed sequences")
    parser.add_argument("--lens-sequences", type=int, default=64, help="tuned-lens fit data")
    parser.add_argument("--lens-steps", type=int, default=100)
    parser.add_argument("--bootstrap", type=int, default=100)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", default=",".join(RUNS), help="subset of static,lns,midas")
    parser.add_argument(
        "--reuse", action="store_true", help="diagnose the checkpoints already in --out/<run>"
    )
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.d_model, args.n_heads, args.steps = 6, 16, 2, 12
        args.seq_len, args.batch_size, args.initial_layers, args.block_size = 16, 4, 2, 2
        args.eval_sequences, args.lens_sequences, args.lens_steps, args.bootstrap = 4, 8, 4, 10
    return args


def _configs(args) -> dict:
    from probekit.lm import LMConfig

    size = dict(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.n_heads,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        lr=args.lr,
        warmup_steps=max(1, args.steps // 20),
        eval_every=max(1, args.steps // 10),
        eval_sequences=64,
        corpus_max_files=60 if args.quick else None,
    )
    configs = {
        "static": LMConfig(growth="static", **size),
        "lns": LMConfig(growth="static", layernorm_scaling=True, **size),
        "midas": LMConfig(
            growth="midas",
            initial_layers=args.initial_layers,
            block_size=args.block_size,
            **size,
        ),
    }
    wanted = args.runs.split(",")
    unknown = sorted(set(wanted) - set(RUNS))
    if unknown:
        raise SystemExit(f"unknown runs {unknown}; use some of {list(RUNS)}")
    for cfg in configs.values():
        cfg.validate()  # every setting is checked before any training starts
    return {name: configs[name] for name in RUNS if name in wanted}


def _profile(result, measure: str) -> list[float]:
    """One value per layer/depth of a Result's ``df`` (``value`` of ``measure``)."""
    df = result.df[result.df.measure == measure]
    key = "layer" if "layer" in df.columns else "depth"
    if "component" in df.columns:
        df = df[df.component == "layer"]
    return [round(float(v), 6) for v in df.sort_values(key)["value"]]


def _layer_shares(contrib):
    """Each layer's share of the output change (||softmax(z') - softmax(z)||), by layer."""
    df = contrib.df
    return df[(df.component == "layer") & (df.measure == "prob_l2")].sort_values("layer")


def _diagnose(path: Path, data, lens_data, args) -> dict:
    """probekit's depth measures of one checkpoint."""
    import probekit
    from probekit.analyses.depth.tuned_lens import TunedLens, tuned_lens

    model = probekit.load(path, device="cpu" if args.device == "cpu" else None)
    contrib = probekit.contributions(model, data)
    skips = probekit.skip_effects(model, data)
    swaps = probekit.layer_swaps(model, data, pairs="adjacent", n_bootstrap=args.bootstrap)
    resid = probekit.residual_stats(model, data)
    fitted = TunedLens.fit(
        model, lens_data, steps=args.lens_steps, progress=False, data_label="train split"
    )
    lenses = {
        "logit": tuned_lens(model, data, lens=TunedLens.zeros(model), data_label="validation"),
        "tuned": tuned_lens(model, data, lens=fitted, data_label="validation"),
    }
    row = {
        "second_half_share": contrib.summary["second_half_share"],
        "depth_score_normalized": skips.summary["depth_score_normalized"],
        "permutable_blocks": swaps.summary["blocks"],
        "n_blocks": swaps.summary["n_blocks"],
        "update_rel_first_half": resid.summary["update_rel_first_half"],
        "update_rel_second_half": resid.summary["update_rel_second_half"],
        "layer_share": [round(float(v), 6) for v in _layer_shares(contrib).share],
        "update_rel": _profile(resid, "update_rel"),
        "skip_matrix": [
            [None if v != v else round(float(v), 4) for v in r]  # NaN -> null (JSON)
            for r in skips.matrix().values.tolist()
        ],
    }
    for name, res in lenses.items():
        row[f"{name}_lens_kl"] = _profile(res, "kl_final_first")
        row[f"{name}_lens_mean_kl"] = float(res.summary["mean_kl"])
        row[f"{name}_lens_first_agreeing_depth"] = res.summary["top1_formed_at_depth"]
    row["tuned_lens_overlap_sequences"] = lenses["tuned"].meta["overlap_sequences"]
    return row


LABELS = {"static": "static pre-LN", "lns": "LayerNorm Scaling", "midas": "MIDAS-grown"}


def _figures(out: Path, results: dict, names: list[str]) -> None:
    """contributions.png (per-layer share) and lens.png (held-out KL per depth, both lenses),
    drawn from the numbers in ``results`` with probekit's figure helpers (integer layer axes,
    legends in words below the axes, readable log ticks)."""
    import plotly.graph_objects as go

    from probekit import figures

    fig = go.Figure()
    for name in names:
        share = results[name]["layer_share"]
        fig.add_trace(
            go.Scatter(x=list(range(len(share))), y=share, mode="lines+markers", name=LABELS[name])
        )
    figures.base_layout(
        fig,
        "Share of the output change when each layer is zero-ablated",
        x="layer (0 = first)",
        y="share of the summed ||Δ softmax|| (fraction)",
        width=900,
        height=500,
    )
    figures.integer_axis(fig, "x", n=max(len(results[n]["layer_share"]) for n in names))
    fig.write_image(out / "contributions.png")
    lens_fig = go.Figure()
    values = []
    for name in names:
        for lens, dash in (("logit", "dot"), ("tuned", "solid")):
            kl = results[name][f"{lens}_lens_kl"][:-1]  # depth L is the output itself: KL 0
            values += kl
            lens_fig.add_trace(
                go.Scatter(
                    x=list(range(len(kl))),
                    y=kl,
                    name=f"{LABELS[name]}, {lens} lens",
                    line={"dash": dash},
                )
            )
    figures.base_layout(
        lens_fig,
        "Logit vs tuned lens: KL(p_final || p_depth) on held-out sequences",
        x="depth (blocks applied)",
        y="KL (nats)",
        width=900,
        height=550,
    )
    figures.integer_axis(lens_fig, "x", n=len(results[names[0]]["logit_lens_kl"]))
    figures.log_axis(lens_fig, "y", values=values)
    lens_fig.write_image(out / "lens.png")


def _print(results: dict, names) -> None:
    cols = [
        ("val loss", "val_loss", "{:.4f}"),
        ("FLOPs", "train_flops", "{:.2e}"),
        ("time s", "train_seconds", "{:.0f}"),
        ("2nd-half share", "second_half_share", "{:.1%}"),
        ("depth score", "depth_score_normalized", "{:.3f}"),
        ("update 1st/2nd half", None, None),
        ("logit/tuned 1st agree", None, None),
        ("logit/tuned mean KL", None, None),
        ("blocks", "n_blocks", "{}"),
    ]
    print(" | ".join(["run"] + [c[0] for c in cols]))
    for name in names:
        r, cells = results[name], [name]
        for _, key, fmt in cols[:5]:
            cells.append(fmt.format(r[key]))
        cells.append(f"{r['update_rel_first_half']:.3f}/{r['update_rel_second_half']:.3f}")
        cells.append(
            f"{r['logit_lens_first_agreeing_depth']}/{r['tuned_lens_first_agreeing_depth']}"
        )
        cells.append(f"{r['logit_lens_mean_kl']:.3f}/{r['tuned_lens_mean_kl']:.3f}")
        cells.append(str(r["n_blocks"]))
        print(" | ".join(cells))


def main(argv=None) -> dict:
    args = _args(argv)
    import torch

    from probekit.lm import ByteCorpus

    torch.set_num_threads(args.threads)
    configs = _configs(args)
    out = Path(args.out)
    corpus = ByteCorpus(max_files=60 if args.quick else None)
    data = corpus.sequences("validation", args.seq_len, n=args.eval_sequences)
    lens_data = corpus.sequences("train", args.seq_len, n=args.lens_sequences)
    load = _uptime()
    for name, cfg in configs.items():
        start = time.perf_counter()
        trained = _trained(cfg, out / name, args)
        start = time.perf_counter()
        row = _diagnose(trained["final"], data, lens_data, args)
        row = {**trained, **row, "diagnose_seconds": time.perf_counter() - start}
        row.update(uptime_before=load, uptime_after=_uptime())
        results = _merge(out, name, {k: v for k, v in row.items() if k != "final"}, args)
    names = [n for n in RUNS if n in results]
    _figures(out, results, names)
    _print(results, names)
    print(f"load before: {load}\nload after:  {_uptime()}")
    return results


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _trained(cfg, folder: Path, args) -> dict:
    """Train a run into ``folder`` (or, with ``--reuse``, read the one there): its final
    checkpoint, validation loss, FLOPs and training time."""
    import pandas as pd

    from probekit.lm import train_lm

    if args.reuse:
        rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
        metrics, final = pd.DataFrame(rows), folder / "final"
        flops = json.loads((final / "trainer_state.json").read_text())["flops"]
        seconds = float(metrics.seconds.iloc[-1])
        if int(metrics.step.iloc[-1]) != cfg.steps:
            raise SystemExit(f"{folder} holds a run of other settings; train it again")
    else:
        start = time.perf_counter()
        run = train_lm(cfg, folder, progress=not args.quick, device=args.device, resume=False)
        metrics, final, flops = run.metrics, run.final, run.flops
        seconds = time.perf_counter() - start
    last = metrics.iloc[-1]
    return {
        "final": final,
        "val_loss": float(last.val_loss),
        "val_perplexity": float(last.val_perplexity),
        "train_flops": float(flops),
        "train_seconds": seconds,
    }


def _merge(out: Path, name: str, row: dict, args) -> dict:
    """Add one run's row to ``out/results.json`` (runs of other settings are dropped)."""
    from probekit.io import atomic_write_text

    path = out / "results.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("runs", "reuse", "threads")}
    results = json.loads(path.read_text()) if path.is_file() else {}
    if results.get("settings") != settings:
        results = {"settings": settings}
    results[name] = row
    atomic_write_text(path, json.dumps(results, indent=1, default=float))
    return results


if __name__ == "__main__":
    main()
