"""Per-layer gradient norms for a given loss.

The loss is the mean cross-entropy over every position that has a target (labels != -100)
inside the selected positions, over all batches together (token-weighted). Per layer:

- ``mean_param_grad_norm``: mean over the layer's parameter tensors of each tensor's gradient
  L2 norm (the per-layer "gradient magnitude" of the depth-growth papers),
- ``grad_norm``: L2 norm of all the layer's parameter gradients together,
- ``resid_grad_norm``: per-token L2 norm of the gradient at the layer's residual input,
  averaged over the selected positions (a decoder's last token, which no target depends on,
  has a zero gradient and counts as such).

Only the blocks' parameters get gradients (the embedding, unembedding and final norm are frozen
for the call: their gradients are not measured and at a real vocabulary they are the largest);
the per-token cross-entropy is taken in float32 and summed in float64. The model's parameters
keep their ``.grad`` and ``requires_grad`` as they were before the call.

The norms are those of the gradient of the whole loss, so with several batches each weight's
gradient is summed over the batches first (in its ``.grad``, in the dtype the weight is kept
in) and its norm taken once the last batch's backward has added its share. A hook on each
weight (``register_post_accumulate_grad_hook``; under ``storage="stored"`` on the stored tensor,
the one the backward accumulates into) takes that norm (float64) as soon as the weight's
gradient is complete and frees the gradient at once: with one batch (an 8B model's default
at 128 tokens) at most one weight's gradient is alive at any time, never every block's; with
several, the sums of the earlier batches are held until the last backward frees them one by
one (the norm of a sum cannot be taken from per-batch norms). A backward that
overflows although the forward is finite (huge weights, float16) raises
:class:`~probekit.errors.NumericalError` naming the first layer whose gradients are not finite,
as a forward that overflows does (no NaN norm is returned).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = gradient_norms(toy_model(n_layers=2), toy_tokens())
    >>> sorted(res.df.measure.unique())
    ['grad_norm', 'mean_param_grad_norm', 'resid_grad_norm']
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from probekit import figures
from probekit.analyses.common import (
    TokenMeans,
    check_outputs_finite,
    labels_of,
    loss_mask,
    result_meta,
    second_half,
)
from probekit.data import Data, position_mask
from probekit.errors import InputError, NumericalError, UnsupportedModelError
from probekit.model import Model, load
from probekit.numerics import all_finite
from probekit.progress import counted
from probekit.result import Result
from probekit.words import AXES, figure_words

GRADIENT_MEASURES = ("mean_param_grad_norm", "grad_norm", "resid_grad_norm")


class GradientResult(Result):
    """``df`` columns: ``layer``, ``measure``, ``value``. ``summary``: ``loss``,
    ``second_half_over_first_half`` (ratio of mean ``mean_param_grad_norm``), ``n_layers``."""

    kind = "gradients"

    def profile(self, measure: str = "mean_param_grad_norm") -> pd.Series:
        """One measure per layer, indexed by layer."""
        part = self.df[self.df.measure == measure]
        return part.set_index("layer")["value"].sort_index()

    def figure(self) -> go.Figure:
        fig = figures.lines(
            self.df,
            "layer",
            "value",
            "measure",
            figure_words("gradients"),
            AXES["layer"],
            figure_words("gradients", "y"),
        )
        figures.integer_axis(fig, "x", n=int(self.df.layer.max()) + 1)
        return figures.log_axis(fig, "y", values=self.df.value)


@contextmanager
def _own_gradients(model: Model) -> Iterator[None]:
    """Give the blocks' parameters a fresh ``.grad`` and ``requires_grad``, freeze every other
    parameter (embedding, unembedding, final norm: their gradients are not measured, and at a
    real vocabulary they are the largest); restore all of it in ``finally``."""
    params = list(model.hf_model.parameters())
    measured = {id(p) for i in range(model.n_layers) for g in model.layer_weights(i) for p in g}
    saved = [(p.grad, p.requires_grad) for p in params]
    try:
        for p in params:
            p.grad = None
            p.requires_grad_(id(p) in measured)
        yield
    finally:
        for p, (grad, requires_grad) in zip(params, saved, strict=True):
            p.grad = grad
            p.requires_grad_(requires_grad)


class WeightNorms:
    """Each measured weight's gradient norm, taken by a hook the moment the backward of the
    last batch has accumulated the weight's gradient, which the hook then frees (see the
    module). The weights whose gradient holds NaN or infinite values after any backward are
    kept by layer and name for :func:`check_gradients_finite`."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.last = False  # whether the backward running now is the last batch's
        self.norms: dict[int, float] = {}  # id of a weight -> its gradient's L2 norm
        self.not_finite: dict[int, set[str]] = {}  # layer -> names of its non-finite weights

    def hook(self, layer: int, name: str) -> Any:
        def fn(param: torch.Tensor) -> None:
            grad = param.grad
            if grad is None:
                return
            if not all_finite(grad):
                self.not_finite.setdefault(layer, set()).add(name)
            elif self.last:
                self.norms[id(param)] = float(grad.double().norm())
            if self.last:
                param.grad = None  # its norm is taken: no later backward adds to it

        return fn

    @contextmanager
    def attached(self) -> Iterator[None]:
        """The hooks on every block's weights while the block runs, removed in ``finally``."""
        handles = [
            param.register_post_accumulate_grad_hook(self.hook(layer, name))
            for layer in range(self.model.n_layers)
            for name, param in self.model.blocks[layer].named_parameters()
            if param.requires_grad
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def layer_rows(self, layer: int, resid_grad_norm: float) -> list[dict]:
        """The three measures of one layer from its weights' gradient norms."""
        # one norm per stored weight; views of a fused weight (q, k, v of c_attn) together
        norms = [
            math.sqrt(sum(self.norms[id(p)] ** 2 for p in group if id(p) in self.norms))
            for group in self.model.layer_weights(layer)
        ]
        values = {
            "mean_param_grad_norm": sum(norms) / len(norms),
            "grad_norm": math.sqrt(sum(x * x for x in norms)),
            "resid_grad_norm": resid_grad_norm,
        }
        return [{"layer": layer, "measure": m, "value": v} for m, v in values.items()]


def _keep_inputs(model: Model, kept: dict[int, torch.Tensor]) -> list:
    """Forward hooks that keep each block's input residual with its gradient retained; the
    first block's input (after frozen embeddings) is made a leaf that requires grad."""

    def keep(layer: int) -> Any:
        def fn(tensor: torch.Tensor, hook: Any) -> torch.Tensor:
            if not tensor.requires_grad:
                tensor = tensor.detach().requires_grad_(True)
            else:
                tensor.retain_grad()
            kept[layer] = tensor
            return tensor

        return fn

    return [(model.hook_name(i, "resid_in"), keep(i)) for i in range(model.n_layers)]


def _input_gradient(layer: int, kept: torch.Tensor) -> torch.Tensor:
    """The gradient of the loss at the kept residual input of ``layer``."""
    if kept.grad is None:
        raise UnsupportedModelError(
            f"the backward did not reach the residual input of layer {layer}",
            fix="use a model whose blocks pass gradients to their input (none detached)",
        )
    return kept.grad.detach()


def check_gradients_finite(
    model: Model, kept: dict[int, torch.Tensor], weights: WeightNorms
) -> None:
    """Raise :class:`NumericalError` naming the first layer (from layer 0 up) whose weight
    gradients (as the hooks of ``weights`` found them) or residual-input gradient hold NaN or
    infinite values."""
    for layer in range(model.n_layers):
        bad = weights.not_finite.get(layer, set())
        names = [
            name.replace("_original_component.", "")
            for name, _ in model.blocks[layer].named_parameters()
            if name in bad
        ]
        resid = kept.get(layer)
        if resid is not None and resid.grad is not None and not all_finite(resid.grad):
            names.append("the residual at its input")
        if names:
            dtype = str(model.dtype).removeprefix("torch.")
            fix = f"check the weights of layer {layer} (too large weights overflow)"
            if torch.finfo(model.dtype).bits < 32:
                fix = f"load the model in float32 (--dtype float32), or {fix}"
            raise NumericalError(
                f"the gradients of layer {layer} ({', '.join(names[:3])}) hold NaN or infinite "
                f"values although the forward is finite: the backward overflows in {dtype}, "
                "so no gradient norm is defined",
                fix=fix,
            )


def _loss_masks(batches: list, positions: str) -> tuple[list, list, int]:
    selected = [position_mask(b, positions) for b in batches]
    masks = [loss_mask(b.labels, s) for b, s in zip(batches, selected, strict=True)]
    total = sum(int(m.sum()) for m in masks)
    if total == 0:
        raise InputError(
            "no selected position has a target, so there is no loss to differentiate",
            fix="pass labels, or use positions='all' (the last token of a decoder has no "
            "next-token target)",
        )
    return selected, masks, total


def gradient_norms(
    model: Model, data: Data, *, positions: str = "all", batch_size: int | None = None
) -> GradientResult:
    """Backpropagate the mean token loss and measure gradient norms per layer.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> res = gradient_norms(toy_model(n_layers=2), toy_tokens())
        >>> res.profile("grad_norm").index.tolist()
        [0, 1]
    """
    if torch.is_inference_mode_enabled():
        raise InputError(
            "gradient_norms was called inside torch.inference_mode(), where no gradient exists",
            fix="call it outside inference_mode (it turns gradients on only for itself)",
        )
    model = load(model)
    model.require_vocabulary("gradient_norms (it backpropagates the token loss)")
    batches = model.prepare(data, batch_size, backward=True)
    selected, masks, total = _loss_masks(batches, positions)
    acc = TokenMeans()
    loss_value = 0.0
    weights = WeightNorms(model)
    with _own_gradients(model), weights.attached():
        work = list(zip(batches, masks, selected, strict=True))
        for index, (batch, mask, chosen) in enumerate(counted(work)):
            weights.last = index == len(work) - 1
            kept: dict[int, torch.Tensor] = {}
            with torch.enable_grad(), model.hooks(_keep_inputs(model, kept)):
                logits = model.forward(batch)
                check_outputs_finite(logits)
                # float32 cross-entropy (a float64 one would hold three [tokens, vocabulary]
                # float64 tensors for the backward); the per-token losses add up in float64
                labels = labels_of(batch)
                tokens = F.cross_entropy(
                    logits.float().flatten(0, 1),
                    labels.flatten(),
                    ignore_index=-100,
                    reduction="none",
                ).view(labels.shape)
                loss = tokens.double()[mask].sum() / total
                del logits, tokens
                loss.backward()
            check_gradients_finite(model, kept, weights)
            for layer, tensor in kept.items():
                acc.add(layer, _input_gradient(layer, tensor).double().norm(dim=-1), chosen)
            loss_value += float(loss.detach())
        rows = [r for i in range(model.n_layers) for r in weights.layer_rows(i, acc.mean(i))]
    df = pd.DataFrame(rows)
    per_layer = df[df.measure == "mean_param_grad_norm"].set_index("layer")["value"]
    late = per_layer.index.isin(second_half(model.n_layers))
    first, second = per_layer[~late].mean(), per_layer[late].mean()
    summary = {
        "n_layers": model.n_layers,
        "loss": loss_value,
        "second_half_over_first_half": float(second / first) if first > 0 else float("nan"),
    }
    meta = result_meta(model, positions=positions, batch_size=batch_size)
    return GradientResult(df, summary, meta)
