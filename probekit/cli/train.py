"""``probekit train``: its flags (the settings ones shared with sweep are in
:mod:`probekit.cli.train_flags`) and what it prints; the training is
:func:`probekit.anchor.training.train`.

Example:
    >>> from probekit.cli import build_parser
    >>> args = build_parser().parse_args(["train", "--out", "runs/a", "--gamma", "0.8"])
    >>> args.func is train_command, build_train_config(args).model.gamma
    (True, 0.8)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probekit.cli.common import TRAINER_HELP, add_command, add_out
from probekit.cli.train_flags import PRESETS, add_settings_flags, build_train_config
from probekit.errors import ConfigError

BAR_LEGEND = (
    "training bar: loss = training loss of the last batch; data = accuracy on seen "
    "anchor pairs with unseen keys; inf / sym = share of the held-out pairs' outputs "
    "that are inferential / symmetric"
)
"""The line printed above the training progress bar, naming its columns."""


def train_command(args: argparse.Namespace) -> int:
    """``probekit train``: train one run; print where its checkpoint and metrics are."""
    from probekit.anchor.training import train

    if getattr(args, "config", None) is not None and getattr(args, "preset", None) is not None:
        raise ConfigError("--config and --preset both give every setting", fix="pass one of them")
    cfg = build_train_config(args)
    if not args.quiet:
        print(BAR_LEGEND)
    out = train(cfg, args.out, resume=not args.no_resume, progress=not args.quiet)
    f = out.final
    print(f"checkpoint: {out.checkpoint}")
    print(f"metrics:    {args.out / 'metrics.jsonl'}")
    print(
        f"step {int(f['step'])}: train acc {f['train_acc']:.3f}, seen pairs on test keys "
        f"{f['test_data_acc']:.3f}, held-out pairs: inferential "
        f"{f['test_task_inferential']:.3f}, symmetric {f['test_task_symmetric']:.3f}"
    )
    return 0


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to an argparse subparsers object."""
    p = add_command(
        subparsers,
        "train",
        help=TRAINER_HELP["train"],
        description="Train a GPT-2-style decoder on the anchor-function task (loss on the last "
        "token; AdamW, warmup + cosine decay). Writes OUT/metrics.jsonl and a "
        "Hugging Face checkpoint in OUT/checkpoint; run the same command again to "
        "resume after an interruption.",
    )
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="start from these settings (flags given on the command line override them): "
        "cpu-reference is the documented CPU reference run (docs/results.md), "
        "anchor_cpu_config (2 layers, d_model 64, 4 heads, 1500 steps of batch 256, lr 2.5e-3, "
        "weight decay 0.1); default: the defaults shown below",
    )
    add_out(p, type=Path, help="output folder (created; an existing run there is resumed)")
    add_settings_flags(p, sweep=False)
    p.set_defaults(func=train_command)
    return p


__all__ = ["BAR_LEGEND", "add_train_parser", "train_command"]
