"""Skip-effect matrix: how does skipping layer s change what every later layer writes?

With D_l = h_{l+1} - h_l the update of layer l in the clean forward and D'_l the same update
when layer s is skipped (its output := its input), the matrix entry is the per-token
``||D_l - D'_l||_2 / ||D_l||_2`` averaged over the selected positions, for l > s (Csordas et al.
2025). Large values below the diagonal mean later layers build on layer s; a matrix that is
near zero after the first few layers means the late layers compute independently of the early
ones' details. The output effect of skipping s is the mean ``||softmax(z') - softmax(z)||_2``.

Depth score: ``sum_l l * m_l / sum_l m_l`` with m_l the output effect of skipping layer l, the
centre of mass of the output's dependence over depth (0-based layer index; also reported
divided by L - 1). Per source layer, :meth:`SkipEffectResult.influence_centers` gives the same
centre of mass over the layers it influences.

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = skip_effects(toy_model(n_layers=3), toy_tokens())
    >>> res.matrix().shape, 0 <= res.summary["depth_score_normalized"] <= 1
    ((3, 3), True)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses._common import TokenMeans, check_finite, output_change
from probekit.data import Data, position_mask
from probekit.model import Model, load
from probekit.result import Result

_EPS = 1e-12


class SkipEffectResult(Result):
    """``df`` columns: ``skipped_layer``, ``target`` ('layer' or 'output'), ``target_layer``
    (the later layer, or -1 for the output), ``value``. ``summary``: ``depth_score``,
    ``depth_score_normalized``, ``n_layers``, ``max_downstream_effect``.
    """

    kind = "skip_effects"

    def matrix(self) -> pd.DataFrame:
        """The layers x layers matrix (rows: skipped layer, columns: affected layer)."""
        n = int(self.summary["n_layers"])
        part = self.df[self.df.target == "layer"]
        mat = part.pivot(index="skipped_layer", columns="target_layer", values="value")
        return mat.reindex(index=range(n), columns=range(n))

    def output_effect(self) -> pd.Series:
        """Output effect (mean ||softmax' - softmax||) of skipping each layer."""
        part = self.df[self.df.target == "output"]
        return part.set_index("skipped_layer")["value"].sort_index()

    def influence_centers(self) -> pd.Series:
        """Per skipped layer s: sum_l l * M[s, l] / sum_l M[s, l] over the layers l > s."""
        mat = self.matrix().to_numpy()
        cols = np.arange(mat.shape[1], dtype=float)
        weights = np.nan_to_num(mat)
        totals = weights.sum(1)
        centers = np.where(
            totals > 0, (weights * cols).sum(1) / np.where(totals > 0, totals, 1), np.nan
        )
        return pd.Series(centers, index=range(mat.shape[0]), name="influence_center")

    def figure(self) -> go.Figure:
        mat = self.matrix()
        return figures.heatmap(
            mat.to_numpy(),
            x=list(mat.columns),
            y=list(mat.index),
            title="Effect of skipping layer s on later updates ||D_l - D'_l|| / ||D_l|| "
            f"(depth score {self.summary['depth_score']:.2f})",
            x_title="affected layer l",
            y_title="skipped layer s",
            colorbar="relative change",
        )


@torch.no_grad()
def skip_effects(
    model: Model, data: Data, *, positions: str = "all", batch_size: int | None = None
) -> SkipEffectResult:
    """Skip every layer in turn and measure the change of each later layer's update.

    Args:
        model: a :class:`probekit.Model` or anything :func:`probekit.load` accepts.
        data: token data; padding never enters the averages.
        positions: 'all' real tokens or the 'last' real token of each sequence.
        batch_size: split the data into batches of at most this many sequences.
    """
    model = load(model)
    n = model.n_layers
    acc = TokenMeans()
    for batch in model.prepare(data, batch_size):
        trace = model.trace(batch)
        check_finite(trace.logits)
        mask = position_mask(batch, positions)
        clean_updates = [trace.residuals[i + 1] - trace.residuals[i] for i in range(n)]
        for skipped in range(n):

            def observe(
                layer: int, h_in, h_out, skipped=skipped, updates=clean_updates, mask=mask
            ) -> None:
                clean = updates[layer]
                change = (h_out - h_in - clean).double().norm(dim=-1)
                acc.add((skipped, layer), change / (clean.double().norm(dim=-1) + _EPS), mask)

            logits = trace.resume(skipped + 1, trace.residuals[skipped], observe=observe)
            check_finite(logits, "the outputs of a skipped-layer forward")
            prob_l2 = output_change(trace.logits, logits, batch.labels)["prob_l2"]
            acc.add((skipped, "output"), prob_l2, mask)
    rows = [
        {"skipped_layer": s, "target": "layer", "target_layer": t, "value": acc.mean((s, t))}
        for s in range(n)
        for t in range(s + 1, n)
    ]
    rows += [
        {
            "skipped_layer": s,
            "target": "output",
            "target_layer": -1,
            "value": acc.mean((s, "output")),
        }
        for s in range(n)
    ]
    df = pd.DataFrame(rows)
    out = df[df.target == "output"]
    m = out["value"].to_numpy()
    score = float((out["skipped_layer"].to_numpy() * m).sum() / m.sum()) if m.sum() > 0 else np.nan
    within = df[df.target == "layer"]["value"]
    summary = {
        "n_layers": n,
        "depth_score": score,
        "depth_score_normalized": score / (n - 1) if n > 1 else np.nan,
        "max_downstream_effect": float(within.max()) if len(within) else np.nan,
    }
    return SkipEffectResult(df, summary, {"positions": positions, "model": repr(model)})
