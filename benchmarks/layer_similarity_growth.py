"""Layer similarity of a static and a MIDAS-grown byte-level LM, within each and across the two.

Trains both (``probekit.lm.train_lm`` on the offline byte corpus, the same recipe as
``benchmarks/growth_comparison.py`` at a smaller size), then measures on validation sequences:
each model's linear-CKA matrix with its blocks of alike layers beside the permutable blocks of
its adjacent layer swaps, and the cross-model CKA and linear-map matrices. Writes the figures to
``--assets`` (``layer_similarity_static.png``, ``layer_similarity_midas.png``,
``layer_similarity_static_vs_midas.png``) and prints the numbers the docs quote.

Usage:
    python benchmarks/layer_similarity_growth.py --out runs/similarity-growth --assets assets
    python benchmarks/layer_similarity_growth.py --quick --out /tmp/s --assets /tmp/s  # smoke
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _train(args: argparse.Namespace) -> dict:
    from probekit.lm import LMConfig, train_lm

    size = dict(
        n_layers=args.layers,
        d_model=args.d_model,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        eval_every=max(1, args.steps // 4),
        eval_sequences=16,
        corpus_max_files=args.corpus_files,
    )
    configs = {
        "static": LMConfig(growth="static", **size),
        "midas": LMConfig(growth="midas", initial_layers=2, block_size=2, **size),
    }
    return {
        name: train_lm(cfg, Path(args.out) / name, progress=False) for name, cfg in configs.items()
    }


def _print_matrix(title: str, table) -> None:
    print(title)
    print(table.round(3).to_string())


def main(argv: list[str] | None = None) -> dict:
    import torch

    import probekit
    from probekit.lm import ByteCorpus
    from probekit.report_text import similarity_beside_swaps

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/similarity-growth")
    parser.add_argument("--assets", default="assets")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=48)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--corpus-files", type=int, default=200)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.d_model, args.steps, args.sequences = 4, 16, 8, 8
        args.seq_len, args.batch_size, args.corpus_files = 32, 4, 30
    torch.set_num_threads(args.threads)
    runs = _train(args)
    corpus = ByteCorpus(max_files=args.corpus_files)
    data = corpus.sequences("validation", args.seq_len, n=args.sequences)
    models = {name: probekit.load(run.final, device="cpu") for name, run in runs.items()}
    assets = Path(args.assets)
    assets.mkdir(parents=True, exist_ok=True)
    found: dict = {}
    words = {"static": "static model", "midas": "MIDAS-grown model"}
    for name, model in models.items():
        similar = probekit.layer_similarity(model, data, names=[words[name]] * 2)
        swaps = probekit.layer_swaps(model, data, pairs="adjacent", n_bootstrap=20)
        summary = {**similar.summary, "swap_blocks": swaps.summary["blocks"]}
        _print_matrix(
            f"{name}: linear CKA (debiased), {similar.summary['n_tokens']} tokens", similar.matrix()
        )
        print(f"{name}: val loss {runs[name].metrics.iloc[-1].val_loss:.3f}")
        print(f"{name}: {similarity_beside_swaps(summary)}")
        similar.figure().write_image(assets / f"layer_similarity_{name}.png")
        found[name] = summary
    names = [words["static"], words["midas"]]
    cross = probekit.layer_similarity(models["static"], data, other=models["midas"], names=names)
    _print_matrix("static (rows) vs MIDAS (columns): linear CKA", cross.matrix())
    cross.figure().write_image(assets / "layer_similarity_static_vs_midas.png")
    mapped = probekit.layer_similarity(
        models["static"], data, other=models["midas"], measure="linear_map", names=names
    )
    _print_matrix("static (rows) -> MIDAS (columns): held-out R² of a linear map", mapped.matrix())
    found["cross_cka"] = cross.matrix().to_numpy().tolist()
    found["cross_map"] = mapped.matrix().to_numpy().tolist()
    return found


if __name__ == "__main__":
    main()
