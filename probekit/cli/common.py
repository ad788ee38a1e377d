"""What every ``probekit`` subcommand shares: the parser style and the flags named alike.

:class:`Parser` makes a usage error one line and exit status 2 and refuses abbreviated flags;
:class:`HelpFormatter` shows a flag's default unless its help already does. The flags that mean
the same in several subcommands are defined once here: ``--threads`` (every subcommand),
``--device``, ``--out`` / ``--force`` and ``--quiet`` (``--no-progress`` is its hidden old
name, kept working for train and sweep).

Example:
    >>> parser = Parser(prog="probekit x")
    >>> add_out(parser, help="output folder")
    >>> add_quiet(parser, help="no progress bars", no_progress_alias=True)
    >>> parser.parse_args(["--out", "r", "--no-progress"]).quiet
    True
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any

from probekit.errors import ConfigError, InputError


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2, and a flag must be
    spelled in full (``--n-layer`` is an error with a suggestion, not ``--n-layers``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(
            2, f"probekit: error: {message}{self.suggest(message)} (see {self.prog} --help)\n"
        )

    def suggest(self, message: str) -> str:
        """ "; did you mean --x?" for an unrecognized flag close to one of a subcommand's."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = set(self._option_string_actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    known |= set(sub._option_string_actions)
        hints = []
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
            if flag.startswith("-") and close:
                hints.append(f"{flag} -> {close[0]}")
        return f"; did you mean {', '.join(hints)}?" if hints else ""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show ``(default: X)`` unless the help already explains the default or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text.lower()
            or action.required
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._StoreFalseAction | argparse._StoreTrueAction)
        ):
            return text  # a switch's help says what it does; "(default: True)" misreads
        if isinstance(action.default, list | tuple):  # as typed: comma-separated
            shown = ",".join(str(v) for v in action.default).replace("%", "%%")
            return f"{text} (default: {shown})"
        return super()._get_help_string(action)


def add_command(subparsers: Any, name: str, *, help: str, description: str) -> Any:
    """Add the subcommand ``name`` to an argparse subparsers object, in the one help style."""
    return subparsers.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter
    )


Flags = argparse.ArgumentParser | argparse._ArgumentGroup
"""Where a flag is added: a parser or one of its argument groups."""


def add_threads(parser: Flags) -> None:
    """``--threads N``: CPU threads for torch (see :func:`set_threads`)."""
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: torch's own choice; results repeat exactly "
        "only at the same thread count)",
    )


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (None: leave torch's choice); torch is imported only to set it."""
    if threads is None:
        return
    if threads < 1:
        raise InputError(
            f"--threads {threads} is not a positive count", fix="pass --threads 1 or more"
        )
    import torch

    torch.set_num_threads(threads)


def add_device(parser: Flags, *, default: str | None, help: str) -> None:
    """``--device``: where the model runs (each subcommand says which names it takes)."""
    parser.add_argument("--device", default=default, help=help)


def check_device(device: str | None) -> None:
    """Refuse a ``--device`` other than cpu or an available cuda device (torch imported here).

    Example:
        >>> check_device("cpu")
        >>> check_device("tpu")
        Traceback (most recent call last):
        ...
        probekit.errors.ConfigError: --device 'tpu' is not one probekit runs on. Fix: use \
--device cpu, or cuda / cuda:N on a machine with CUDA.
    """
    if device is None:
        return
    import torch

    fix = "use --device cpu, or cuda / cuda:N on a machine with CUDA"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r} is not one probekit runs on", fix=fix)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available here", fix="use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {device}: there are only {torch.cuda.device_count()} CUDA device(s)",
            fix="use cuda:0 .. cuda:N-1, or --device cpu",
        )


def add_out(parser: Flags, *, help: str, default: str | None = None, type: Any = str) -> None:
    """``--out``: the output folder; required when it has no ``default``."""
    parser.add_argument("--out", required=default is None, default=default, type=type, help=help)


def add_force(parser: Flags, *, what: str) -> None:
    """``--force``: replace a non-empty ``--out`` that holds no probekit ``what``."""
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"replace a non-empty --out that holds no probekit {what} (its files are deleted)",
    )


def add_quiet(parser: Flags, *, help: str, no_progress_alias: bool = False) -> None:
    """``--quiet`` (dest ``quiet``): no progress bars, and what else ``help`` says. With
    ``no_progress_alias``, ``--no-progress`` (its old name in train and sweep) sets it too and
    is left out of the help."""
    parser.add_argument("--quiet", action="store_true", help=help)
    if no_progress_alias:
        parser.add_argument(
            "--no-progress", dest="quiet", action="store_true", help=argparse.SUPPRESS
        )


__all__ = [
    "HelpFormatter",
    "Parser",
    "add_command",
    "add_device",
    "add_force",
    "add_out",
    "add_quiet",
    "add_threads",
    "check_device",
    "set_threads",
]
