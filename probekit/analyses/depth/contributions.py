"""Layer contributions by zero ablation: how much does each layer (and sublayer) change the output?

For each layer l, its whole update is removed (the block's output := its input), and separately
its attention and its MLP update are zeroed. The output change is measured per token (see
:data:`probekit.analyses._common.OUTPUT_MEASURES`) and averaged over the selected positions.
Each layer's *share* is its whole-layer measure divided by the sum over layers; the
*second-half share* (layers l >= L/2) is the depth-curse headline number: static pre-LN models
put little of their output in the second half.

Fast path: one clean forward keeps the residual entering every block; removing layer l only
changes what comes after it, so the ablated forward resumes at l+1 from the cached residual
(sublayer ablations resume at l). Numbers equal a full hooked forward per variant.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = contributions(toy_model(n_layers=4), toy_tokens())
    >>> round(res.summary["second_half_share"], 6) == round(res.second_half_share("prob_l2"), 6)
    True
    >>> fig = res.figure()          # a plotly figure; fig.show() in a notebook
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses._common import (
    OUTPUT_MEASURES,
    TokenMeans,
    add_output_change,
    check_finite,
    loss_mask,
    second_half,
    token_loss,
)
from probekit.data import Data, position_mask
from probekit.errors import InputError
from probekit.interventions import ablate_hooks
from probekit.model import Model, load
from probekit.result import Result

COMPONENTS = ("layer", "attn", "mlp")
SHARE_MEASURES = ("logit_l2", "kl", "prob_l2")


class ContributionResult(Result):
    """Per (layer, component, measure): the mean output change and, for whole layers, the share.

    ``df`` columns: ``layer``, ``component`` ('layer', 'attn', 'mlp'), ``measure``, ``value``,
    ``share``. ``summary``: ``second_half_share`` (by ``prob_l2``), ``second_half_share_<m>``
    for every share measure, ``clean_loss``, ``n_layers``, ``most_important_layer``,
    ``least_important_layer``.
    """

    kind = "contributions"

    def profile(self, measure: str = "prob_l2", component: str = "layer") -> pd.Series:
        """The measure per layer for one component, indexed by layer."""
        part = self.df[(self.df.measure == measure) & (self.df.component == component)]
        return part.set_index("layer")["value"].sort_index()

    def second_half_share(self, measure: str = "prob_l2") -> float:
        """Share of the whole-layer ``measure`` from layers ``l >= L/2`` (NaN if not measured)."""
        part = self.df[(self.df.measure == measure) & (self.df.component == "layer")]
        if part.empty or part["share"].isna().all():
            return float("nan")
        late = part.layer.isin(second_half(int(self.summary["n_layers"])))
        return float(part.loc[late, "share"].sum())

    def figure(self, measure: str = "prob_l2") -> go.Figure:
        part = self.df[self.df.measure == measure]
        n_layers = int(self.summary["n_layers"])
        fig = figures.bars(
            part,
            "layer",
            "value",
            "component",
            f"Zero-ablation contribution per layer ({measure}); second-half share "
            f"{self.second_half_share(measure):.1%}",
            "layer",
            measure,
        )
        return figures.shade_second_half(fig, n_layers)


@torch.no_grad()
def contributions(
    model: Model,
    data: Data,
    *,
    positions: str = "all",
    components: Sequence[str] = COMPONENTS,
    batch_size: int | None = None,
) -> ContributionResult:
    """Zero-ablate every layer and sublayer and measure the change of the output.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data (see :mod:`probekit.data`); padding never enters the averages.
        positions: 'all' real tokens, or only the 'last' real token of each sequence.
        components: any of 'layer' (whole block), 'attn', 'mlp'.
        batch_size: split the data into batches of at most this many sequences.

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> res = contributions(toy_model(n_layers=2), toy_tokens(), components=["layer"])
        >>> res.profile().index.tolist(), 0 <= res.summary["second_half_share"] <= 1
        ([0, 1], True)
    """
    model = load(model)
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise InputError(f"unknown components {sorted(unknown)}", fix=f"use {COMPONENTS}")
    acc = _ablation_means(model, model.prepare(data, batch_size), positions, components)
    rows = [
        {
            "layer": layer,
            "component": component,
            "measure": measure,
            "value": acc.mean((layer, component, measure)),
        }
        for component in components
        for layer in range(model.n_layers)
        for measure in OUTPUT_MEASURES
    ]
    df = pd.DataFrame(rows)
    df["share"] = np.nan
    summary: dict = {"n_layers": model.n_layers, "clean_loss": acc.mean("clean_loss")}
    if "layer" in components:
        summary.update(_add_shares(df, model.n_layers))
    meta = {"positions": positions, "components": list(components), "model": repr(model)}
    return ContributionResult(df, summary, meta)


@torch.no_grad()
def _ablation_means(
    model: Model, batches: list, positions: str, components: Sequence[str]
) -> TokenMeans:
    """Token means of every output measure per (layer, component), and the clean loss."""
    acc = TokenMeans()
    for batch in batches:
        trace = model.trace(batch)
        check_finite(trace.logits)
        mask = position_mask(batch, positions)
        acc.add("clean_loss", token_loss(trace.logits, batch.labels), loss_mask(batch.labels, mask))
        for layer in range(model.n_layers):
            for component in components:
                if component == "layer":
                    logits = trace.resume(layer + 1, trace.residuals[layer])
                else:
                    logits = trace.resume(layer, fwd_hooks=ablate_hooks(model, layer, component))
                add_output_change(acc, (layer, component), trace.logits, logits, batch.labels, mask)
    return acc


def _add_shares(df: pd.DataFrame, n_layers: int) -> dict:
    """Fill the whole-layer ``share`` column; return the second-half shares and extremes."""
    summary = {}
    late = list(second_half(n_layers))
    for measure in SHARE_MEASURES:
        sel = (df.component == "layer") & (df.measure == measure)
        total = df.loc[sel, "value"].sum()
        df.loc[sel, "share"] = df.loc[sel, "value"] / total if total > 0 else np.nan
        summary[f"second_half_share_{measure}"] = float(
            df.loc[sel & df.layer.isin(late), "share"].sum()
        )
    summary["second_half_share"] = summary["second_half_share_prob_l2"]
    profile = df[(df.component == "layer") & (df.measure == "prob_l2")].set_index("layer")
    summary["most_important_layer"] = int(profile["value"].idxmax())
    summary["least_important_layer"] = int(profile["value"].idxmin())
    return summary
