"""``probekit diagnose PATH --out DIR``: its flags, their checks, and the report it prints.

The checks of the checkpoint path, loading it and choosing its data are
:mod:`probekit.sources`' (:func:`~probekit.sources.resolve`: the run folder is read once); the
diagnosis and the report are :func:`probekit.report.diagnose_checkpoint`'s, with the settings
the flags give (:class:`~probekit.report.DiagnosisSettings`). Every check that needs no model
runs before the model loads.

Example:
    >>> from probekit.cli import build_parser
    >>> args = build_parser().parse_args(["diagnose", "runs/anchor", "--out", "report/"])
    >>> args.func is diagnose_command, args.positions, args.n_sequences
    (True, 'auto', 32)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probekit.cli.common import (
    add_command,
    add_data_flags,
    add_device,
    add_dtype_flags,
    add_estimate,
    add_force,
    add_out,
    add_quiet,
    check_device,
    check_estimate_fits,
    check_int_flags,
    dataset_choice,
    estimate_diagnosis,
    storage_that_fits,
)
from probekit.errors import ConfigError
from probekit.sources import (
    N_SEQUENCES,
    SEQ_LEN,
    check_dataset,
    check_diagnose_inputs,
    checkpoint_to_diagnose,
    resolve,
)

if TYPE_CHECKING:
    from probekit.report import DiagnosisSettings
    from probekit.run_folders import RunInfo
    from probekit.sources import Source


def check_flags(args: argparse.Namespace) -> None:
    """The flag checks of ``probekit diagnose``: the integers in :data:`LIMITS`, ``--device``,
    and not both ``--device`` (or ``--storage stored``) and ``--device-map``."""
    check_int_flags(args)
    check_device(args.device)
    dataset_choice(args)
    if getattr(args, "device_map", None) is not None and args.device is not None:
        raise ConfigError("--device and --device-map were both given", fix="pass only one of them")
    if getattr(args, "device_map", None) is not None and getattr(args, "storage", None) == "stored":
        raise ConfigError(
            "--storage stored and --device-map were both given", fix="pass only one of them"
        )


def checkpoint_of(args: argparse.Namespace) -> tuple[str, RunInfo | None, list[str]]:
    """The checks of ``probekit diagnose``'s flags and checkpoint path (before torch loads):
    the checkpoint folder, the run that wrote it, and the lines to print (warnings, notices)."""
    check_diagnose_inputs(args.model, text=args.text, lens=args.lens)
    check_flags(args)
    warning = check_dataset(dataset_choice(args))  # name, split, column: before torch loads
    path, run, lines = checkpoint_to_diagnose(args.model, text=args.text)
    return path, run, lines + ([f"warning: {warning}"] if warning else [])


def prepare(args: argparse.Namespace) -> tuple[str, RunInfo | None, Path]:
    """Every check of ``probekit diagnose`` that needs no model, the cheap ones first (a wrong
    path is reported before torch loads): the checkpoint path and ``--out``. Prints a warning
    for a non-UTF-8 ``--text`` (or ``--dataset`` .txt) and a notice per ignored file. Returns
    the checkpoint folder, the probekit run that wrote it (read here, once) and the output
    folder."""
    path, run, lines = checkpoint_of(args)
    from probekit.page import check_out_dir  # light: the report's imports wait for the work

    out = check_out_dir(args.out, force=args.force, protect=(path, args.model, args.text))
    for line in lines:
        print(f"probekit: {line}", file=sys.stderr)
    return path, run, out


def _source(args: argparse.Namespace, path: str, run: RunInfo | None) -> Source:
    """The :class:`~probekit.sources.Source` ``probekit diagnose``'s flags name: the
    checkpoint folder ``path`` written by ``run`` (as :func:`prepare` found them), loaded as
    ``--device``, ``--dtype``, ``--storage`` and ``--device-map`` say, with the data the
    data flags choose."""
    return resolve(
        path,
        run,
        text=args.text,
        dataset=dataset_choice(args),
        random=args.random_tokens,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        seed=args.seed,
        positions=args.positions,
        tuned_lens=args.tuned_lens and args.lens is None,  # a saved lens is read, not fitted
        device=args.device,
        dtype=args.dtype,
        storage=args.storage,
        device_map=args.device_map,
        label=None if os.path.lexists(args.model) else args.model,  # a Hub name
    )


def diagnosis_settings(args: argparse.Namespace) -> DiagnosisSettings:
    """The :class:`~probekit.report.DiagnosisSettings` of ``probekit diagnose``'s flags."""
    from probekit.interventions import InterventionSetting
    from probekit.report import DiagnosisSettings

    keep_first = {"auto": None, "yes": True, "no": False}[args.keep_first]
    return DiagnosisSettings(
        pairs=args.pairs,
        n_bootstrap=args.bootstrap,
        batch_size=args.batch_size,
        progress=not args.quiet,
        intervention=InterventionSetting(
            args.convention, args.mode, keep_first, ablation=args.ablation
        ),
        lens=args.lens,
        lens_steps=args.lens_steps,
        images=not args.no_images,
        token_lens=args.token_lens,
        similarity=not args.no_similarity,
    )


def estimate(args: argparse.Namespace, path: str, timed: bool | None) -> Any:
    """The :class:`~probekit.cli.common.Estimate` of diagnosing the checkpoint in ``path``
    with ``args``' data and settings (a block and a head timed when ``timed``; None: when
    the work is more than seconds)."""
    return estimate_diagnosis(
        path,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        dtype=args.dtype,
        keep=args.storage,
        device=args.device,
        timed=timed,
        pairs=args.pairs,
        similarity=not args.no_similarity,
        token_lens=args.token_lens,
    )


def _estimate_or_none(args: argparse.Namespace, path: str) -> Any:
    """The estimate before a diagnosis (timed unless ``--quiet`` or the work takes seconds),
    or None where the folder's config cannot be estimated from (the load then says what is
    wrong with it, as without an estimate)."""
    try:
        return estimate(args, path, timed=False if args.quiet else None)
    except Exception:  # noqa: BLE001 - an estimate never stops a diagnosis the load allows
        return None


def estimate_command(args: argparse.Namespace) -> int:
    """``probekit diagnose --estimate``: the checks, then the estimate on stdout; nothing is
    loaded or written."""
    path, _, lines = checkpoint_of(args)
    for line in lines:
        print(f"probekit: {line}", file=sys.stderr)
    found = storage_that_fits(args, estimate(args, path, True), lambda: estimate(args, path, True))
    for line in found.lines:
        print(f"estimate: {line}")
    if not found.fits:
        print(f"estimate: does not fit in the free memory; use {'; or '.join(found.remedies)}")
    if args.tuned_lens:
        print("estimate: the tuned lens's fit is not counted")
    return 0


def diagnose_command(args: argparse.Namespace) -> int:
    """``probekit diagnose``: check every flag, print the estimate of the work's time and
    memory (refusing a diagnosis that would not fit in memory), then diagnose the checkpoint
    and write the report (:func:`probekit.report.diagnose_checkpoint`); print the verdict and
    the page. ``--estimate``: the estimate only (:func:`estimate_command`)."""
    if args.estimate:
        return estimate_command(args)
    path, run, out = prepare(args)  # before the slow imports and the load
    found = _estimate_or_none(args, path)
    if found is not None:
        found = storage_that_fits(args, found, lambda: _estimate_or_none(args, path) or found)
        if not args.quiet and found.seconds is not None:  # work of more than seconds
            print(f"probekit: estimate: {found.summary}", file=sys.stderr)
        if args.device_map is None:  # a device map offloads what does not fit
            check_estimate_fits(found)  # before the weights load: not killed half-way
    from probekit import report

    source = _source(args, path, run)
    diagnosis, page = report.diagnose_checkpoint(source, diagnosis_settings(args), out)
    for name, why in diagnosis.not_defined.items():
        print(f"probekit: warning: {name} not defined: {why}", file=sys.stderr)
    missing = None if args.no_images else report.missing_for_images()
    if missing:
        print(
            f"probekit: no PNG/SVG images: missing {missing}; wrote HTML figures only",
            file=sys.stderr,
        )
    if not args.quiet:
        for line in diagnosis.verdict:
            print(f"- {line}")
    print(f"report: {page}")  # even with --quiet: where the report is
    return 0


def add_diagnose_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``diagnose`` to an argparse subparsers object."""
    # one add_argument per flag: a flat table, longer than 60 lines only by its help texts
    diag = add_command(
        subparsers,
        "diagnose",
        help="depth-use diagnosis of a checkpoint, written as an HTML report",
        description="Run the depth-use analyzers (zero-ablation contributions, skip effects, "
        "layer swaps and permutable blocks, residual stream, logit lens, gradient norms) on a "
        "checkpoint and write report.html, summary.json and one JSON/CSV per analysis.",
    )
    diag.add_argument(
        "model", help="Hugging Face model directory (config.json + safetensors) or a probekit run"
    )
    add_out(
        diag,
        help="folder for the report and the numbers; written beside it and swapped in whole, "
        "replacing an older probekit report there",
    )
    add_force(diag, what="report")
    add_data_flags(diag)
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
    diag.add_argument(
        "--token-lens",
        action="store_true",
        help="add the token-resolved logit lens section: the lens's top token at every depth "
        "and position, each token's prediction depth (about the logit lens's cost)",
    )
    add_quiet(
        diag,
        help="no progress lines, estimate or verdict: only the report's path (and warnings)",
    )
    add_estimate(diag)
    _add_placement_flags(diag)
    _add_depth_flags(diag)
    _add_similarity_flag(diag)
    diag.set_defaults(func=diagnose_command)
    return diag


def _add_placement_flags(diag: argparse.ArgumentParser) -> None:
    """Where and how ``probekit diagnose`` runs the model."""
    diag.add_argument(
        "--batch-size", type=int, default=None, help="sequences per forward (default: all at once)"
    )
    add_device(diag, default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    diag.add_argument(
        "--device-map",
        choices=["auto", "balanced", "sequential"],
        default=None,
        help="spread the layers over the GPUs and the CPU with accelerate (a model bigger than "
        "one device); not with --device",
    )
    add_dtype_flags(diag)
    diag.add_argument(
        "--seed", type=int, default=0, help="seed of the drawn tokens, 0 to 2**32-1 (default 0)"
    )


def _add_depth_flags(diag: argparse.ArgumentParser) -> None:
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
        "--ablation",
        choices=["zero", "mean", "resample"],
        default="zero",
        help="what a removed layer or sublayer update is replaced by in the contributions and "
        "skip effects: zero (default), its mean over the data's real tokens, or the update of "
        "another sequence of the batch at the same position (resample; needs two sequences or "
        "more per batch)",
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


def _add_similarity_flag(diag: argparse.ArgumentParser) -> None:
    """The switch of ``probekit diagnose``'s layer-similarity section."""
    diag.add_argument(
        "--no-similarity",
        action="store_true",
        help="leave out the layer-similarity section (linear CKA between every two layers; "
        "one more forward per batch and a d x d product per pair of layers)",
    )


__all__ = ["add_diagnose_parser", "check_flags", "diagnose_command"]
