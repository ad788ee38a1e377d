"""The second-half share of one small trained LM under zero, mean and resample ablation.

Trains (once; the folder is reused) a small byte-level GPT-2 with probekit's own LM trainer on
the Python standard library's source, then runs ``probekit.contributions`` and
``probekit.skip_effects`` on held-out validation sequences with each ablation kind and prints
the second-half share (by ‖Δsoftmax‖₂ and by KL), the depth score and the most important
layer. The numbers in docs/conventions.md ("Ablation kinds") come from:

    python benchmarks/ablation_kinds.py --out runs/ablation-lm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import probekit
from probekit.lm import LMConfig, train_lm
from probekit.lm.corpus import ByteCorpus

KINDS = ("zero", "mean", "resample")


def trained(out: Path, steps: int) -> Path:
    """The final checkpoint of the small LM (trained when the folder has none)."""
    if (out / "final" / "config.json").exists():
        return out / "final"
    cfg = LMConfig(
        n_layers=6,
        d_model=64,
        n_heads=4,
        seq_len=64,
        batch_size=16,
        steps=steps,
        warmup_steps=20,
        eval_every=steps,
        eval_sequences=16,
        corpus_max_files=400,
        seed=0,
    )
    return train_lm(cfg, out, progress=False, device="cpu").final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/ablation-lm", help="the LM's run folder")
    parser.add_argument("--steps", type=int, default=400, help="training steps of the LM")
    parser.add_argument("--n-sequences", type=int, default=32, help="validation sequences")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = probekit.load(trained(Path(args.out), args.steps), device="cpu")
    tokens = ByteCorpus(max_files=400).sequences("validation", 64, args.n_sequences)
    print(f"{model.n_layers}-layer LM, {tokens.shape[0]} validation sequences of 64 bytes")
    print("ablation   second-half share (prob_l2)  (kl)   depth score  most important layer")
    for kind in KINDS:
        res = probekit.contributions(model, tokens, ablation=kind, batch_size=16)
        skips = probekit.skip_effects(model, tokens, ablation=kind, batch_size=16)
        s = res.summary
        print(
            f"{kind:9s}  {s['second_half_share']:27.3f}  {s['second_half_share_kl']:5.3f}"
            f"  {skips.summary['depth_score']:11.2f}  {s['most_important_layer']:20d}"
        )


if __name__ == "__main__":
    main()
