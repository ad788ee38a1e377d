"""The ``probekit`` command line.

``probekit diagnose PATH --out DIR`` writes the depth-use report of any checkpoint probekit can
load; ``probekit train`` and ``probekit sweep`` run the anchor-function trainer. Every problem
with the input prints one line (``probekit: error: ...``) and exits with status 2.

Example:
    $ probekit diagnose runs/anchor/final --out report/
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence

from probekit.errors import InputError, ProbekitError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"probekit: error: {message} (see {self.prog} --help)\n")


def _kaleido_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("kaleido") is not None


def _chromium_available() -> bool:
    return any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))


def _run_checkpoint(path: str) -> str:
    """A probekit run folder stands for its checkpoint folder."""
    inner = os.path.join(path, "checkpoint")
    return inner if os.path.isfile(os.path.join(inner, "run_config.json")) else path


def _diagnose_data(model, args):
    """The task's test data for probekit runs, a tokenized --text file, or drawn tokens."""
    from probekit.report import random_tokens

    run_config = os.path.join(args.model, "run_config.json")
    if os.path.isfile(run_config) and not args.text:
        import json

        import torch

        with open(run_config) as handle:
            stored = json.load(handle)
        if "lm" in stored:  # a byte-level LM run: validation text of its corpus
            from probekit.tasks.corpus import ByteCorpus

            if args.positions == "auto":
                args.positions = "all"
            lm = stored["lm"]
            corpus = ByteCorpus(lm.get("corpus_root"), max_files=lm.get("corpus_max_files"))
            length = min(args.seq_len, model.n_ctx)
            return corpus.sequences("validation", length, n=args.n_sequences)
        from probekit.training.trainer import load_run_config

        data = load_run_config(args.model).task.dataset("test_data")
        labels = torch.full_like(data.tokens, -100)
        labels[:, -1] = data.targets
        if args.positions == "auto":
            args.positions = "last"
        return {"input_ids": data.tokens, "labels": labels}
    if args.positions == "auto":
        args.positions = "all"
    if args.text:
        tokenizer = getattr(model.bridge, "tokenizer", None)
        if tokenizer is None:
            raise InputError(
                f"{args.model} has no tokenizer, so --text cannot be tokenized",
                fix="save a tokenizer beside the weights, or leave out --text to use tokens "
                "drawn from the vocabulary",
            )
        with open(args.text, encoding="utf-8", errors="replace") as handle:
            ids = tokenizer(handle.read())["input_ids"]
        import torch

        length = min(args.seq_len, model.n_ctx)
        n = min(args.n_sequences, len(ids) // length)
        if n == 0:
            raise InputError(
                f"{args.text} has only {len(ids)} tokens, fewer than one sequence of {length}",
                fix="pass a longer text or a smaller --seq-len",
            )
        return torch.tensor(ids[: n * length]).view(n, length)
    return random_tokens(model, args.n_sequences, args.seq_len, seed=args.seed)


def cmd_diagnose(args: argparse.Namespace) -> int:
    import probekit
    from probekit.report import diagnose, export_images, write_report

    args.model = _run_checkpoint(args.model)
    if args.text and not os.path.isfile(args.text):
        raise InputError(f"text file {args.text} does not exist", fix="pass a readable file")
    model = probekit.load(args.model, device=args.device)
    data = _diagnose_data(model, args)
    diagnosis = diagnose(
        model,
        data,
        pairs=args.pairs,
        n_bootstrap=args.bootstrap,
        positions=args.positions,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )
    report = write_report(diagnosis, args.out, title=f"probekit depth diagnosis: {args.model}")
    if not args.no_images:
        if _chromium_available() and _kaleido_available():
            export_images(diagnosis, args.out)
        else:
            print(
                "probekit: no Chrome/Chromium (or kaleido) found; wrote HTML figures only",
                file=sys.stderr,
            )
    if not args.quiet:
        for line in diagnosis.verdict:
            print(f"- {line}")
        print(f"report: {report}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from probekit.demo import run_demo

    index = run_demo(args.out, quick=args.quick, progress=not args.quiet, images=not args.no_images)
    if not args.quiet:
        print(f"demo report: {index}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="probekit",
        description="probekit: how does a Transformer use its depth, and did it learn a rule "
        "or memorize?",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
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
    diag.add_argument("--out", required=True, help="folder for the report and the numbers")
    diag.add_argument(
        "--text",
        help="a UTF-8 text file to tokenize with the model's tokenizer "
        "(default: the task's test data for probekit runs, else tokens drawn uniformly from "
        "the vocabulary)",
    )
    diag.add_argument("--n-sequences", type=int, default=32, help="sequences of data (default 32)")
    diag.add_argument(
        "--seq-len",
        type=int,
        default=64,
        help="tokens per sequence, capped at the model's context (default 64)",
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
        help="bootstrap replicates for block-boundary confidence (default 100)",
    )
    diag.add_argument(
        "--positions",
        choices=["auto", "all", "last"],
        default="auto",
        help="average over all real tokens or only the last one (default auto: the last "
        "token for probekit anchor runs, all tokens otherwise)",
    )
    diag.add_argument(
        "--batch-size", type=int, default=None, help="sequences per forward (default: all at once)"
    )
    diag.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    diag.add_argument("--seed", type=int, default=0, help="seed of the drawn tokens (default 0)")
    diag.add_argument(
        "--no-images",
        action="store_true",
        help="skip the PNG and SVG copies of the figures (made by default when kaleido and a "
        "Chrome/Chromium are present)",
    )
    diag.add_argument("--quiet", action="store_true", help="no progress bar or verdict output")
    diag.set_defaults(func=cmd_diagnose)
    demo = sub.add_parser(
        "demo",
        help="train the two reference anchor models and write the full report",
        description="Train the symmetric (gamma 0.5) and inferential (gamma 0.8) reference "
        "models of the anchor-function task, classify their solutions, run the mechanism "
        "analyses and the depth-use diagnosis, and write a report per model and an index page.",
    )
    demo.add_argument(
        "--out", default="probekit-demo", help="output folder (default ./probekit-demo)"
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
    try:
        from probekit.training import cli as training_cli
    except ImportError:  # the trainer is optional for the analyzers
        training_cli = None
    if training_cli is not None:
        training_cli.add_train_parser(sub)
        training_cli.add_sweep_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``probekit`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ProbekitError as err:
        print("probekit: error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("probekit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
