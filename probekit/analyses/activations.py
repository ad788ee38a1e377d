"""Activations one site at a time, and the positions single-position readers take them at.

Shared by the probes, the hidden-state maps and the pair cosines. Task knowledge comes only
through :class:`probekit.data.TaskData` (its ``tokens`` and ``roles()``).

Positions a single-position reader understands (one position per sequence): ``"last"`` (the
last real token), an index (negative from the end), or a role name of the task data whose mask
marks exactly one position in every sequence (the anchor task: ``"key"``, ``"anchor1"``,
``"anchor2"``).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model("gpt2", n_layers=2)
    >>> _, batches = batches_of(model, toy_tokens(3, 5), batch_size=2)
    >>> acts, valid = gather(model, batches, model.hook_name(0, "resid_out"))
    >>> acts.shape, bool(valid.all())
    ((3, 5, 32), True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from probekit.data import Batch, TaskData, task_data
from probekit.errors import InputError
from probekit.model import Model

Position = int | str


def batches_of(
    model: Model, data: Any, batch_size: int | None
) -> tuple[TaskData | None, list[Batch]]:
    """``data`` as task data (or ``None`` for plain token data) and the model's batches of it.

    A list of task data sets is concatenated into one (e.g. seen and held-out pairs).
    """
    task = task_data(data)
    return task, model.prepare(task.tokens if task is not None else data, batch_size)


@torch.no_grad()
def gather(model: Model, batches: list[Batch], hook: str) -> tuple[np.ndarray, np.ndarray]:
    """Activations ``[n, pos, d]`` at one hook over all batches, and the valid mask ``[n, pos]``.

    Only this hook's activations are kept (one site at a time, never every hook at once).
    """
    chunks: list[np.ndarray] = []
    valid: list[np.ndarray] = []

    def keep(tensor: torch.Tensor, hook: Any) -> None:
        chunks.append(tensor.detach().float().cpu().numpy())

    for batch in batches:
        model.forward(batch, [(hook, keep)])
        valid.append(batch.valid.cpu().numpy())
    return np.concatenate(chunks), np.concatenate(valid)


def row_positions(pos: Position, task: TaskData | None, valid: np.ndarray) -> np.ndarray:
    """Position index per sequence of one single-position selection (see module docstring)."""
    n, n_pos = valid.shape
    if pos == "last":
        return valid.cumsum(-1).argmax(-1)
    if isinstance(pos, str):
        roles = task.roles() if task is not None else {}
        if pos not in roles:
            raise InputError(
                f"unknown position {pos!r}"
                + ("" if task is not None else " (plain token data has no roles)"),
                fix=f"use 'last', an index, or a role among {sorted(roles)}",
            )
        mask = np.asarray(roles[pos], dtype=bool)
        if not (mask.sum(-1) == 1).all():
            raise InputError(
                f"role {pos!r} does not mark exactly one position in every sequence",
                fix="read single positions at a one-position role, 'last' or an index",
            )
        return mask.argmax(-1)
    if not -n_pos <= int(pos) < n_pos:
        raise InputError(
            f"position {pos} is outside the {n_pos} positions",
            fix=f"use positions in -{n_pos}..{n_pos - 1}",
        )
    return np.full(n, int(pos) % n_pos, dtype=np.int64)


def single_roles(task: TaskData | None) -> list[str]:
    """The roles of ``task`` that mark exactly one position in every sequence."""
    if task is None:
        return []
    return [r for r, m in task.roles().items() if bool((torch.as_tensor(m).sum(-1) == 1).all())]


def states_at(
    model: Model, batches: list[Batch], hook: str, task: TaskData | None, pos: Position
) -> np.ndarray:
    """The state ``[n, d]`` at one hook and one position per sequence."""
    acts, valid = gather(model, batches, hook)
    return acts[np.arange(len(acts)), row_positions(pos, task, valid)]


def position_list(positions: str | Sequence[Position], n_pos: int) -> list[Position]:
    """Normalise a list of single positions: indices in range (sorted, unique), names kept."""
    if isinstance(positions, str):
        return [positions]
    names = [p for p in positions if isinstance(p, str)]
    out = []
    for p in positions:
        if isinstance(p, str):
            continue
        if not -n_pos <= int(p) < n_pos:
            raise InputError(
                f"position {p} is outside the {n_pos} positions",
                fix=f"use positions in -{n_pos}..{n_pos - 1}",
            )
        out.append(int(p) % n_pos)
    return [*sorted(set(out)), *dict.fromkeys(names)]


__all__ = ["batches_of", "gather", "position_list", "row_positions", "single_roles", "states_at"]
