"""``probekit demo``: its flags, and the verdicts it prints; the demo itself is
:func:`probekit.demo.run_demo`.

Example:
    >>> from probekit.cli import build_parser
    >>> args = build_parser().parse_args(["demo", "--quick"])
    >>> args.func is demo_command, args.out, args.quiet
    (True, 'probekit-demo', False)
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from probekit.cli.common import add_command, add_force, add_out, add_quiet
from probekit.sources import check_path_names


def print_demo_verdicts(summary: os.PathLike) -> None:
    """Print each demo model's verdict lines from the demo's summary.json."""
    from probekit.demo import model_label  # after the demo ran: no import cost before it

    for name, value in json.loads(open(summary, encoding="utf-8").read()).items():
        if isinstance(value, dict) and "verdict" in value:
            found = value.get("solution", "see the verdict")
            print(f"{name} model: {model_label(name)}, found {found}:")
            for line in value["verdict"]:
                print(f"- {line}")


def demo_command(args: argparse.Namespace) -> int:
    """``probekit demo``: train, classify and dissect the two reference models."""
    from probekit.demo import run_demo

    check_path_names(args.out)
    index = run_demo(
        args.out,
        quick=args.quick,
        progress=not args.quiet,
        images=not args.no_images,
        force=args.force,
    )
    if not args.quiet:
        print_demo_verdicts(index.parent / "summary.json")
    print(f"demo report: {index}")  # even with --quiet: where the demo is
    return 0


def add_demo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to an argparse subparsers object."""
    demo = add_command(
        subparsers,
        "demo",
        help="train the two reference anchor models and write the full report",
        description="Train the symmetric (gamma 0.5) and inferential (gamma 0.8) reference "
        "models of the anchor-function task, classify their solutions, run the mechanism "
        "analyses and the depth-use diagnosis, and write a report per model and an index page.",
    )
    add_out(
        demo,
        default="probekit-demo",
        help="output folder (default ./probekit-demo), built beside it and swapped in whole",
    )
    add_force(demo, what="demo")
    demo.add_argument(
        "--quick",
        action="store_true",
        help="tiny models and few steps: a smoke run whose numbers mean nothing",
    )
    demo.add_argument(
        "--no-images", action="store_true", help="skip the PNG/SVG copies of the figures"
    )
    add_quiet(demo, help="no progress lines or verdicts: only the index page's path")
    demo.set_defaults(func=demo_command)
    return demo


__all__ = ["add_demo_parser", "demo_command", "print_demo_verdicts"]
