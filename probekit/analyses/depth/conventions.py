"""Reduction conventions of the depth analyses and the positions an intervention touches.

Two conventions (the ``convention`` of the :class:`~probekit.interventions.InterventionSetting`
passed as ``setting=`` to :func:`~probekit.skip_effects`, :func:`~probekit.contributions`,
:func:`~probekit.logit_lens` and :func:`~probekit.residual_stats`):

- ``"probekit"`` (default): every per-token measure is averaged over all selected tokens of all
  prompts pooled together (a token mean); a sequence of 10 tokens weighs twice one of 5.
- ``"csordas2025"``: the reductions of the reference code of Csordas, Manning & Potts 2025
  (github.com/RobertCsordas/llm_effective_depth, ``analysis/``). Skip and ablation effects take
  the **max** over the measured tokens, then over the positions t of a prompt, then over the
  prompts (``analyze_current_effects.py``, ``analyze_future_effects.py``); relative changes
  divide by ``max(||D_l||, 1e-6)``; position 0 is never intervened on (``keep_first=True``,
  the reference's ``merge_io(..., no_skip_front=1)``). The logit lens averages over the tokens
  of each prompt, then over the prompts (``logitlens.py``). Residual statistics pool tokens as
  probekit does (``analyze_norms.py``), dividing by ``max(||x||, 1e-6)`` and with torch's
  default cosine eps (1e-8), so the conventions differ there only for norms below 1e-6.

Modes of the skip and ablation analyses:

- ``"current"``: the intervention applies at every position (>= 1 with ``keep_first``) and the
  effect is measured at every selected position;
- ``"future"``: for each prompt of real length T, intervention at ``keep_first <= p < t`` and
  measurement at ``p >= t`` (the layer itself still runs at p >= t). The positions t are
  ``list(range(8, T - 4, 8))``, shuffled by one ``random.Random(seed)`` created per call and
  used prompt by prompt in data order (independent of ``batch_size``), keeping the first
  ``n_future``; or, with ``answer_start``, the positions given per prompt: one int (the
  answer start, as ``skip_max_depth.py`` does for MQuake) or a sequence of ints (its Math
  variant takes up to four positions inside the answer); the effects are maxed over them. A
  prompt too short for any t (T < 13), or given an empty sequence, is skipped and counted in
  the summary (``n_prompts_skipped``); if every prompt is, the analysis raises
  :class:`~probekit.errors.InputError` before any forward.

Positions per component (``component_positions`` of :func:`~probekit.contributions`, future
mode with drawn positions): the reference's ``analyze_future_effects.py`` seeds Python's
``random`` once (123) and runs the parts in the order layer, MLP, attention, each over all
prompts, so the MLP ablations get new positions t drawn after the layer's, and the attention
ablations after the MLP's: one continuing random stream. ``"redrawn"`` does exactly that (the
default under ``"csordas2025"``); ``"shared"`` (the default under ``"probekit"``) uses the
layer's positions for all three, so the components are compared at the same t. The layer's
positions, and so every ``skip_effects`` number, are the same either way.

``keep_first=None`` (default) keeps position 0 untouched when the model's tokenizer adds a BOS
token (position 0 is then the BOS, a sink whose update later layers rely on) and always under
``"csordas2025"``; a model without a tokenizer (an in-memory Hugging Face model) gets ``False``.

Example:
    >>> from probekit.toy import toy_model
    >>> setting = InterventionSetting("csordas2025", "future").resolved(toy_model())
    >>> setting.keep_first, setting.component_positions, future_positions(30, 4, random.Random(123))
    (True, 'redrawn', [24, 16, 8])
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from probekit.analyses.common import TokenMeans
from probekit.data import Batch, position_mask
from probekit.errors import InputError
from probekit.interventions import ANSWER_FIX, InterventionSetting
from probekit.model import Model

DRAW_ORDER = ("layer", "mlp", "attn")
"""The order in which ``component_positions="redrawn"`` draws positions t per component (the
reference's ``run()``: layer, mlp, attention), whichever components are asked for."""
FUTURE_START, FUTURE_STRIDE, FUTURE_MARGIN = 8, 8, 4
CSORDAS_EPS = 1e-6


def future_positions(length: int, n_future: int, rng: random.Random) -> list[int]:
    """The reference's positions t of one prompt: ``range(8, T-4, 8)`` shuffled, first n."""
    ts = list(range(FUTURE_START, length - FUTURE_MARGIN, FUTURE_STRIDE))
    rng.shuffle(ts)
    return ts[:n_future]


@dataclass
class Windows:
    """Per batch, per row: the positions t of that prompt (``[None]`` in current mode)."""

    ts: list[list[list[int | None]]]
    n_prompts: int
    n_skipped: int

    def summary(self) -> dict:
        return {"n_prompts": self.n_prompts, "n_prompts_skipped": self.n_skipped}

    def positions(self) -> list[list[int | None]]:
        return [row for batch in self.ts for row in batch]


def plan_windows(setting: InterventionSetting, batches: list[Batch]) -> Windows:
    """Draw the positions t of every prompt; refuse data where no prompt has one."""
    return _plan(setting, batches, random.Random(setting.seed))


def plan_component_windows(
    setting: InterventionSetting, batches: list[Batch]
) -> dict[str, Windows]:
    """The positions t per component of :data:`DRAW_ORDER`: the layer's for all three
    (``component_positions='shared'``), or drawn component after component from one random
    stream seeded once (``'redrawn'``)."""
    if not setting.redraws:
        windows = plan_windows(setting, batches)
        return dict.fromkeys(DRAW_ORDER, windows)
    rng = random.Random(setting.seed)
    return {component: _plan(setting, batches, rng) for component in DRAW_ORDER}


def _plan(setting: InterventionSetting, batches: list[Batch], rng: random.Random) -> Windows:
    """:func:`plan_windows` drawing from ``rng`` (in future mode without ``answer_start``)."""
    lengths = [int(n) for b in batches for n in b.valid.sum(-1).tolist()]
    if setting.answer_start is not None and len(setting.answer_start) != len(lengths):
        raise InputError(
            f"answer_start has entries for {len(setting.answer_start)} prompts; the data has "
            f"{len(lengths)}",
            fix=ANSWER_FIX,
        )
    rows: list[list[int | None]] = []
    for i, length in enumerate(lengths):
        if setting.mode == "current":
            rows.append([None])
        elif setting.answer_start is not None:
            rows.append(_given(setting, i, length))
        else:
            rows.append(list[int | None](future_positions(length, setting.n_future, rng)))
    skipped = sum(not r for r in rows)
    if skipped == len(rows):
        raise InputError(
            f"no prompt is long enough for mode='future' (needs at least "
            f"{FUTURE_START + FUTURE_MARGIN + 1} real tokens; the longest has {max(lengths)})"
            if setting.answer_start is None
            else "answer_start gives no position for any prompt",
            fix="pass longer prompts, or answer_start=..., or mode='current'",
        )
    out, start = [], 0
    for b in batches:
        out.append(rows[start : start + b.tokens.shape[0]])
        start += b.tokens.shape[0]
    return Windows(out, len(rows), skipped)


def _given(setting: InterventionSetting, i: int, length: int) -> list[int | None]:
    """The ``answer_start`` positions of prompt ``i`` (``length`` real tokens), checked."""
    ts: tuple[int, ...] = setting.answer_start[i]  # type: ignore[index,assignment]
    first = int(bool(setting.keep_first))
    for t in ts:
        if not first < t < length:
            raise InputError(
                f"answer_start[{i}] holds {t}, which leaves nothing to intervene on or to "
                f"measure in a prompt of {length} tokens",
                fix=f"use positions {first + 1} <= t < prompt length",
            )
    return list(ts)


def plan_windows_of(
    model: Model, data: Any, batch_size: int | None, setting: InterventionSetting
) -> tuple[list[Batch], Windows]:
    """The batches of ``data`` and the positions t of every prompt (:func:`plan_windows`):
    what an intervention analyzer does, after resolving its setting
    (:meth:`~probekit.interventions.InterventionSetting.resolved`), before its loop."""
    batches = model.prepare(data, batch_size)
    return batches, plan_windows(setting, batches)


def window_meta(
    setting: InterventionSetting, windows: Windows, per_component: dict[str, Windows] | None = None
) -> dict:
    """The ``meta`` entries of the options, and in future mode the positions t that were used
    (``future_t``: the layer's; with ``per_component`` redrawn also ``future_t_<component>``)."""
    out = setting.meta()
    if setting.mode == "future":
        out["future_t"] = windows.positions()
    if per_component is not None and setting.mode == "future":
        out["component_positions"] = setting.component_positions
        if setting.redraws:
            for component in DRAW_ORDER[1:]:
                out[f"future_t_{component}"] = per_component[component].positions()
    return out


def slot_masks(
    batch: Batch, ts: list[list[int | None]], positions: str, keep_first: bool
) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
    """Per slot j (the j-th t of every prompt): the intervention mask ``[B, T]`` (``None`` =
    every position) and the measurement mask (selected real positions ``>= t``)."""
    selected = position_mask(batch, positions)
    n_pos = batch.tokens.shape[1]
    pos = torch.arange(n_pos, device=selected.device)
    for slot in range(max(len(row) for row in ts)):
        intervene_at = torch.zeros_like(selected)
        measure = torch.zeros_like(selected)
        for b, row in enumerate(ts):
            if slot < len(row):
                start = row[slot]
                t = n_pos if start is None else start
                intervene_at[b] = (pos >= int(keep_first)) & (pos < t)
                measure[b] = selected[b] & (pos >= (0 if start is None else t))
        yield (None if bool(intervene_at.all()) else intervene_at), measure


def n_slots(windows: Windows) -> int:
    """How many :func:`slot_masks` all batches of ``windows`` give (the variants of a live
    progress line are counted per slot)."""
    return sum(max(len(row) for row in ts) for ts in windows.ts)


class Reduction:
    """Reduce per-token values ``[B, T]`` per key: ``'token_mean'`` (all tokens pooled),
    ``'max'`` (per prompt the max, then over prompts) or ``'prompt_mean'`` (per prompt the
    mean, then the mean over prompts).

    Example:
        >>> reduction = Reduction("max")
        >>> values, mask = torch.tensor([[1.0, 5.0], [2.0, 3.0]]), torch.ones(2, 2, dtype=bool)
        >>> reduction.add("x", values, mask, prompt_ids=[0, 1])
        >>> reduction.value("x"), reduction.value("x", over_prompts="mean")
        (5.0, 4.0)
    """

    def __init__(self, how: str) -> None:
        self.how = how
        self.tokens = TokenMeans()
        self.prompts: dict[object, dict[int, list[float]]] = defaultdict(dict)

    def add(
        self, key: object, values: torch.Tensor, mask: torch.Tensor, prompt_ids: Sequence[int]
    ) -> None:
        if self.how == "token_mean":
            self.tokens.add(key, values, mask)
            return
        v = values.double()
        if self.how == "max":
            per_row = torch.where(mask, v, -math.inf).amax(-1).tolist()
        else:
            per_row = torch.where(mask, v, 0.0).sum(-1).tolist()
        counts = mask.sum(-1).tolist()
        store = self.prompts[key]
        for pid, value, count in zip(prompt_ids, per_row, counts, strict=True):
            if count == 0:
                continue
            old = store.setdefault(pid, [-math.inf if self.how == "max" else 0.0, 0])
            old[0] = max(old[0], value) if self.how == "max" else old[0] + value
            old[1] += count

    def per_prompt(self, key: object) -> list[float]:
        """Per prompt (in order of ids): its max, or its token mean."""
        store = self.prompts.get(key, {})
        return [v if self.how == "max" else v / n for _, (v, n) in sorted(store.items())]

    def value(self, key: object, over_prompts: str = "default") -> float:
        """The reduced value (``over_prompts='mean'``: mean of the per-prompt values)."""
        if self.how == "token_mean":
            return self.tokens.mean(key)
        vals = self.per_prompt(key)
        if not vals:
            return float("nan")
        if self.how == "max" and over_prompts != "mean":
            return max(vals)
        return sum(vals) / len(vals)


def relative_change(clean: torch.Tensor, changed: torch.Tensor, convention: str) -> torch.Tensor:
    """Per token ``||clean - changed|| / ||clean||`` (float64; the denominator clamped at 1e-6
    under ``'csordas2025'``, plus 1e-12 under ``'probekit'``)."""
    num = (changed - clean).double().norm(dim=-1)
    return relative_from_norms(num, clean.double().norm(dim=-1), convention)


def relative_from_norms(num: torch.Tensor, den: torch.Tensor, convention: str) -> torch.Tensor:
    """``num / den`` per token, the denominator clamped as :func:`relative_change` says."""
    return num / (den.clamp(min=CSORDAS_EPS) if convention == "csordas2025" else den + 1e-12)
