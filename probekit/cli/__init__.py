"""The ``probekit`` command line: one module per subcommand, its flags and what it prints.

``probekit diagnose PATH --out DIR`` (:mod:`probekit.cli.diagnose`) writes the depth-use report
of any checkpoint probekit can load; ``probekit demo`` (:mod:`probekit.cli.demo`) trains and
reports the two reference models; ``probekit train`` and ``probekit sweep``
(:mod:`probekit.cli.train`, :mod:`probekit.cli.sweep`, their shared settings flags in
:mod:`probekit.cli.train_flags`) run the anchor-function trainer; ``probekit study
depth-width|transition`` (:mod:`probekit.cli.study`) runs the depth-against-width studies. The
parser style and the flags every subcommand shares are in :mod:`probekit.cli.common`. Every
problem with the input prints one line (``probekit: error: ...``) and exits with status 2.

From a shell: ``probekit diagnose runs/anchor --out report/`` (a run folder stands for its
checkpoint), ``probekit demo``, ``probekit train --out runs/a``, ``probekit sweep ...``.

Example:
    >>> args = build_parser().parse_args(["diagnose", "runs/anchor", "--out", "report/"])
    >>> args.command, args.positions, args.threads
    ('diagnose', 'auto', None)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from probekit.cli.common import (
    LIMITS,
    TRAINER_HELP,
    Parser,
    add_command,
    add_threads,
    check_device,
    check_int_flags,
    one_line_warnings,
    set_threads,
)
from probekit.cli.compare import add_compare_parsers
from probekit.cli.demo import add_demo_parser
from probekit.cli.diagnose import add_diagnose_parser
from probekit.cli.shutdown import EXIT_TERMINATED, Terminated, graceful_shutdown
from probekit.errors import ProbekitError

LIGHT_COMMANDS = ("diagnose", "demo", "compare", "timeline")
"""Subcommands whose parser needs no trainer: for them the train/sweep parsers (which import
torch) are not built, so a wrong path is reported before torch loads."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``probekit`` parser: diagnose, demo, compare, timeline, and train/sweep when the
    trainer imports. The trainer's parsers (which import torch) are built for ``command``
    None (every parser, as the docs' flag tables read them), ``"train"`` and ``"sweep"``; not
    for one of :data:`LIGHT_COMMANDS`; for any other ``command`` (``""``: none given, as for
    ``probekit --help``; a mistyped one) train and sweep are listed with their one-line help
    (:data:`~probekit.cli.common.TRAINER_HELP`) only, so the answer comes before torch loads."""
    parser = Parser(
        prog="probekit",
        description="probekit: how does a Transformer use its depth, and did it learn a rule "
        "or memorize?",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_diagnose_parser(sub)
    add_demo_parser(sub)
    add_compare_parsers(sub)
    if command is None or command in TRAINER_HELP:
        _add_trainer_parsers(sub)
    elif command not in LIGHT_COMMANDS:  # listed in the help, parsed by no one
        for name, words in TRAINER_HELP.items():
            add_command(sub, name, help=words, description=words)
    for subparser in sub.choices.values():
        add_threads(subparser)
    return parser


def _add_trainer_parsers(sub: argparse._SubParsersAction) -> None:
    """The train and sweep parsers (they import the trainer and torch), when it imports."""
    try:
        from probekit.cli.sweep import add_sweep_parser
        from probekit.cli.train import add_train_parser
    except ImportError:  # the trainer is optional for the analyzers
        return
    add_train_parser(sub)
    add_sweep_parser(sub)
    # --- the depth against width studies ---
    from probekit.cli.study import add_study_parser

    add_study_parser(sub)


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``probekit`` command; returns the exit status.

    Before torch is imported it sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
    it (:func:`probekit.openmp.wait_passively`): OpenMP threads that spin while they wait slow
    a shared machine down several times.
    The command runs under :func:`~probekit.cli.shutdown.graceful_shutdown`: a reader that
    closes the pipe early (``| head -1``) costs no traceback and no exit status, and SIGTERM
    stops it as Ctrl-C does, its temporary files removed (exit 143; Ctrl-C: 130).
    """
    from probekit.openmp import wait_passively  # stdlib only: light

    wait_passively()
    argv = sys.argv[1:] if argv is None else list(argv)
    with graceful_shutdown():
        parser = build_parser(_command(argv) or "")
        args = parser.parse_args(argv)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; a problem is one line on stderr and its exit status."""
    try:
        set_threads(args.threads)
        with one_line_warnings():  # a ProbekitWarning: "probekit: warning: ..."
            return int(args.func(args) or 0)
    except ProbekitError as err:
        print("probekit: error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("probekit: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("probekit: terminated", file=sys.stderr)
        return EXIT_TERMINATED


__all__ = ["LIGHT_COMMANDS", "LIMITS", "build_parser", "check_device", "check_int_flags", "main"]
