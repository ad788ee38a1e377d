"""``probekit compare A B [C ...]`` and ``probekit timeline RUN | A B ... | NAME --revisions``:
several checkpoints diagnosed on the same data, each with its own report, and one page that
sets them side by side (:mod:`probekit.compare`).

Example:
    >>> from probekit.cli import build_parser
    >>> args = build_parser("compare").parse_args(["compare", "a", "b", "--out", "r"])
    >>> args.checkpoints, args.executor
    (['a', 'b'], 'local')
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from probekit.cli.common import (
    add_command,
    add_data_flags,
    add_dtype_flags,
    add_estimate,
    add_executor,
    add_force,
    add_out,
    add_quiet,
    check_estimate_fits,
    check_executor_flags,
    check_int_flags,
    dataset_choice,
    estimate_diagnosis,
)
from probekit.sources import N_SEQUENCES, SEQ_LEN, check_dataset, checkpoints_to_compare


def _check(args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """Every check that needs no model; the ``{name: folder}`` to compare, and the warning
    for a ``--dataset`` .txt that is not UTF-8 (or None)."""
    check_int_flags(args)
    check_executor_flags(args)
    names = args.names.split(",") if getattr(args, "names", None) else None
    revisions = args.revisions.split(",") if getattr(args, "revisions", None) else None
    found = checkpoints_to_compare(
        args.checkpoints, names=names, revisions=revisions, run=args.command == "timeline"
    )
    return found, check_dataset(dataset_choice(args))


def compare_command(args: argparse.Namespace) -> int:
    """``probekit compare`` / ``probekit timeline``: check, diagnose each, write the page.

    Exits 1 when a checkpoint's diagnosis failed (after the others are written, the failure
    listed on the page and in diagnoses.csv), printing one error line per failed checkpoint,
    also with ``--quiet``."""
    checkpoints, warning = _check(args)
    if args.estimate:
        return estimate_each(args, checkpoints)
    from probekit.page import check_out_dir  # light: the comparison's imports wait for the work

    out = check_out_dir(args.out, force=args.force, protect=tuple(checkpoints.values()))
    from probekit import compare

    if warning:
        print(f"probekit: warning: {warning}", file=sys.stderr)
    for name, found in _estimates(args, checkpoints, timed=False if args.quiet else None).items():
        if not args.quiet and found.seconds is not None:  # work of more than seconds
            print(f"probekit: estimate: {name}: {found.summary}", file=sys.stderr)
        check_estimate_fits(found)  # before any weights load
    page, failed = compare.compare_checkpoints(
        checkpoints,
        out,
        timeline=args.command == "timeline",
        text=args.text,
        dataset=dataset_choice(args),
        random_tokens=args.random_tokens,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        executor=args.executor,
        ray_address=args.ray_address,
        progress=not args.quiet,
        pairs=args.pairs,
        n_bootstrap=args.bootstrap,
        dtype=args.dtype,
        storage=args.storage,
    )
    for name, error in failed.items():
        print(f"probekit: error: checkpoint {name} failed: {error}", file=sys.stderr)
    print(f"comparison: {page}", file=sys.stdout)  # even with --quiet: where the page is
    return 1 if failed else 0


def _estimates(
    args: argparse.Namespace, checkpoints: dict[str, str], timed: bool | None
) -> dict[str, Any]:
    """The :class:`~probekit.cli.common.Estimate` of each checkpoint's diagnosis (one block
    and one head timed per shape), leaving out a folder whose config cannot be estimated from
    (its diagnosis says what is wrong with it)."""
    from probekit.sources import locate

    timings: dict = {}
    out = {}
    for name, folder in checkpoints.items():
        try:
            path, _ = locate(folder)
            out[name] = estimate_diagnosis(
                path,
                n_sequences=args.n_sequences,
                seq_len=args.seq_len,
                dtype=args.dtype,
                keep=args.storage,
                timed=timed,
                timings=timings,
                pairs=args.pairs,
            )
        except Exception:  # noqa: BLE001 - an estimate never stops what the load allows
            continue
    return out


def estimate_each(args: argparse.Namespace, checkpoints: dict[str, str]) -> int:
    """``--estimate``: each checkpoint's estimate on stdout; nothing is loaded or written."""
    found = _estimates(args, checkpoints, timed=True)
    for name, estimate in found.items():
        for line in estimate.lines:
            print(f"estimate: {name}: {line}")
        if not estimate.fits:
            print(f"estimate: {name}: does not fit in the free memory")
    seconds = sum(e.seconds or 0.0 for e in found.values())
    print(
        f"estimate: {len(found)} of {len(checkpoints)} checkpoints, {seconds / 60:.1f} min in all"
    )
    return 0


def add_compare_parsers(subparsers: Any) -> None:
    """The ``compare`` and ``timeline`` subcommands."""
    for name, help, what in (
        ("compare", "several checkpoints side by side", "checkpoint folders or Hub names"),
        (
            "timeline",
            "one run's checkpoints (or Hub revisions) over training",
            "a run folder (its checkpoints below it, ordered by step), checkpoints in training "
            "order, or one Hub name with --revisions",
        ),
    ):
        p = add_command(
            subparsers,
            name,
            help=help,
            description=f"Diagnose {what} on the same data, write each one's full report and "
            "one page with the headline table, the contribution and logit-lens profiles "
            "overlaid and the permutable blocks of each.",
        )
        p.add_argument("checkpoints", nargs="+", help=what)
        if name == "compare":
            p.add_argument("--names", help="comma-separated names, one per checkpoint")
        else:
            p.add_argument(
                "--revisions", help="comma-separated Hub revisions of the one Hub name given"
            )
        _add_shared_flags(p)
        p.set_defaults(func=compare_command)


def _add_shared_flags(p: argparse.ArgumentParser) -> None:
    add_out(p, help="folder for the page (index.html) and one report folder per checkpoint")
    add_force(p, what="comparison")
    add_data_flags(p)
    p.add_argument(
        "--n-sequences", type=int, default=N_SEQUENCES, help="sequences of data, 1 to 100000"
    )
    p.add_argument("--seq-len", type=int, default=SEQ_LEN, help="tokens per sequence")
    p.add_argument("--pairs", choices=["adjacent", "all"], default="adjacent",
                   help="layer pairs to swap")  # fmt: skip
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap replicates, 0 to 10000")
    add_dtype_flags(p)
    add_executor(p, what="checkpoints")
    add_quiet(p, help="no progress output or estimate: only the page's path")
    add_estimate(p)


__all__ = ["add_compare_parsers", "compare_command"]
