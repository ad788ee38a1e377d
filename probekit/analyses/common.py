"""Pieces shared by the analyzers: per-token output measures and masked token averages."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import torch
import torch.nn.functional as F

from probekit.data import Batch, Data, TaskData
from probekit.errors import InputError, NumericalError
from probekit.numerics import all_finite

DataOrTask = Union[Data, TaskData]  # noqa: UP007  (Data is a typing.Union)
"""What the mechanism analyzers read: token data (:data:`probekit.data.Data`) or task data
(:class:`probekit.data.TaskData`, or a list of them), whose targets, roles and answers they
use."""


def result_meta(model: Any, **settings: Any) -> dict[str, Any]:
    """The ``meta`` of an analyzer's result: ``model`` (its repr), then ``settings`` -- every
    analyzer of data writes at least ``positions`` (where it takes them) and ``batch_size``
    (as given; ``None`` = the automatic, memory-bounded choice of
    :meth:`probekit.Model.default_batch_size`).

    Example:
        >>> result_meta("m", positions="all", batch_size=None)
        {'model': "'m'", 'positions': 'all', 'batch_size': None}
    """
    return {"model": repr(model), **settings}


OUTPUT_MEASURES = ("logit_l2", "kl", "prob_l2", "loss_delta")
"""How an intervention's output is compared with the clean output, per token:

- ``logit_l2``: ||z' - z||_2 over the vocabulary,
- ``kl``: KL(p || p'), clean distribution first,
- ``prob_l2``: ||softmax(z') - softmax(z)||_2,
- ``loss_delta``: CE(z', y) - CE(z, y) at positions that have a target y.
"""


def check_outputs_finite(logits: torch.Tensor, what: str = "the model's outputs") -> None:
    """Raise :class:`NumericalError` if a forward's outputs (``logits``, or the hidden states of
    a model without a head) hold NaN or infinities. (:meth:`probekit.Model.check_finite` checks
    the weights.)"""
    if not all_finite(logits):
        raise NumericalError(
            f"{what} contain NaN or infinite values",
            fix="check the checkpoint's weights (probekit.load checks them) and the input data",
        )


def labels_of(batch: Batch) -> torch.Tensor:
    """The labels of ``batch``, a batch of :meth:`probekit.Model.prepare` (which adds them).

    Example:
        >>> labels_of(Batch(torch.tensor([[5, 6]]), labels=torch.tensor([[6, -100]]))).tolist()
        [[6, -100]]
    """
    if batch.labels is None:
        raise InputError(
            "a batch without labels has no loss",
            fix="pass the batches of model.prepare(data), which adds the labels",
        )
    return batch.labels


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per position ``[B, T]`` (0 where ``labels == -100``), in float64."""
    flat = F.cross_entropy(
        logits.double().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none"
    )
    return flat.view(labels.shape)


CHUNK_TOKENS = 128
"""Tokens per chunk of the output measures: a variant's temporaries are a few ``[128, vocab]``
float32 tensors, whatever the batch (about 25 MB each at a 50k vocabulary)."""


@dataclass
class CleanSide:
    """The clean output of one batch, flattened to ``[N, vocab]`` tokens, with what every
    variant's measures need computed once: the logits and probabilities (float32), the
    log-sum-exp and the per-token loss (float64, loss 0 where there is no target). Build with
    :func:`clean_side`."""

    logits: torch.Tensor
    p: torch.Tensor
    lse: torch.Tensor
    loss: torch.Tensor
    labels: torch.Tensor
    shape: tuple[int, ...]
    _top: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    work_buffers: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    """The work tensors :meth:`work` has made so far, by chunk size."""

    def top(self, k: int) -> torch.Tensor:
        """Indices ``[N, k]`` of the ``k`` largest clean logits (computed once per ``k``)."""
        if k not in self._top:
            self._top[k] = self.logits.topk(k, dim=-1).indices
        return self._top[k]

    def work(self, chunk: int) -> torch.Tensor:
        """Two float32 ``[chunk, vocab]`` work tensors that :func:`output_change` writes its
        temporaries into, made once per clean side and reused by every variant measured
        against it: fresh memory of that size per chunk took longer than the arithmetic
        (a new page is zeroed by the system on first touch)."""
        if chunk not in self.work_buffers:
            rows = min(chunk, self.logits.shape[0])
            self.work_buffers[chunk] = self.logits.new_empty(2, rows, self.logits.shape[1])
        return self.work_buffers[chunk]


def _chunks(n: int, chunk: int) -> Iterator[slice]:
    return (slice(s, min(s + chunk, n)) for s in range(0, n, chunk))


def softmax_parts(
    z: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities (float32, written into ``out`` if given) and log-sum-exp (float64) of
    float32 logits ``[n, V]``: one exp over the chunk, the sum by torch's pairwise float32
    summation, its log in float64."""
    top = z.amax(-1, keepdim=True)
    e = torch.sub(z, top, out=out).exp_()
    total = e.sum(-1, keepdim=True)
    return e.div_(total), top[:, 0].double() + total[:, 0].double().log()


def _nll(z: torch.Tensor, lse: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``lse - z[y]`` in float64 (0 where ``y == -100``)."""
    picked = z.gather(-1, y.clamp(min=0)[:, None])[:, 0].double()
    return torch.where(y != -100, lse - picked, 0.0)


@torch.no_grad()  # measures, never differentiated: work tensors are written in place
def clean_side(clean: torch.Tensor, labels: torch.Tensor, chunk: int = CHUNK_TOKENS) -> CleanSide:
    """The clean side of :func:`output_change` for logits ``[B, T, V]`` and labels ``[B, T]``.

    Example:
        >>> side = clean_side(torch.zeros(1, 2, 4), torch.tensor([[1, -100]]))
        >>> side.p[0].tolist(), [round(v, 4) for v in side.loss.tolist()]
        ([0.25, 0.25, 0.25, 0.25], [1.3863, 0.0])
    """
    shape = tuple(labels.shape)
    logits = clean.reshape(-1, clean.shape[-1]).float()
    flat_labels = labels.reshape(-1)
    p = torch.empty_like(logits)
    lse = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
    for part in _chunks(logits.shape[0], chunk):
        lse[part] = softmax_parts(logits[part], out=p[part])[1]
    return CleanSide(logits, p, lse, _nll(logits, lse, flat_labels), flat_labels, shape)


EXP_SAFE = 60.0
"""Largest logit increase the float32 ``expm1`` path of :func:`output_change` takes; tokens
with a larger one are measured by the float64 formulas instead (no overflow)."""

SUM_SAFE = 2.0**60
"""Largest S = sum p (e^d - 1) the float32 path of :func:`output_change` takes: the
``prob_l2`` norm squares terms up to about 2 S, and (2 S + 2)^2 stays below the float32
limit (2^128) only while S <= 2^60. A logit rise of 44 to 60 on a token holding a quarter of
the probability gives S of 2^61 to 2^85, whose square overflowed to an infinite ``prob_l2``
(issue 31); such tokens are measured in float64."""


def prob_l2_error_bound(vocab: int) -> float:
    """Worst-case absolute error per token of the float32 ``prob_l2`` of :func:`output_change`
    against the float64 formula on the same logits, ``(2 EXP_SAFE + 8 log2(vocab) + 30) u``
    with u = 2^-24 (the argument is in :func:`output_change`'s docstring). Measured errors are
    about 1e-7 to 1e-6.

    Example:
        >>> f"{prob_l2_error_bound(50257):.1e}"
        '1.6e-05'
    """
    return (2 * EXP_SAFE + 8 * math.log2(vocab) + 30) * 2.0**-24


@torch.no_grad()  # measures, never differentiated: work tensors are written in place
def output_change(
    clean: torch.Tensor | CleanSide,
    changed: torch.Tensor,
    labels: torch.Tensor,
    chunk: int = CHUNK_TOKENS,
    measures: tuple[str, ...] = OUTPUT_MEASURES,
) -> dict[str, torch.Tensor]:
    """Per-token measures (see :data:`OUTPUT_MEASURES`; ``measures`` picks some) of
    ``changed`` logits against ``clean`` (logits, or their :func:`clean_side` computed once per
    batch), ``[B, T]`` in float64.

    Computed ``chunk`` tokens at a time in float32, so memory is bounded by a chunk, and
    written from the logit difference d = z' - z so that nothing large cancels in float32:
    with S = sum p (e^d - 1) (``expm1``), lse(z') - lse(z) = log1p(S), so
    KL(p || p') = log1p(S) - sum p d, ||p' - p|| = ||p (e^d - 1 - S)|| / (1 + S) and the loss
    change is log1p(S) - d[y]; per-token values are float64. Tokens whose logits rise by more
    than :data:`EXP_SAFE`, whose S < -0.5 (1 + S would lose digits) or S > :data:`SUM_SAFE`
    (the squares of the ``prob_l2`` norm would overflow), or with any non-finite float32 value,
    are measured in float64, exact over the whole float range.
    Its ``[chunk, vocab]`` temporaries (d, then e^d - 1 in its place; p d) are written into the
    clean side's :meth:`CleanSide.work` tensors, made once per clean side.

    Accuracy against the float64 formulas on the same logits (tests/test_fast_paths.py): about
    1e-6 relative to the largest value in tests, 1e-7 to 1e-6 absolute for ``prob_l2`` on peaky
    outputs. The worst case of ``prob_l2`` (absolute, per token; u = 2^-24, first order) is
    about ``(2 R + 8 log2 V + 30) u`` with R <= EXP_SAFE the largest rise among the tokens that
    carry probability after the change: (1) each d is rounded to float32, ``|dd| <= u |d|``,
    which moves q = softmax(z') by ``||q * (dd - <q, dd>)|| <= 2 u R``; (2) the float32 sum of
    S errs by at most ``log2(V) u sum|p (e^d - 1)| <= log2(V) u (2 + S)``, which, divided by
    1 + S >= 0.5 and entering p (e^d - 1 - S) and 1 + S, adds at most
    ``3 (1 + sqrt 2) log2(V) u``; (3) the sum that normalises p adds ``log2(V) u``, and the
    elementwise roundings (exp, expm1, the products, the subtraction p (e^d - 1) - p S, the
    norm and the division) a few u each. At R = 60 and V = 50257 that is about 1.6e-5
    (:func:`prob_l2_error_bound`); a trained LM was measured at up to 8.3e-6. Getting below
    it needs float64 elementwise work, about 5x slower on a CPU.

    Example:
        >>> z = torch.tensor([[[0.0, 1.0, 2.0]]])
        >>> out = output_change(z, z + torch.tensor([0.0, 0.0, 1.0]), torch.tensor([[2]]))
        >>> round(float(out["loss_delta"]), 4), sorted(output_change(z, z, z[..., 0].long(),
        ...     measures=("kl",)))
        (-0.2378, ['kl'])
    """
    # 78 lines long: 33 are the docstring deriving the formulas and their error bound; the
    # body is one loop over chunks, kept whole because each step reuses the previous step's
    # temporary in place.
    unknown = set(measures) - set(OUTPUT_MEASURES)
    if unknown:
        raise ValueError(f"unknown output measures {sorted(unknown)}")
    side = clean if isinstance(clean, CleanSide) else clean_side(clean, labels, chunk)
    flat = changed.reshape(-1, changed.shape[-1])
    n, f64 = flat.shape[0], torch.float64
    out = {name: torch.empty(n, dtype=f64, device=flat.device) for name in measures}
    work = side.work(chunk)
    for part in _chunks(n, chunk):
        z, p, y = side.logits[part], side.p[part], side.labels[part]
        d = torch.sub(flat[part].float(), z, out=work[0, : z.shape[0]])
        rise = d.amax(-1)
        if "logit_l2" in measures:
            out["logit_l2"][part] = torch.linalg.vector_norm(d, dim=-1).double()
        if "kl" in measures:
            p_d = torch.mul(p, d, out=work[1, : z.shape[0]]).sum(-1).double()
        picked = d.gather(-1, y.clamp(min=0)[:, None])[:, 0].double()
        pe = d.expm1_().mul_(p)  # d is not needed any more: e^d - 1 in its place, times p
        s = pe.sum(-1, keepdim=True)
        shift = s[:, 0].double().log1p()
        if "kl" in measures:
            out["kl"][part] = shift - p_d
        if "prob_l2" in measures:
            spread = pe.addcmul_(p, s, value=-1)  # p (e^d - 1 - S)
            out["prob_l2"][part] = torch.linalg.vector_norm(spread, dim=-1).double() / (
                1 + s[:, 0].double()
            )
        if "loss_delta" in measures:
            out["loss_delta"][part] = torch.where(y != -100, shift - picked, 0.0)
        wild = _needs_float64(rise, s[:, 0], [out[name][part] for name in measures])
        if bool(wild.any()):
            rows = torch.arange(part.start, part.stop, device=flat.device)[wild]
            exact = output_change_float64(z[wild], flat[part][wild].float(), y[wild])
            for name in measures:
                out[name][rows] = exact[name]
    return {name: values.view(side.shape) for name, values in out.items()}


def _needs_float64(rise: torch.Tensor, s: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
    """Tokens ``[n]`` the float32 path of :func:`output_change` cannot measure: e^d overflows
    (``rise`` > :data:`EXP_SAFE`), 1 + S loses digits (S < -0.5), the squares of the
    ``prob_l2`` norm may overflow (S > :data:`SUM_SAFE`), or any value came out non-finite."""
    wild = (rise > EXP_SAFE) | (s < -0.5) | (s > SUM_SAFE) | ~torch.isfinite(s)
    for value in values:
        wild |= ~torch.isfinite(value)
    return wild


def output_change_float64(z: torch.Tensor, zq: torch.Tensor, y: torch.Tensor) -> dict:
    """The measures of logits ``[n, V]`` in float64 from their definitions (few tokens), exact
    for any finite float32 logits; :class:`NumericalError` if a value is still not finite
    (infinite or NaN logits), never an infinite measure."""
    z, zq = z.double(), zq.double()
    logp, logq = z.log_softmax(-1), zq.log_softmax(-1)
    p, q = logp.exp(), logq.exp()
    safe = y.clamp(min=0)[:, None]
    loss = (logp.gather(-1, safe) - logq.gather(-1, safe))[:, 0]
    out = {
        "logit_l2": (zq - z).norm(dim=-1),
        "kl": (p * (logp - logq)).sum(-1),
        "prob_l2": (q - p).norm(dim=-1),
        "loss_delta": torch.where(y != -100, loss, 0.0),
    }
    for name, values in out.items():
        if not bool(torch.isfinite(values).all()):
            raise NumericalError(
                f"the output measure {name} is not finite even in float64",
                fix="check that the model's logits are finite (probekit.load checks the weights)",
            )
    return out


HIDDEN_MEASURES = ("rel_l2", "cos_dist")
"""How an intervention's output is compared with the clean output in a model without an LM
head, whose output ``z`` is the final hidden state per token or the pooled embedding per
sequence (:attr:`probekit.model.Model.output_kind`):

- ``rel_l2``: ||z' - z||_2 / ||z||_2, the relative change (the hidden-space substitute of
  ``prob_l2`` and of the loss change: shares, skip output effects and swap costs use it),
- ``cos_dist``: 1 - cos(z', z).

Measures that need a vocabulary (KL, Δsoftmax, Δloss, the logit and tuned lenses, gradient
norms of the loss) have no hidden-space counterpart here and are refused for such models.
"""


def output_measures(model: Any) -> tuple[str, ...]:
    """The output measures of ``model``: :data:`OUTPUT_MEASURES` for logits, else
    :data:`HIDDEN_MEASURES`."""
    return OUTPUT_MEASURES if model.output_kind == "logits" else HIDDEN_MEASURES


def headline_measure(model: Any) -> str:
    """The measure behind shares, skip output effects and verdicts: ``prob_l2`` for logits,
    ``rel_l2`` for hidden states and embeddings."""
    return "prob_l2" if model.output_kind == "logits" else "rel_l2"


def output_note(model: Any) -> dict[str, str]:
    """``{"output": ..., "measure": ...}``: which output an analyzer compared and its headline
    measure, for summaries and reports."""
    return {"output": model.output_description, "measure": headline_measure(model)}


def hidden_change(clean: torch.Tensor, changed: torch.Tensor) -> dict[str, torch.Tensor]:
    """:data:`HIDDEN_MEASURES` of ``changed`` against ``clean`` over the last dimension, in
    float64 (``[..., d] -> [...]``).

    Example:
        >>> out = hidden_change(torch.tensor([[3.0, 4.0]]), torch.tensor([[3.0, 0.0]]))
        >>> round(float(out["rel_l2"][0]), 4), round(float(out["cos_dist"][0]), 4)
        (0.8, 0.4)
    """
    clean = clean.double()
    changed = changed.double().to(clean.device)
    norm = clean.norm(dim=-1)
    return {
        "rel_l2": (changed - clean).norm(dim=-1) / norm.clamp_min(1e-300),
        "cos_dist": 1 - F.cosine_similarity(changed, clean, dim=-1, eps=1e-300),
    }


def sequence_mask(mask: torch.Tensor) -> torch.Tensor:
    """One position (the first) per sequence with any position in ``mask``: per-sequence
    values spread over ``[B, T]`` then count once per sequence."""
    out = torch.zeros_like(mask, dtype=torch.bool)
    out[:, 0] = mask.bool().any(-1)
    return out


def variant_measures(
    model: Any,
    batch: Any,
    clean: torch.Tensor | CleanSide,
    changed: torch.Tensor,
    measures: tuple[str, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """Every output measure of ``model`` (:func:`output_measures`; or those in ``measures``)
    for one variant, ``[B, T]``:
    :func:`output_change` for logits (``clean`` may be their :func:`clean_side`);
    :func:`hidden_change` per token for a hidden state; for an embedding, :func:`hidden_change`
    of the pooled embeddings (:meth:`~probekit.model.Model.pool`), one value per sequence spread
    over its positions (count it once per sequence: :func:`measure_positions`)."""
    kind = model.output_kind
    if kind == "logits":
        return output_change(clean, changed, batch.labels, measures=measures or OUTPUT_MEASURES)
    if isinstance(clean, CleanSide):  # a clean side holds logits: only for output_kind "logits"
        raise InputError(
            f"a clean side of logits given for a model whose output is {kind}",
            fix="pass the clean output itself",
        )
    if kind == "hidden":
        out = hidden_change(clean, changed)
    else:
        attention = batch.attention_mask
        pooled = hidden_change(
            model.pool(clean.double(), attention), model.pool(changed.double(), attention)
        )
        out = {name: v[:, None].expand(changed.shape[:2]) for name, v in pooled.items()}
    return out if measures is None else {name: out[name] for name in measures}


def measure_positions(
    model: Any, measure: str, labels: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """The positions of ``mask`` that ``measure`` averages over: those with a target for
    ``loss_delta`` (which needs ``labels``), one per sequence for a pooled embedding, else
    ``mask`` itself."""
    if measure == "loss_delta":
        if labels is None:
            raise InputError(
                "loss_delta needs labels and the batch has none",
                fix="pass the batches of model.prepare(data), which adds the labels",
            )
        return loss_mask(labels, mask)
    return sequence_mask(mask) if model.output_kind == "embedding" else mask


def cost_measure(model: Any) -> str:
    """The per-token cost a layer order is judged by: the loss change with a vocabulary, the
    headline hidden-space measure without one."""
    return "loss_delta" if model.output_kind == "logits" else headline_measure(model)


def measured_changes(
    model: Any, batch: Any, clean: torch.Tensor, changed: torch.Tensor, mask: torch.Tensor
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """:func:`variant_measures` as ``(measure, values [B, T], positions to average over)``."""
    return [
        (name, values, measure_positions(model, name, batch.labels, mask))
        for name, values in variant_measures(model, batch, clean, changed).items()
    ]


class TokenMeans:
    """Accumulate masked sums over batches and return exact means over all selected tokens.

    Example:
        >>> acc = TokenMeans()
        >>> acc.add("x", torch.tensor([[1.0, 3.0]]), torch.tensor([[True, True]]))
        >>> acc.mean("x")
        2.0
    """

    def __init__(self) -> None:
        self.sums: dict[object, float] = defaultdict(float)
        self.counts: dict[object, int] = defaultdict(int)

    def add(self, key: object, values: torch.Tensor, mask: torch.Tensor) -> None:
        self.sums[key] += float(values.double()[mask].sum())
        self.counts[key] += int(mask.sum())

    def mean(self, key: object) -> float:
        count = self.counts.get(key, 0)
        return self.sums[key] / count if count else float("nan")


def loss_mask(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Positions in ``mask`` that also have a target."""
    return mask & (labels != -100)


def add_output_change(
    acc: TokenMeans,
    key: tuple,
    clean: torch.Tensor | CleanSide,
    changed: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Add every output measure of one variant to ``acc`` under ``key + (measure,)``."""
    check_outputs_finite(changed, "the outputs of an intervened forward")
    for name, values in output_change(clean, changed, labels).items():
        acc.add(key + (name,), values, loss_mask(labels, mask) if name == "loss_delta" else mask)


def second_half(n_layers: int) -> range:
    """Indices of the layers in the second half: ``l >= n_layers / 2``."""
    return range((n_layers + 1) // 2, n_layers)


def cosine_matrix(vectors: Any) -> np.ndarray:
    """Cosine similarity between the rows of ``vectors`` ``[n, d]`` (zero rows give 0).

    Example:
        >>> cosine_matrix(np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])).round(3).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    v = np.asarray(vectors.numpy() if isinstance(vectors, torch.Tensor) else vectors, dtype=float)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    unit = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    cos = np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(cos, np.where(norms[:, 0] > 0, 1.0, 0.0))
    return cos
