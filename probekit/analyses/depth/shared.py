"""Work shared between the depth analyses of one diagnosis, so no variant runs twice.

A :class:`Shared` object is made per diagnosis (:func:`probekit.report.diagnose` makes one)
and passed explicitly to the analyzers (``cache=``); an analyzer given none makes its own.
It keeps:

- the clean :class:`~probekit.model.Trace` of the latest batch and its output side
  (:func:`~probekit.analyses.common.clean_side`): one batch's residuals at a time, never more;
- per whole-layer skip variant (batch, skipped layer, intervened positions) its per-token
  output measures and, per later layer, ``||D'_l - D_l||``: what ``contributions`` (component
  'layer') and ``skip_effects`` both need, so each skip runs once (a few ``[B, T]`` float64
  tensors per variant, not its logits);
- per swap order, the per-token loss change;
- per batch (every batch, a few ``[B, T]`` float64 tensors each) its clean per-token cost and
  clean update norms ``||D_l||``, so an analysis that finds every variant it needs already
  measured (``skip_effects`` after ``contributions``, the clean side of ``layer_swaps``) does
  not trace the batch again.

Hook-free variants (whole-layer skips, the blocks after an ablated sublayer, swaps) run
block by block, several at a time stacked along the batch dimension
(:meth:`probekit.model.Trace.resume_stacked`): ``variants_per_pass`` sets how many per block run
(``None``, the default: on a CPU enough for :data:`~probekit.model.inputs.STACKED_ROWS` token
rows, 1 for a batch of that many tokens or more; on an accelerator as many as half its free
memory holds; 1: one variant at a time). The variants whose residuals are held at once are as
many as an eighth of the free memory holds (all of a batch's, at the sizes a diagnosis runs).
``autocast`` (``"bf16"``/``"fp16"``) runs the forwards under ``torch.autocast`` with the
measures still taken in float32.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> model = toy_model(n_layers=3)
    >>> shared = Shared(model)
    >>> [batch] = model.prepare(toy_tokens())
    >>> record = shared.skip(batch, 0, None)
    >>> sorted(record.diffs), shared.skip(batch, 0, None) is record
    ([1, 2], True)
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from probekit.analyses.common import (
    CleanSide,
    check_outputs_finite,
    clean_side,
    cost_measure,
    labels_of,
    variant_measures,
)
from probekit.data import Batch
from probekit.errors import InputError
from probekit.interventions import (
    InterventionSetting,
    Replacement,
    merge,
    plan_replacements,
    sublayer_means,
)
from probekit.model import Model, Trace
from probekit.model.inputs import variants_per_run
from probekit.numerics import available_memory
from probekit.progress import step as count_variants

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class SkipRecord:
    """What one whole-layer skip variant changed, per token ``[B, T]`` (float64):
    ``measures`` (every output measure) and ``diffs[l]`` = ``||D'_l - D_l||`` for each later
    layer l."""

    measures: dict[str, torch.Tensor]
    diffs: dict[int, torch.Tensor]


def _fingerprint(*tensors: torch.Tensor | None) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for tensor in tensors:
        if tensor is None:
            digest.update(b"none")
            continue
        digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _batch_key(batch: Batch) -> str:
    return _fingerprint(batch.tokens, batch.attention_mask, batch.labels)


class Shared:
    """The per-diagnosis cache of clean traces and hook-free variants (see the module)."""

    def __init__(
        self, model: Model, *, variants_per_pass: int | None = None, autocast: str | None = None
    ) -> None:
        if variants_per_pass is not None and (
            isinstance(variants_per_pass, bool)
            or not isinstance(variants_per_pass, int)
            or variants_per_pass < 1
        ):
            raise InputError(
                f"variants_per_pass={variants_per_pass!r} is not a positive integer",
                fix="pass 1 (one variant per forward), a larger count, or None (from memory)",
            )
        if autocast is not None and autocast not in AUTOCAST:
            raise InputError(f"unknown autocast={autocast!r}", fix=f"use one of {list(AUTOCAST)}")
        self.model = model
        self.variants_per_pass = variants_per_pass
        self.autocast = autocast
        self._key: str | None = None
        self._trace: Trace | None = None
        self._side: CleanSide | None = None
        self._costs: dict[str, torch.Tensor] = {}
        self._norms: dict[str, list[torch.Tensor]] = {}
        self._logits: torch.Tensor | None = None
        self.skips: dict[tuple, SkipRecord] = {}
        self.swaps: dict[tuple, torch.Tensor] = {}
        self._means: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
        self.runs = {"traces": 0, "skips": 0, "swaps": 0}

    def check_model(self, model: Model) -> None:
        """Refuse a cache made for another model."""
        if model is not self.model:
            raise InputError(
                "the shared cache was made for another model",
                fix="make one Shared(model) per model and pass it with that model only",
            )

    @contextlib.contextmanager
    def precision(self) -> Iterator[None]:
        """The ``autocast`` context of the forwards (nothing without one)."""
        if self.autocast is None:
            yield
            return
        with torch.autocast(self.model.device.type, dtype=AUTOCAST[self.autocast]):
            yield

    def _load(self, batch: Batch) -> str:
        key = _batch_key(batch)
        if key != self._key:
            self._key, self._trace, self._side = key, None, None
            with self.precision():
                trace = self.model.trace(batch)
            check_outputs_finite(trace.logits)
            self._trace = trace
            if self.model.output_kind == "logits":
                self._side = clean_side(trace.logits, labels_of(batch))
                self._costs[key] = self._side.loss.view(self._side.shape)
            else:
                self._costs[key] = torch.zeros(
                    batch.tokens.shape, dtype=torch.float64, device=batch.tokens.device
                )
            self._norms[key] = [
                (after - before).double().norm(dim=-1)
                for before, after in zip(trace.residuals[:-1], trace.residuals[1:], strict=True)
            ]
            self.runs["traces"] += 1
        return key

    def trace(self, batch: Batch) -> Trace:
        """The clean trace of ``batch`` (kept for the latest batch only)."""
        self._load(batch)
        assert self._trace is not None, "_load keeps the trace of the batch it loads"
        return self._trace

    def side(self, batch: Batch) -> CleanSide:
        """The clean output side of ``batch`` (see :func:`clean_side`); models with a
        vocabulary only."""
        self._load(batch)
        if self._side is None:
            raise InputError(
                f"the {self.model.architecture} model has no vocabulary, so no clean loss",
                fix="use clean_cost() / measure() for models without an LM head",
            )
        return self._side

    def clean_cost(self, batch: Batch) -> torch.Tensor:
        """The clean per-token cost ``[B, T]`` of :func:`cost_measure`: the loss with a
        vocabulary, 0 without one (the clean output's change from itself); kept per batch."""
        key = _batch_key(batch)
        return self._costs[key] if key in self._costs else self._costs[self._load(batch)]

    def clean_norms(self, batch: Batch) -> list[torch.Tensor]:
        """Per layer l the clean update norm ``||D_l||`` ``[B, T]`` (float64); kept per
        batch."""
        key = _batch_key(batch)
        return self._norms[key] if key in self._norms else self._norms[self._load(batch)]

    def measure(
        self, batch: Batch, changed: torch.Tensor, measures: tuple[str, ...] | None = None
    ) -> dict[str, torch.Tensor]:
        """Every output measure ``[B, T]`` (or those in ``measures``) of the output
        ``changed`` against the clean one of ``batch`` (:func:`variant_measures`)."""
        self._load(batch)
        trace = self._trace
        assert trace is not None
        clean = self._side if self._side is not None else trace.logits
        return variant_measures(self.model, trace.batch, clean, changed, measures)

    def logits_out(self, final: torch.Tensor) -> torch.Tensor | None:
        """The tensor this cache's variant logits are written into on a CPU (``out`` of
        :meth:`~probekit.model.Model.head`), made once per shape of ``final`` and reused by
        every variant, each measured before the next is made; None elsewhere (an accelerator's
        allocator reuses its memory already) and for models without a vocabulary."""
        if self.model.output_kind != "logits" or final.device.type != "cpu":
            return None
        shape = (*final.shape[:-1], self.model.d_vocab)
        dtype = self.model.dtype
        if self._logits is None or self._logits.shape != shape or self._logits.dtype != dtype:
            self._logits = torch.empty(shape, dtype=dtype, device=final.device)
        return self._logits

    def per_pass(self) -> int:
        """How many variants one stacked block run takes (see the module)."""
        if self.variants_per_pass is not None:
            return self.variants_per_pass
        if self._trace is None:
            return 1
        device = self.model.device
        return variants_per_run(
            self._trace.batch.tokens.numel(),
            device.type,
            d_model=self.model.d_model,
            d_vocab=self.model.d_vocab,
            n_layers=self.model.n_layers,
            free=None if device.type == "cpu" else available_memory(device),
            half=self.autocast is not None,
        )

    def in_flight(self, count: int) -> int:
        """How many of ``count`` variants of the current batch one stacked resumption holds:
        all when their residuals take at most an eighth of the free memory, never fewer than
        :meth:`per_pass`."""
        assert self._trace is not None
        residual = self._trace.residuals[0]
        per_variant = 2 * residual.numel() * residual.element_size()  # its input and output
        free = available_memory(self.model.device) or 0
        return max(1, self.per_pass(), min(count, int(free / 8 // max(per_variant, 1))))

    def resume_variants(
        self,
        starts: Sequence[int],
        residual: Callable[[int], torch.Tensor] | None = None,
        orders: Sequence[Sequence[int]] | None = None,
        observe: Callable[[int, int, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(v, final residual)`` of each hook-free variant ``v`` of the loaded batch, in
        order: variant v resumes at block ``starts[v]`` from ``residual(v)`` (default: the
        clean input there) in the layer order ``orders[v]`` (default: the remaining layers);
        :meth:`in_flight` variants at a time, :meth:`per_pass` per block run, under
        :meth:`precision`. ``observe(v, layer, h_in, h_out)`` sees every block run."""
        trace = self._trace
        assert trace is not None
        step = self.per_pass()
        held = self.in_flight(len(starts))
        for first in range(0, len(starts), held):
            group = range(first, min(first + held, len(starts)))
            seen = None if observe is None else _offset(observe, first)
            with self.precision():
                residuals = None if residual is None else [residual(v) for v in group]
                finals = trace.resume_stacked(
                    [starts[v] for v in group],
                    residuals,
                    orders=None if orders is None else [orders[v] for v in group],
                    observe=seen,
                    chunk=step,
                )
            yield from zip(group, finals, strict=True)

    def replacements(self, setting: InterventionSetting, batches: list[Batch]) -> list[Replacement]:
        """Per batch, what an ablated update is replaced by under ``setting.ablation``
        (:func:`~probekit.interventions.plan_replacements`); the mean updates of the same
        batches are computed once per cache, so once per diagnosis."""
        means = None
        if setting.ablation == "mean":
            key = _fingerprint(*(t for b in batches for t in (b.tokens, b.attention_mask)))
            if key not in self._means:
                self._means[key] = sublayer_means(self.model, batches)
            means = self._means[key]
        return plan_replacements(self.model, setting, batches, means)

    def skip(
        self,
        batch: Batch,
        layer: int,
        intervene_at: torch.Tensor | None,
        replacement: Replacement | None = None,
    ) -> SkipRecord:
        """The record of skipping ``layer`` at the positions in ``intervene_at`` (all: None),
        its update replaced as ``replacement`` says (None: zero, the block returns its input);
        on a miss every layer's skip of this batch and mask is computed, stacked per pass."""
        key = _batch_key(batch)
        mask_key = None if intervene_at is None else _fingerprint(intervene_at)
        kind = "zero" if replacement is None else replacement.key
        if (key, layer, mask_key, kind) not in self.skips:
            self._load(batch)
            for record_layer, record in self._run_skips(intervene_at, replacement):
                self.skips[(key, record_layer, mask_key, kind)] = record
        return self.skips[(key, layer, mask_key, kind)]

    def _run_skips(
        self, intervene_at: torch.Tensor | None, replacement: Replacement | None
    ) -> Iterator[tuple[int, SkipRecord]]:
        trace, n = self._trace, self.model.n_layers
        assert trace is not None
        diffs: list[dict[int, torch.Tensor]] = [{} for _ in range(n)]

        def skipped(s: int) -> torch.Tensor:
            return merge(intervene_at, _skipped(trace, s, replacement), trace.residuals[s + 1])

        def observe(v: int, block: int, h_in, h_out) -> None:
            clean = trace.residuals[block + 1] - trace.residuals[block]
            diffs[v][block] = ((h_out - h_in) - clean).double().norm(dim=-1)

        starts = [s + 1 for s in range(n)]
        for s, final in self.resume_variants(starts, skipped, observe=observe):
            yield s, SkipRecord(self.measure_final(final), diffs[s])
            self.runs["skips"] += 1

    def measure_final(
        self, final: torch.Tensor, what: str = "the outputs of a skipped-layer forward"
    ) -> dict[str, torch.Tensor]:
        """Every output measure ``[B, T]`` of the variant of the loaded batch whose final
        residual is ``final`` (its output made by the model's head); a non-finite output is
        refused naming ``what`` it is."""
        with self.precision():
            logits = self.model.head(final, self.logits_out(final))
        check_outputs_finite(logits, what)
        trace = self._trace
        assert trace is not None
        return self.measure(trace.batch, logits)

    def swap_costs(
        self, batch: Batch, orders: Sequence[Sequence[int]], starts: Sequence[int]
    ) -> list[torch.Tensor]:
        """Per-token change ``[B, T]`` of the :func:`cost_measure` (the loss with a
        vocabulary) of each full layer order (resumed at its start)."""
        key = _batch_key(batch)
        todo = [i for i, o in enumerate(orders) if (key, tuple(o)) not in self.swaps]
        count_variants(len(orders) - len(todo))  # cached ones are done (live progress line)
        if not todo:
            return [self.swaps[(key, tuple(o))] for o in orders]
        self._load(batch)
        trace = self._trace
        assert trace is not None
        variants = self.resume_variants(
            [starts[i] for i in todo], orders=[orders[i][starts[i] :] for i in todo]
        )
        for v, final in variants:
            i = todo[v]
            with self.precision():
                logits = self.model.head(final, self.logits_out(final))
            check_outputs_finite(logits, "the outputs of a swapped forward")
            cost = cost_measure(self.model)
            change = self.measure(batch, logits, (cost,))[cost]
            self.swaps[(key, tuple(orders[i]))] = change
            self.runs["swaps"] += 1
            count_variants(1)
        return [self.swaps[(key, tuple(o))] for o in orders]


def _offset(
    observe: Callable[[int, int, torch.Tensor, torch.Tensor], None], first: int
) -> Callable[[int, int, torch.Tensor, torch.Tensor], None]:
    """``observe`` seeing the variants of a group numbered from ``first``."""

    def seen(v: int, layer: int, h_in: torch.Tensor, h_out: torch.Tensor) -> None:
        observe(first + v, layer, h_in, h_out)

    return seen


def _skipped(trace: Trace, layer: int, replacement: Replacement | None) -> torch.Tensor:
    """The residual leaving block ``layer`` when its update is ablated: its input (zero), or
    its input plus the replacing update (mean, resample)."""
    h_in = trace.residuals[layer]
    if replacement is None or replacement.kind == "zero":
        return h_in
    value = replacement.update(layer, "layer", trace.residuals[layer + 1] - h_in)
    assert value is not None
    return h_in + value.to(h_in.dtype)


def make_shared(model: Model, cache: Shared | None) -> Shared:
    """``cache`` checked against ``model``, or a fresh one for a single analysis."""
    if cache is None:
        return Shared(model)
    if not isinstance(cache, Shared):
        raise InputError(
            f"cache={type(cache).__name__} is not a probekit Shared cache",
            fix="pass probekit.analyses.depth.shared.Shared(model) or None",
        )
    cache.check_model(model)
    return cache
