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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
        "measure accumulates in float32 or float64. For numbers to publish use float32: "
        "bfloat16 is about 2.5x faster on a CPU, its per-layer effects good to about 2.5e-3 "
        "in loss change (docs: Speed, Half precision on a CPU)",
    )
    parser.add_argument(
        "--storage",
        choices=["auto", "stored", "dtype"],
        default="auto",
        help="the dtype the weights are kept in while the computation runs in --dtype: "
        "stored keeps them as the checkpoint stores them (bf16/fp16, 2 bytes a parameter) and "
        "computes in float32 (or --dtype) on the fly, the numbers of --dtype float32 in about "
        "half its memory; dtype casts them to --dtype; auto (default): dtype, or stored when "
        "the --dtype copy would not fit in free memory (diagnose: or when the diagnosis's "
        "peak would not fit while the stored one does)",
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


# --- the estimate of a diagnosis's time and memory, before the weights load ---


def add_estimate(parser: Flags) -> None:
    """``--estimate``: print the expected time and peak memory of the work and exit before
    the weights load (:func:`estimate_diagnosis`)."""
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="print the expected time and peak memory (from the model's config, the planned "
        "block passes and heads, and a short timing of one block and one head here) and exit "
        "without loading the weights",
    )


HALF_DTYPES = ("bfloat16", "float16")


def weight_dtypes(
    stored: str,
    dtype: str,
    storage: str = "dtype",
    config: dict | None = None,
    free: int | None = None,
) -> tuple[str, str]:
    """The dtype the weights are kept in memory in and the dtype each block computes in, for
    weights stored in ``stored`` loaded with ``--dtype`` ``dtype`` (``"stored"``: as stored;
    float32 with ``--storage stored``) and ``--storage`` ``storage``, as
    :func:`probekit.load` chooses them, by its own rule
    (:func:`probekit.model.checkpoint.kept_dtype`: with ``"auto"``, kept as stored only when
    the ``dtype`` copy of the weights of ``config`` would not fit in ``free`` bytes while the
    stored ones would)."""
    import torch

    from probekit.model.checkpoint import kept_dtype

    compute = dtype if dtype != "stored" else "float32" if storage == "stored" else stored
    free = free if config is not None else None  # no config: nothing to weigh, as load
    keep = kept_dtype(config or {}, getattr(torch, compute), getattr(torch, stored), storage, free)
    return str(keep).removeprefix("torch."), compute


@dataclass
class Estimate:
    """What :func:`estimate_diagnosis` found: one summary line, the detail lines (``--estimate``
    prints them), the expected seconds (None: not timed), the peak memory in bytes, the free
    memory (None: unknown) and what to do when the peak does not fit."""

    summary: str
    lines: list[str]
    seconds: float | None
    peak: int
    free: int | None
    remedies: list[str]

    @property
    def fits(self) -> bool:
        return self.free is None or self.peak <= self.free


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def _count(n: float) -> str:
    """A parameter count in words: 494M, 8.03B."""
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


TIMED_FLOPS = 1e10
"""A diagnosis with less arithmetic than this takes seconds: its estimate times nothing (a
block and a head are timed only for more, or when ``--estimate`` asks)."""


def estimate_diagnosis(
    folder: str,
    *,
    n_sequences: int,
    seq_len: int,
    batch_size: int | None = None,
    dtype: str = "stored",
    keep: str = "dtype",
    device: str | None = None,
    timed: bool | None = None,
    timings: dict | None = None,
    **plan: Any,
) -> Estimate:
    """The expected time and peak memory of diagnosing the checkpoint in ``folder`` on
    ``n_sequences`` x ``seq_len`` tokens (loaded with ``--dtype`` ``dtype`` and ``--storage``
    ``keep``, :func:`weight_dtypes`), from its config and safetensors headers alone
    (:mod:`probekit.model.estimate`): the planned block passes and heads per analysis, their
    FLOPs and one block pass and one head timed here (``timed``; None: when the work has
    :data:`TIMED_FLOPS` or more; the timings kept in ``timings`` by shape, for several
    checkpoints of one shape). ``plan`` goes to
    :func:`~probekit.model.estimate.diagnosis_plan` (``pairs``, ``similarity``,
    ``token_lens``)."""
    from probekit.model import estimate as est
    from probekit.numerics import available_memory

    shapes, stored, config = est.read_shapes(folder)
    context = config.get("max_position_embeddings") or config.get("n_positions") or seq_len
    seq_len = min(seq_len, int(context))
    where = device or _default_device()
    free = available_memory(where)
    storage, compute = weight_dtypes(stored, dtype, keep, config, available_memory("cpu"))
    work = est.workload(shapes, n_sequences, seq_len, batch_size, where, free, storage, **plan)
    peak = est.peak_bytes(work, storage, compute, stored)
    weights = est.weight_bytes(shapes, storage, compute)
    total, flops = work.total, work.flops(work.total)
    counts = f"{total.block_passes:,} block passes and {total.heads:,} heads" + (
        f" and {total.backwards} backward{'s' if total.backwards > 1 else ''}"
        if total.backwards
        else ""
    )
    lines = [
        f"model: {_count(shapes.parameters)} parameters, {shapes.n_layers} layers, d_model "
        f"{shapes.d_model}, vocabulary {shapes.vocab:,}; stored in {stored}, kept in "
        f"{storage}, computed in {compute}",
        f"plan: {n_sequences} x {seq_len} tokens in batches of {work.batch}; {counts} = "
        f"{flops / 1e12:.3g} TFLOP; per analysis (block passes/heads) "
        + ", ".join(f"{name} {p.block_passes:,}/{p.heads:,}" for name, p in work.plan.items()),
    ]
    seconds = None
    if timed or (timed is None and flops >= TIMED_FLOPS):
        key = (shapes, work.batch, seq_len, storage, compute, where, work.chunk)
        cache = {} if timings is None else timings
        try:
            if key not in cache:
                cache[key] = est.time_block_and_head(
                    config, work.batch, seq_len, compute, where, storage=storage, chunk=work.chunk
                )
        except Exception as err:  # noqa: BLE001 - a config transformers cannot build alone
            lines.append(f"timing here: not available ({type(err).__name__}: {err})"[:300])
        else:
            timing = cache[key]
            each = {name: timing.seconds(work, p) for name, p in work.plan.items()}
            seconds = sum(each.values())
            lines.append(
                f"timing here: one block pass {timing.block * 1e3:.1f} ms"
                + (
                    f" ({timing.per_variant * 1e3:.1f} ms each, {work.chunk} stacked)"
                    if work.chunk > 1
                    else ""
                )
                + f", one head and its "
                f"measures {timing.head * 1e3:.1f} ms ({_load_line()}); expected "
                f"{_minutes(seconds)}: "
                + ", ".join(f"{name} {_minutes(s)}" for name, s in each.items() if s > 0)
            )
    room = f"{_gib(free)} free" if free is not None else "free memory unknown"
    lines.append(f"memory: expected peak {_gib(peak)} (weights {_gib(weights)}); {room}")
    took = f"about {_minutes(seconds)}" if seconds is not None else "a few seconds"
    summary = f"{took} and {_gib(peak)} at the peak (weights {_gib(weights)}, {room}): {counts}"
    remedies = _remedies(work, stored, storage, compute, free)
    return Estimate(summary, lines, seconds, peak, free, remedies)


def _default_device() -> str:
    """Where a diagnosis without ``--device`` runs: CUDA when present, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_line() -> str:
    """The load average beside the core count: a busy machine's timings are longer."""
    try:
        load = f"load average {os.getloadavg()[0]:.2f}"
    except OSError:  # pragma: no cover - no load average
        load = "load unknown"
    return f"{load} on {os.cpu_count()} cores"


def _remedies(work: Any, stored: str, storage: str, compute: str, free: int | None) -> list[str]:
    """What brings a diagnosis's peak under ``free`` bytes, the ones that help most first."""
    from probekit.model import estimate as est

    weights = est.weight_bytes(work.shapes, storage, compute)
    out = []
    if storage == "float32" and stored in HALF_DTYPES:
        out.append(f"--storage stored (the weights kept in {stored}, float32 numbers)")
    if storage == "float32":
        half = stored if stored in HALF_DTYPES else "bfloat16"
        out.append(f"--dtype {half} (half the weights' memory; computes in {half})")
    if free is None or weights + est.BASE_PROCESS_BYTES < free:
        out.append("--batch-size 1, fewer --n-sequences or a shorter --seq-len")
    out.append("a machine with more memory")
    return out


def storage_that_fits(
    args: argparse.Namespace, found: Estimate, again: Callable[[], Estimate]
) -> Estimate:
    """With ``--storage auto`` and a ``--dtype`` wider than the stored weights: when the
    estimate ``found`` (the weights copied to ``--dtype``) does not fit in the free memory and
    the estimate with the weights kept as stored (``again()``, asked with ``args.storage``
    set to ``"stored"``) does, keep them as stored (the same numbers,
    :mod:`probekit.model.storage`), say so on stderr and return that estimate.
    :func:`probekit.model.checkpoint.kept_dtype` weighs the weights alone; this weighs the
    diagnosis's whole peak (with several batches, every block's gradient sums).
    Otherwise ``found``, ``args`` unchanged."""
    if found.fits or getattr(args, "storage", None) != "auto" or args.dtype == "stored":
        return found
    args.storage = "stored"
    kept = again()
    if not kept.fits:
        args.storage = "auto"
        return found
    print(
        f"probekit: --storage auto keeps the weights as stored ({args.dtype} numbers): with "
        f"a {args.dtype} copy the peak would be about {_gib(found.peak)}, above the "
        f"{_gib(found.free or 0)} free",
        file=sys.stderr,
    )
    return kept


def check_estimate_fits(estimate: Estimate) -> None:
    """Refuse, before the weights load, a diagnosis whose expected peak exceeds the free
    memory (it would be killed mid-way), naming what to do."""
    if estimate.fits:
        return
    raise ConfigError(
        f"the diagnosis needs about {_gib(estimate.peak)} of memory at its peak and "
        f"{_gib(estimate.free or 0)} are free",
        fix="use " + "; or ".join(estimate.remedies),
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
    "Estimate",
    "add_estimate",
    "check_estimate_fits",
    "estimate_diagnosis",
    "storage_that_fits",
    "weight_dtypes",
]
