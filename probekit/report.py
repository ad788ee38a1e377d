"""The depth-use diagnosis of one model, as numbers and one self-contained HTML report.

:func:`diagnose` runs the depth analyzers on a model and data; :func:`write_report` writes
``report.html`` (plotly embedded, opens offline), ``summary.json`` and one ``<analysis>.json``
(the saved Result) plus ``<analysis>.csv`` (its table) per analysis. Every file is written
atomically.

Example:
    >>> import tempfile
    >>> from probekit.toy import toy_model, toy_tokens
    >>> diagnosis = diagnose(toy_model("gpt2", n_layers=2), toy_tokens(4, 8), n_bootstrap=2)
    >>> sorted(diagnosis.results) == sorted(ANALYSES)
    True
    >>> write_report(diagnosis, tempfile.mkdtemp(), title="my model").name
    'report.html'
"""

from __future__ import annotations

import gzip
import html
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from probekit.analyses import (
    contributions,
    gradient_norms,
    layer_similarity,
    layer_swaps,
    logit_lens,
    residual_stats,
    skip_effects,
    token_lens,
)
from probekit.analyses.depth.lens import LogitLensResult
from probekit.analyses.depth.shared import Shared
from probekit.analyses.depth.tuned_lens import TunedLens, as_lens, compare_lenses, tuned_lens
from probekit.data import Data
from probekit.errors import CheckpointError, NumericalError
from probekit.interventions import InterventionSetting
from probekit.io import atomic_write_bytes, atomic_write_text
from probekit.model import Model, load
from probekit.page import (
    can_export_images,
    check_out_dir,
    export_figures,
    export_or_warn,
    figure_html,
    html_page,
    is_report_folder,
    missing_for_images,
    page_folder,
    sub,
    write_json,
)
from probekit.progress import bar as progress_bar
from probekit.progress import expect, phase, step
from probekit.report_text import TITLES, conclusion, explanation, heading
from probekit.result import SIDECAR_CELLS, Result, summary_table
from probekit.sources import Source
from probekit.verdict import headline_and_verdict

ANALYSES = (
    "contributions",
    "skip_effects",
    "layer_swaps",
    "residual",
    "logit_lens",
    "gradients",
    "layer_similarity",
)
"""The analyses of a diagnosis, in the order they run and appear in the report."""

MAY_BE_UNDEFINED = ("residual", "gradients")
"""Analyses the verdict does not read: one that raises
:class:`~probekit.errors.NumericalError` (e.g. gradients that overflow in the backward of a
finite forward) is reported as not defined, with the reason, and the diagnosis goes on. A
NumericalError anywhere else stops the diagnosis (its numbers would all be meaningless)."""


@dataclass
class Diagnosis:
    """The results of :func:`diagnose`, keyed by analysis name, and the verdict lines."""

    model: str
    results: dict[str, Result]
    verdict: list[str] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    """What was measured: data size, positions, bootstrap, versions, device, date; callers add
    ``checkpoint`` and ``data_source``."""
    not_defined: dict[str, str] = field(default_factory=dict)
    """Analyses of :data:`MAY_BE_UNDEFINED` that have no numbers, and why."""


def diagnose(
    model: Model | Any,
    data: Data,
    *,
    pairs: str = "adjacent",
    n_bootstrap: int = 100,
    positions: str = "all",
    batch_size: int | None = None,
    progress: bool = False,
    setting: InterventionSetting = InterventionSetting(),
    lens: TunedLens | str | os.PathLike | None = None,
    lens_data: Data | None = None,
    lens_steps: int | None = None,
    variants_per_pass: int | None = None,
    autocast: str | None = None,
    data_source: str | None = None,
    token_lens: bool = False,
    similarity: bool = True,
) -> Diagnosis:
    """Run every depth-use analyzer and derive the verdict a reader wants first.

    ``pairs`` and ``n_bootstrap`` go to :func:`~probekit.analyses.layer_swaps`; ``positions``
    and ``batch_size`` to every analyzer; ``setting`` (how to intervene and reduce, see
    :class:`~probekit.interventions.InterventionSetting`) to the skip, ablation, residual and
    lens analyses; ``progress`` shows a bar over the analyses. A tuned lens is read beside the
    logit lens when ``lens`` (a fitted :class:`~probekit.analyses.depth.tuned_lens.TunedLens`
    or its folder) or ``lens_data`` (data to fit one on, kept apart from ``data``; ``lens_steps``
    steps, default one pass) is given. One :class:`~probekit.analyses.depth.shared.Shared`
    cache serves the analyses, so no variant runs twice (the whole-layer skips of
    ``contributions`` and ``skip_effects``, the clean traces); ``variants_per_pass`` stacks
    that many hook-free variants into one block run (None, the default: on a CPU enough for
    1024 token rows, on an accelerator from its free memory;
    :meth:`~probekit.analyses.depth.shared.Shared.per_pass`) and ``autocast``
    (``"bf16"``/``"fp16"``) runs the forwards under ``torch.autocast``.
    ``data_source`` names the data in words (:func:`~probekit.sources.data_source`; recorded
    in the meta): the "at chance" warning says random tokens are unpredictable to any model
    only when they are random tokens. ``token_lens`` adds the token-resolved logit lens
    (:func:`~probekit.analyses.depth.token_lens.token_lens`) after the logit lens, read from
    the shared clean traces (no forward of its own when the data are one batch; about the
    logit lens's cost); off by default, so a diagnosis's sections stay as they were.
    ``similarity=False`` leaves out the layer-similarity
    section (linear CKA between every two layers, its blocks of alike layers set beside the
    permutable blocks of the layer swaps: :func:`~probekit.analyses.layer_similarity`).
    """
    model = load(model)
    if lens is not None or lens_data is not None:
        model.require_vocabulary("the tuned lens")
    if lens is not None:  # checked against the model before any analysis runs
        lens = as_lens(lens, model)
    shared = Shared(model, variants_per_pass=variants_per_pass, autocast=autocast)
    if lens is None and lens_data is not None:
        lens = TunedLens.fit(
            model, lens_data, steps=lens_steps, progress=progress, data_label="fit"
        )
    steps = _steps(model, data, pairs, n_bootstrap, positions, batch_size, setting, lens, shared)
    if token_lens:
        steps = _with_token_lens(steps, model, data, positions, batch_size, shared)
    if not similarity:
        del steps["layer_similarity"]
    results, not_defined = run_analyses(steps, progress)
    _similarity_beside_swaps(results)
    headline, verdict = headline_and_verdict(model, results, data_source)
    meta = measured(
        model, data, batch_size, positions=positions, pairs=pairs, n_bootstrap=n_bootstrap
    )
    if data_source is not None:
        meta = {"data_source": data_source, **meta}
    return Diagnosis(repr(model), results, verdict, headline, meta, not_defined)


@dataclass(frozen=True)
class DiagnosisSettings:
    """How :func:`diagnose_checkpoint` diagnoses a :class:`~probekit.sources.Source` (what is
    read, where it runs and in which dtype are the source's, :func:`probekit.sources.resolve`).

    ``pairs``, ``n_bootstrap``, ``batch_size``, ``progress``, ``lens``, ``lens_steps``,
    ``variants_per_pass`` and ``autocast`` go to :func:`diagnose` (its defaults; ``lens``
    reads a fitted tuned lens, which wins over the source's ``lens_data``), ``intervention``
    as its ``setting`` (how to intervene and reduce,
    :class:`~probekit.interventions.InterventionSetting`);
    ``images`` adds PNG and SVG copies of the figures (:func:`save_report`); ``token_lens``
    adds the token-resolved logit lens section (``probekit diagnose --token-lens``);
    ``similarity`` the layer-similarity section (:func:`diagnose`).
    """

    pairs: str = "adjacent"
    n_bootstrap: int = 100
    batch_size: int | None = None
    progress: bool = False
    intervention: InterventionSetting = InterventionSetting()
    lens: TunedLens | str | os.PathLike | None = None
    lens_steps: int | None = None
    variants_per_pass: int | None = None
    autocast: str | None = None
    images: bool = True
    token_lens: bool = False
    similarity: bool = True


def diagnose_checkpoint(
    source: Source, settings: DiagnosisSettings, out_dir: str | os.PathLike
) -> tuple[Diagnosis, Path]:
    """``probekit diagnose``'s work: :func:`diagnose` the ``source`` (its model on its data at
    its positions; a tuned lens fitted on its ``lens_data`` unless ``settings.lens`` names one)
    with ``settings``, and save the report into ``out_dir`` (checked with
    :func:`check_out_dir`) with :func:`save_report`. The meta names the checkpoint (the
    source's label, e.g. the Hub name the folder was resolved from, and the folder), the data's
    source and the dtype. Returns the diagnosis and the page."""
    diagnosis = diagnose(
        source.model,
        source.data,
        pairs=settings.pairs,
        n_bootstrap=settings.n_bootstrap,
        positions=source.positions,
        batch_size=settings.batch_size,
        progress=settings.progress,
        setting=settings.intervention,
        lens=settings.lens,
        lens_data=source.lens_data,
        lens_steps=settings.lens_steps,
        variants_per_pass=settings.variants_per_pass,
        autocast=settings.autocast,
        data_source=source.description,
        token_lens=settings.token_lens,
        similarity=settings.similarity,
    )
    _add_pair_curves(diagnosis, source)
    folder = os.path.abspath(source.checkpoint)
    diagnosis.meta = {
        "checkpoint": f"{source.label} (snapshot {folder})" if source.label else folder,
        "data_source": source.description,
        "dtype": source.dtype,
        **{k: v for k, v in diagnosis.meta.items() if k != "data_source"},
    }
    title = f"probekit depth diagnosis: {source.label or source.checkpoint}"
    page, _ = save_report(diagnosis, out_dir, title=title, images=settings.images)
    return diagnosis, page


# --- anchor runs: per-pair convergence curves ---
def _add_pair_curves(diagnosis: Diagnosis, source: Source) -> None:
    """An anchor run's report shows every pair's accuracy over training (the run's
    metrics.jsonl, :func:`probekit.anchor.curves.pair_curves`) after the depth analyses."""
    run = source.run
    if run is None or run.kind != "anchor":
        return
    from probekit.anchor.curves import checkpoint_pair_curves

    curves = checkpoint_pair_curves(run.path, str(run.config.get("name", "run")))
    if curves is not None:
        diagnosis.results["pair_curves"] = curves


def measured(
    model: Model, data: Data, batch_size: int | None = None, **settings: Any
) -> dict[str, Any]:
    """What a diagnosis measured: the data's size, the sequences per forward (``batch_size``,
    or the model's memory-bounded default), ``settings``, versions, device, date, threads.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> meta = measured(load(toy_model("gpt2", n_layers=2)), toy_tokens(4, 8), positions="all")
        >>> meta["n_sequences"], meta["seq_len"], meta["sequences_per_batch"], meta["positions"]
        (4, 8, 4, 'all')
    """
    import datetime
    import importlib.metadata

    import torch

    from probekit.data import as_batches

    batches = as_batches(data)
    split = model.split_batches(as_batches(data, batch_size), batch_size)
    versions = {}
    for package in ("probekit", "torch", "transformer-lens", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "n_sequences": sum(int(b.tokens.shape[0]) for b in batches),
        "seq_len": max(int(b.tokens.shape[1]) for b in batches),
        "sequences_per_batch": max(int(b.tokens.shape[0]) for b in split),
        **settings,
        "versions": versions,
        "device": str(model.device),
        "torch_threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _steps(
    model: Model,
    data: Data,
    pairs: str,
    n_bootstrap: int,
    positions: str,
    batch_size: int | None,
    setting: InterventionSetting,
    lens: TunedLens | str | os.PathLike | None,
    shared: Shared | None = None,
) -> dict[str, Callable[[], Result]]:
    """Each analysis of :data:`ANALYSES` (and the tuned lens if asked) as a call still to make,
    those that can sharing the ``shared`` cache."""
    analyzers: dict[str, Callable[..., Result]] = {
        "contributions": partial(contributions, setting=setting, cache=shared),
        "skip_effects": partial(skip_effects, setting=setting, cache=shared),
        "layer_swaps": partial(layer_swaps, pairs=pairs, n_bootstrap=n_bootstrap, cache=shared),
        "residual": partial(residual_stats, setting=setting),
        "logit_lens": partial(logit_lens, setting=setting, cache=shared),
        "gradients": gradient_norms,
        "layer_similarity": layer_similarity,
    }
    if lens is not None:
        analyzers["tuned_lens"] = partial(tuned_lens, lens=lens)
    if model.output_kind != "logits":  # no vocabulary: no lens, no loss to differentiate
        del analyzers["logit_lens"], analyzers["gradients"]
    return {
        name: partial(analyzer, model, data, positions=positions, batch_size=batch_size)
        for name, analyzer in analyzers.items()
    }


def _with_token_lens(
    steps: dict[str, Callable[[], Result]],
    model: Model,
    data: Data,
    positions: str,
    batch_size: int | None,
    shared: Shared,
) -> dict[str, Callable[[], Result]]:
    """``steps`` with the token-resolved logit lens right after the logit lens (on the
    ``shared`` traces); unchanged for a model without a vocabulary (no lens to read)."""
    if "logit_lens" not in steps:
        return steps
    call = partial(
        token_lens, model, data, positions=positions, batch_size=batch_size, cache=shared
    )
    out: dict[str, Callable[[], Result]] = {}
    for name, analysis in steps.items():
        out[name] = analysis
        if name == "logit_lens":
            out["token_lens"] = call
    return out


def _similarity_beside_swaps(results: dict[str, Result]) -> None:
    """Give the layer-similarity summary the permutable blocks of the layer swaps, so its
    section sets its near-identity layers beside them (no number of either changes)."""
    similar, swaps = results.get("layer_similarity"), results.get("layer_swaps")
    if similar is not None and swaps is not None and "blocks" in swaps.summary:
        similar.summary["swap_blocks"] = swaps.summary["blocks"]


def run_analyses(
    steps: dict[str, Callable[[], Result]], progress: bool
) -> tuple[dict[str, Result], dict[str, str]]:
    """Make every call of ``steps`` (analysis name: a call that returns its result), with a
    progress bar when asked; returns the results and, for an analysis of
    :data:`MAY_BE_UNDEFINED` that raised :class:`NumericalError`, why it has none.

    :func:`diagnose` runs its analyses through this one function, so a caller that wraps it
    (``benchmarks/bench_diagnose_gpt2.py`` times each analysis so) sees every one of them."""
    results: dict[str, Result] = {}
    not_defined: dict[str, str] = {}
    bar = None
    if progress:
        bar = progress_bar(total=len(steps), desc="diagnose", unit="analyses")
    expect(len(steps), "analyses")  # on the line of a phase around the diagnosis (the demo's)
    try:
        for name, call in steps.items():
            if bar is not None:
                bar.set_postfix_str(name)
            with phase(name, enabled=progress):  # a live line of its variants and block passes
                try:
                    results[name] = call()
                except NumericalError as err:
                    if name not in MAY_BE_UNDEFINED:
                        raise
                    not_defined[name] = str(err)
            step()
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.set_postfix_str("")  # the last analysis's name: the bar ends on the count
    finally:
        if bar is not None:
            bar.close()
    return results, not_defined


def _details_table(result: Result) -> str:
    """A readable table of per-matrix statistics where a result has them (condensation)."""
    stats = getattr(result, "stats", None)
    if not callable(stats):
        return ""
    table = stats()
    table.columns = [str(c).replace("_", " ") for c in table.columns]
    return (
        "<details open><summary>Per layer and matrix</summary>"
        + table.to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="n/a", border=0)
        + "</details>"
    )


def _data_line(meta: dict[str, Any]) -> str:
    """The line under a report's title that names the data, whatever they are."""
    source = meta.get("data_source")
    if not source:
        return ""
    size = ""
    if meta.get("n_sequences") is not None and meta.get("seq_len") is not None:
        size = f" ({meta['n_sequences']} sequences of up to {meta['seq_len']} tokens)"
    return sub(f"Data: {source}{size}")


def _meta_table(meta: dict[str, Any]) -> str:
    """The 'what was measured' table of a report."""
    return summary_table({k: v for k, v in meta.items() if k != "versions"}) + (
        "<p>versions: "
        + html.escape(", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()))
        + "</p>"
    )


def _section(name: str, result: Result, figure: str) -> str:
    """One report section: heading, conclusion, what the figure shows, figure, tables."""
    said = conclusion(name, result)
    return (
        f"<section><h2>{html.escape(heading(name, result))}</h2>"
        + (f"<p class='conclusion'>{html.escape(said)}</p>" if said else "")
        + f"<p class='explain'>{html.escape(explanation(name, result))}</p>{figure}"
        f"{summary_table(_shown(result.summary), kind=result.kind)}{_details_table(result)}"
        "</section>"
    )


def _undefined_section(name: str, why: str) -> str:
    """The section of an analysis that has no numbers: its heading and why."""
    return (
        f"<section><h2>{html.escape(TITLES.get(name, name))}</h2>"
        f"<p class='conclusion'>Not defined: {html.escape(why)}</p></section>"
    )


def _shown(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary a section shows: a model compared by the relative change of its output
    (``rel_l2``, no vocabulary) has no loss, so its undefined ``clean_loss`` is left out."""
    if summary.get("measure") == "rel_l2":
        return {k: v for k, v in summary.items() if k != "clean_loss"}
    return summary


def write_csv(result: Result, path: Path) -> Path:
    """``result.df`` as CSV at ``path``; a large table (over
    :data:`~probekit.result.SIDECAR_CELLS` cells) gzip-compressed at ``path`` + ``.gz``
    (pandas reads either: ``pd.read_csv("condensation.csv.gz")``)."""
    text = result.df.to_csv(index=False)
    if result.df.size <= SIDECAR_CELLS:
        return atomic_write_text(path, text)
    return atomic_write_bytes(
        path.with_name(path.name + ".gz"), gzip.compress(text.encode(), mtime=0)
    )


def write_report(
    diagnosis: Diagnosis,
    out_dir: str | os.PathLike,
    title: str = "probekit depth diagnosis",
    *,
    banner: str = "",
    plotly_src: str | None = None,
) -> Path:
    """Write report.html, summary.json and each analysis's JSON and CSV (:func:`write_csv`)
    into ``out_dir``.

    ``banner`` is shown above the title (e.g. "smoke run"). plotly.js is embedded once in the
    page, or read from ``plotly_src`` (a relative path, e.g. ``../plotly.min.js`` shared by the
    reports of a demo) when given (:func:`probekit.page.html_page`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for name, result in diagnosis.results.items():
        result.save(out / f"{name}.json")
        write_csv(result, out / f"{name}.csv")
        sections.append(_section(name, result, figure_html(_figure(name, diagnosis.results))))
    sections += [_undefined_section(name, why) for name, why in diagnosis.not_defined.items()]
    body = "\n".join([_top(diagnosis), *sections])
    write_json(out / "summary.json", _summary(diagnosis))
    text = html_page(title, body, banner=banner, plotly_src=plotly_src)
    return atomic_write_text(out / "report.html", text)


def _top(diagnosis: Diagnosis) -> str:
    """What a report says under its title, before the sections: the model, the data, the
    verdict and what was measured."""
    verdict = "".join(f"<li>{html.escape(line)}</li>" for line in diagnosis.verdict)
    return (
        sub(diagnosis.model)
        + _data_line(diagnosis.meta)
        + f'\n<div class="verdict"><strong>Verdict</strong><ul>{verdict}</ul></div>\n'
        + f"<details><summary>What was measured</summary>{_meta_table(diagnosis.meta)}</details>"
    )


def _summary(diagnosis: Diagnosis) -> dict[str, Any]:
    """The contents of a report's summary.json: the model, verdict, headline and meta."""
    summary = {
        "model": diagnosis.model,
        "verdict": diagnosis.verdict,
        "headline": diagnosis.headline,
        "measured": diagnosis.meta,
    }
    if diagnosis.not_defined:
        summary["not_defined"] = diagnosis.not_defined
    return summary


def _figure(name: str, results: dict[str, Result]) -> Any:
    """The figure of one analysis; the tuned lens is drawn over the logit lens."""
    if name == "tuned_lens":
        lenses = [results["logit_lens"], results["tuned_lens"]]
        both = [lens for lens in lenses if isinstance(lens, LogitLensResult)]
        if len(both) != 2:  # a saved report edited by hand: say so rather than draw one
            raise CheckpointError(
                "the report's logit_lens and tuned_lens results are not lens results",
                fix="rerun the diagnosis to write them again",
            )
        return compare_lenses(*both, names=["logit lens", "tuned lens"])
    return results[name].figure()


def save_report(
    diagnosis: Diagnosis,
    out_dir: str | os.PathLike,
    *,
    title: str = "probekit depth diagnosis",
    images: bool = True,
) -> tuple[Path, bool]:
    """Write the whole report (:func:`write_report`, and :func:`export_images` when ``images``
    and they can be made) into a temporary folder beside ``out_dir``, then swap it in whole
    (:func:`probekit.page.page_folder`).

    ``out_dir`` thus always holds one complete report: files of an older report there are gone,
    and a failure (disk full) leaves the older report as it was and no temporary folder; it is
    raised as one :class:`~probekit.errors.InputError`. A failing image renderer is one
    warning (:func:`probekit.page.export_or_warn`). Returns the page and whether images were
    made.
    """
    with page_folder(out_dir, "report") as tmp:
        write_report(diagnosis, tmp, title=title)
        made = images and can_export_images()
        if made:
            made = export_or_warn(partial(export_images, diagnosis, tmp))
    return Path(out_dir) / "report.html", made


def export_images(diagnosis: Diagnosis, out_dir: str | os.PathLike) -> list[Path]:
    """PNG and SVG copies of every figure of the report
    (:func:`probekit.page.export_figures`), written atomically."""
    figs = {name: _figure(name, diagnosis.results) for name in diagnosis.results}
    return export_figures(figs, out_dir)


__all__ = [
    "ANALYSES",
    "Diagnosis",
    "DiagnosisSettings",
    "can_export_images",
    "check_out_dir",
    "diagnose",
    "diagnose_checkpoint",
    "export_images",
    "measured",
    "missing_for_images",
    "is_report_folder",
    "run_analyses",
    "save_report",
    "write_json",
    "write_report",
]
