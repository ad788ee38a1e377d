"""Token data as analyzers take it: batches of token ids with an optional mask and labels.

Analyzers accept a token tensor ``[batch, pos]``, a ``(tokens, attention_mask)`` tuple, a dict
with ``input_ids`` (or ``tokens``), ``attention_mask`` and ``labels`` keys (and optionally a
``description`` in words, see :func:`describe`), a :class:`Batch`, or a list of any of these (one
entry per batch; averages are then taken over all valid tokens of all batches, never by averaging
batch means). Task data (:class:`TaskData`) also say what their answers mean.

Token ids may have any integer dtype (``uint8`` and ``int16`` included: they are read as the
same ids in ``int64``). A 1-D tensor is one sequence (a batch of one). The batches of a list
may differ in length: each runs as it is, and the averages are over all their valid tokens;
analyses that stack positions across sequences (:func:`~probekit.analyses.linear_probes`) and
``Model.logits``, which returns one tensor, need one length and say so. Plain Python lists of
token ids (``[[1, 2, 3], [4, 5]]``) are refused with the way to pass them:
``torch.tensor(ids)``, or for sequences of different lengths the padded ids with an attention
mask (what a tokenizer returns with ``padding=True``).

``labels[b, t]`` is the token the model should predict *at* position ``t`` (``-100`` = no target).
When labels are omitted, the model handle fills them in: the next token for decoders, the token
itself for masked-LM encoders.

Example:
    >>> import torch
    >>> [b] = as_batches(torch.tensor([[5, 6, 7]]))
    >>> b.tokens.shape, b.attention_mask is None
    (torch.Size([1, 3]), True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

import torch

from probekit.errors import InputError


@dataclass
class Batch:
    """One batch: ``tokens [B, T]``, ``attention_mask [B, T]`` (1 = real token), ``labels``."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor | None = None
    labels: torch.Tensor | None = None

    @property
    def valid(self) -> torch.Tensor:
        """Bool mask of real (non-padding) tokens."""
        if self.attention_mask is None:
            return torch.ones_like(self.tokens, dtype=torch.bool)
        return self.attention_mask.bool()

    def to(self, device: torch.device | str) -> Batch:
        """Move all tensors to ``device``."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Batch(self.tokens.to(device), move(self.attention_mask), move(self.labels))


Data = Union[torch.Tensor, Batch, Mapping[str, Any], tuple, list]  # noqa: UP007


def right_padded(batch: Batch) -> Batch:
    """``batch`` with left-padded rows (mask ``0 ... 0 1 ... 1``, the default padding side of
    many decoder tokenizers) moved to right padding (``1 ... 1 0 ... 0``): each row's tokens,
    mask and labels shift left by its number of leading padding positions, so the real tokens
    start at position 0 and every number equals that of the right-padded input. Rows already
    right-padded are unchanged; a mask of another shape or kind is returned as is for the
    model's checks to name. Positions in results then count from each row's first real token.

    Example:
        >>> b = right_padded(Batch(torch.tensor([[0, 0, 7, 8]]), torch.tensor([[0, 0, 1, 1]])))
        >>> b.tokens.tolist(), b.attention_mask.tolist()
        ([[7, 8, 0, 0]], [[1, 1, 0, 0]])
    """
    mask = batch.attention_mask
    if mask is None or mask.shape != batch.tokens.shape or mask.is_complex() or mask.ndim != 2:
        return batch
    real = mask != 0
    leading = torch.where(real.any(-1), real.int().argmax(-1), 0)
    if not bool(leading.any()):
        return batch
    steps = torch.arange(mask.shape[-1], device=mask.device)
    index = (steps + leading[:, None]) % mask.shape[-1]
    labels = batch.labels
    if labels is not None and labels.shape == mask.shape:
        labels = labels.gather(-1, index.to(labels.device))
    return Batch(
        batch.tokens.gather(-1, index.to(batch.tokens.device)), mask.gather(-1, index), labels
    )


def _one_batch(item: Any) -> Batch:
    if isinstance(item, Batch):
        return item
    if isinstance(item, torch.Tensor):
        return Batch(item)
    if isinstance(item, Mapping):
        tokens = item.get("input_ids", item.get("tokens"))
        if tokens is None:
            raise InputError(
                f"a data dict has no 'input_ids' or 'tokens' key (keys: {sorted(item)})",
                fix="pass {'input_ids': tokens, 'attention_mask': mask}",
            )
        return Batch(_tensor(tokens), _opt(item.get("attention_mask")), _opt(item.get("labels")))
    if isinstance(item, tuple) and 1 <= len(item) <= 3:
        tokens, *rest = item
        if tokens is None:
            raise InputError(
                "a data tuple's first item (the tokens) is None",
                fix="pass (tokens, attention_mask, labels) with the tokens first",
            )
        return Batch(_tensor(tokens), *(_opt(x) for x in rest))
    if isinstance(item, list | int):
        raise InputError(
            "a plain list of token ids is not read as tokens (a list is a list of batches)",
            fix="pass torch.tensor(ids) for sequences of one length; for sequences of different "
            "lengths pad them to one length and pass (tokens, attention_mask), 0 marking the "
            "padding (a tokenizer called with padding=True returns both)",
        )
    raise InputError(
        f"cannot read data of type {type(item).__name__}",
        fix="pass a token tensor [batch, pos], a (tokens, attention_mask) tuple, a dict with "
        "'input_ids', or a list of these",
    )


def check_one_length(batches: Sequence[Batch], what: str) -> int:
    """The one sequence length of ``batches``; :class:`InputError` when they differ, saying
    that ``what`` needs one length and how to get it."""
    lengths = sorted({int(b.tokens.shape[-1]) for b in batches})
    if len(lengths) > 1:
        raise InputError(
            f"{what} needs sequences of one length, but the batches have lengths {lengths}",
            fix="pad every sequence to one length and pass (tokens, attention_mask) in one batch "
            "(0 marks the padding)",
        )
    return lengths[0]


def _tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _opt(x: Any) -> torch.Tensor | None:
    return None if x is None else _tensor(x)


def check_batch_size(batch_size: Any) -> None:
    """``batch_size`` must be ``None`` (the automatic choice) or a whole count of at least 1.

    Example:
        >>> check_batch_size(2.5)
        Traceback (most recent call last):
        ...
        probekit.errors.InputError: batch_size=2.5 is not a whole count of sequences. Fix: \
pass batch_size=None (the automatic choice) or an integer of at least 1.
    """
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not hasattr(batch_size, "__index__") or batch_size < 1:
        raise InputError(
            f"batch_size={batch_size!r} is not a whole count of sequences",
            fix="pass batch_size=None (the automatic choice) or an integer of at least 1",
        )


def as_batches(data: Data, batch_size: int | None = None) -> list[Batch]:
    """Normalise any accepted data form into a list of :class:`Batch`.

    ``batch_size`` splits each batch further into chunks of at most that many sequences.
    """
    check_batch_size(batch_size)
    if isinstance(data, list) or (
        isinstance(data, Iterable) and not isinstance(data, torch.Tensor | Mapping | tuple | Batch)
    ):
        items = [_one_batch(x) for x in data]
    else:
        items = [_one_batch(data)]
    if not items:
        raise InputError("the data is empty (no batches)", fix="pass at least one sequence")
    out: list[Batch] = []
    for b in items:
        if b.tokens.ndim == 1:
            b = Batch(
                b.tokens[None],
                None if b.attention_mask is None else b.attention_mask.reshape(1, -1),
                None if b.labels is None else b.labels.reshape(1, -1),
            )
        if batch_size is None or b.tokens.shape[0] <= batch_size:
            out.append(b)
            continue
        for start in range(0, b.tokens.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            out.append(
                Batch(
                    b.tokens[sl],
                    None if b.attention_mask is None else b.attention_mask[sl],
                    None if b.labels is None else b.labels[sl],
                )
            )
    return out


POSITIONS = ("all", "last")
"""The position selections every analyzer understands. ``"all"``: every real token;
``"last"``: the last real token of each sequence. Task data (:class:`TaskData`) adds its role
names (the anchor task: ``"key"``, ``"anchor1"``, ``"anchor2"``, ``"noise"``); analyzers
that read single positions also take a list of position indices."""


def position_mask(batch: Batch, positions: str) -> torch.Tensor:
    """Bool mask ``[B, T]`` of the positions a measure is averaged over.

    ``positions="all"``: every real token; ``"last"``: the last real token of each sequence.
    """
    valid = batch.valid
    if positions == "all":
        return valid
    if positions == "last":
        last = valid.long().cumsum(-1).argmax(-1)
        out = torch.zeros_like(valid)
        has_any = valid.any(-1)
        out[torch.arange(valid.shape[0], device=valid.device)[has_any], last[has_any]] = True
        return out
    raise InputError(f"unknown positions={positions!r}", fix="use positions='all' or 'last'")


@dataclass(frozen=True)
class SolutionWording:
    """How figures and reports speak of a task's solutions (:meth:`TaskData.solution_wording`).

    ``groups``: the groups in a short plural (the anchor task: ``"pairs"``, as in "seen
    pairs"); ``reference``: the first answer category's answer, which the figure's histogram
    subtracts from the prediction (``"composite"``); ``seen_scope`` / ``heldout_scope``: which
    sequences of the seen and of the held-out groups are scored (``"test keys"``, ``"all
    keys"``); ``target``: a seen group's correct answer (``"trained target"``); ``memorizing``:
    the solution of a model that gets the seen groups wrong; ``title`` and ``explain``: the
    report section's heading and what its figure shows; ``conclusion``: the section's sentence,
    a :meth:`str.format` template over the solution summary (``{solution}``,
    ``{heldout_<category>}``, ...; a missing number reads "n/a").

    Example:
        >>> SolutionWording(groups="prompts").conclusion.format(solution="copying")
        'Solution: copying.'
    """

    groups: str = "groups"
    reference: str = "reference answer"
    seen_scope: str = "all sequences"
    heldout_scope: str = "all sequences"
    target: str = "target"
    memorizing: str = "memorizing"
    title: str = "Solution type on the held-out groups"
    explain: str = (
        "The figure shows, for each group, the share of outputs in each answer category; the "
        "held-out groups tell the solutions apart."
    )
    conclusion: str = "Solution: {solution}."


@runtime_checkable
class TaskData(Protocol):
    """Sequences of a task with what task-aware analyzers ask about them.

    Analyzers (token masking, attention knockout, probes, hidden-state maps, solution types)
    know nothing of any task: they ask data of this shape. Every per-sequence field has one
    entry per row of ``tokens``; each sequence is scored at its last position.

    - ``tokens`` ``[n, T]`` long token ids (no padding);
    - ``targets`` ``[n]``: the token the sequence is scored against;
    - ``groups()``: one label per sequence (anchor task: the pair, ``"(4,3)"``);
    - ``group_label``: what one group is, for figure axes (anchor task: ``"anchor pair"``);
    - ``heldout()`` ``[n]`` bool: sequences of groups never seen in training;
    - ``answers()``: named alternative answers ``[n]`` (``-1`` = none), e.g. the anchor task's
      ``"inferential"`` (composite) and ``"symmetric"`` (mirrored pair's trained target);
    - ``categories()``: the answer categories a prediction falls in, in order, each with its
      description (anchor task: inferential, symmetric, other); the first one names the
      answer in ``answers()`` that predictions are compared with;
    - ``classify(predictions)``: per category a float ``[n]``: 1 where the prediction
      ``[n]`` is in it, 0 where not, NaN where the category has no answer for the sequence
      (shares: :func:`category_shares`);
    - ``subsets()``: named bool ``[n]`` masks of sequences the held-out shares are also
      reported on (anchor task: ``"train_keys"``, the official code's held-out cells);
    - ``solution_wording()``: a :class:`SolutionWording`, the words of the figures and reports;
    - ``description()``: what the data are, in words (anchor task: ``"the anchor task's test
      split"``);
    - ``roles()``: named bool position masks ``[n, T]`` (anchor task: key, anchor1, anchor2,
      noise), usable wherever ``positions=`` takes a role name;
    - ``variables()``: task variables per sequence for probes, ``{name: [n] array}``;
    - ``mirror_groups()``: pairs of groups expected to be related (held-out pair and mirror);
    - ``resample_range``: ``(low, high)`` token ids that a resampled position draws from;
    - ``vocab_size``: the vocabulary the task's tokens come from (``None``: not known), which
      a model must match;
    - ``concat(others)``: one data set from this and more of the same kind.

    Example:
        >>> from probekit.anchor import AnchorTask
        >>> data = AnchorTask(n_test=20).dataset("test_task")
        >>> isinstance(data, TaskData), sorted(data.roles())
        (True, ['anchor1', 'anchor2', 'key', 'noise'])
        >>> list(data.categories()), data.group_label
        (['inferential', 'symmetric', 'other'], 'anchor pair')
    """

    tokens: torch.Tensor
    targets: torch.Tensor
    vocab_size: int | None
    group_label: str

    @property
    def resample_range(self) -> tuple[int, int]: ...

    def __len__(self) -> int: ...

    def groups(self) -> list[str]: ...

    def heldout(self) -> torch.Tensor: ...

    def answers(self) -> dict[str, torch.Tensor]: ...

    def categories(self) -> dict[str, str]: ...

    def classify(self, predictions: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def subsets(self) -> dict[str, torch.Tensor]: ...

    def solution_wording(self) -> SolutionWording: ...

    def description(self) -> str: ...

    def roles(self) -> dict[str, torch.Tensor]: ...

    def variables(self) -> dict[str, Any]: ...

    def mirror_groups(self) -> list[tuple[str, str]]: ...

    def concat(self, others: Sequence[TaskData]) -> TaskData: ...


def category_shares(
    classified: Mapping[str, torch.Tensor], selected: torch.Tensor | None = None
) -> dict[str, float]:
    """The share of each category of ``classified`` (:meth:`TaskData.classify`) among the
    ``selected`` sequences (bool ``[n]``, default all) where the category has an answer; NaN
    where it has none (or nothing is selected).

    Example:
        >>> nan = float("nan")
        >>> in_a, in_b = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([nan, nan, 0.0, 1.0])
        >>> category_shares({"a": in_a, "b": in_b})
        {'a': 0.5, 'b': 0.5}
    """
    shares = {}
    for name, inside in classified.items():
        part = inside if selected is None else inside[selected]
        part = part[~part.isnan()]
        shares[name] = float(part.mean()) if part.numel() else float("nan")
    return shares


def describe(data: Any) -> str | None:
    """What ``data`` are, in words, where they say so: a :class:`TaskData`'s ``description()``
    or a data dict's ``"description"`` entry; ``None`` otherwise.

    Example:
        >>> describe({"input_ids": torch.tensor([[5, 6]]), "description": "two tokens"})
        'two tokens'
    """
    if isinstance(data, TaskData):
        return data.description()
    if isinstance(data, Mapping) and isinstance(data.get("description"), str):
        return data["description"]
    return None


def task_data(data: Any) -> TaskData | None:
    """``data`` as :class:`TaskData`: itself, one data set from a non-empty list of task data,
    or ``None`` for plain token data."""
    if isinstance(data, TaskData):
        return data
    if isinstance(data, list | tuple) and data and all(isinstance(d, TaskData) for d in data):
        return data[0].concat(list(data[1:]))
    return None


__all__ = [
    "POSITIONS",
    "Batch",
    "Data",
    "SolutionWording",
    "TaskData",
    "as_batches",
    "category_shares",
    "describe",
    "position_mask",
    "task_data",
]
