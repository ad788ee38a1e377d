"""``probekit study depth-width`` and ``probekit study transition``: the two studies of depth
against width (:func:`probekit.studies.depth_width`, :func:`probekit.studies.width_transition`)
as commands: a study folder that resumes, local or on Ray, ``--dry-run`` for the plan and
its cost.

Example:
    >>> from probekit.cli import build_parser
    >>> args = build_parser("study").parse_args(
    ...     ["study", "depth-width", "--out", "s", "--depths", "1,2,4", "--dry-run"])
    >>> args.func is study_command, args.study, args.depths, args.scale
    (True, 'depth-width', [1, 2, 4], None)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probekit.cli.common import (
    TRAINER_HELP,
    Parser,
    add_command,
    add_data_flags,
    add_executor,
    add_out,
    add_quiet,
    check_device,
    check_executor_flags,
    dataset_choice,
)
from probekit.cli.train_flags import parse_ints


def study_command(args: argparse.Namespace) -> int:
    """Run (or with ``--dry-run`` plan) the study; print where its tables and page are."""
    from probekit import studies

    if not args.dry_run:
        check_executor_flags(args)
        if args.device not in (None, "auto"):
            check_device(args.device)
    common: dict[str, Any] = dict(
        scale=args.scale,
        seeds=args.seeds,
        steps=args.steps,
        corpus=args.corpus,
        text=args.text,
        dataset=dataset_choice(args),
        executor=args.executor,
        ray_address=args.ray_address,
        device=args.device,
        progress=not args.quiet or args.dry_run,
        dry_run=args.dry_run,
    )
    study: studies.Study
    if args.study == "depth-width":
        study = studies.depth_width(
            args.out,
            budgets=args.budgets,
            depths=args.depths,
            finetune_steps=args.finetune_steps,
            task="anchor" if args.task == "anchor" else None,
            from_scratch=args.from_scratch,
            **common,
        )
    else:
        study = studies.width_transition(args.out, depths=args.depths, widths=args.widths, **common)
    if args.dry_run:
        return 0
    print(study.members.to_string(index=False))
    print(f"members: {args.out / 'members.csv'}")
    if study.page is not None:
        print(f"summary: {args.out / 'summary.json'}\npage: {study.page}")
    return 0


def add_study_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``study`` (with ``depth-width`` and ``transition``) to an argparse subparsers object."""
    p = add_command(
        subparsers,
        "study",
        help=TRAINER_HELP["study"],
        description="Studies of depth against width: depth-width (Petty et al. 2024: "
        "parameter-matched families pretrained and fine-tuned on compositions) and "
        "transition (Levine et al. 2020: a depth x width grid of language models).",
    )
    sub = p.add_subparsers(dest="study", required=True, parser_class=Parser)
    dw = add_command(
        sub,
        "depth-width",
        help="Petty et al.: accuracy on compositions against depth at a fixed budget",
        description="Per budget x depth x seed: a parameter-matched byte-level GPT-2 (width "
        "shrinking with depth), pretrained on the corpus, fine-tuned on the composition task, "
        "scored on seen and held-out combinations. Writes OUT/members.csv, OUT/study.json, "
        "OUT/summary.json and OUT/index.html; run again to resume.",
    )
    dw.add_argument(
        "--budgets", type=parse_ints, default=None, help="parameter budgets, comma-separated"
    )
    _add_depths(dw)
    dw.add_argument("--finetune-steps", type=int, default=None, help="fine-tuning steps per member")
    dw.add_argument(
        "--task",
        choices=["composition", "anchor"],
        default="composition",
        help="what the members are fine-tuned on: the composition task (Petty-style "
        "compositions of primitive operations), or the anchor-function task (trained on from "
        "scratch: its tokens are not bytes)",
    )
    dw.add_argument(
        "--from-scratch",
        action="store_true",
        help="train on the task from scratch instead of pretraining first",
    )
    tr = add_command(
        sub,
        "transition",
        help="Levine et al.: where depth stops paying, on a depth x width grid",
        description="Per depth x width x seed: a byte-level GPT-2 (d_mlp = 4 d_model) "
        "pretrained on the corpus; the loss against size per depth. Writes OUT/members.csv, "
        "OUT/study.json, OUT/summary.json and OUT/index.html; run again to resume.",
    )
    _add_depths(tr)
    tr.add_argument(
        "--widths", type=parse_ints, default=None, help="model widths (d_model), comma-separated"
    )
    for q in (dw, tr):
        _add_shared(q)
        q.set_defaults(func=study_command)
    return p


def _add_depths(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--depths", type=parse_ints, default=None, help="numbers of layers, comma-separated (3+)"
    )


def _add_shared(p: argparse.ArgumentParser) -> None:
    """The flags both studies take."""
    add_out(p, type=Path, help="the study folder (created; a study there is resumed)")
    p.add_argument(
        "--scale",
        choices=["cpu", "paper"],
        default=None,
        help="a preset: cpu (finishes on a 2-core machine in under an hour) or paper (the "
        "papers' sizes, for a GPU cluster; see --dry-run: on a machine without a GPU it is "
        "refused when its estimated time here exceeds a day, and smaller flags are the way to "
        "run its shapes on a CPU, there is no override); the other flags override it "
        "(default: a small study)",
    )
    p.add_argument("--seeds", type=parse_ints, default=None, help="seeds, comma-separated")
    p.add_argument("--steps", type=int, default=None, help="pretraining steps per member")
    data = add_data_flags(
        p,
        text_help="a UTF-8 text file to pretrain on, read as bytes (binary files are refused; "
        "bytes that are not UTF-8 are read as U+FFFD); its last 5%% is the validation split "
        "(default: the Python standard library's sources)",
        random_tokens=False,
    )
    data.add_argument(
        "--corpus",
        default=None,
        help="a folder of .py text files to pretrain on (default: the Python standard library)",
    )
    p.add_argument(
        "--device", default=None, help="cpu, cuda or auto (default: the scale's: cpu or auto)"
    )
    add_executor(p, what="members")
    p.add_argument("--address", dest="ray_address", default=None, help="the same as --ray-address")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the members (depth, width, d_mlp, parameters, tokens, FLOPs) and the "
        "expected cost, and exit without training",
    )
    add_quiet(p, help="no progress bars or time estimates")
    p.add_argument(  # also here, after the study's name (`probekit study --threads N` too)
        "--threads",
        type=int,
        default=argparse.SUPPRESS,
        help="CPU threads for torch (default: torch's own choice; results repeat exactly only "
        "at the same thread count)",
    )


__all__ = ["add_study_parser", "study_command"]
