"""Activation patching and direct logit attribution: which layer, sublayer and position carries
the difference between two inputs, and how much each layer writes onto an answer's logit.

:func:`activation_patching` runs a clean and a corrupted input of the same shape, then for every
site x layer x position copies the activation of one run into the other and measures the
answer at each sequence's last real token. One generic loop does every site: the clean forward
is kept as a :class:`~probekit.model.Trace`, and each patched forward resumes at the patched
layer (the blocks before it are never rerun), the variants of one layer stacked along the
batch. Sites:

- ``resid_in`` / ``resid_out``: the residual entering / leaving block ``layer``;
- ``resid_mid``: the residual between the attention and the MLP of ``layer`` (the MLP's
  input; not defined for parallel blocks, whose MLP reads the block input);
- ``attn_out`` / ``mlp_out``: the attention / MLP update of ``layer`` (as
  :meth:`probekit.Model.update_hooks` defines it), patched through
  :meth:`probekit.Model.replace_update_hooks` inside a context manager.

Metrics (:data:`METRICS`): ``logit_diff`` (logit of the correct minus the wrong answer),
``target_prob`` (probability of one answer) and ``kl`` (KL(clean || patched) in nats). The
normalised score is ``(m - m_corrupted) / (m_clean - m_corrupted)``: 0 = the corrupted run's
value, 1 = the clean run's.

:func:`direct_logit_attribution` splits a target's logit at a position of a pre-norm decoder
into the embedding's term, each layer's attention and MLP term (the update added to the
residual) and the bias term: each term is passed through the final norm with its scale
(the token's standard deviation or RMS) FROZEN at the clean run's value, which makes the
norm linear, then through the unembedding; the terms sum to the logit.

Example:
    >>> import torch
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model("gpt2", n_layers=2)
    >>> clean = toy_tokens(2, 5)
    >>> corrupted = clean.clone(); corrupted[:, 1] = (corrupted[:, 1] + 1) % model.d_vocab
    >>> res = activation_patching(model, clean, corrupted, answers=[3, 4])
    >>> res.grid().shape   # layers x positions of the normalised score
    (2, 5)
    >>> dla = direct_logit_attribution(model, clean, targets=[3, 4])
    >>> abs(dla.summary["sum_of_terms"] - dla.summary["logit"]) < 1e-4
    True
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probekit import figures
from probekit.analyses.common import DataOrTask, check_outputs_finite, result_meta
from probekit.data import Batch, as_batches, task_data
from probekit.errors import InputError, UnsupportedModelError
from probekit.interventions import hooks
from probekit.model import Model, Trace, load
from probekit.model.output import FrozenNorm
from probekit.result import Result
from probekit.words import AXES, figure_words

PATCH_SITES = ("resid_in", "resid_mid", "resid_out", "attn_out", "mlp_out")
"""Where :func:`activation_patching` patches (see the module docstring)."""
METRICS = ("logit_diff", "target_prob", "kl")
"""What :func:`activation_patching` measures at each sequence's last real token."""
DIRECTIONS = ("corrupted_into_clean", "clean_into_corrupted")
"""Which run's activation goes into which (``"both"``: each in turn)."""
STACK_ROWS = 256
"""Most sequences one stacked block run of :func:`activation_patching` holds (variants x
batch)."""

_UPDATE_OF = {"resid_mid": "attn", "attn_out": "attn", "mlp_out": "mlp"}


# ---------------------------------------------------------------- checks (before any work)
def _choice(value: Any, allowed: Sequence[str], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"unknown {what} {value!r}", fix=f"use one of {tuple(allowed)}")
    return value


def _sites(sites: Any, model: Model) -> tuple[str, ...]:
    names = (sites,) if isinstance(sites, str) else tuple(sites)
    if not names:
        raise InputError("no sites to patch", fix=f"pass sites from {PATCH_SITES}")
    for site in names:
        _choice(site, PATCH_SITES, "patching site")
    if "resid_mid" in names and model.parallel_blocks:
        raise UnsupportedModelError(
            f"{model.architecture} runs attention and MLP in parallel: its MLP reads the block "
            "input, so there is no residual between them to patch",
            fix="patch 'resid_in', 'attn_out' or 'mlp_out' instead",
        )
    return tuple(dict.fromkeys(names))


def _positions(positions: Any) -> list[tuple[int, int | str]] | str:
    """``"all"``, or ``[(index, label)]``: ``"last"`` -> ``[(-1, "last")]``; ints as given."""
    if isinstance(positions, str):
        if positions == "all":
            return "all"
        if positions == "last":
            return [(-1, "last")]
        raise InputError(
            f"unknown positions={positions!r}", fix="use 'all', 'last' or a list of positions"
        )
    try:
        items = [positions] if isinstance(positions, int) else list(positions)
        out = [operator.index(p) for p in items]
        if not out or any(isinstance(p, bool) for p in items):
            raise TypeError
    except TypeError:
        raise InputError(
            f"positions={positions!r:.60} are not 'all', 'last' or a list of integer positions",
            fix="e.g. positions=[0, 3, -1] (real positions; -1 is each sequence's last token)",
        ) from None
    return [(p, p) for p in dict.fromkeys(out)]


def _tokens_of(data: DataOrTask) -> Any:
    task = task_data(data)
    return data if task is None else task.tokens


def _pair_batches(
    model: Model, clean: DataOrTask, corrupted: DataOrTask, batch_size: int | None
) -> list[tuple[Batch, Batch]]:
    """Clean and corrupted as prepared batches side by side, after checking that their token
    shapes and real-token masks agree."""
    raw_clean = as_batches(_tokens_of(clean))
    raw_corrupted = as_batches(_tokens_of(corrupted))
    shapes = [tuple(b.tokens.shape) for b in raw_clean]
    if shapes != [tuple(b.tokens.shape) for b in raw_corrupted]:
        raise InputError(
            f"clean tokens have shape(s) {shapes}, corrupted "
            f"{[tuple(b.tokens.shape) for b in raw_corrupted]}",
            fix="give the corrupted run the same number of sequences of the same lengths",
        )
    for a, b in zip(raw_clean, raw_corrupted, strict=True):
        if not torch.equal(a.valid.cpu(), b.valid.cpu()):
            raise InputError(
                "the clean and corrupted real-token masks differ",
                fix="pad both runs the same way (same real positions in every sequence)",
            )
    size = batch_size if batch_size is not None else _auto_batch(model, shapes)
    pairs = list(
        zip(
            model.prepare(_tokens_of(clean), size),
            model.prepare(_tokens_of(corrupted), size),
            strict=True,
        )
    )
    return pairs


def _auto_batch(model: Model, shapes: list[tuple[int, ...]]) -> int:
    """One batch size for both runs (the automatic choice of the longest sequences), so the
    two are split at the same sequences."""
    longest = max(s[-1] for s in shapes)
    return model.default_batch_size(longest)


def _answers(answers: Any, metric: str, n: int, d_vocab: int) -> torch.Tensor | None:
    """Answers as ``[n, 2]`` (logit_diff) or ``[n]`` (target_prob) token ids, else None (kl, or
    target_prob's default: the clean prediction)."""
    if metric == "kl" or (metric == "target_prob" and answers is None):
        return None
    if answers is None:
        raise InputError(
            "metric='logit_diff' needs answers", fix="pass answers=(correct, wrong) token ids"
        )
    return token_ids(answers, n, d_vocab, pairs=metric == "logit_diff", what="answers")


def token_ids(values: Any, n: int, d_vocab: int, *, pairs: bool, what: str) -> torch.Tensor:
    """``values`` as ``[n, 2]`` pairs (``pairs``) or ``[n]`` token ids of the vocabulary: one
    pair / id for every sequence, or one per sequence; else :class:`InputError`.

    Example:
        >>> token_ids([3, 4], 2, 10, pairs=True, what="answers").tolist()
        [[3, 4], [3, 4]]
    """
    try:
        ids = torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InputError(f"{what} {values!r:.60} are not token ids", fix="give integers") from err
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputError(f"{what} of dtype {ids.dtype} are not token ids", fix="give integers")
    shape = (2,) if pairs else ()
    if tuple(ids.shape) in (shape, (1, *shape)):
        ids = ids.reshape(shape).expand(n, *shape)
    if tuple(ids.shape) != (n, *shape):
        want = "(correct, wrong) pair" if pairs else "token id"
        raise InputError(
            f"{what} of shape {tuple(ids.shape)} for {n} sequences",
            fix=f"give one {want} for all sequences, or one per sequence",
        )
    bad = ids[(ids < 0) | (ids >= d_vocab)]
    if len(bad):
        raise InputError(
            f"{what} token {int(bad[0])} is outside the vocabulary [0, {d_vocab})",
            fix="give token ids of this model's vocabulary",
        )
    return ids.long()


# ---------------------------------------------------------------- one side of one batch
@dataclass
class _Run:
    """One run of one batch: its trace and each layer's attention and MLP updates."""

    trace: Trace
    attn: list[torch.Tensor]
    mlp: list[torch.Tensor]

    def site(self, site: str, layer: int) -> torch.Tensor:
        """The activation at ``site`` of ``layer``."""
        res = self.trace.residuals
        if site == "resid_in":
            return res[layer]
        if site == "resid_out":
            return res[layer + 1]
        if site == "resid_mid":
            return res[layer] + self.attn[layer]
        return self.attn[layer] if site == "attn_out" else self.mlp[layer]


def _record(model: Model, batch: Batch, updates: bool = True) -> _Run:
    """The trace of ``batch``, with each layer's updates when ``updates`` (the residual sites
    need none, and their forward then runs without hooks)."""
    n = model.n_layers
    attn: list[Any] = [None] * n
    mlp: list[Any] = [None] * n

    def keep(layer: int) -> Any:
        def fn(h_in: torch.Tensor, a: torch.Tensor, m: torch.Tensor, h_out: torch.Tensor) -> None:
            attn[layer], mlp[layer] = a, m

        return fn

    fwd = [h for layer in range(n) for h in model.update_hooks(layer, keep(layer)) if updates]
    return _Run(model.trace(batch, fwd), attn, mlp)


def _last(batch: Batch) -> torch.Tensor:
    """``[B]`` index of each sequence's last real token."""
    return batch.valid.long().sum(-1) - 1


def _rows_at(batch: Batch, index: int) -> torch.Tensor:
    """``[B]`` tensor index of real position ``index`` (negative: from each sequence's end) per
    sequence, -1 where the sequence has no such position."""
    length = batch.valid.long().sum(-1)
    at = torch.full_like(length, index) if index >= 0 else length + index
    return torch.where((at >= 0) & (at < length), at, -1)


# ---------------------------------------------------------------- metrics
@dataclass
class _Metric:
    """The metric of one batch: its answers and the clean distribution (for KL)."""

    name: str
    answers: torch.Tensor | None
    clean_logp: torch.Tensor

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-sequence metric ``[B]`` (float64) of logits ``[B, V]`` at the answer position."""
        check_outputs_finite(logits, "the outputs of a patched forward")
        z = logits.double()
        rows = torch.arange(len(z), device=z.device)
        if self.name == "logit_diff":
            assert self.answers is not None
            return z[rows, self.answers[:, 0]] - z[rows, self.answers[:, 1]]
        logq = z.log_softmax(-1)
        if self.name == "target_prob":
            assert self.answers is not None
            return logq[rows, self.answers].exp()
        return (self.clean_logp.exp() * (self.clean_logp - logq)).sum(-1)


def _head_at(model: Model, residual: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, V]`` of final residuals ``[B, T, d]`` at positions ``at`` ``[B]``."""
    rows = torch.arange(len(at), device=at.device)
    return model.head(residual[rows, at][:, None])[:, 0]


# ---------------------------------------------------------------- patching
@dataclass
class _Cell:
    """Sums over sequences of one (direction, site, layer, position) cell."""

    value: float = 0.0
    clean: float = 0.0
    corrupted: float = 0.0
    n: int = 0


@dataclass
class _Sums:
    cells: dict[tuple, _Cell] = field(default_factory=dict)
    tokens: dict[int | str, str] = field(default_factory=dict)
    clean: float = 0.0
    corrupted: float = 0.0
    n: int = 0

    def add(self, key: tuple, values: torch.Tensor, base: dict[str, torch.Tensor], rows: Any):
        cell = self.cells.setdefault(key, _Cell())
        cell.value += float(values[rows].sum())
        cell.clean += float(base["clean"][rows].sum())
        cell.corrupted += float(base["corrupted"][rows].sum())
        cell.n += int(rows.sum())


def _patched_input(
    site: str, layer: int, base: _Run, source: _Run, at: torch.Tensor
) -> tuple[int, torch.Tensor, torch.Tensor | None]:
    """Where the patched forward starts, its residual there, and the update the hook puts in
    (None: none) when ``site`` of ``layer`` is copied from ``source`` into ``base`` at the
    tensor positions ``at`` ``[B]`` (-1: that sequence is not patched)."""
    rows = (at >= 0).nonzero()[:, 0]
    cols = at[rows]

    def patched(into: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        out = into.clone()
        out[rows, cols] = value[rows, cols].to(out.dtype)
        return out

    res = base.trace.residuals
    if site in ("resid_in", "resid_out"):
        start = layer if site == "resid_in" else layer + 1
        return start, patched(res[start], source.site(site, layer)), None
    if site == "resid_mid":  # the attention update that makes the MLP input the source's
        wanted = source.site("resid_mid", layer) - res[layer]
        return layer, res[layer], patched(base.attn[layer], wanted)
    return layer, res[layer], patched(base.site(site, layer), source.site(site, layer))


def _run_variants(
    model: Model, base: _Run, site: str, layer: int, variants: list[tuple], answer: torch.Tensor
) -> list[torch.Tensor]:
    """Logits at the answer position of each patched variant ``(start, residual, update)``,
    stacked along the batch (all variants of one site and layer start at the same block)."""
    starts = [v[0] for v in variants]
    updates = [v[2] for v in variants]
    fwd: list = []
    if updates[0] is not None:
        stacked = torch.cat(updates) if len(updates) > 1 else updates[0]
        fwd = model.replace_update_hooks(layer, _UPDATE_OF[site], stacked)
    with hooks(model, fwd):
        finals = base.trace.resume_stacked(starts, [v[1] for v in variants])
    return [_head_at(model, h, answer) for h in finals]


def _cells(
    positions: list[tuple[int, int | str]] | str, batch: Batch
) -> list[tuple[int | str, torch.Tensor]]:
    """``[(label, tensor position per sequence [B])]`` of this batch's patched positions."""
    if positions == "all":
        return [(p, _rows_at(batch, p)) for p in range(batch.tokens.shape[1])]
    assert not isinstance(positions, str)
    return [(label, _rows_at(batch, index)) for index, label in positions]


def _token_words(model: Model, tokens: torch.Tensor) -> list[str]:
    """The tokens of one sequence as text (decoded where the model has a tokenizer)."""
    tokenizer = model.tokenizer
    ids = [int(t) for t in tokens]
    if tokenizer is None:
        return [str(t) for t in ids]
    return [str(tokenizer.decode([t])) for t in ids]


def _patch_batch(
    model: Model,
    pair: tuple[Batch, Batch],
    sites: tuple[str, ...],
    directions: list[str],
    positions: Any,
    metric_name: str,
    answers: torch.Tensor | None,
    sums: _Sums,
) -> None:
    clean_batch, corrupted_batch = pair
    updates = any(site in _UPDATE_OF for site in sites)
    runs = {
        "clean": _record(model, clean_batch, updates),
        "corrupted": _record(model, corrupted_batch, updates),
    }
    answer = _last(clean_batch)
    clean_logits = _head_at(model, runs["clean"].trace.residuals[-1], answer)
    check_outputs_finite(clean_logits)
    if metric_name == "target_prob" and answers is None:
        answers = clean_logits.argmax(-1)
    metric = _Metric(metric_name, answers, clean_logits.double().log_softmax(-1))
    base = {
        "clean": metric(clean_logits),
        "corrupted": metric(_head_at(model, runs["corrupted"].trace.residuals[-1], answer)),
    }
    sums.clean += float(base["clean"].sum())
    sums.corrupted += float(base["corrupted"].sum())
    sums.n += len(answer)
    cells = _cells(positions, clean_batch)
    words = _token_words(model, clean_batch.tokens[0])
    for label, _ in cells:
        if label not in sums.tokens:
            sums.tokens[label] = "" if label == "last" else words[int(label)]
    chunk = max(1, STACK_ROWS // len(answer))
    for direction in directions:
        source, into = direction.split("_into_")
        for site in sites:
            for layer in range(model.n_layers):
                for start in range(0, len(cells), chunk):
                    part = cells[start : start + chunk]
                    variants = [
                        _patched_input(site, layer, runs[into], runs[source], at) for _, at in part
                    ]
                    logits = _run_variants(model, runs[into], site, layer, variants, answer)
                    for (label, at), z in zip(part, logits, strict=True):
                        key = (direction, site, layer, label)
                        sums.add(key, metric(z), base, (at >= 0).cpu())


def _frame(sums: _Sums, sites: tuple[str, ...], directions: list[str], n_layers: int):
    rows = []
    labels = list(sums.tokens)
    for direction in directions:
        for site in sites:
            for layer in range(n_layers):
                for label in labels:
                    cell = sums.cells.get((direction, site, layer, label))
                    if cell is None or cell.n == 0:
                        continue
                    value, clean, corrupted = (
                        cell.value / cell.n,
                        cell.clean / cell.n,
                        cell.corrupted / cell.n,
                    )
                    gap = clean - corrupted
                    rows.append(
                        {
                            "direction": direction,
                            "site": site,
                            "layer": layer,
                            "position": -1 if label == "last" else int(label),
                            "token": sums.tokens[label],
                            "value": value,
                            "clean": clean,
                            "corrupted": corrupted,
                            "normalized": (value - corrupted) / gap if gap != 0 else np.nan,
                            "n": cell.n,
                        }
                    )
    columns = ["direction", "site", "layer", "position", "token", "value", "clean"]
    columns += ["corrupted", "normalized", "n"]
    return pd.DataFrame(rows, columns=columns)


def _patching_summary(df: pd.DataFrame, sums: _Sums) -> dict[str, Any]:
    clean, corrupted = sums.clean / sums.n, sums.corrupted / sums.n
    summary: dict[str, Any] = {"clean_metric": clean, "corrupted_metric": corrupted}
    summary["n_sequences"] = sums.n
    for (direction, site), part in df.groupby(["direction", "site"], sort=False):
        scores = part.normalized
        if scores.isna().all():
            continue
        # the cell that moves the answer furthest from the run it is patched into
        best = part.loc[scores.idxmin() if direction.endswith("clean") else scores.idxmax()]
        prefix = f"{direction}_{site}"
        summary[f"{prefix}_layer"] = int(best.layer)
        summary[f"{prefix}_position"] = int(best.position)
        summary[f"{prefix}_normalized"] = float(best.normalized)
    return summary


class PatchingResult(Result):
    """Activation patching: the metric at each sequence's last real token when one site x layer
    x position is copied from one run into the other.

    ``df`` columns: ``direction`` ('corrupted_into_clean' or 'clean_into_corrupted'),
    ``site``, ``layer``, ``position`` (real position, pads excluded; -1 for
    ``positions="last"``), ``token`` (the first clean sequence's token there, decoded where the
    model has a tokenizer), ``value`` (the metric, mean over the sequences that have that
    position), ``clean`` and ``corrupted`` (the unpatched runs' metric over the same
    sequences), ``normalized`` ((value - corrupted) / (clean - corrupted): 0 = corrupted,
    1 = clean), ``n``. ``summary``: the unpatched metrics and, per direction and site, the
    cell that moves the answer furthest from the run patched into (``<direction>_<site>_layer``,
    ``..._position``, ``..._normalized``).
    """

    kind = "activation_patching"

    def grid(
        self, site: str | None = None, direction: str | None = None, value: str = "normalized"
    ) -> pd.DataFrame:
        """Layers x positions table of ``value`` ('normalized' or 'value') for one site and
        direction (default: the first of the run)."""
        site = site or self.meta["sites"][0]
        direction = direction or self.meta["directions"][0]
        part = self.df[(self.df.site == site) & (self.df.direction == direction)]
        return part.pivot(index="layer", columns="position", values=value)

    def figure(self, direction: str | None = None, value: str = "normalized") -> go.Figure:
        """One layer x position heatmap per site, on one colour scale (``value``: the
        'normalized' score or the raw metric 'value')."""
        direction = direction or self.meta["directions"][0]
        sites = list(self.meta["sites"])
        fig = make_subplots(
            rows=len(sites),
            cols=1,
            subplot_titles=[figure_words("activation_patching", "site", site=s) for s in sites],
            vertical_spacing=min(0.3 / max(1, len(sites) - 1), 0.2) if len(sites) > 1 else 0.0,
        )
        measure = figure_words("activation_patching", self.meta["metric"])
        colorbar = measure if value == "value" else figure_words("activation_patching", "score")
        tokens = self.df.drop_duplicates("position").set_index("position").token
        grids = [self.grid(site, direction, value) for site in sites]
        for row, table in enumerate(grids, start=1):
            fig.add_trace(
                go.Heatmap(
                    z=table.to_numpy(dtype=float),
                    x=[_tick(int(p), str(tokens.get(p, ""))) for p in table.columns],
                    y=[int(layer) for layer in table.index],
                    coloraxis="coloraxis",  # one scale, drawn by the colour axis
                    showscale=False,
                    hovertemplate="position %{x}<br>layer %{y}<br>%{z:.4g}<extra></extra>",
                ),
                row=row,
                col=1,
            )
            figures.integer_axis(fig, "y", n=len(table.index), row=row, col=1, autorange="reversed")
            fig.update_yaxes(title_text=AXES["layer"], row=row, col=1)
        fig.update_xaxes(title_text=figure_words("activation_patching", "x"), row=len(sites))
        figures.base_layout(
            fig,
            figure_words(
                "activation_patching", direction=figures.words(direction), measure=measure
            ),
        )
        values = np.concatenate([g.to_numpy(dtype=float).ravel() for g in grids])
        bound = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
        fig.update_layout(
            height=max(360, 230 * len(sites) + 140),
            coloraxis={
                "colorscale": figures.DIVERGING,
                "cmid": 0.0 if value == "value" else 0.5,
                "colorbar": {"title": {"text": figures.wrap(colorbar, 16)}},
                **({"cmin": -bound, "cmax": bound} if value == "value" else {}),
            },
        )
        return fig


def _tick(position: int, token: str) -> str:
    where = "last" if position == -1 else str(position)
    return f"{where}: {token.strip() or repr(token)}" if token else where


@torch.no_grad()
def activation_patching(
    model: Model,
    clean: DataOrTask,
    corrupted: DataOrTask,
    *,
    sites: Sequence[str] | str = ("resid_out",),
    positions: str | int | Sequence[int] = "all",
    metric: str = "logit_diff",
    answers: Any = None,
    direction: str = "corrupted_into_clean",
    batch_size: int | None = None,
) -> PatchingResult:
    """Patch each site x layer x position from one run into the other and measure the answer.

    Args:
        model: a :class:`probekit.Model` (with its LM head) or anything :func:`probekit.load`
            accepts.
        clean: token data (or task data), the run whose answer is measured.
        corrupted: the other run: the same token shapes and the same real-token masks (left
            or right padding; positions are real positions, pads excluded).
        sites: any of :data:`PATCH_SITES`.
        positions: 'all' real positions, 'last' (each sequence's last real token), or a list
            of real positions (negative: counted from each sequence's end).
        metric: one of :data:`METRICS`, read at each sequence's last real token.
        answers: for 'logit_diff' one (correct, wrong) pair of token ids or one per sequence;
            for 'target_prob' one token id or one per sequence (default: the clean
            prediction); not used by 'kl'.
        direction: 'corrupted_into_clean' (default), 'clean_into_corrupted' or 'both'.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).

    The normalised score is ``(m - m_corrupted) / (m_clean - m_corrupted)``.
    """
    model = load(model)
    model.require_vocabulary("activation_patching (it measures the answer's logits)")
    metric = _choice(metric, METRICS, "metric")
    directions = (
        list(DIRECTIONS) if direction == "both" else [_choice(direction, DIRECTIONS, "direction")]
    )
    chosen = _positions(positions)
    site_names = _sites(sites, model)
    pairs = _pair_batches(model, clean, corrupted, batch_size)
    n = sum(len(c.tokens) for c, _ in pairs)
    ids = _answers(answers, metric, n, model.d_vocab)
    sums, start = _Sums(), 0
    for pair in pairs:
        size = len(pair[0].tokens)
        part = None if ids is None else ids[start : start + size].to(pair[0].tokens.device)
        start += size
        _patch_batch(model, pair, site_names, directions, chosen, metric, part, sums)
    df = _frame(sums, site_names, directions, model.n_layers)
    meta = result_meta(model, positions=positions, batch_size=batch_size, metric=metric)
    meta.update(sites=list(site_names), directions=directions)
    return PatchingResult(df, _patching_summary(df, sums), meta)


# ---------------------------------------------------------------- direct logit attribution
def _frozen_norm(model: Model) -> FrozenNorm:
    """The final norm of a pre-norm decoder at a frozen scale, else
    :class:`UnsupportedModelError` with the reason."""
    model.require_vocabulary("direct_logit_attribution (it reads the unembedding)")
    if model.post_norm or not model.is_causal:
        raise UnsupportedModelError(
            f"{model.architecture} normalises the residual stream after every block (post-norm), "
            "so the output is no sum of the layers' updates and has no direct logit attribution",
            fix="use a pre-norm decoder (GPT-2, Llama, ...), or activation_patching",
        )
    return model.runtime.head.frozen_norm(model.architecture)


def _direction(model: Model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence the unembedding direction ``[B, d]`` and the logit bias ``[B]`` of target
    ids ``[B]`` or of (target, other) pairs ``[B, 2]`` (their difference)."""
    head = model.runtime.head
    w_u = model.unembedding.to(ids.device)  # [d, V] float64
    zero = torch.zeros(1, 1, model.d_model, dtype=model.dtype, device=model.device)
    b_u = head.unembedding(zero)[0, 0].double().to(ids.device)  # type: ignore[misc]
    factor = (head.scale or 1.0) / (head.scaling or 1.0)
    if ids.ndim == 1:
        return w_u[:, ids].T * factor, b_u[ids] * factor
    return (w_u[:, ids[:, 0]] - w_u[:, ids[:, 1]]).T * factor, (
        b_u[ids[:, 0]] - b_u[ids[:, 1]]
    ) * factor


def _dla_batch(
    model: Model, batch: Batch, ids: torch.Tensor, norm: FrozenNorm, cells: list, sums: dict
) -> None:
    run = _record(model, batch)
    res = run.trace.residuals
    direction, bias = _direction(model, ids)
    direction, bias = direction.to(model.device), bias.to(model.device)
    terms = {("embedding", -1): res[0]}
    for layer in range(model.n_layers):
        terms[("attn", layer)] = run.attn[layer]
        terms[("mlp", layer)] = run.mlp[layer]
    b = len(ids)
    rows = torch.arange(b, device=model.device)
    logits = run.trace.logits
    for label, at in cells:
        real = at >= 0
        if not bool(real.any()):
            continue
        idx = at.clamp(min=0)
        scale = norm.scale(res[-1][rows, idx].double())
        constant = bias
        if norm.bias is not None:  # the norm's bias, carried through the unembedding
            constant = bias + (norm.bias.to(direction.device) * direction).sum(-1)
        values = {
            key: (norm.linear(t[rows, idx].double(), scale) * direction).sum(-1)
            for key, t in terms.items()
        }
        values[("bias", -1)] = constant
        z = logits[rows, idx].double()
        if ids.ndim == 1:
            values[("logit", -1)] = z[rows, ids]
        else:
            values[("logit", -1)] = z[rows, ids[:, 0]] - z[rows, ids[:, 1]]
        for key, v in values.items():
            total = sums.setdefault((*key, label), [0.0, 0])
            total[0] += float(v[real].sum())
            total[1] += int(real.sum())


class AttributionResult(Result):
    """Direct logit attribution: each layer's attention and MLP term of a target's logit (or
    of a difference of two logits) at a position.

    ``df`` columns: ``component`` ('embedding', 'attn', 'mlp', 'bias' -- the final norm's bias
    and the unembedding's, carried through the unembedding -- and 'logit', the model's own
    value), ``layer`` (-1 for embedding, bias and logit), ``position`` (real position; -1 for
    ``positions="last"``), ``value`` (mean over the sequences that have that position) and
    ``n``. The terms use the final norm with its scale frozen at the clean run's value, so
    embedding + attn + mlp + bias = logit. ``summary``: ``logit`` and ``sum_of_terms`` at
    the first position, its ``bias``, and the largest layer term (``top_component``,
    ``top_layer``, ``top_value``).
    """

    kind = "direct_logit_attribution"

    def figure(self, position: int | None = None) -> go.Figure:
        df = self.df
        position = int(df.position.iloc[0]) if position is None else position
        part = df[df.position == position]
        fig = go.Figure()
        for component in ("attn", "mlp"):
            rows = part[part.component == component]
            fig.add_bar(x=list(rows.layer), y=list(rows.value), name=figures.words(component))
        fixed = part[part.layer == -1].set_index("component").value
        title = figure_words(
            "direct_logit_attribution",
            target=figure_words("direct_logit_attribution", self.meta["target_kind"]),
            where="the last token" if position == -1 else f"position {position}",
            embedding=fixed.get("embedding", np.nan),
            bias=fixed.get("bias", np.nan),
            logit=fixed.get("logit", np.nan),
        )
        figures.base_layout(
            fig, title, AXES["layer"], figure_words("direct_logit_attribution", "y")
        )
        figures.integer_axis(fig, "x", n=int(part.layer.max()) + 1)
        fig.update_layout(barmode="group")
        return fig


@torch.no_grad()
def direct_logit_attribution(
    model: Model,
    data: DataOrTask,
    *,
    targets: Any,
    positions: str | int | Sequence[int] = "last",
    batch_size: int | None = None,
) -> AttributionResult:
    """Split a target's logit into the embedding's, each layer's attention and MLP, and the
    bias term, through the final norm with its scale FROZEN at the clean run's value.

    Args:
        model: a pre-norm decoder with its LM head (post-norm models such as BERT are refused:
            their output is no sum of the layers' updates).
        data: token data (or task data).
        targets: one token id per sequence (or one for all), or (target, other) pairs per
            sequence (or one ``[[target, other]]`` for all) for the logit difference.
        positions: 'last' real token (default), 'all', or a list of real positions.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
    """
    model = load(model)
    norm = _frozen_norm(model)
    chosen = _positions(positions)
    batches = model.prepare(_tokens_of(data), batch_size)
    n = sum(len(b.tokens) for b in batches)
    ids = _targets(targets, n, model.d_vocab)
    sums: dict[tuple, list] = {}
    start = 0
    for batch in batches:
        part = ids[start : start + len(batch.tokens)].to(model.device)
        start += len(batch.tokens)
        _dla_batch(model, batch, part, norm, _cells(chosen, batch), sums)
    df = pd.DataFrame(
        [
            {
                "component": c,
                "layer": layer,
                "position": -1 if p == "last" else int(p),
                "value": s / k,
                "n": k,
            }
            for (c, layer, p), (s, k) in sums.items()
        ],
        columns=["component", "layer", "position", "value", "n"],
    )
    meta = result_meta(model, positions=positions, batch_size=batch_size)
    meta["target_kind"] = "difference" if ids.ndim == 2 else "logit"
    meta["frozen_norm_scale"] = True
    return AttributionResult(df, _dla_summary(df), meta)


def _targets(targets: Any, n: int, d_vocab: int) -> torch.Tensor:
    """DLA targets as ``[n]`` ids or ``[n, 2]`` pairs (see :func:`direct_logit_attribution`)."""
    shape = tuple(np.shape(targets)) if not isinstance(targets, torch.Tensor) else targets.shape
    pairs = len(shape) == 2
    return token_ids(targets, n, d_vocab, pairs=pairs, what="targets")


def _dla_summary(df: pd.DataFrame) -> dict[str, Any]:
    if df.empty:
        return {}
    first = df[df.position == df.position.iloc[0]].set_index(["component", "layer"]).value
    terms = first.drop(index="logit", level="component")
    layers = first.drop(index=["logit", "bias", "embedding"], level="component")
    top = layers.abs().idxmax()
    return {
        "logit": float(first[("logit", -1)]),
        "sum_of_terms": float(terms.sum()),
        "bias": float(first[("bias", -1)]),
        "embedding": float(first[("embedding", -1)]),
        "top_component": str(top[0]),
        "top_layer": int(top[1]),
        "top_value": float(layers[top]),
    }


__all__ = [
    "DIRECTIONS",
    "METRICS",
    "PATCH_SITES",
    "AttributionResult",
    "PatchingResult",
    "activation_patching",
    "direct_logit_attribution",
    "token_ids",
]
