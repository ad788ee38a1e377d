"""Logit lens: decode the residual stream after every layer with the model's own head.

For depth d = 0 .. L (d = number of blocks applied; 0 is the embedding), p_d is the softmax of
the final norm + unembedding applied to the residual after d blocks (at d = L the model's own
output, taken from the clean forward: no head is run for it). Per token, averaged over
the selected positions: ``kl`` = KL(p_d || p_final) and ``topk_overlap`` = |top-k(p_d) ∩
top-k(p_final)| / k. With the convention (of the
:class:`~probekit.interventions.InterventionSetting` passed as ``setting=``; the lens reads
nothing else of it) ``"probekit"`` (default) both are averaged over all selected tokens of all
prompts pooled; with ``"csordas2025"`` over the tokens of each prompt,
then over the prompts (the reference's ``logitlens.py``; identical for equal-length prompts).
The summary gives the first depth at which the mean KL falls below
``kl_threshold`` (the layer where the prediction is essentially formed).

Example:
    >>> from probekit.toy import toy_model, toy_tokens
    >>> res = logit_lens(toy_model(n_layers=2), toy_tokens(), k=5)
    >>> int(res.df.depth.max()), res.summary["k"]
    (2, 5)
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
import torch

from probekit import figures
from probekit.analyses.common import (
    CHUNK_TOKENS,
    CleanSide,
    clean_side,
    result_meta,
    softmax_parts,
)
from probekit.analyses.depth.conventions import Reduction
from probekit.analyses.depth.shared import Shared, make_shared
from probekit.data import Data, position_mask
from probekit.errors import InputError
from probekit.interventions import InterventionSetting, check_setting
from probekit.model import Model, load
from probekit.progress import counted
from probekit.result import Result
from probekit.words import AXES, figure_words


@torch.no_grad()  # measures, never differentiated: work tensors are written in place
def lens_measures(
    layer_logits: torch.Tensor, final_logits: torch.Tensor | CleanSide, k: int
) -> dict[str, torch.Tensor]:
    """Per-token KL(p_layer || p_final) and top-k overlap with the final prediction.

    ``final_logits`` may be the :func:`~probekit.analyses.common.clean_side` of the final
    logits, computed once per batch. Computed in float32 chunks of
    :data:`~probekit.analyses.common.CHUNK_TOKENS` tokens (memory bounded by a chunk), with
    KL = sum p_layer (z_layer - z_final) - (lse_layer - lse_final), the log-sum-exps in float64.
    """
    labels = torch.full(layer_logits.shape[:-1], -100, device=layer_logits.device)
    side = final_logits if isinstance(final_logits, CleanSide) else clean_side(final_logits, labels)
    flat = layer_logits.reshape(-1, layer_logits.shape[-1])
    top_final = side.top(k)
    n, f64 = flat.shape[0], torch.float64
    kl = torch.empty(n, dtype=f64, device=flat.device)
    overlap = torch.empty(n, dtype=f64, device=flat.device)
    work = side.work(CHUNK_TOKENS)  # the temporaries, reused chunk after chunk
    for start in range(0, n, CHUNK_TOKENS):
        part = slice(start, min(start + CHUNK_TOKENS, n))
        z, rows = flat[part].float(), part.stop - part.start
        q, lse = softmax_parts(z, out=work[0, :rows])
        change = torch.sub(z, side.logits[part], out=work[1, :rows]).mul_(q)
        kl[part] = change.sum(-1).double() - (lse - side.lse[part])
        top_layer = z.topk(k, dim=-1).indices
        hits = (top_layer[:, :, None] == top_final[part][:, None, :]).any(-1)
        overlap[part] = hits.double().sum(-1) / k
    return {"kl": kl.view(side.shape), "topk_overlap": overlap.view(side.shape)}


class LogitLensResult(Result):
    """``df`` columns: ``depth`` (blocks applied, 0 = embeddings), ``measure`` ('kl' or
    'topk_overlap'), ``value``. ``summary``: ``k``, ``kl_threshold``, ``formed_at_depth``,
    ``mean_kl_second_half``."""

    kind = "logit_lens"

    def figure(self) -> go.Figure:
        from plotly.subplots import make_subplots

        fig = make_subplots(specs=[[{"secondary_y": True}]])
        kl = self.df[self.df.measure == "kl"]
        ov = self.df[self.df.measure == "topk_overlap"]
        fig.add_trace(
            go.Scatter(
                x=kl.depth,
                y=kl.value,
                name=figure_words("logit_lens", "kl"),
                mode="lines+markers",
                line={"color": figures.PALETTE[0]},
            ),
            secondary_y=False,
        )
        fig.add_trace(
            go.Scatter(
                x=ov.depth,
                y=ov.value,
                name=figure_words("logit_lens", "overlap", k=self.summary["k"]),
                mode="lines+markers",
                line={"color": figures.PALETTE[1]},
            ),
            secondary_y=True,
        )
        fig.update_yaxes(title_text=figure_words("logit_lens", "y"), secondary_y=False)
        figures.overlap_axis(fig)
        fig.update_xaxes(title_text=AXES["depth"])
        figures.integer_axis(fig, "x", n=int(self.df.depth.max()) + 1)
        return figures.base_layout(fig, figure_words("logit_lens"))


def _summary(df: pd.DataFrame, n_layers: int, k: int, kl_threshold: float) -> dict:
    """Where the prediction forms (the first depth whose KL is under ``kl_threshold``) and the
    mean KL over the second half of the depths."""
    kl = df[df.measure == "kl"].set_index("depth")["value"]
    formed = kl[kl < kl_threshold]
    half = (n_layers + 1) // 2
    return {
        "k": k,
        "kl_threshold": kl_threshold,
        "formed_at_depth": int(formed.index.min()) if len(formed) else n_layers,
        "mean_kl_second_half": float(kl[(kl.index > half) & (kl.index < n_layers)].mean())
        if n_layers - half > 1
        else float("nan"),
        "n_layers": n_layers,
    }


@torch.no_grad()
def logit_lens(
    model: Model,
    data: Data,
    *,
    k: int = 5,
    positions: str = "all",
    kl_threshold: float = 0.1,
    batch_size: int | None = None,
    setting: InterventionSetting = InterventionSetting(),
    cache: Shared | None = None,
) -> LogitLensResult:
    """Decode every layer's residual with the final head and compare with the final output.

    ``setting``: only its ``convention`` is read (the lens intervenes nowhere): 'probekit'
    (token mean over all prompts) or 'csordas2025' (mean per prompt, then over prompts).
    ``cache``: a
    :class:`~probekit.analyses.depth.shared.Shared` cache of one diagnosis (its clean traces).

    Example:
        >>> from probekit.toy import toy_model, toy_tokens
        >>> from probekit.interventions import InterventionSetting
        >>> setting = InterventionSetting(convention="csordas2025")
        >>> res = logit_lens(toy_model(), toy_tokens(), setting=setting)
        >>> res.meta["convention"]
        'csordas2025'
    """
    model = load(model)
    model.require_vocabulary("the logit lens")
    shared = make_shared(model, cache)
    if not 1 <= k <= model.d_vocab:
        raise InputError(f"k={k} is outside 1..{model.d_vocab}", fix="pick k <= vocabulary size")
    if not (isinstance(kl_threshold, int | float) and math.isfinite(kl_threshold)) or not (
        kl_threshold > 0
    ):
        raise InputError(
            f"kl_threshold={kl_threshold!r} is not a positive finite KL (nats)",
            fix="pass e.g. kl_threshold=0.1",
        )
    convention = check_setting(setting).convention
    reduction = Reduction("prompt_mean" if convention == "csordas2025" else "token_mean")
    first = 0
    for batch in counted(model.prepare(data, batch_size)):
        ids = list(range(first, first + batch.tokens.shape[0]))
        first += len(ids)
        trace, side = shared.trace(batch), shared.side(batch)
        mask = position_mask(batch, positions)
        for depth, residual in enumerate(trace.residuals):
            if depth == model.n_layers:  # the final depth decodes to the clean output itself
                layer_logits = side.logits
            else:
                with shared.precision():
                    layer_logits = model.head(residual, shared.logits_out(residual))
            measures = lens_measures(layer_logits, side, k)
            for name, values in measures.items():
                reduction.add((depth, name), values, mask, ids)
    rows = [
        {"depth": d, "measure": m, "value": reduction.value((d, m))}
        for d in range(model.n_layers + 1)
        for m in ("kl", "topk_overlap")
    ]
    df = pd.DataFrame(rows)
    summary = _summary(df, model.n_layers, k, kl_threshold)
    meta = result_meta(model, positions=positions, batch_size=batch_size, convention=convention)
    return LogitLensResult(df, summary, meta)
