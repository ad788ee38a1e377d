"""The ``probekit`` command line.

``probekit diagnose PATH --out DIR`` writes the depth-use report of any checkpoint probekit can
load; ``probekit train`` and ``probekit sweep`` run the anchor-function trainer. Every problem
with the input prints one line (``probekit: error: ...``) and exits with status 2.

From a shell: ``probekit diagnose runs/anchor --out report/`` (a run folder stands for its
checkpoint), ``probekit demo``, ``probekit train --out runs/a``, ``probekit sweep ...``.

Example:
    >>> args = build_parser().parse_args(["diagnose", "runs/anchor", "--out", "report/"])
    >>> args.func is cmd_diagnose, args.positions, args.n_sequences
    (True, 'auto', 32)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from probekit.errors import CheckpointError, ConfigError, InputError, ProbekitError
from probekit.runs import N_SEQUENCES, SEQ_LEN


class _Parser(argparse.ArgumentParser):
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
        import difflib

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


LIMITS = {
    "n_sequences": (1, 100_000),
    "seq_len": (1, 2**20),
    "bootstrap": (0, 10_000),
    "batch_size": (1, 10**6),
    "seed": (0, 2**32 - 1),
    "lens_steps": (1, 10**7),
}
"""The range ``(low, high)`` each integer flag of ``probekit diagnose`` accepts."""


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


def _check_paths(*paths: str | None) -> None:
    """Refuse an empty path or one holding a NUL byte."""
    for path in paths:
        if path is not None and (not path.strip() or "\0" in path):
            raise InputError(f"{path!r} is not a path", fix="pass a file or folder name")


def checkpoints_below(path: str | os.PathLike, depth: int = 3) -> list[str]:
    """Folders up to ``depth`` levels below ``path`` that hold a checkpoint (a config.json
    beside weights), sorted; hidden and temporary folders are left out.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for name in ("config.json", "model.safetensors"):
        ...     _ = (root / "runs" / "a" / "checkpoint").mkdir(parents=True, exist_ok=True)
        ...     _ = (root / "runs" / "a" / "checkpoint" / name).write_text("{}")
        >>> checkpoints_below(root / "runs") == [str(root / "runs" / "a" / "checkpoint")]
        True
    """
    found: list[str] = []
    if not os.path.isdir(path):
        return found
    for root, dirs, files in os.walk(path):
        level = os.path.relpath(root, path).count(os.sep) + (root != os.fspath(path))
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if level < depth else []
        weights = any(f.endswith((".safetensors", ".bin")) for f in files)
        if root != os.fspath(path) and "config.json" in files and weights:
            found.append(root)
            dirs[:] = []
    return sorted(found)


def _prepare_diagnose(args: argparse.Namespace) -> tuple[str, Any]:
    """Every check of ``probekit diagnose`` that needs no model: the checkpoint path and
    ``--out``. Prints a warning for a non-UTF-8 ``--text`` and a notice per ignored file."""
    from probekit import runs

    _check_paths(args.model, args.text)
    if not os.path.lexists(args.model):  # before anything slow is imported
        raise CheckpointError(
            f"checkpoint path {args.model} does not exist",
            fix="pass a Hugging Face model directory",
        )
    if args.lens is not None and not os.path.isdir(args.lens):
        raise InputError(
            f"--lens {args.lens} is not a folder", fix="pass a folder written by TunedLens.save()"
        )
    check_int_flags(args)
    check_device(args.device)
    if getattr(args, "device_map", None) is not None and args.device is not None:
        raise ConfigError("--device and --device-map were both given", fix="pass only one of them")
    path = runs.checkpoint_of(args.model)
    try:
        runs.check_checkpoint_folder(path)
    except CheckpointError as err:
        below = checkpoints_below(path)
        if not below:
            raise
        shown = ", ".join(below[:8]) + (f" and {len(below) - 8} more" if len(below) > 8 else "")
        raise CheckpointError(
            f"{path} holds no checkpoint itself, but these folders below it do: {shown}",
            fix=f"pass one of them, e.g. probekit diagnose {below[0]} --out report/",
        ) from err
    warning = runs.check_text_file(args.text) if args.text is not None else None
    from probekit import report  # the analyses, plotly and torch

    out = report.check_out_dir(args.out, force=args.force, protect=(path, args.model, args.text))
    if warning:
        print(f"probekit: warning: {warning}", file=sys.stderr)
    for line in runs.ignored_files(path):
        print(f"probekit: notice: ignored {line}", file=sys.stderr)
    return path, out


def data_source(args: argparse.Namespace, data: Any) -> str:
    """In words, where ``probekit diagnose``'s data came from (see runs.default_data)."""
    if args.text:
        return f"text file {os.path.abspath(args.text)}, tokenized with the model's tokenizer"
    from probekit.data import describe  # a task's data say what they are

    if (described := describe(data)) is not None:
        return described
    from probekit import runs
    from probekit.training.runs import load_run

    if load_run(runs.checkpoint_of(args.model)) is not None:
        return "the validation split of the run's byte corpus"
    return f"tokens drawn uniformly from the vocabulary (seed {args.seed})"


def cmd_diagnose(args: argparse.Namespace) -> int:
    """``probekit diagnose``: check every flag, load the checkpoint, pick its data, write the
    report (into a temporary folder swapped in whole)."""
    path, out = _prepare_diagnose(args)  # before the slow imports and the load
    import torch

    import probekit
    from probekit import report, runs

    dtype = None if args.dtype == "stored" else getattr(torch, args.dtype)
    model = probekit.load(path, device=args.device, dtype=dtype, device_map=args.device_map)
    source = dict(
        text=args.text or None,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        seed=args.seed,
        model=model,
    )
    data, positions = runs.default_data(path, **source)
    lens_data = None
    if args.tuned_lens and args.lens is None:  # a lens is fitted on other data than it reads
        lens_data, _ = runs.default_data(path, **source, purpose="fit")
    keep_first = {"auto": None, "yes": True, "no": False}[args.keep_first]
    diagnosis = report.diagnose(
        model,
        data,
        pairs=args.pairs,
        n_bootstrap=args.bootstrap,
        positions=positions if args.positions == "auto" else args.positions,
        batch_size=args.batch_size,
        progress=not args.quiet,
        conventions=report.Conventions(args.convention, args.mode, keep_first),
        lens=args.lens,
        lens_data=lens_data,
        lens_steps=args.lens_steps,
    )
    diagnosis.meta = {
        "checkpoint": os.path.abspath(path),
        "data_source": data_source(args, data),
        "dtype": args.dtype,
        **diagnosis.meta,
    }
    title = f"probekit depth diagnosis: {path}"
    page, _ = report.save_report(diagnosis, out, title=title, images=not args.no_images)
    missing = None if args.no_images else report.missing_for_images()
    if missing:
        print(
            f"probekit: no PNG/SVG images: missing {missing}; wrote HTML figures only",
            file=sys.stderr,
        )
    if not args.quiet:
        for line in diagnosis.verdict:
            print(f"- {line}")
        print(f"report: {page}")
    return 0


def print_demo_verdicts(summary: os.PathLike) -> None:
    """Print each demo model's verdict lines from the demo's summary.json."""
    import json

    for name, value in json.loads(open(summary, encoding="utf-8").read()).items():
        if isinstance(value, dict) and "verdict" in value:
            print(f"{name} model:")
            for line in value["verdict"]:
                print(f"- {line}")


def cmd_demo(args: argparse.Namespace) -> int:
    """``probekit demo``: train, classify and dissect the two reference models."""
    from probekit.demo import run_demo

    _check_paths(args.out)
    index = run_demo(
        args.out,
        quick=args.quick,
        progress=not args.quiet,
        images=not args.no_images,
        force=args.force,
    )
    if not args.quiet:
        print_demo_verdicts(index.parent / "summary.json")
        print(f"demo report: {index}")
    return 0


def _add_diagnose_parser(sub: argparse._SubParsersAction) -> None:
    # one add_argument per flag: a flat table, longer than 60 lines only by its help texts
    diag = sub.add_parser(
        "diagnose",
        help="depth-use diagnosis of a checkpoint, written as an HTML report",
        description="Run the depth-use analyzers (zero-ablation contributions, skip effects, "
        "layer swaps and permutable blocks, residual stream, logit lens, gradient norms) on a "
        "checkpoint and write report.html, summary.json and one JSON/CSV per analysis.",
    )
    diag.add_argument(
        "model", help="Hugging Face model directory (config.json + safetensors) or a probekit run"
    )
    diag.add_argument(
        "--out",
        required=True,
        help="folder for the report and the numbers; written beside it and swapped in whole, "
        "replacing an older probekit report there",
    )
    diag.add_argument(
        "--force",
        action="store_true",
        help="replace a non-empty --out that holds no probekit report (its files are deleted)",
    )
    diag.add_argument(
        "--text",
        help="a UTF-8 text file to tokenize with the model's tokenizer (binary files are "
        "refused; bytes that are not UTF-8 are read as U+FFFD, with a warning) "
        "(default: the task's test data for probekit runs, else tokens drawn uniformly from "
        "the vocabulary)",
    )
    diag.add_argument(
        "--n-sequences",
        type=int,
        default=N_SEQUENCES,
        help=f"sequences of data, 1 to 100000 (default {N_SEQUENCES})",
    )
    diag.add_argument(
        "--seq-len",
        type=int,
        default=SEQ_LEN,
        help=f"tokens per sequence, at least 1, capped at the model's context (default {SEQ_LEN})",
    )
    diag.add_argument(
        "--pairs",
        choices=["adjacent", "all"],
        default="adjacent",
        help="layer pairs to swap: adjacent (fast, default) or all",
    )
    diag.add_argument(
        "--bootstrap",
        type=int,
        default=100,
        help="bootstrap replicates for block-boundary confidence, 0 to 10000 (default 100)",
    )
    diag.add_argument(
        "--positions",
        choices=["auto", "all", "last"],
        default="auto",
        help="average over all real tokens or only the last one (default auto: the last "
        "token for probekit anchor runs, all tokens otherwise)",
    )
    diag.add_argument(
        "--no-images",
        action="store_true",
        help="skip the PNG and SVG copies of the figures (made by default when kaleido and a "
        "Chrome/Chromium are present)",
    )
    diag.add_argument("--quiet", action="store_true", help="no progress bar or verdict output")
    _add_run_options(diag)
    _add_depth_options(diag)
    diag.set_defaults(func=cmd_diagnose)


def _add_run_options(diag: argparse.ArgumentParser) -> None:
    """Where and how ``probekit diagnose`` runs the model."""
    diag.add_argument(
        "--batch-size", type=int, default=None, help="sequences per forward (default: all at once)"
    )
    diag.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)"
    )
    diag.add_argument(
        "--device-map",
        choices=["auto", "balanced", "sequential"],
        default=None,
        help="spread the layers over the GPUs and the CPU with accelerate (a model bigger than "
        "one device); not with --device",
    )
    diag.add_argument(
        "--dtype",
        choices=["stored", "float32", "bfloat16", "float16"],
        default="stored",
        help="load the weights in this dtype (default: as stored in the checkpoint); every "
        "measure accumulates in float32 or float64",
    )
    diag.add_argument(
        "--seed", type=int, default=0, help="seed of the drawn tokens, 0 to 2**32-1 (default 0)"
    )


def _add_depth_options(diag: argparse.ArgumentParser) -> None:
    """The measure conventions and the tuned lens of ``probekit diagnose``."""
    group = diag.add_argument_group("measure conventions and the tuned lens")
    group.add_argument(
        "--convention",
        choices=["probekit", "csordas2025"],
        default="probekit",
        help="reductions: token means (default) or Csordas et al. 2025's maxima and per-prompt "
        "means",
    )
    group.add_argument(
        "--mode",
        choices=["current", "future"],
        default="current",
        help="skip/ablate at every position (current, default), or at positions < t and "
        "measure at >= t (future; needs --seq-len of at least 13)",
    )
    group.add_argument(
        "--keep-first",
        choices=["auto", "yes", "no"],
        default="auto",
        help="never intervene at position 0 (auto, default: when the tokenizer adds a BOS)",
    )
    group.add_argument(
        "--tuned-lens",
        action="store_true",
        help="fit a tuned lens (on data kept apart from the diagnosed data: the training "
        "split of probekit runs, the text after the diagnosed sequences, or other drawn "
        "tokens) and show it beside the logit lens",
    )
    group.add_argument("--lens", help="read this saved tuned lens (a folder) instead of fitting")
    group.add_argument(
        "--lens-steps",
        type=int,
        default=None,
        help="optimizer steps of the tuned-lens fit, 1 to 10**7 (default: one pass)",
    )


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser(
        "demo",
        help="train the two reference anchor models and write the full report",
        description="Train the symmetric (gamma 0.5) and inferential (gamma 0.8) reference "
        "models of the anchor-function task, classify their solutions, run the mechanism "
        "analyses and the depth-use diagnosis, and write a report per model and an index page.",
    )
    demo.add_argument(
        "--out",
        default="probekit-demo",
        help="output folder (default ./probekit-demo), built beside it and swapped in whole",
    )
    demo.add_argument(
        "--force",
        action="store_true",
        help="replace a non-empty --out that holds no probekit demo (its files are deleted)",
    )
    demo.add_argument(
        "--quick",
        action="store_true",
        help="tiny models and few steps: a smoke run whose numbers mean nothing",
    )
    demo.add_argument(
        "--no-images", action="store_true", help="skip the PNG/SVG copies of the figures"
    )
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(func=cmd_demo)


LIGHT_COMMANDS = ("diagnose", "demo")
"""Subcommands whose parser needs no trainer: for them the train/sweep parsers (which import
torch) are not built, so a wrong path is reported before torch loads."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``probekit`` parser: diagnose, demo, and train/sweep when the trainer imports (not
    built when ``command`` is one of :data:`LIGHT_COMMANDS`)."""
    parser = _Parser(
        prog="probekit",
        description="probekit: how does a Transformer use its depth, and did it learn a rule "
        "or memorize?",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_diagnose_parser(sub)
    _add_demo_parser(sub)
    training_cli = None
    if command not in LIGHT_COMMANDS:
        try:
            from probekit.training import cli as training_cli
        except ImportError:  # the trainer is optional for the analyzers
            training_cli = None
    if training_cli is not None:
        training_cli.add_train_parser(sub)
        training_cli.add_sweep_parser(sub)
    for subparser in sub.choices.values():
        subparser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="CPU threads for torch (default: torch's own choice; results repeat exactly "
            "only at the same thread count)",
        )
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def _set_threads(threads: int | None) -> None:
    if threads is None:
        return
    if threads < 1:
        raise InputError(
            f"--threads {threads} is not a positive count", fix="pass --threads 1 or more"
        )
    import torch

    torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``probekit`` command; returns the exit status.

    Before torch is imported it sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
    it: OpenMP threads that spin while they wait slow a shared machine down several times.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(argv))
    args = parser.parse_args(argv)
    try:
        _set_threads(args.threads)
        return int(args.func(args) or 0)
    except ProbekitError as err:
        print("probekit: error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("probekit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
