"""Layer contributions by zero ablation: how much does each layer (and sublayer) change the output?

For each layer l, its whole update is removed (the block's output := its input), and separately
its attention and its MLP update are zeroed. The output change is measured per token (see
:data:`probekit.analyses._common.OUTPUT_MEASURES`) and reduced per ``convention`` (see
:mod:`probekit.analyses.depth.conventions`): ``"probekit"`` (default, probekit's own choice)
averages over all selected tokens of all prompts; ``"csordas2025"`` takes the max over the
measured tokens, then positions t, then prompts, never ablates position 0, and is the
reference code's reduction for ``prob_l2`` (its ``analyze_*_effects.py`` report only that
measure; the others are reduced the same way). ``mode="future"`` ablates at positions < t and
measures at positions >= t; ``keep_first`` leaves position 0 (a BOS token) untouched. Each
layer's *share* is its whole-layer measure divided by the sum over layers; the
*second-half share* (layers l >= L/2) is the depth-curse headline number: static pre-LN models
put little of their output in the second half.

Fast path: one clean forward keeps the residual entering every block; removing layer l only
changes what comes after it, so the ablated forward resumes at l+1 from the cached residual
(sublayer ablations resume at l). Numbers equal a full hooked forward per variant. Given the
``cache`` of a diagnosis (:class:`~probekit.analyses.depth.shared.Shared`), the clean trace
and the whole-layer skips are those ``skip_effects`` uses too, each run once.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = contributions(toy_model(n_layers=4), toy_tokens())
    >>> round(res.summary["second_half_share"], 6) == round(res.second_half_share("prob_l2"), 6)
    True
    >>> fig = res.figure()          # a plotly figure; fig.show() in a notebook
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses._common import (
    OUTPUT_MEASURES,
    TokenMeans,
    check_finite,
    loss_mask,
    output_change,
    second_half,
)
from probekit.analyses.depth.conventions import (
    Reduction,
    Setup,
    Windows,
    make_setup,
    masked_ablate_hooks,
    plan_windows,
    slot_masks,
)
from probekit.analyses.depth.shared import Shared, make_shared
from probekit.data import Data, position_mask
from probekit.errors import InputError
from probekit.interventions import ablate_hooks
from probekit.model import Model, load
from probekit.result import Result

COMPONENTS = ("layer", "attn", "mlp")
SHARE_MEASURES = ("logit_l2", "kl", "prob_l2")


class ContributionResult(Result):
    """Per (layer, component, measure): the mean output change and, for whole layers, the share.

    ``df`` columns: ``layer``, ``component`` ('layer', 'attn', 'mlp'), ``measure``, ``value``,
    ``share``. ``summary``: ``second_half_share`` (by ``prob_l2``), ``second_half_share_<m>``
    for every share measure, ``clean_loss``, ``n_layers``, ``most_important_layer``,
    ``least_important_layer``.
    """

    kind = "contributions"

    def profile(self, measure: str = "prob_l2", component: str = "layer") -> pd.Series:
        """The measure per layer for one component, indexed by layer."""
        part = self.df[(self.df.measure == measure) & (self.df.component == component)]
        return part.set_index("layer")["value"].sort_index()

    def second_half_share(self, measure: str = "prob_l2") -> float:
        """Share of the whole-layer ``measure`` from layers ``l >= L/2`` (NaN if not measured)."""
        part = self.df[(self.df.measure == measure) & (self.df.component == "layer")]
        if part.empty or part["share"].isna().all():
            return float("nan")
        late = part.layer.isin(second_half(int(self.summary["n_layers"])))
        return float(part.loc[late, "share"].sum())

    def figure(self, measure: str = "prob_l2") -> go.Figure:
        part = self.df[self.df.measure == measure]
        n_layers = int(self.summary["n_layers"])
        fig = figures.bars(
            part,
            "layer",
            "value",
            "component",
            f"Zero-ablation contribution per layer ({measure}); second-half share "
            f"{self.second_half_share(measure):.1%}",
            "layer",
            measure,
        )
        return figures.shade_second_half(fig, n_layers)


@torch.no_grad()
def contributions(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    components: Sequence[str] = COMPONENTS,
    batch_size: int | None = None,
    convention: str = "probekit",
    mode: str = "current",
    keep_first: bool | None = None,
    n_future: int = 4,
    seed: int = 123,
    answer_start: Sequence[int] | None = None,
    cache: Shared | None = None,
) -> ContributionResult:
    """Zero-ablate every layer and sublayer and measure the change of the output.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data (see :mod:`probekit.data`); padding never enters the reductions.
        positions: 'all' real tokens, or only the 'last' real token of each sequence.
        components: any of 'layer' (whole block), 'attn', 'mlp'.
        batch_size: split the data into batches of at most this many sequences.
        convention: 'probekit' (token means) or 'csordas2025' (max over tokens, positions t
            and prompts); see :mod:`probekit.analyses.depth.conventions`.
        mode: 'current' (ablate at every position) or 'future' (ablate at positions < t,
            measure at positions >= t).
        keep_first: never ablate position 0 (default: when the tokenizer adds a BOS token, and
            always under 'csordas2025').
        n_future, seed: how many positions t per prompt future mode draws, and its seed.
        answer_start: future mode at one given position per prompt (e.g. the answer start).
        cache: a :class:`~probekit.analyses.depth.shared.Shared` cache of one diagnosis, so
            the clean traces and the whole-layer skips are shared with ``skip_effects``.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> res = contributions(toy_model(n_layers=2), toy_tokens(), components=["layer"])
        >>> res.profile().index.tolist(), 0 <= res.summary["second_half_share"] <= 1
        ([0, 1], True)
    """
    model = load(model)
    shared = make_shared(model, cache)
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise InputError(f"unknown components {sorted(unknown)}", fix=f"use {COMPONENTS}")
    setup = make_setup(model, convention, mode, keep_first, n_future, seed, answer_start)
    batches = model.prepare(data, batch_size)
    windows = plan_windows(setup, batches)
    red, clean_loss = _ablation_means(shared, batches, windows, setup, positions, components)
    rows = [
        {
            "layer": layer,
            "component": component,
            "measure": measure,
            "value": red.value((layer, component, measure)),
        }
        for component in components
        for layer in range(model.n_layers)
        for measure in OUTPUT_MEASURES
    ]
    df = pd.DataFrame(rows)
    df["share"] = np.nan
    summary: dict = {"n_layers": model.n_layers, "clean_loss": clean_loss}
    summary.update(windows.summary())
    if "layer" in components:
        summary.update(_add_shares(df, model.n_layers))
    meta = {"positions": positions, "components": list(components), "model": repr(model)}
    meta.update(setup.meta())
    if setup.mode == "future":
        meta["future_t"] = windows.positions()
    return ContributionResult(df, summary, meta)


@torch.no_grad()
def _ablation_means(
    shared: Shared,
    batches: list,
    windows: Windows,
    setup: Setup,
    positions: str,
    components: Sequence[str],
) -> tuple[Reduction, float]:
    """Every output measure per (layer, component), reduced per the convention, and the
    clean loss (token mean over the selected positions)."""
    red, clean = Reduction(setup.reduction), TokenMeans()
    n_layers, first = shared.model.n_layers, 0
    for batch, ts in zip(batches, windows.ts, strict=True):
        ids = list(range(first, first + batch.tokens.shape[0]))
        first += len(ids)
        side = shared.side(batch)
        mask = position_mask(batch, positions)
        clean.add("clean_loss", side.loss.view(side.shape), loss_mask(batch.labels, mask))
        for inter, measure in slot_masks(batch, ts, positions, setup.keep_first):
            for layer in range(n_layers):
                for component in components:
                    if component == "layer":
                        values = shared.skip(batch, layer, inter).measures
                    else:
                        values = _sublayer_ablated(shared, batch, layer, component, inter)
                    _add_change(red, (layer, component), values, batch.labels, measure, ids)
    return red, clean.mean("clean_loss")


def _sublayer_ablated(
    shared: Shared, batch, layer: int, component: str, inter: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """The output measures with ``component`` of ``layer`` zeroed at the positions in
    ``inter`` (all: None); a hooked forward resumed at ``layer``."""
    trace = shared.trace(batch)
    model = trace.model
    if inter is None:
        hooks = ablate_hooks(model, layer, component)
    else:
        hooks = masked_ablate_hooks(model, layer, component, inter)
    with shared.precision():
        logits = trace.resume(layer, fwd_hooks=hooks)
    check_finite(logits, "the outputs of an intervened forward")
    return output_change(shared.side(batch), logits, batch.labels)


def _add_change(
    red: Reduction,
    key: tuple,
    values: dict[str, torch.Tensor],
    labels: torch.Tensor,
    mask: torch.Tensor,
    ids: list,
) -> None:
    """Add every output measure of one variant under ``key + (measure,)``."""
    for name, per_token in values.items():
        where = loss_mask(labels, mask) if name == "loss_delta" else mask
        red.add(key + (name,), per_token, where, ids)


def _add_shares(df: pd.DataFrame, n_layers: int) -> dict:
    """Fill the whole-layer ``share`` column; return the second-half shares and extremes."""
    summary = {}
    late = list(second_half(n_layers))
    for measure in SHARE_MEASURES:
        sel = (df.component == "layer") & (df.measure == measure)
        total = df.loc[sel, "value"].sum()
        df.loc[sel, "share"] = df.loc[sel, "value"] / total if total > 0 else np.nan
        summary[f"second_half_share_{measure}"] = float(
            df.loc[sel & df.layer.isin(late), "share"].sum()
        )
    summary["second_half_share"] = summary["second_half_share_prob_l2"]
    profile = df[(df.component == "layer") & (df.measure == "prob_l2")].set_index("layer")
    summary["most_important_layer"] = int(profile["value"].idxmax())
    summary["least_important_layer"] = int(profile["value"].idxmin())
    return summary
