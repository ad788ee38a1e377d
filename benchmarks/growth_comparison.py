"""Static versus MIDAS-grown language models of equal final depth, measured with probekit.

Trains both on the offline byte corpus (the Python standard library), then reports validation
loss and perplexity, training FLOPs, the zero-ablation second-half share, the skip-effect depth
score and the permutable blocks of each, and the second-half share along training (both runs
checkpoint every ``--save-every`` steps). Writes ``results.json`` and ``timeline.html`` into
``--out``.

Usage:
    python benchmarks/growth_comparison.py --out runs/growth          # the docs' comparison
    python benchmarks/growth_comparison.py --quick --out /tmp/g       # a shortened version
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> dict:
    import torch

    import probekit
    from probekit.analyses.across_checkpoints import depth_timeline
    from probekit.io import atomic_write_text
    from probekit.lm import ByteCorpus, LMConfig, train_lm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/growth-comparison")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--save-every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    size = dict(
        n_layers=args.layers,
        d_model=args.d_model,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        save_every=args.save_every,
        eval_every=max(1, args.steps // 10),
        eval_sequences=64,
    )
    if args.quick:
        size.update(
            n_layers=4,
            d_model=32,
            seq_len=32,
            batch_size=4,
            steps=24,
            save_every=8,
            eval_every=8,
            eval_sequences=8,
            corpus_max_files=60,
        )
    runs = {
        "static": LMConfig(growth="static", **size),
        "midas": LMConfig(growth="midas", initial_layers=2, block_size=2, **size),
    }
    out = Path(args.out)
    results, series = {}, []
    corpus = ByteCorpus(max_files=size.get("corpus_max_files"))
    data = corpus.sequences("validation", size["seq_len"], n=16 if args.quick else 48)
    for name, cfg in runs.items():
        start = time.perf_counter()
        run = train_lm(cfg, out / name, progress=not args.quick, resume=False)  # time it all
        seconds = time.perf_counter() - start
        model = probekit.load(run.final, device="cpu")
        contrib = probekit.contributions(model, data)
        skips = probekit.skip_effects(model, data)
        swaps = probekit.layer_swaps(model, data, pairs="adjacent", n_bootstrap=100)
        last = run.metrics.iloc[-1]
        results[name] = {
            "val_loss": float(last.val_loss),
            "val_perplexity": float(last.val_perplexity),
            "train_flops": run.flops,
            "train_seconds": seconds,
            "second_half_share": contrib.summary["second_half_share"],
            "depth_score_normalized": skips.summary["depth_score_normalized"],
            "permutable_blocks": swaps.summary["blocks"],
            "boundary_confidence": {
                int(k): float(v) for k, v in swaps.boundary_confidence().items()
            },
            "skip_matrix": [
                [None if v != v else round(float(v), 4) for v in row]  # NaN -> null (JSON)
                for row in skips.matrix().values.tolist()
            ],
        }
        series += [(name, int(p.name[4:]), p) for p in run.checkpoints if p.name.startswith("step")]
        series.append((name, cfg.steps, run.final))
    timeline = depth_timeline(series, data)
    results["flops_saving"] = 1 - results["midas"]["train_flops"] / results["static"]["train_flops"]
    results["timeline"] = timeline.table().reset_index().to_dict(orient="records")
    atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=float))
    timeline.figure().write_html(out / "timeline.html", include_plotlyjs=True)
    for name in runs:
        r = results[name]
        print(
            f"{name:7s} val loss {r['val_loss']:.4f}  ppl {r['val_perplexity']:.3f}  "
            f"FLOPs {r['train_flops']:.3e}  second-half share {r['second_half_share']:.1%}  "
            f"depth score {r['depth_score_normalized']:.3f}  blocks {r['permutable_blocks']}  "
            f"({r['train_seconds']:.0f} s)"
        )
    print(f"MIDAS saves {results['flops_saving']:.1%} of the training FLOPs")
    return results


if __name__ == "__main__":
    main()
