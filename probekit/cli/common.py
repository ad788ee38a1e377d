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
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from probekit.errors import ConfigError, InputError, ProbekitWarning
from probekit.sources import DatasetChoice


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

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.argv = list(sys.argv[1:] if args is None else args)  # read by :meth:`suggest`
        return super().parse_args(args, namespace)

    def suggest(self, message: str) -> str:
        """ "; did you mean --x?" for an unrecognized flag close to one of the subcommand's
        own, or the subcommands it belongs to when it is another one's flag."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        subcommands: dict[str, argparse.ArgumentParser] = {}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                subcommands.update(action.choices)
        used = next((w for w in getattr(self, "argv", []) if w in subcommands), None)
        known = set(self._option_string_actions)
        if used is not None:
            known |= set(subcommands[used]._option_string_actions)
        close_to, belongs = [], []
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            if not flag.startswith("-"):
                continue
            elsewhere = [n for n, sub in subcommands.items() if flag in sub._option_string_actions]
            close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
            if elsewhere:
                belongs.append(f"{flag} is a flag of probekit {' / '.join(elsewhere)}")
            elif close:
                close_to.append(f"{flag} -> {close[0]}")
        said = [f"did you mean {', '.join(close_to)}?"] if close_to else []
        return "".join(f"; {part}" for part in said + belongs)


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
        return super()._get_help_string(action) or ""  # typed str | None, always text here


TRAINER_HELP = {
    "train": "train a GPT-2-style model on the anchor-function task",
    "sweep": "sweep gamma x weight decay x depth x seeds; phase diagrams",
    # --- the depth against width studies ---
    "study": "depth against width: Petty's depth-width study, Levine's width transition",
}
"""The one-line help of the trainer's subcommands: ``probekit --help`` lists them with it
without importing the trainer (and torch)."""


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


MAX_THREADS = 4096
"""The most CPU threads ``--threads`` takes (torch overflows on absurd counts)."""


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (None: leave torch's choice); torch is imported only to set it."""
    if threads is None:
        return
    if threads < 1:
        raise InputError(
            f"--threads {threads} is not a positive count", fix="pass --threads 1 or more"
        )
    if threads > MAX_THREADS:
        raise InputError(
            f"--threads {threads} is more than {MAX_THREADS}",
            fix=f"pass at most {MAX_THREADS} (this machine has {os.cpu_count()} CPUs)",
        )
    import torch

    torch.set_num_threads(threads)


def add_dtype_flags(parser: Flags) -> None:
    """``--dtype`` (the dtype the computation runs in) and ``--storage`` (the dtype the weights
    are kept in meanwhile, :func:`probekit.load`'s ``storage``) of the commands that load a
    checkpoint to diagnose it."""
    parser.add_argument(
        "--dtype",
        choices=["stored", "float32", "bfloat16", "float16"],
        default="stored",
        help="load the weights in this dtype (default: as stored in the checkpoint); every "
        "measure accumulates in float32 or float64",
    )
    parser.add_argument(
        "--storage",
        choices=["auto", "stored", "dtype"],
        default="auto",
        help="the dtype the weights are kept in while the computation runs in --dtype: "
        "stored keeps them as the checkpoint stores them (bf16/fp16, 2 bytes a parameter) and "
        "computes in float32 (or --dtype) on the fly, the numbers of --dtype float32 in about "
        "half its memory; dtype casts them to --dtype; auto (default): dtype, or stored when "
        "the --dtype copy would not fit in free memory",
    )


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


def add_data_flags(
    diag: Flags, *, text_help: str | None = None, random_tokens: bool = True
) -> argparse._MutuallyExclusiveGroup:
    """What a diagnosis reads (``diagnose``, ``compare``, ``timeline``): a text file, a data
    set or drawn tokens (one of them; without any, what the checkpoint implies). Another
    command reading text (``study``) passes its own ``text_help`` and no ``random_tokens``;
    the group is returned for its own choices."""
    choice = diag.add_mutually_exclusive_group()
    choice.add_argument(
        "--text",
        help=text_help
        or "a UTF-8 text file to tokenize with the model's tokenizer, read only as far as "
        "needed (binary files are refused; bytes that are not UTF-8 are read as U+FFFD, with "
        "a warning) (default: the task's test data for probekit runs, else the Python "
        "standard library's sources for a model with a tokenizer, else tokens drawn "
        "uniformly from the vocabulary)",
    )
    choice.add_argument(
        "--dataset",
        help="a data set's text: a Hugging Face datasets name (offline: from the local "
        "datasets cache), a save_to_disk folder, or a local .jsonl/.json/.parquet/.csv/.txt "
        "file; with --dataset-config, --split, --column",
    )
    if random_tokens:
        choice.add_argument(
            "--random-tokens",
            action="store_true",
            help="tokens drawn uniformly from the vocabulary (describe random tokens, not "
            "language)",
        )
    diag.add_argument("--dataset-config", help="the data set's configuration (with --dataset)")
    diag.add_argument(
        "--split",
        help="the data set's split (with --dataset; default validation for a named data set, "
        "train for a local file)",
    )
    diag.add_argument(
        "--column",
        help="the data set's text column (with --dataset; default text, or else its only "
        "string column)",
    )
    return choice


DATASET_FLAG_EXAMPLES = {
    "--dataset-config": "--dataset-config wikitext-2-raw-v1",
    "--split": "--split validation",
    "--column": "--column text",
}
"""An example of each data-set flag, for the error that refuses an empty one."""


def dataset_choice(args: argparse.Namespace) -> DatasetChoice | None:
    """The data set ``--dataset`` and its flags name, or ``None``; a data-set flag without
    ``--dataset`` is refused."""
    extras = {"--dataset-config": args.dataset_config, "--split": args.split}
    extras["--column"] = args.column
    given = [flag for flag, value in extras.items() if value is not None]
    if args.dataset is None:
        if given:
            raise ConfigError(f"{given[0]} was given without --dataset", fix="add --dataset NAME")
        return None
    if not args.dataset.strip():
        raise ConfigError("--dataset is empty", fix="name a data set or a data file")
    for flag, value in extras.items():
        if value is not None and not value.strip():
            raise ConfigError(
                f"{flag} {value!r} is empty",
                fix=f"name one (e.g. {DATASET_FLAG_EXAMPLES[flag]}), or leave {flag} out "
                "for the default",
            )
    return DatasetChoice(args.dataset, args.dataset_config, args.split, args.column or "text")


def add_executor(parser: Flags, *, what: str) -> None:
    """``--executor local|ray`` and ``--ray-address``: where the ``what`` run."""
    group = parser.add_argument_group("executor")
    group.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help=f"local: the {what} one after another in this process; ray: each one Ray task (a "
        'local Ray, or the cluster at --ray-address; needs pip install -e ".[ray]" and an '
        "absolute --out on a filesystem every node sees)",
    )
    group.add_argument(
        "--ray-address",
        default=None,
        help="address of a running Ray cluster (`ray start --head` prints it, e.g. "
        "10.0.0.1:6379); default: start a local Ray sized to this machine",
    )


def check_executor_flags(args: argparse.Namespace) -> None:
    """``--ray-address`` only with ``--executor ray``, and a Ray head answers there (or at
    ``RAY_ADDRESS``), checked in seconds before any work."""
    if args.ray_address is not None and args.executor != "ray":
        raise ConfigError(
            "--ray-address is given but the executor is local",
            fix="add --executor ray, or leave --ray-address out",
        )
    if args.executor == "ray":
        from probekit.executor import check_ray_address

        check_ray_address(args.ray_address)


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """While the block runs, a :class:`~probekit.errors.ProbekitWarning` is printed as one line
    on stderr, ``probekit: warning: ...`` (other warnings as Python shows them)."""
    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, ProbekitWarning):
            print("probekit: warning: " + " ".join(str(message).split()), file=sys.stderr)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


LIMITS = {
    "n_sequences": (1, 100_000),
    "seq_len": (1, 2**20),
    "bootstrap": (0, 10_000),
    "batch_size": (1, 10**6),
    "seed": (0, 2**32 - 1),
    "lens_steps": (1, 10**7),
}
"""The range ``(low, high)`` each integer flag of a diagnosis (``diagnose``, ``compare``,
``timeline``) accepts."""


def check_int_flags(args: argparse.Namespace) -> None:
    """Raise :class:`~probekit.errors.ConfigError` for an integer flag outside :data:`LIMITS`.

    Example:
        >>> check_int_flags(argparse.Namespace(seq_len=0))
        Traceback (most recent call last):
        ...
        probekit.errors.ConfigError: --seq-len 0 is outside [1, 1048576]. Fix: pass --seq-len \
from 1 to 1048576.
    """
    for dest, (low, high) in LIMITS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(
                f"{flag} {value} is outside [{low}, {high}]",
                fix=f"pass {flag} from {low} to {high}",
            )


__all__ = [
    "LIMITS",
    "check_int_flags",
    "add_data_flags",
    "add_executor",
    "check_executor_flags",
    "dataset_choice",
    "HelpFormatter",
    "Parser",
    "add_command",
    "add_device",
    "add_force",
    "add_out",
    "add_quiet",
    "add_threads",
    "check_device",
    "one_line_warnings",
    "set_threads",
]
