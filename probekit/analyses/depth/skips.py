"""Skip-effect matrix: how does skipping layer s change what every later layer writes?

With D_l = h_{l+1} - h_l the update of layer l in the clean forward and D'_l the same update
when layer s is skipped (its output := its input), the per-token relative change is
``||D_l - D'_l||_2 / ||D_l||_2`` for l > s (the measure of Csordas, Manning & Potts 2025), and
the output effect of skipping s is the per-token ``||softmax(z') - softmax(z)||_2``. How the
per-token values are reduced depends on the ``convention`` of the
:class:`~probekit.interventions.InterventionSetting` passed as ``setting=`` (see
:mod:`probekit.analyses.depth.conventions`):

- ``"probekit"`` (default): the mean over all selected tokens of all prompts pooled. This is
  probekit's own choice; the paper's figures use the max below.
- ``"csordas2025"``: the max over the measured tokens, then over the positions t, then over the
  prompts, as in the reference code (denominator clamped at 1e-6, position 0 never skipped).

The setting's ``ablation`` says what the skipped block's update becomes: zero (the default:
the block returns its input), its mean over the data's real tokens (``"mean"``) or the update
of another sequence of the batch at that position (``"resample"``); both are meaningful for
a whole block, so all three kinds apply.

``mode="current"`` skips the layer at every position (>= 1 with ``keep_first``);
``mode="future"`` skips it at positions < t only and measures at positions >= t, the paper's
"future effects". Large values below the diagonal mean later layers build on layer s.

A model without an LM head measures the output effect as ``rel_l2`` (||z' - z|| / ||z|| of its
final hidden state or pooled embedding) instead; ``summary["output"]`` and
``summary["measure"]`` say which.

Depth scores (the summary; all centres of mass over the 0-based skipped layer, also divided
by L - 1 as ``*_normalized``): ``depth_score`` from the output effects m_s,
``sum_s s * m_s / sum_s m_s``; ``depth_score_layer`` from the layer effects
``sum_{l>s} M[s, l] / max(L-1-s, 1)`` (``skip_max_depth.py``; use ``mode="future"`` with
``answer_start`` for the paper's score). Under ``"csordas2025"`` the ``*_prompt_mean`` variants
average the per-prompt maxima over prompts instead of taking their max. Per source layer,
:meth:`SkipEffectResult.influence_centers` gives the centre of mass over the layers it
influences.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = skip_effects(toy_model(n_layers=3), toy_tokens())
    >>> res.matrix().shape, 0 <= res.summary["depth_score_normalized"] <= 1
    ((3, 3), True)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import (
    headline_measure,
    measure_positions,
    output_note,
    result_meta,
)
from probekit.analyses.depth.conventions import (
    Reduction,
    Windows,
    n_slots,
    plan_windows_of,
    relative_from_norms,
    slot_masks,
    window_meta,
)
from probekit.analyses.depth.shared import Shared, make_shared
from probekit.data import Batch, Data
from probekit.interventions import InterventionSetting, Replacement, with_ablation
from probekit.model import Model, load
from probekit.progress import expect, step
from probekit.result import Result
from probekit.words import figure_words


class SkipEffectResult(Result):
    """``df`` columns: ``skipped_layer``, ``target`` ('layer' or 'output'), ``target_layer``
    (the later layer, or -1 for the output), ``value`` (reduced as ``meta['convention']``
    says). ``summary``: ``depth_score``, ``depth_score_layer`` (each also ``_normalized``, and
    ``_prompt_mean`` under 'csordas2025'), ``n_layers``, ``n_prompts``, ``n_prompts_skipped``,
    ``max_downstream_effect``.
    """

    kind = "skip_effects"

    def matrix(self) -> pd.DataFrame:
        """The layers x layers matrix (rows: skipped layer, columns: affected layer)."""
        n = int(self.summary["n_layers"])
        part = self.df[self.df.target == "layer"]
        mat = part.pivot(index="skipped_layer", columns="target_layer", values="value")
        return mat.reindex(index=range(n), columns=range(n))

    def output_effect(self) -> pd.Series:
        """Output effect (||softmax' - softmax||, reduced per the convention) per layer."""
        part = self.df[self.df.target == "output"]
        return part.set_index("skipped_layer")["value"].sort_index()

    def influence_centers(self) -> pd.Series:
        """Per skipped layer s: sum_l l * M[s, l] / sum_l M[s, l] over the layers l > s."""
        mat = self.matrix().to_numpy()
        cols = np.arange(mat.shape[1], dtype=float)
        weights = np.nan_to_num(mat)
        totals = weights.sum(1)
        centers = np.where(
            totals > 0, (weights * cols).sum(1) / np.where(totals > 0, totals, 1), np.nan
        )
        return pd.Series(centers, index=range(mat.shape[0]), name="influence_center")

    def figure(self) -> go.Figure:
        mat = self.matrix()
        return figures.heatmap(
            mat.to_numpy(),
            x=list(mat.columns),
            y=list(mat.index),
            title=figure_words("skip_effects", **self.summary),
            x_title=figure_words("skip_effects", "x"),
            y_title=figure_words("skip_effects", "y"),
            colorbar=figure_words("skip_effects", "colorbar"),
        )


@torch.no_grad()
def skip_effects(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    batch_size: int | None = None,
    setting: InterventionSetting = InterventionSetting(),
    cache: Shared | None = None,
    ablation: str | None = None,
) -> SkipEffectResult:
    """Skip every layer in turn and measure the change of each later layer's update.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data; padding never enters the reductions.
        positions: 'all' real tokens or the 'last' real token of each sequence.
        batch_size: sequences per forward (None: the automatic, memory-bounded choice of
            :meth:`probekit.Model.default_batch_size`); the numbers do not depend on it.
        setting: the :class:`~probekit.interventions.InterventionSetting`: the convention
            ('probekit' token means or 'csordas2025' maxima over tokens, positions t and
            prompts; see :mod:`probekit.analyses.depth.conventions`), the mode ('current':
            skip at every position; 'future': skip at positions < t, measure at positions
            >= t), ``keep_first`` and the positions t (drawn: ``n_future``, ``seed``; or
            given: ``answer_start``). Its ``component_positions`` does not matter here: the
            layer's positions are the same either way.
        cache: a :class:`~probekit.analyses.depth.shared.Shared` cache of one diagnosis (the
            skips ``contributions`` ran are reused, not run again).
        ablation: what the skipped block's update is replaced by: 'zero' (default: the block
            returns its input), 'mean' (its input plus the block's mean update over the data's
            real tokens) or 'resample' (its input plus, per position, the block's update in
            another sequence of the batch, drawn with the setting's ``seed``). A shorthand for
            the setting's ``ablation`` field; None: the setting's.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> from probekit.interventions import InterventionSetting
        >>> res = skip_effects(toy_model(), toy_tokens(length=16),
        ...                    setting=InterventionSetting("csordas2025", mode="future"))
        >>> res.summary["n_prompts_skipped"], 0 <= res.summary["depth_score_layer"] <= 1
        (0, True)
    """
    model = load(model)
    shared = make_shared(model, cache)
    setting = with_ablation(setting, ablation).resolved(model)
    batches, windows = plan_windows_of(model, data, batch_size, setting)
    replacements = shared.replacements(setting, batches)
    reduction = _skip_batches(shared, batches, windows, setting, positions, replacements)
    df = _rows(reduction, model.n_layers)
    summary = {"n_layers": model.n_layers, **windows.summary(), **_scores(df, model.n_layers)}
    summary["ablation"] = setting.ablation
    summary.update(output_note(model))
    if setting.reduction == "max":
        summary.update(_prompt_mean_scores(reduction, model.n_layers))
    within = df[df.target == "layer"]["value"]
    summary["max_downstream_effect"] = float(within.max()) if len(within) else np.nan
    meta = result_meta(
        model, positions=positions, batch_size=batch_size, **window_meta(setting, windows)
    )
    return SkipEffectResult(df, summary, meta)


def _skip_batches(
    shared: Shared,
    batches: list[Batch],
    windows: Windows,
    setting: InterventionSetting,
    positions: str,
    replacements: list[Replacement],
) -> Reduction:
    """Skip every layer in every batch and window; the relative changes, reduced per prompt."""
    reduction = Reduction(setting.reduction)
    first = 0
    expect(n_slots(windows) * shared.model.n_layers)  # the live line's variants
    for batch, ts, replacement in zip(batches, windows.ts, replacements, strict=True):
        ids = list(range(first, first + batch.tokens.shape[0]))
        first += len(ids)
        for intervene_at, measure in slot_masks(batch, ts, positions, bool(setting.keep_first)):
            slot = (intervene_at, measure, replacement)
            _skip_all(shared, batch, reduction, setting.convention, slot, ids)
    return reduction


def _skip_all(
    shared: Shared,
    batch: Batch,
    reduction: Reduction,
    convention: str,
    slot: tuple[torch.Tensor | None, torch.Tensor, Replacement],
    ids: list[int],
) -> None:
    """Skip each layer at the positions ``intervene_at`` (its update replaced as
    ``replacement`` says); reduce the effects over ``measure``; ``slot`` holds the three."""
    intervene_at, measure, replacement = slot
    model = shared.model
    n = model.n_layers
    clean_norms = shared.clean_norms(batch)
    for skipped in range(n):
        record = shared.skip(batch, skipped, intervene_at, replacement)
        for layer in range(skipped + 1, n):
            change = relative_from_norms(record.diffs[layer], clean_norms[layer], convention)
            reduction.add((skipped, layer), change, measure, ids)
        headline = headline_measure(model)
        where = measure_positions(model, headline, batch.labels, measure)
        reduction.add((skipped, "output"), record.measures[headline], where, ids)
        step()


def _rows(reduction: Reduction, n: int, over_prompts: str = "default") -> pd.DataFrame:
    rows = [
        {
            "skipped_layer": s,
            "target": "layer",
            "target_layer": t,
            "value": reduction.value((s, t), over_prompts),
        }
        for s in range(n)
        for t in range(s + 1, n)
    ]
    rows += [
        {
            "skipped_layer": s,
            "target": "output",
            "target_layer": -1,
            "value": reduction.value((s, "output"), over_prompts),
        }
        for s in range(n)
    ]
    return pd.DataFrame(rows)


def _center(weights: np.ndarray) -> float:
    """``sum_i i * w_i / sum_i w_i`` (NaN when the weights sum to 0)."""
    total = weights.sum()
    return float((np.arange(len(weights)) * weights).sum() / total) if total > 0 else np.nan


def layer_effects(df: pd.DataFrame, n: int) -> np.ndarray:
    """Per skipped layer s: ``sum_{l>s} M[s, l] / max(L-1-s, 1)`` (``skip_max_depth.py``)."""
    part = df[df.target == "layer"]
    sums = part.groupby("skipped_layer")["value"].sum().reindex(range(n), fill_value=0.0)
    return sums.to_numpy() / np.maximum(n - 1 - np.arange(n), 1)


def _scores(df: pd.DataFrame, n: int, suffix: str = "") -> dict:
    """Depth scores from the output effect and from the layer effect."""
    out = df[df.target == "output"].sort_values("skipped_layer")["value"].to_numpy()
    score, layer_score = _center(out), _center(layer_effects(df, n))
    norm = n - 1 if n > 1 else np.nan
    return {
        f"depth_score{suffix}": score,
        f"depth_score_normalized{suffix}": score / norm,
        f"depth_score_layer{suffix}": layer_score,
        f"depth_score_layer_normalized{suffix}": layer_score / norm,
    }


def _prompt_mean_scores(reduction: Reduction, n: int) -> dict:
    """The depth scores from per-prompt maxima averaged over prompts (the "mean" variant)."""
    return _scores(_rows(reduction, n, over_prompts="mean"), n, suffix="_prompt_mean")
