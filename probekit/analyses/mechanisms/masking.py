"""Token masking: which input positions the prediction at one query position depends on.

:func:`token_masking` replaces the token at each position (or each *role* of task data, see
:meth:`probekit.data.TaskData.roles`) by padding, a fixed mask token or a random resample, and
reports the change of accuracy and of the target's probability at the query position (default:
the last real token), per solution type (the task data's ``answers()``: the anchor task's
``inferential`` and ``symmetric``, then ``other``). Attention-edge knockout is in
:mod:`probekit.analyses.mechanisms.knockout`, the information-flow figure in
:mod:`probekit.analyses.mechanisms.flow`.

Example:
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.toy import TOY_VOCAB, toy_model
    >>> task = AnchorTask(n_train=64, n_test=32, item_high=40, vocab_size=TOY_VOCAB)
    >>> res = token_masking(toy_model("gpt2"), task.dataset("test_task"), by="role")
    >>> list(res.table().index)
    ['anchor1', 'anchor2', 'key', 'noise']
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import DataOrTask, result_meta
from probekit.analyses.mechanisms._rows import (
    MEASURES,
    SELF,
    Rows,
    Scores,
    at_query,
    check_by,
    effects,
    role_units,
    rows,
)
from probekit.data import Batch, task_data
from probekit.errors import InputError
from probekit.model import Model, load
from probekit.result import Result
from probekit.words import figure_words

MASK_MODES = ("pad", "mask", "resample")


class MaskingResult(Result):
    """Effect of masking each position or role on the prediction at the query position.

    ``df`` columns: ``unit`` (position index as text, or role), ``group`` (all, the task data's
    answers such as inferential / symmetric, other), ``measure`` (see :data:`MEASURES`),
    ``value``, ``n``. ``summary``: clean accuracy and target probability per group,
    ``most_important`` (unit with the largest drop of the target's probability) and its
    ``most_important_p_target_delta``.
    """

    kind = "token_masking"

    def table(self, measure: str = "p_target_delta") -> pd.DataFrame:
        """Units x groups table of one measure."""
        part = self.df[self.df.measure == measure]
        return part.pivot(index="unit", columns="group", values="value")

    def figure(self, measure: str = "p_target_delta") -> go.Figure:
        part = self.df[self.df.measure == measure]
        fig = figures.bars(
            part,
            "unit",
            "value",
            "group",
            figure_words(
                "token_masking", mode=self.meta.get("mode", ""), measure=figures.words(measure)
            ),
            figure_words("token_masking", "x", by=self.meta.get("by", "unit")),
            figures.words(measure),
        )
        if self.meta.get("by", "position") == "position":
            figures.integer_axis(fig, "x", n=len(set(part.unit)))
        return fig


def mask_tokens(
    tokens: torch.Tensor,
    where: torch.Tensor,
    mode: str = "pad",
    *,
    pad_token: int = 0,
    mask_token: int | None = None,
    low: int = 1,
    high: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A copy of ``tokens`` with the positions in ``where`` replaced (the input is untouched).

    ``mode``: 'pad' (``pad_token``), 'mask' (``mask_token``) or 'resample' (uniform in
    ``[low, high)``, a fresh draw per position). The attention mask is left as it is.

    Example:
        >>> mask_tokens(torch.tensor([[5, 6, 7]]), torch.tensor([[False, True, False]])).tolist()
        [[5, 0, 7]]
    """
    if mode not in MASK_MODES:
        raise InputError(f"unknown masking mode {mode!r}", fix=f"use one of {MASK_MODES}")
    if mode == "pad":
        fill = torch.full_like(tokens, pad_token)
    elif mode == "mask":
        if mask_token is None:
            raise InputError("mode='mask' needs a mask token", fix="pass mask_token=<token id>")
        fill = torch.full_like(tokens, mask_token)
    else:
        if high is None or high <= low:
            raise InputError(
                f"cannot resample from [{low}, {high})", fix="pass low < high token ids"
            )
        fill = torch.randint(low, high, tokens.shape, generator=generator).to(tokens.device)
    return torch.where(where, fill, tokens)


def _check_tokens(
    model: Model, data: Any, mode: str, mask_token: int | None, pad_token: int, resample: Any
) -> tuple[int, int]:
    """Validate the masking mode and tokens; return the resampling range ``(low, high)``."""
    if mode not in MASK_MODES:
        raise InputError(f"unknown masking mode {mode!r}", fix=f"use one of {MASK_MODES}")
    if mode == "mask" and mask_token is None:
        raise InputError("mode='mask' needs a mask token", fix="pass mask_token=<token id>")
    for what, tok in (("mask_token", mask_token), ("pad_token", pad_token)):
        if tok is not None and not 0 <= int(tok) < model.d_vocab:
            raise InputError(
                f"{what} {tok} is outside the vocabulary [0, {model.d_vocab})",
                fix=f"pick a {what} of this model's vocabulary",
            )
    if resample is None:
        task = task_data(data)
        resample = (1, model.d_vocab) if task is None else task.resample_range
    low, high = (int(v) for v in resample)
    if not 0 <= low < high <= model.d_vocab:
        raise InputError(
            f"resample range [{low}, {high}) is not inside the vocabulary [0, {model.d_vocab})",
            fix="pass resample_range=(low, high) with 0 <= low < high <= d_vocab",
        )
    return low, high


def _mask_units(scored: Rows, by: str) -> dict[str, torch.Tensor]:
    """Bool ``[B, T]`` positions to mask per unit: each real position before the query, or each
    role (never ``self``, the query position)."""
    valid = scored.batch.valid
    if by == "role":
        return {name: where & valid for name, where in role_units(scored).items() if name != SELF}
    out = {}
    for pos in range(scored.batch.tokens.shape[1]):
        where = torch.zeros_like(valid)
        where[:, pos] = True
        out[str(pos)] = where & valid & (pos < scored.query[:, None])
    return out


@torch.no_grad()
def token_masking(
    model: Model,
    data: DataOrTask,
    *,
    by: str = "position",
    mode: str = "pad",
    mask_token: int | None = None,
    pad_token: int = 0,
    resample_range: tuple[int, int] | None = None,
    targets: Any = None,
    positions: str | int = "last",
    batch_size: int | None = None,
    seed: int = 0,
) -> MaskingResult:
    """Mask each input position (or role) and measure the effect at the query position.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: :class:`~probekit.data.TaskData` (targets, roles and solution types come with
            it) or any token data (see :mod:`probekit.data`).
        by: 'position' (each position before the query) or 'role' (each of the task data's
            roles, e.g. key, anchor1, anchor2, noise).
        mode: 'pad' (``pad_token``, default 0), 'mask' (``mask_token``) or 'resample' (uniform
            in ``resample_range``; default the task data's ``resample_range``, else
            [1, d_vocab)).
        targets: one target token per sequence (default: the task data's targets, else the
            clean prediction, so accuracy means "prediction unchanged").
        positions: the query position the effect is measured at: 'last' real token (default)
            or a position index. One position per sequence, unlike the depth analyzers'
            default of 'all': the effect is read where the prediction is scored (the task's
            answer at the last token).
        batch_size: sequences per forward (None: the automatic, memory-bounded choice).
        seed: seed of the resampling (mode 'resample' draws batch by batch, so its numbers
            depend on ``batch_size`` as well as on the seed).
    """
    model = load(model)
    model.require_vocabulary("token_masking (it measures the answer's probability)")
    check_by(by, data, "masking")
    low, high = _check_tokens(model, data, mode, mask_token, pad_token, resample_range)
    generator = torch.Generator().manual_seed(seed)
    scores, units = Scores(), []
    for scored in rows(model, data, targets, batch_size, positions):
        batch, query = scored.batch, scored.query
        clean = at_query(model.forward(batch), query)
        targets_b, members = scores.clean(scored, clean)
        for unit, where in _mask_units(scored, by).items():
            has = where.any(-1)
            if not has.any():
                continue
            tokens = mask_tokens(
                batch.tokens,
                where,
                mode,
                pad_token=pad_token,
                mask_token=mask_token,
                low=low,
                high=high,
                generator=generator,
            )
            changed = model.forward(Batch(tokens, batch.attention_mask, batch.labels))
            scores.add((unit,), effects(clean, at_query(changed, query), targets_b), members, has)
            if unit not in units:
                units.append(unit)
    df = scores.frame([(u,) for u in units], ["unit"])
    meta = result_meta(model, positions=positions, batch_size=batch_size, by=by, mode=mode)
    return MaskingResult(df, _summary(scores, df), meta)


def _summary(scores: Scores, df: pd.DataFrame) -> dict[str, Any]:
    """The clean statistics per group, and the unit whose masking lowers the target's
    probability most (``most_important`` and its ``most_important_p_target_delta``)."""
    summary = scores.summary()
    drops = df[(df.group == "all") & (df.measure == "p_target_delta")]
    if len(drops):
        worst = drops.loc[drops.value.idxmin()]
        summary["most_important"] = worst.unit
        summary["most_important_p_target_delta"] = float(worst.value)
    return summary


__all__ = ["MASK_MODES", "MEASURES", "MaskingResult", "mask_tokens", "token_masking"]
