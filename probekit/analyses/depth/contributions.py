"""Layer contributions by ablation: how much does each layer (and sublayer) change the output?

For each layer l, its whole update is removed (the block's output := its input), and separately
its attention and its MLP update are zeroed. The setting's ``ablation`` (or the ``ablation=``
shorthand) replaces the removed update by its mean over the data's real tokens (``"mean"``)
or by the update of another sequence of the batch at that position (``"resample"``) instead
of zero (see :data:`probekit.interventions.ABLATIONS`). The output change is measured per token (see
:data:`probekit.analyses.common.OUTPUT_MEASURES`) and reduced per ``convention`` (see
:mod:`probekit.analyses.depth.conventions`): ``"probekit"`` (default, probekit's own choice)
averages over all selected tokens of all prompts; ``"csordas2025"`` takes the max over the
measured tokens, then positions t, then prompts, never ablates position 0, and is the
reference code's reduction for ``prob_l2`` (its ``analyze_*_effects.py`` report only that
measure; the others are reduced the same way). These choices come as one
:class:`~probekit.interventions.InterventionSetting` (``setting=``): ``mode="future"``
ablates at positions < t and measures at positions >= t; ``keep_first`` leaves position 0 (a
BOS token) untouched; ``component_positions`` says whether the attention and MLP ablations
use the layer's positions t (``"shared"``) or draw their own after it, as the reference does
(``"redrawn"``, the default under ``"csordas2025"``). Each layer's *share* is its whole-layer
measure divided by the sum over layers; the *second-half share* (layers l >= L/2) is the
depth-curse headline number: static pre-LN models put little of their output in the second
half.

A model without an LM head (a base model's final hidden state, or a sentence-transformers
embedding; see :data:`probekit.analyses.common.HIDDEN_MEASURES`) is measured in hidden space:
``rel_l2`` (||z' - z|| / ||z||, also the share measure and the headline) and ``cos_dist``; its
``clean_loss`` is NaN and ``summary["output"]`` / ``summary["measure"]`` name what was compared.

Fast path: one clean forward keeps the residual entering every block; removing layer l only
changes what comes after it, so the ablated forward resumes at l+1 from the cached residual
(a sublayer ablation runs block l alone inside :func:`probekit.interventions.ablate` and
resumes hook-free at l+1 from its output); the resumed forwards of a batch's variants run
stacked along the batch dimension, block by block
(:meth:`~probekit.analyses.depth.shared.Shared.resume_variants`). Numbers equal a full hooked
forward per variant (within float noise). Given the
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

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import (
    TokenMeans,
    headline_measure,
    loss_mask,
    measure_positions,
    output_measures,
    output_note,
    result_meta,
    second_half,
)
from probekit.analyses.depth.conventions import (
    Reduction,
    Windows,
    n_slots,
    plan_component_windows,
    slot_masks,
    window_meta,
)
from probekit.analyses.depth.shared import Shared, make_shared
from probekit.data import Data, position_mask
from probekit.errors import InputError
from probekit.interventions import (
    InterventionSetting,
    Replacement,
    ablate,
    clean_updates,
    replace_update,
    with_ablation,
)
from probekit.model import Model, load
from probekit.progress import expect, step
from probekit.result import Result
from probekit.words import AXES, ablation_words, figure_words

COMPONENTS = ("layer", "attn", "mlp")
SHARE_MEASURES = ("logit_l2", "kl", "prob_l2")


class ContributionResult(Result):
    """Per (layer, component, measure): the mean output change and, for whole layers, the share.

    ``df`` columns: ``layer``, ``component`` ('layer', 'attn', 'mlp'), ``measure``, ``value``,
    ``share``. ``summary``: ``second_half_share`` (by ``prob_l2``; ``rel_l2`` for a model
    without a head), ``second_half_share_<m>`` for every share measure, ``clean_loss``,
    ``n_layers``, ``most_important_layer``, ``least_important_layer``, ``output`` and
    ``measure`` (what was compared, and the headline measure).
    """

    kind = "contributions"

    def profile(self, measure: str | None = None, component: str = "layer") -> pd.Series:
        """The measure (default: the headline one) per layer for one component."""
        measure = measure or self.summary.get("measure", "prob_l2")
        part = self.df[(self.df.measure == measure) & (self.df.component == component)]
        return part.set_index("layer")["value"].sort_index()

    def second_half_share(self, measure: str | None = None) -> float:
        """Share of the whole-layer ``measure`` from layers ``l >= L/2`` (NaN if not measured)."""
        measure = measure or self.summary.get("measure", "prob_l2")
        part = self.df[(self.df.measure == measure) & (self.df.component == "layer")]
        if part.empty or part["share"].isna().all():
            return float("nan")
        late = part.layer.isin(second_half(int(self.summary["n_layers"])))
        return float(part.loc[late, "share"].sum())

    def figure(self, measure: str | None = None) -> go.Figure:
        measure = measure or self.summary.get("measure", "prob_l2")
        part = self.df[self.df.measure == measure]
        n_layers = int(self.summary["n_layers"])
        fig = figures.bars(
            part,
            "layer",
            "value",
            "component",
            figure_words(
                "contributions",
                ablation=ablation_words(self.meta.get("ablation")),
                measure=figures.words(measure),
                share=self.second_half_share(measure),
            ),
            AXES["layer"],
            figures.words(measure),
        )
        figures.integer_axis(fig, "x", n=n_layers)
        return figures.shade_second_half(fig, n_layers)


@torch.no_grad()
def contributions(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    components: Sequence[str] = COMPONENTS,
    batch_size: int | None = None,
    setting: InterventionSetting = InterventionSetting(),
    cache: Shared | None = None,
    ablation: str | None = None,
) -> ContributionResult:
    """Ablate every layer and sublayer (zero-ablate, by default) and measure the change of the
    output.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data (see :mod:`probekit.data`); padding never enters the reductions.
        positions: 'all' real tokens, or only the 'last' real token of each sequence.
        components: any of 'layer' (whole block), 'attn', 'mlp'.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice of
            :meth:`probekit.Model.default_batch_size`); the numbers do not depend on it.
        setting: the :class:`~probekit.interventions.InterventionSetting`: the convention
            ('probekit' token means or 'csordas2025' maxima over tokens, positions t and
            prompts; see :mod:`probekit.analyses.depth.conventions`), the mode ('current':
            ablate at every position; 'future': ablate at positions < t, measure at positions
            >= t), ``keep_first``, the positions t (drawn: ``n_future``, ``seed``; or given:
            ``answer_start``) and ``component_positions`` (whether the attention and MLP
            ablations use the layer's positions t or draw their own).
        cache: a :class:`~probekit.analyses.depth.shared.Shared` cache of one diagnosis, so
            the clean traces and the whole-layer skips are shared with ``skip_effects``.
        ablation: what a removed update is replaced by: 'zero' (default), 'mean' (its mean
            over the data's real tokens) or 'resample' (per position the update of another
            sequence of the batch, drawn with the setting's ``seed``). A shorthand for the
            setting's ``ablation`` field (:class:`~probekit.interventions.InterventionSetting`),
            which carries it everywhere else (``diagnose``); None: the setting's.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> res = contributions(toy_model(n_layers=2), toy_tokens(), components=["layer"])
        >>> res.profile().index.tolist(), 0 <= res.summary["second_half_share"] <= 1
        ([0, 1], True)
        >>> contributions(toy_model(n_layers=2), toy_tokens(), ablation="mean").summary["ablation"]
        'mean'
    """
    model = load(model)
    shared = make_shared(model, cache)
    if not list(components):
        raise InputError("components=[] asks for no component", fix=f"use some of {COMPONENTS}")
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise InputError(f"unknown components {sorted(unknown)}", fix=f"use {COMPONENTS}")
    setting = with_ablation(setting, ablation).resolved(model)
    batches = model.prepare(data, batch_size)
    windows = plan_component_windows(setting, batches)
    replacements = shared.replacements(setting, batches)
    reduction, clean_loss = _ablation_means(
        shared, batches, windows, setting, positions, components, replacements
    )
    df = _table(model, reduction, components)
    summary: dict = {"n_layers": model.n_layers, "clean_loss": clean_loss, **output_note(model)}
    summary["ablation"] = setting.ablation
    summary.update(windows["layer"].summary())
    if "layer" in components:
        summary.update(_add_shares(df, model.n_layers, model))
    meta = result_meta(
        model,
        positions=positions,
        batch_size=batch_size,
        components=list(components),
        **window_meta(setting, windows["layer"], windows),
    )
    return ContributionResult(df, summary, meta)


def _table(model: Model, reduction: Reduction, components: Sequence[str]) -> pd.DataFrame:
    """One row per component, layer and output measure; ``share`` is filled later."""
    rows = [
        {
            "layer": layer,
            "component": component,
            "measure": measure,
            "value": reduction.value((layer, component, measure)),
        }
        for component in components
        for layer in range(model.n_layers)
        for measure in output_measures(model)
    ]
    df = pd.DataFrame(rows)
    df["share"] = np.nan
    return df


@torch.no_grad()
def _ablation_means(
    shared: Shared,
    batches: list,
    windows: dict[str, Windows],
    setting: InterventionSetting,
    positions: str,
    components: Sequence[str],
    replacements: list[Replacement],
) -> tuple[Reduction, float]:
    """Every output measure per (layer, component), reduced per the convention, and the
    clean loss (token mean over the selected positions). ``windows``: the positions t of
    each component (:func:`~probekit.analyses.depth.conventions.plan_component_windows`)."""
    reduction, clean = Reduction(setting.reduction), TokenMeans()
    n_layers, first = shared.model.n_layers, 0
    expect(sum(n_slots(windows[c]) for c in components) * n_layers)  # the live line's variants
    for i, batch in enumerate(batches):
        ids = list(range(first, first + batch.tokens.shape[0]))
        first += len(ids)
        mask = position_mask(batch, positions)
        if shared.model.output_kind == "logits":  # no loss without a vocabulary: NaN
            side = shared.side(batch)
            clean.add("clean_loss", side.loss.view(side.shape), loss_mask(batch.labels, mask))
        replacement = replacements[i]
        updates = _donor_updates(shared.model, batch, replacement, components)
        for component in components:
            ts = windows[component].ts[i]
            for intervene_at, measure in slot_masks(batch, ts, positions, bool(setting.keep_first)):
                if component == "layer":
                    per_layer: Iterable[dict[str, torch.Tensor]] = (
                        shared.skip(batch, layer, intervene_at, replacement).measures
                        for layer in range(n_layers)
                    )
                else:
                    values = [
                        replacement.update(layer, component, updates.get((layer, component)))
                        for layer in range(n_layers)
                    ]
                    per_layer = _sublayer_ablations(shared, batch, component, intervene_at, values)
                for layer, measures in enumerate(per_layer):
                    key = (layer, component)
                    _add_change(reduction, shared.model, key, measures, batch.labels, measure, ids)
                    step()
    return reduction, clean.mean("clean_loss")


def _donor_updates(
    model: Model, batch, replacement: Replacement, components: Sequence[str]
) -> dict[tuple[int, str], torch.Tensor]:
    """The clean sublayer updates of ``batch`` that resample ablation of the attention and
    MLP takes from other sequences (one hooked forward); nothing for the other kinds."""
    if replacement.kind != "resample" or set(components) <= {"layer"}:
        return {}
    return clean_updates(model, batch)


def _sublayer_ablations(
    shared: Shared,
    batch,
    component: str,
    intervene_at: torch.Tensor | None,
    values: Sequence[torch.Tensor | None],
) -> Iterator[dict[str, torch.Tensor]]:
    """Per layer, in order, the output measures with ``component`` of that layer replaced by
    ``values[layer]`` (None: zeroed) at the positions in ``intervene_at`` (all: None): the
    ablated block runs alone inside :func:`~probekit.interventions.ablate` (zero) or
    :func:`~probekit.interventions.replace_update`, and the forwards resume hook-free from its
    output, stacked (:meth:`~probekit.analyses.depth.shared.Shared.resume_variants`)."""
    trace = shared.trace(batch)
    model = shared.model

    def ablated(layer: int) -> torch.Tensor:
        value = values[layer]
        if value is None:
            replaced = ablate(model, layer, component, at=intervene_at)
        else:
            replaced = replace_update(model, layer, component, value, intervene_at)
        with replaced:
            return trace.run_block(layer, trace.residuals[layer])

    starts = [layer + 1 for layer in range(model.n_layers)]
    for _, final in shared.resume_variants(starts, ablated):
        yield shared.measure_final(final, "the outputs of an intervened forward")


def _add_change(
    reduction: Reduction,
    model: Model,
    key: tuple,
    values: dict[str, torch.Tensor],
    labels: torch.Tensor,
    mask: torch.Tensor,
    ids: list,
) -> None:
    """Add every output measure of one variant under ``key + (measure,)``."""
    for name, per_token in values.items():
        reduction.add(key + (name,), per_token, measure_positions(model, name, labels, mask), ids)


def _add_shares(df: pd.DataFrame, n_layers: int, model: Model) -> dict:
    """Fill the whole-layer ``share`` column; return the second-half shares and extremes."""
    summary = {}
    late = list(second_half(n_layers))
    headline = headline_measure(model)
    shares = SHARE_MEASURES if model.output_kind == "logits" else output_measures(model)
    for measure in shares:
        sel = (df.component == "layer") & (df.measure == measure)
        total = df.loc[sel, "value"].sum()
        df.loc[sel, "share"] = df.loc[sel, "value"] / total if total > 0 else np.nan
        summary[f"second_half_share_{measure}"] = float(
            df.loc[sel & df.layer.isin(late), "share"].sum()
        )
    summary["second_half_share"] = summary[f"second_half_share_{headline}"]
    profile = df[(df.component == "layer") & (df.measure == headline)].set_index("layer")
    summary["most_important_layer"] = int(profile["value"].idxmax())
    summary["least_important_layer"] = int(profile["value"].idxmin())
    return summary
