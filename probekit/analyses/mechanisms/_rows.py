"""Rows of samples scored at one query position: the data adapter, the effect measures and the
tidy frame that token masking and attention knockout share.

Task knowledge comes only through :class:`probekit.data.TaskData`: its ``targets`` (default
targets), its ``answers()`` (the solution types a clean prediction is sorted into) and its
``roles()`` (the position units of ``by="role"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from probekit.analyses.common import DataOrTask, TokenMeans, check_outputs_finite
from probekit.data import Batch, TaskData, position_mask, task_data
from probekit.errors import InputError
from probekit.model import Model

MEASURES = ("p_target_delta", "accuracy_delta", "kl", "prob_l2", "pred_changed")
"""Effects at the query position, per sample, averaged: change of the target's probability, of
accuracy (argmax == target), KL(clean || changed), ||p' - p||_2, share of changed argmaxes."""

SELF = "self"
"""The unit of the query position where no single-position role marks it."""


@dataclass
class Rows:
    """One batch of samples with what the analyses score them by."""

    batch: Batch
    query: torch.Tensor  # [B] query position
    targets: torch.Tensor | None  # [B]; None = the clean argmax
    answers: dict[str, torch.Tensor]  # named alternative answers [B] (TaskData.answers())
    roles: dict[str, torch.Tensor]  # named bool position masks [B, T] (TaskData.roles())


def check_by(by: str, data: DataOrTask, what: str) -> None:
    """``by`` is 'position' or 'role'; 'role' needs task data."""
    if by not in ("position", "role"):
        raise InputError(f"unknown {what} unit by={by!r}", fix="use by='position' or 'role'")
    if by == "role" and task_data(data) is None:
        raise InputError(
            "by='role' needs anchor-task data (any probekit.data.TaskData, whose roles() name "
            "the positions)",
            fix="pass task.dataset(split), or by='position'",
        )


def _query(batch: Batch, positions: str | int) -> torch.Tensor:
    """``[B]`` query position of each row: the last real token, or one index for all rows."""
    if positions == "last":
        return position_mask(batch, "last").long().argmax(-1)
    t = batch.tokens.shape[1]
    if isinstance(positions, str) or not -t <= int(positions) < t:
        raise InputError(
            f"query position positions={positions!r} is not 'last' or one of the {t} positions",
            fix="use positions='last' or a position index",
        )
    n, dev = len(batch.tokens), batch.tokens.device
    return torch.full((n,), int(positions) % t, dtype=torch.long, device=dev)


def _checked_targets(targets: Any, n: int, d_vocab: int) -> torch.Tensor:
    """``targets`` as ``[n]`` long token ids of the vocabulary, else :class:`InputError`."""
    try:
        targets = torch.as_tensor(targets).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InputError(
            f"targets {targets!r:.60} are not token ids ({err})",
            fix="give one integer target token per sequence",
        ) from err
    if len(targets) != n:
        raise InputError(
            f"{len(targets)} targets for {n} sequences", fix="give one target per sequence"
        )
    whole = targets.dtype.is_floating_point and bool((targets == targets.round()).all())
    if (
        targets.dtype.is_complex
        or targets.dtype == torch.bool
        or (targets.dtype.is_floating_point and not whole)
    ):
        raise InputError(
            f"targets of dtype {targets.dtype} are not token ids",
            fix="give integer target token ids",
        )
    bad = targets[(targets < 0) | (targets >= d_vocab)]
    if len(bad):
        raise InputError(
            f"target {int(bad[0])} is outside the vocabulary [0, {d_vocab})",
            fix="give target token ids of this model's vocabulary",
        )
    return targets.long()


def rows(
    model: Model,
    data: DataOrTask,
    targets: Any,
    batch_size: int | None,
    positions: str | int,
) -> list[Rows]:
    """``data`` (token data or :class:`~probekit.data.TaskData`) as batches of :class:`Rows`."""
    task = task_data(data)
    if task is not None:
        batches = model.prepare(task.tokens, batch_size)
        targets = task.targets if targets is None else targets
        answers, roles = dict(task.answers()), dict(task.roles())
    else:
        assert not isinstance(data, TaskData), "task_data() takes every TaskData"
        batches = model.prepare(data, batch_size)
        answers, roles = {}, {}
    n = sum(len(b.tokens) for b in batches)
    if targets is not None:
        targets = _checked_targets(targets, n, model.d_vocab)
    out, start = [], 0
    for batch in batches:
        sl, dev = slice(start, start + len(batch.tokens)), batch.tokens.device
        start = sl.stop
        out.append(
            Rows(
                batch,
                _query(batch, positions),
                None if targets is None else targets[sl].to(dev),
                {k: torch.as_tensor(v)[sl].to(dev) for k, v in answers.items()},
                {k: torch.as_tensor(v)[sl].to(dev).bool() for k, v in roles.items()},
            )
        )
    return out


def role_units(rows: Rows) -> dict[str, torch.Tensor]:
    """Bool ``[B, T]`` positions of each role, then of :data:`SELF`.

    A role that marks one position in every row (a token of its own, e.g. the anchor task's key
    and anchors) is taken as it is, the query position included. A role spread over several
    positions (e.g. the anchor task's noise) is taken before the query only; the query position
    is then the unit ``self``, unless a single-position role marks it.
    """
    b, t = rows.batch.tokens.shape
    pos = torch.arange(t, device=rows.query.device)[None].expand(b, t)
    before = pos < rows.query[:, None]
    out, single = {}, torch.zeros(b, t, dtype=torch.bool, device=pos.device)
    for name, mask in rows.roles.items():
        if bool((mask.sum(-1) == 1).all()):
            out[name] = mask
            single |= mask
        else:
            out[name] = mask & before
    out[SELF] = (pos == rows.query[:, None]) & ~single
    return out


def groups(rows: Rows, pred: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sample masks per solution type of the clean prediction: 'all', then one per answer of
    the task data (first match wins), then 'other'."""
    out = {"all": torch.ones_like(pred, dtype=torch.bool)}
    if rows.answers:
        taken = torch.zeros_like(out["all"])
        for name, answer in rows.answers.items():
            out[name] = (pred == answer) & (answer >= 0) & ~taken
            taken |= out[name]
        out["other"] = ~taken
    return out


def at_query(logits: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``[B, vocab]`` float64 logits at each row's query position."""
    return logits[torch.arange(len(query), device=logits.device), query].double()


def effects(clean: torch.Tensor, changed: torch.Tensor, targets: torch.Tensor) -> dict:
    """Per-sample :data:`MEASURES` of ``changed`` against ``clean`` logits."""
    check_outputs_finite(changed, "the outputs of an intervened forward")
    logp, logq = clean.log_softmax(-1), changed.log_softmax(-1)
    p, q = logp.exp(), logq.exp()
    idx = targets[:, None]
    pred, pred2 = clean.argmax(-1), changed.argmax(-1)
    return {
        "p_target_delta": (q.gather(-1, idx) - p.gather(-1, idx))[:, 0],
        "accuracy_delta": (pred2 == targets).double() - (pred == targets).double(),
        "kl": (p * (logp - logq)).sum(-1),
        "prob_l2": (q - p).norm(dim=-1),
        "pred_changed": (pred2 != pred).double(),
    }


class Scores:
    """Accumulates clean statistics and effects per (unit key, group, measure)."""

    def __init__(self) -> None:
        self.acc = TokenMeans()
        self.groups: list[str] = []

    def clean(self, rows: Rows, clean: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Record the clean accuracy and target probability; return (targets, groups)."""
        check_outputs_finite(clean)
        targets = clean.argmax(-1) if rows.targets is None else rows.targets
        members = groups(rows, clean.argmax(-1))
        self.groups += [g for g in members if g not in self.groups]
        p = clean.softmax(-1).gather(-1, targets[:, None])[:, 0]
        correct = (clean.argmax(-1) == targets).double()
        for group, sel in members.items():
            self.acc.add(("clean", group, "p_target"), p, sel)
            self.acc.add(("clean", group, "accuracy"), correct, sel)
        return targets, members

    def add(self, key: tuple, values: dict, members: dict, where: torch.Tensor) -> None:
        """Add per-sample ``values`` of the samples in ``where`` under ``key``, per group."""
        for group, sel in members.items():
            for name, v in values.items():
                self.acc.add(key + (group, name), v, sel & where)

    def frame(self, keys: list[tuple], columns: list[str]) -> pd.DataFrame:
        """Tidy ``df``: ``columns``, group, measure, value, n (groups without samples left out)."""
        acc, out = self.acc, []
        for key in keys:
            for group in self.groups:
                if acc.counts.get(key + (group, "kl"), 0) == 0:
                    continue
                for name in MEASURES:
                    out.append(
                        {
                            **dict(zip(columns, key, strict=True)),
                            "group": group,
                            "measure": name,
                            "value": acc.mean(key + (group, name)),
                            "n": acc.counts[key + (group, name)],
                        }
                    )
        return pd.DataFrame(out, columns=[*columns, "group", "measure", "value", "n"])

    def summary(self) -> dict[str, Any]:
        """Clean accuracy, target probability and sample count of each group."""
        out: dict[str, Any] = {}
        for group in self.groups:
            if self.acc.counts.get(("clean", group, "accuracy"), 0):
                out[f"clean_accuracy_{group}"] = self.acc.mean(("clean", group, "accuracy"))
                out[f"clean_p_target_{group}"] = self.acc.mean(("clean", group, "p_target"))
                out[f"n_{group}"] = self.acc.counts[("clean", group, "accuracy")]
        return out
