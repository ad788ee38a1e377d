"""The token-resolved lens on a small trained language model (docs/diagnose-a-checkpoint.md,
"Token-resolved lens"; assets/token_lens_lm.png).

    python -m benchmarks.token_lens_lm --out runs/token-lens-lm

Trains (or, when OUT/final exists, reuses) a byte-level GPT-2 of 6 layers, d_model 64, on the
Python standard library's source with probekit's own LM trainer (``probekit.train_lm``; about
3 minutes on one CPU core), reads 16 validation sequences of 64 bytes through
``probekit.token_lens`` at ``resid_out`` and ``resid_mid``, prints the summary, and draws
sequence 0 into assets/token_lens_lm.png. Bytes are written as their characters (the model has
no tokenizer; ``decode=``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ASSETS = Path(__file__).resolve().parent.parent / "assets"

SETTINGS = dict(
    n_layers=6,
    d_model=64,
    n_heads=4,
    seq_len=64,
    batch_size=16,
    steps=800,
    eval_every=400,
    eval_sequences=16,
    corpus_max_files=300,
    seed=0,
)
"""The LM run: small enough to train in minutes on a CPU core."""


def byte_text(token: int) -> str:
    """A byte as the character it is (whitespace and specials named)."""
    names = {10: "\\n", 32: "␣", 9: "\\t", 256: "PAD", 257: "BOS", 258: "EOS"}
    if token in names:
        return names[token]
    return chr(token) if 33 <= token < 127 else f"x{token:02x}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/token-lens-lm", help="the LM run's folder")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()

    import torch

    import probekit
    from probekit.lm import ByteCorpus, LMConfig

    torch.set_num_threads(args.threads)
    cfg = LMConfig(**SETTINGS)
    final = Path(args.out) / "final"
    if not final.is_dir():
        run = probekit.train_lm(cfg, args.out, device="cpu")
        print(run.metrics.tail(2).to_string(index=False))
    model = probekit.load(final)
    corpus = ByteCorpus(max_files=SETTINGS["corpus_max_files"])
    tokens = corpus.sequences("validation", SETTINGS["seq_len"], n=16)
    res = probekit.token_lens(model, tokens, sites=("resid_out", "resid_mid"), decode=byte_text)
    for key, value in res.summary.items():
        print(f"{key}: {value}")
    out = res.df[res.df.site == "resid_out"]
    first = out[out.depth == 0]
    print(f"depth 0: top token = the input token for {(first.top_id == first.token_id).mean():.3f}")
    for depth, rows in out.groupby("depth"):
        common = ", ".join(rows.top_token.value_counts().head(3).index)
        print(
            f"depth {depth}: top-1 = final {rows.matches_final.mean():.3f}, cross-entropy "
            f"{rows.cross_entropy.mean():.3f} nats, most read {common}"
        )
    fig = res.figure(sequence=0, max_positions=32)
    path = ASSETS / "token_lens_lm.png"
    fig.write_image(path, width=fig.layout.width, height=fig.layout.height, scale=1)
    print(path)


if __name__ == "__main__":
    main()
