"""Evaluation of a stack of anchor runs on every split (the rows of ``metrics.jsonl``).

:class:`Evaluator` scores each run of a stack on the training split (its first
``eval_train_samples`` sequences), ``test_data`` and ``test_task``: loss and accuracy on the last
token, and on the held-out ``test_task`` pairs how often the answer is the inferential
(composite) one, the symmetric one, or neither; and the accuracy of every anchor pair on each
split (:data:`PAIR_ACC`).

Example:
    >>> from probekit.anchor import AnchorTask
    >>> from probekit.training.models import ModelConfig, init_stacked_params
    >>> cfg = ModelConfig(d_model=16, n_heads=2)
    >>> params = init_stacked_params([cfg], [0])
    >>> ev = Evaluator(AnchorTask(n_train=64, n_test=16), 32, torch.device("cpu"))
    >>> scores = ev(params, cfg)
    >>> sorted(scores[0])[:3]
    ['test_data_acc', 'test_data_loss', 'test_task_acc']
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from probekit.anchor.data import AnchorData
from probekit.anchor.task import AnchorTask
from probekit.training.models import ModelConfig, stacked_forward
from probekit.training.precision import autocast

FIELDS = ("tokens", "targets", "composite", "symmetric")


class Evaluator:
    """Scores every run of a stack on the task's splits (see the module docstring)."""

    def __init__(
        self,
        task: AnchorTask,
        train_samples: int,
        device: torch.device,
        train: AnchorData | None = None,
        precision: str = "auto",
    ) -> None:
        train = task.dataset("train") if train is None else train
        fields: dict[str, Any] = {
            k: (v[:train_samples] if torch.is_tensor(v) else v) for k, v in train.__dict__.items()
        }
        head = AnchorData(**fields)
        sets = {
            "train": head,
            "test_data": task.dataset("test_data"),
            "test_task": task.dataset("test_task"),
        }
        self.device, self.precision = device, precision
        self.sets = {k: {f: getattr(v, f).to(device) for f in FIELDS} for k, v in sets.items()}
        self.groups = {k: _pair_groups(v, device) for k, v in sets.items()}

    def _logits(
        self, params: dict[str, torch.Tensor], cfg: ModelConfig, tokens: torch.Tensor, M: int
    ) -> torch.Tensor:
        """Last-token logits ``[M, n, vocab]`` of every run on the same ``tokens``."""
        with autocast(self.device, self.precision):
            return stacked_forward(params, tokens[None].expand(M, -1, -1), cfg).float()

    def _split(self, params, cfg, d: dict[str, torch.Tensor], M: int) -> dict[str, torch.Tensor]:
        chunk = max(1, 8192 // M)
        preds, losses = [], []
        for i in range(0, d["tokens"].shape[0], chunk):
            logits = self._logits(params, cfg, d["tokens"][i : i + chunk], M)
            tgt = d["targets"][i : i + chunk]
            losses.append(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), tgt.repeat(M), reduction="none"
                ).view(M, -1)
            )
            preds.append(logits.argmax(-1))
        pred = torch.cat(preds, 1)
        return {
            "pred": pred,
            "loss": torch.cat(losses, 1).mean(1).cpu(),
            "acc": (pred == d["targets"]).float().mean(1).cpu(),
        }

    @torch.no_grad()
    def __call__(
        self, params: dict[str, torch.Tensor], cfg: ModelConfig, per_pair: bool = False
    ) -> list[dict[str, Any]]:
        """One dict of scores per run of the stack ``params``; with ``per_pair`` also the
        accuracy of every pair on every split (the entry :data:`PAIR_ACC`)."""
        M = next(iter(params.values())).shape[0]
        rows: list[dict[str, Any]] = [{} for _ in range(M)]
        pairs: list[dict[str, Any]] = [{} for _ in range(M)]
        for split, d in self.sets.items():
            r = self._split(params, cfg, d, M)
            accuracy = _per_pair_accuracy(r["pred"] == d["targets"], *self.groups[split])
            for m in range(M):
                rows[m][f"{split}_loss"] = float(r["loss"][m])
                rows[m][f"{split}_acc"] = float(r["acc"][m])
                if split == "test_task":
                    rows[m].update(_answer_kinds(r["pred"][m], d))
                pairs[m][split] = accuracy[m]
        for m in range(M):
            if per_pair:
                rows[m][PAIR_ACC] = pairs[m]
        return rows


# --- per-pair metrics ---
PAIR_ACC = "pair_acc"
"""The metrics row entry of the per-pair accuracies: ``{split: {"(a1,a2)": accuracy}}`` for
the splits ``train`` (seen pairs on training keys, the first ``eval_train_samples``
sequences), ``test_data`` (seen pairs on test keys) and ``test_task`` (held-out pairs, all
keys); a pair (a chain ``"(a1,a2,a3)"`` at chain length 3) absent from a split has no entry."""


def _pair_groups(data: AnchorData, device: torch.device) -> tuple[torch.Tensor, list[str]]:
    """The index of every sequence's pair among the split's pairs, and the pairs' names."""
    names = data.groups()
    order = sorted(set(names), key=lambda n: [int(a) for a in n.strip("()").split(",")])
    index = {name: i for i, name in enumerate(order)}
    return torch.tensor([index[n] for n in names], dtype=torch.long, device=device), order


def _per_pair_accuracy(
    correct: torch.Tensor, group: torch.Tensor, names: list[str]
) -> list[dict[str, float]]:
    """Per run of ``correct`` ``[M, n]``, the accuracy of each pair ``{name: accuracy}``."""
    sums = torch.zeros(correct.shape[0], len(names), dtype=torch.float64, device=correct.device)
    sums.index_add_(1, group, correct.double())
    counts = torch.bincount(group, minlength=len(names)).double()
    acc = (sums / counts).cpu().tolist()
    return [dict(zip(names, run, strict=True)) for run in acc]


def _answer_kinds(pred: torch.Tensor, d: dict[str, torch.Tensor]) -> dict[str, float]:
    """How often the held-out answers are inferential, symmetric or neither."""
    inf = pred == d["composite"]
    sym = pred == d["symmetric"]
    return {
        "test_task_inferential": float(inf.float().mean().cpu()),
        "test_task_symmetric": float(sym.float().mean().cpu()),
        "test_task_other": float(1 - ((inf | sym).float().mean())),
    }


__all__ = ["PAIR_ACC", "Evaluator"]
