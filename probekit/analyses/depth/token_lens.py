"""Token-resolved lens: what the logit lens (or a tuned lens) reads at every layer and position.

The :func:`~probekit.analyses.depth.lens.logit_lens` averages over tokens; this keeps every
token. For each selected position of each sequence, each ``site`` and each depth, the lens
decodes the residual with the model's own head (:meth:`probekit.Model.head`; through a
:class:`~probekit.analyses.depth.tuned_lens.TunedLens`'s translator first when one is given)
and records:

- ``top_id`` / ``top_token``: the lens' most probable token and its text (decoded by the
  model's tokenizer; the id as text when the model has none), ``top_prob`` its probability;
- ``entropy``: the entropy of the lens' distribution (nats);
- ``cross_entropy``: -log p_lens(target), the target being the next real token for decoders
  (the token itself for masked-LM encoders); NaN where there is none (the last real token);
- ``kl_final``: KL(p_final || p_lens) (nats), p_final the model's own output;
- ``matches_final``: whether the lens' top token is the model's final top token;
- per target of ``targets={"name": ids}``: ``logp_<name>``, log p_lens(that token).

Depths and sites: at site ``resid_out``, depth d = 0 .. n_layers is the residual after d
blocks (0: the embeddings; n_layers: the model's output, taken from the clean forward, so it
always matches itself). At site ``resid_mid``, depth d = 0 .. n_layers-1 is the residual inside
block d after its attention update and before its MLP update: ``h_d + a_d`` with the updates
of :meth:`probekit.Model.update_hooks` (the stream after the attention's add-norm in post-norm
blocks; in parallel blocks, where the MLP reads h_d, the stream with only the attention's
update added). A tuned lens has translators for the block inputs (``resid_out`` depths
0 .. n_layers-1) only; at ``resid_mid`` depth d the translator of depth d (fit on the input
of block d, before its attention) is applied to the mid-block residual: an extrapolation,
not a fit, which the result's meta records (``resid_mid_translator``).

**Prediction depth** of a token (per site): the first depth from which the lens' top token
equals the model's final top token and stays equal through the last depth of that site. At
``resid_out`` the last depth is the output itself, so every token settles (at n_layers at the
latest); at ``resid_mid`` a token whose last mid-block read-out differs from the final
prediction never settles: its prediction depth is NaN, counted in the summary's
``n_never_settled_<site>``.

Left padding is honoured (the batches are right-padded first, positions counted from the first
real token; pad positions are never rows); ``positions="last"`` keeps the last real token of
each sequence. Models without an LM head are refused (no vocabulary to decode to).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = token_lens(toy_model(n_layers=2), toy_tokens(2, 5), sites=("resid_out", "resid_mid"))
    >>> sorted(set(res.df.site)), int(res.df.depth.max()), len(res.prediction_depths())
    (['resid_mid', 'resid_out'], 2, 20)
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import CHUNK_TOKENS, CleanSide, result_meta
from probekit.analyses.depth.shared import Shared, make_shared
from probekit.analyses.depth.tuned_lens import TunedLens, as_lens
from probekit.data import Batch, Data, position_mask
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.progress import counted
from probekit.result import Result
from probekit.words import AXES, figure_words

SITES = ("resid_out", "resid_mid")
"""The residual-stream sites a token lens reads (see the module)."""

COLOURS = ("top_prob", "entropy")
"""What the heatmap's colour can show: the lens' top-token probability or its entropy."""

MEASURES = ("top_prob", "entropy", "cross_entropy", "kl_final")
"""The per-token numbers of every row, besides the top token and the target log-probs."""


# ---------------------------------------------------------------- input checks
def _check_sites(sites: Any) -> tuple[str, ...]:
    if isinstance(sites, str):
        sites = (sites,)
    try:
        listed = tuple(sites)
    except TypeError:
        listed = ()
    unknown = [s for s in listed if s not in SITES]
    if not listed or unknown or len(set(listed)) != len(listed):
        raise InputError(
            f"sites={sites!r} is not a list of distinct sites from {list(SITES)}"
            + (f" (unknown: {unknown})" if unknown else ""),
            fix="pass e.g. sites=('resid_out',) or sites=('resid_out', 'resid_mid')",
        )
    return listed


def _check_lens(lens: Any, model: Model) -> TunedLens | None:
    """None for the logit lens, else the tuned lens checked against ``model``."""
    if isinstance(lens, str) and lens == "logit":
        return None
    if isinstance(lens, TunedLens) or (
        isinstance(lens, str | os.PathLike) and os.path.isdir(os.fspath(lens))
    ):
        return as_lens(lens, model)
    raise InputError(
        f"lens={lens!r:.80} is neither 'logit' nor a TunedLens (or the folder of a saved one)",
        fix="pass lens='logit', a TunedLens (TunedLens.fit(model, data)) or its saved folder",
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_targets(
    targets: Mapping[str, Any] | None, n_sequences: int, d_vocab: int
) -> dict[str, list[int]]:
    """``targets`` as one token id per sequence for each name, or :class:`InputError`."""
    if targets is None:
        return {}
    if not isinstance(targets, Mapping):
        raise InputError(
            f"targets is a {type(targets).__name__}, not a dict of name: token ids",
            fix="pass e.g. targets={'answer': 17} or {'answer': [17, 4, ...]} (one per sequence)",
        )
    out: dict[str, list[int]] = {}
    for name, ids in targets.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"target name {name!r} is not a non-empty string", fix="name it")
        if isinstance(ids, torch.Tensor | np.ndarray):
            ids = ids.tolist()
        listed = [ids] * n_sequences if _is_id(ids) else ids
        if not isinstance(listed, Sequence) or isinstance(listed, str):
            listed = None
        if listed is None or len(listed) != n_sequences or not all(map(_is_id, listed)):
            raise InputError(
                f"targets[{name!r}] is not one token id, nor a list of one token id per "
                f"sequence ({n_sequences} sequences)",
                fix=f"pass an int or a list of {n_sequences} ints",
            )
        bad = [int(i) for i in listed if not 0 <= int(i) < d_vocab]
        if bad:
            raise InputError(
                f"targets[{name!r}] holds token ids outside the vocabulary 0..{d_vocab - 1}: "
                f"{bad[:5]}",
                fix="pass ids of this model's vocabulary",
            )
        out[name] = [int(i) for i in listed]
    return out


# ---------------------------------------------------------------- decoding
class _Decoder:
    """Token ids as text through ``decode`` when given, else the model's tokenizer (each id
    decoded once); the id itself when the model has none."""

    def __init__(self, tokenizer: Any, decode: Callable[[int], str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.decode = decode
        self.known: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        for i in set(ids) - set(self.known):
            self.known[i] = self._one(i)
        return [self.known[i] for i in ids]

    def _one(self, token: int) -> str:
        if self.decode is not None:
            return str(self.decode(token))
        if self.tokenizer is None:
            return str(token)
        try:
            text = self.tokenizer.decode([token])
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode an id: show the id
            return str(token)
        return text if isinstance(text, str) and text != "" else str(token)


# ---------------------------------------------------------------- the measures
@torch.no_grad()
def read_out(
    logits: torch.Tensor | None,
    side: CleanSide,
    rows: torch.Tensor,
    targets: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per token the lens' top token, its probability, the entropy, the cross-entropy to the
    clean side's label (NaN where -100), KL(p_final || p_lens) and the log-probabilities of
    ``targets`` ``[N, n_targets]``, for lens ``logits`` ``[N, V]`` (None: the final output
    itself) of the tokens ``rows`` of the clean ``side``
    (:func:`~probekit.analyses.common.clean_side`). In float32 chunks of
    :data:`~probekit.analyses.common.CHUNK_TOKENS` tokens, the logits shifted by their maximum
    first; sums and logs in float64: with q the lens' and p the final distribution,
    H = lse - sum q z and KL = sum p (z_final - z) + lse - lse_final.

    Example:
        >>> from probekit.analyses.common import clean_side
        >>> side = clean_side(torch.tensor([[[0.0, 0.0]]]), torch.tensor([[1]]))
        >>> out = read_out(None, side, torch.tensor([0]))
        >>> round(float(out["entropy"][0]), 4), float(out["kl_final"][0])
        (0.6931, 0.0)
    """
    n = rows.shape[0]
    parts: dict[str, list[torch.Tensor]] = {}
    work = side.work(CHUNK_TOKENS)  # reused chunk after chunk: fresh memory costs more
    final_ids = side.top(1)[rows, 0]
    first = int(rows[0]) if n else 0
    contiguous = n > 0 and int(rows[-1]) - first + 1 == n  # every token: slices, no copies
    for start in range(0, n, CHUNK_TOKENS):
        part = slice(start, min(start + CHUNK_TOKENS, n))
        size = part.stop - part.start
        at = slice(first + part.start, first + part.stop) if contiguous else rows[part]
        z = side.logits[at] if logits is None else logits[part].float()
        best, top = z.max(-1)
        shifted = torch.sub(z, best[:, None], out=work[0, :size])
        q = torch.exp(shifted, out=work[1, :size])
        total = q.sum(-1)
        lse_shifted = total.double().log()
        lse = best.double() + lse_shifted
        spread = q.mul_(shifted).sum(-1).double() / total.double()  # sum q z, shifted
        change = torch.sub(side.logits[at], z, out=work[0, :size]).mul_(side.p[at])
        y = side.labels[at]
        picked = z.gather(-1, y.clamp(min=0)[:, None])[:, 0].double()
        chunk = {
            "top_id": top,
            "top_prob": (-lse_shifted).exp(),
            "entropy": lse_shifted - spread,
            "cross_entropy": torch.where(y != -100, lse - picked, math.nan),
            "kl_final": change.sum(-1).double() + (lse - side.lse[at]),
        }
        if targets is not None:
            chunk["targets"] = z.gather(-1, targets[part]).double() - lse[:, None]
        for name, values in chunk.items():
            parts.setdefault(name, []).append(values)
    out = {name: torch.cat(values) for name, values in parts.items()}
    return {**out, "final_id": final_ids}


def _mid_residuals(model: Model, batch: Batch) -> list[torch.Tensor]:
    """Per block l the residual after its attention update, ``h_l + a_l`` (one hooked
    forward)."""
    mids: dict[int, torch.Tensor] = {}
    hooks = []
    for layer in range(model.n_layers):

        def keep(h_in, a, m, h_out, layer=layer) -> None:
            mids[layer] = h_in + a

        hooks += model.update_hooks(layer, keep)
    model.forward(batch, hooks)
    return [mids[layer] for layer in range(model.n_layers)]


def _site_residuals(
    model: Model, shared: Shared, batch: Batch, site: str
) -> list[tuple[int, torch.Tensor | None]]:
    """``(depth, residual)`` of ``site`` for one batch; None for the final depth (the clean
    output is used)."""
    if site == "resid_mid":
        return list(enumerate(_mid_residuals(model, batch)))
    residuals = shared.trace(batch).residuals
    return [(d, None if d == model.n_layers else r) for d, r in enumerate(residuals)]


def _lens_logits(
    model: Model, lens: TunedLens | None, depth: int, residual: torch.Tensor
) -> torch.Tensor:
    with torch.no_grad():
        if lens is None:
            return model.head(residual)
        return lens.logits(model, depth, residual)


# ---------------------------------------------------------------- the result
class TokenLensResult(Result):
    """``df``: one row per sequence x selected position x site x depth, columns ``sequence``
    (its index in the data), ``position`` (counted from its first real token), ``token_id`` /
    ``token`` (the input token there), ``site``, ``depth``, ``top_id``, ``top_token``,
    ``top_prob``, ``entropy``, ``cross_entropy``, ``kl_final``, ``final_id``,
    ``matches_final`` and ``logp_<name>`` per target (see the module).
    ``summary``: ``n_sequences``, ``n_tokens``, ``n_layers``, and per site
    ``mean_prediction_depth_<site>`` (over the tokens that settle),
    ``n_never_settled_<site>``, ``never_settled_fraction_<site>``, ``mean_kl_final_<site>``
    (over tokens and the depths below the output) and ``mean_entropy_by_depth_<site>`` (a list,
    one per depth). ``meta``: ``lens``, ``sites``, ``targets`` (name: ids),
    ``resid_mid_translator``."""

    kind = "token_lens"

    def prediction_depths(self) -> pd.DataFrame:
        """Per sequence, position and site the prediction depth (NaN: never settles)."""
        return prediction_depths(self.df)

    def figure(
        self,
        sequence: int = 0,
        *,
        site: str | None = None,
        colour: str = "top_prob",
        max_positions: int = 32,
    ) -> go.Figure:
        """Depth x position heatmap of ``sequence`` at ``site`` (default: the first measured)
        with the lens' top token written in every cell, coloured by ``colour`` (the lens'
        top-token probability, default, or its entropy); at most the last ``max_positions``
        positions. A result of one position per sequence (``positions="last"``) shows the
        sequences side by side instead. With targets, a second panel draws each target's
        log-probability against depth at the sequence's last measured position (solid) and
        its mean over every sequence's last measured position (dotted)."""
        site = self._site(site)
        if colour not in COLOURS:
            raise InputError(f"unknown colour {colour!r}", fix=f"use one of {list(COLOURS)}")
        part = self.df[self.df.site == site]
        per_sequence = part.groupby("sequence").position.nunique().max() == 1
        if not per_sequence:
            part = self._sequence(part, sequence).sort_values(["position", "depth"])
            part = part[part.position >= part.position.max() - max_positions + 1]
        column = "sequence" if per_sequence else "position"
        grid = part.pivot_table(index="depth", columns=column, values=colour, aggfunc="first")
        text = part.pivot_table(index="depth", columns=column, values="top_token", aggfunc="first")
        ticks = part.drop_duplicates(column).set_index(column)
        labels = [f"{c}: {ticks.loc[c, 'token']!s:.12}" for c in grid.columns]
        targets = [c for c in part.columns if str(c).startswith("logp_")]
        return self._draw(grid, text, labels, site, colour, per_sequence, sequence, targets)

    def _site(self, site: str | None) -> str:
        measured = list(dict.fromkeys(self.df.site))
        site = measured[0] if site is None else site
        if site not in measured:
            raise InputError(f"site {site!r} was not measured", fix=f"use one of {measured}")
        return site

    @staticmethod
    def _sequence(part: pd.DataFrame, sequence: int) -> pd.DataFrame:
        chosen = part[part.sequence == sequence]
        if chosen.empty:
            raise InputError(
                f"sequence {sequence!r} is not in this result",
                fix=f"pick one of 0..{int(part.sequence.max())}",
            )
        return chosen

    def _draw(
        self,
        grid: pd.DataFrame,
        text: pd.DataFrame,
        labels: list[str],
        site: str,
        colour: str,
        per_sequence: bool,
        sequence: int,
        targets: list[str],
    ) -> go.Figure:
        from plotly.subplots import make_subplots

        rows = 2 if targets else 1
        fig = make_subplots(
            rows=rows,
            cols=1,
            row_heights=[0.62, 0.38] if targets else [1.0],
            vertical_spacing=0.22,
            subplot_titles=[
                figure_words("token_lens", "panel", site=figure_words("token_lens", site)),
                *([figure_words("token_lens", "targets_panel")] if targets else []),
            ],
        )
        fig.add_trace(
            go.Heatmap(
                z=grid.to_numpy(dtype=float),
                x=list(range(grid.shape[1])),
                y=[int(d) for d in grid.index],
                text=text.to_numpy(dtype=object),
                texttemplate="%{text}",
                textfont={"size": 9},
                colorscale=figures.SEQUENTIAL,
                zmin=0.0,
                zmax=1.0 if colour == "top_prob" else None,
                colorbar={
                    "title": {"text": figures.wrap(figure_words("token_lens", colour), 16)},
                    "len": 0.45 if targets else 0.75,
                    "y": 0.9 if targets else 0.85,
                    "yanchor": "top",
                },
            ),
            row=1,
            col=1,
        )
        fig.update_xaxes(
            tickmode="array",
            tickvals=list(range(grid.shape[1])),
            ticktext=labels,
            tickangle=-60 if len(labels) > 8 else 0,
            title_text=figure_words("token_lens", "x_sequences" if per_sequence else "x"),
            row=1,
            col=1,
        )
        fig.update_yaxes(title_text=AXES["depth"], autorange="reversed", row=1, col=1)
        figures.integer_axis(fig, "y", n=len(grid.index), row=1, col=1)
        if targets:
            self._target_curves(fig, site, sequence, targets)
        title = figure_words(
            "token_lens",
            lens=self.meta.get("lens", "logit lens"),
            colour=figure_words("token_lens", colour),
            which="sequences' last tokens" if per_sequence else f"sequence {sequence}",
        )
        figures.base_layout(fig, title, height=520 + (260 if targets else 0))
        return fig

    def _target_curves(self, fig: go.Figure, site: str, sequence: int, targets: list[str]) -> None:
        part = self.df[self.df.site == site]
        last = part[part.position == part.groupby("sequence").position.transform("max")]
        own = last[last.sequence == sequence].sort_values("depth")
        mean = last.groupby("depth")[targets].mean()
        for i, column in enumerate(targets):
            colour = figures.PALETTE[i % len(figures.PALETTE)]
            name = column.removeprefix("logp_")
            for frame, x, dash, which in (
                (own, own.depth, None, "own"),
                (mean, mean.index, "dot", "mean"),
            ):
                fig.add_trace(
                    go.Scatter(
                        x=list(x),
                        y=frame[column],
                        name=figure_words("token_lens", which, name=name, sequence=sequence),
                        mode="lines+markers",
                        line={"color": colour, "dash": dash},
                    ),
                    row=2,
                    col=1,
                )
        fig.update_xaxes(title_text=AXES["depth"], row=2, col=1)
        fig.update_yaxes(title_text=figure_words("token_lens", "y_targets"), row=2, col=1)
        figures.integer_axis(fig, "x", n=int(part.depth.max()) + 1, row=2, col=1)


def prediction_depths(df: pd.DataFrame) -> pd.DataFrame:
    """Per ``sequence``, ``position`` and ``site`` of a token-lens table its
    ``prediction_depth``: the first depth from which ``matches_final`` holds through the
    site's last depth (NaN where the last depth does not match: never settles).

    Example:
        >>> df = pd.DataFrame({"sequence": 0, "position": 0, "site": "resid_out",
        ...                    "depth": [0, 1, 2, 3], "matches_final": [True, False, True, True]})
        >>> prediction_depths(df).prediction_depth.tolist()
        [2.0]
    """
    keys = ["sequence", "position", "site"]
    ordered = df.sort_values([*keys, "depth"], ascending=[True, True, True, False])
    settled = ordered.groupby(keys, sort=False).matches_final.cummin().astype(bool)
    depth = ordered.depth.where(settled)
    out = depth.groupby([ordered[k] for k in keys], sort=True).min()
    return out.rename("prediction_depth").astype(float).reset_index()


def _summary(df: pd.DataFrame, sites: tuple[str, ...], n_layers: int, n_sequences: int) -> dict:
    depths = prediction_depths(df)
    summary: dict[str, Any] = {
        "n_sequences": n_sequences,
        "n_tokens": int(len(depths) // max(len(sites), 1)),
        "n_layers": n_layers,
    }
    for site in sites:
        at = depths[depths.site == site].prediction_depth
        rows = df[df.site == site]
        never = int(at.isna().sum())
        summary[f"mean_prediction_depth_{site}"] = float(at.mean()) if at.notna().any() else None
        summary[f"n_never_settled_{site}"] = never
        summary[f"never_settled_fraction_{site}"] = never / len(at) if len(at) else None
        below = rows[rows.depth < n_layers]
        summary[f"mean_kl_final_{site}"] = float(below.kl_final.mean()) if len(below) else None
        by_depth = rows.groupby("depth").entropy.mean()
        summary[f"mean_entropy_by_depth_{site}"] = [round(float(v), 6) for v in by_depth]
    return summary


# ---------------------------------------------------------------- the analyzer
def _batch_rows(
    model: Model,
    shared: Shared,
    lens: TunedLens | None,
    batch: Batch,
    mask: torch.Tensor,
    sites: tuple[str, ...],
    target_ids: torch.Tensor | None,
) -> list[dict[str, Any]]:
    """The measures of one batch: per site and depth a dict of ``[N]`` tensors over the
    ``mask`` tokens (in row-major order)."""
    side = shared.side(batch)
    rows = mask.reshape(-1).nonzero()[:, 0]
    out = []
    for site in sites:
        for depth, residual in _site_residuals(model, shared, batch, site):
            logits = None if residual is None else _lens_logits(model, lens, depth, residual[mask])
            measured = read_out(logits, side, rows, target_ids)
            out.append({"site": site, "depth": depth, **measured})
    return out


@torch.no_grad()
def token_lens(
    model: Model,
    data: Data,
    *,
    lens: str | TunedLens | os.PathLike = "logit",
    sites: Sequence[str] = ("resid_out",),
    targets: Mapping[str, Any] | None = None,
    positions: str = "all",
    batch_size: int | None = None,
    decode: Callable[[int], str] | None = None,
    cache: Shared | None = None,
) -> TokenLensResult:
    """Read every layer at every token through the logit lens (``lens="logit"``) or a tuned
    lens (a :class:`~probekit.analyses.depth.tuned_lens.TunedLens` or its saved folder): the
    top token and its text, probability, entropy, cross-entropy to the next token, KL from the
    final output, prediction depth, and the log-probability of each of ``targets`` (name: one
    token id, or one per sequence), at the ``sites`` ``"resid_out"`` and/or ``"resid_mid"``
    (see the module). ``decode``: how a token id is written as text (default: the model's
    tokenizer, else the id itself; e.g. a byte-level model's bytes). ``cache``: a diagnosis's
    :class:`~probekit.analyses.depth.shared.Shared` cache, whose clean traces the
    ``resid_out`` read-outs reuse.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> res = token_lens(toy_model(n_layers=2), toy_tokens(3, 6), targets={"one": 1},
        ...                  positions="last")
        >>> len(res.df), res.summary["n_never_settled_resid_out"], "logp_one" in res.df
        (9, 0, True)
    """
    model = load(model)
    model.require_vocabulary("the token lens")
    site_list = _check_sites(sites)
    position_mask(Batch(torch.ones(1, 1, dtype=torch.long)), positions)  # refuses unknown ones
    tuned = _check_lens(lens, model)
    if decode is not None and not callable(decode):
        raise InputError(f"decode={decode!r:.60} is not callable", fix="pass a function id -> text")
    shared = make_shared(model, cache)
    batches = model.prepare(data, batch_size)
    n_sequences = sum(int(b.tokens.shape[0]) for b in batches)
    wanted = _check_targets(targets, n_sequences, model.d_vocab)
    decoder = _Decoder(model.tokenizer, decode)
    frames, first = [], 0
    for batch in counted(batches):
        frames.append(
            _batch_frame(model, shared, tuned, batch, positions, site_list, wanted, first)
        )
        first += int(batch.tokens.shape[0])
    df = pd.concat(frames, ignore_index=True)
    df.insert(3, "token", decoder(df.token_id.tolist()))
    df.insert(df.columns.get_loc("top_id") + 1, "top_token", decoder(df.top_id.tolist()))
    summary = _summary(df, site_list, model.n_layers, n_sequences)
    meta = result_meta(model, positions=positions, batch_size=batch_size)
    meta |= {
        "lens": "logit lens" if tuned is None else "tuned lens",
        "sites": list(site_list),
        "targets": wanted,
        "resid_mid_translator": None
        if tuned is None or "resid_mid" not in site_list
        else "the translator of the block's input (depth d), fit before its attention",
    }
    return TokenLensResult(df, summary, meta)


def _batch_frame(
    model: Model,
    shared: Shared,
    lens: TunedLens | None,
    batch: Batch,
    positions: str,
    sites: tuple[str, ...],
    targets: dict[str, list[int]],
    first: int,
) -> pd.DataFrame:
    """The rows of one batch (sequences numbered from ``first``)."""
    mask = position_mask(batch, positions)
    rows, cols = mask.nonzero(as_tuple=True)
    ids = None
    if targets:
        per_sequence = torch.tensor(list(targets.values()), device=mask.device).T  # [S, n]
        ids = per_sequence[first + rows]
    frames = []
    for measured in _batch_rows(model, shared, lens, batch, mask, sites, ids):
        frame = {
            "sequence": (first + rows).cpu().numpy(),
            "position": cols.cpu().numpy(),
            "token_id": batch.tokens[rows, cols].cpu().numpy(),
            "site": measured["site"],
            "depth": measured["depth"],
            "top_id": measured["top_id"].cpu().numpy(),
            **{name: measured[name].cpu().numpy() for name in MEASURES},
            "final_id": measured["final_id"].cpu().numpy(),
        }
        frame["matches_final"] = frame["top_id"] == frame["final_id"]
        if ids is not None:
            logps = measured["targets"].cpu().numpy()
            for i, name in enumerate(targets):
                frame[f"logp_{name}"] = logps[:, i]
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True)


__all__ = ["SITES", "TokenLensResult", "prediction_depths", "read_out", "token_lens"]
