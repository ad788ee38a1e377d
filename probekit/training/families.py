"""Depth/width families: GPT-2-style models of one parameter budget whose depth varies.

Two styles (Petty et al. 2024; Levine et al. 2020):

- ``"mlp"``: hold ``d_model`` (and the heads) fixed and shrink the MLP width as depth grows;
- ``"width"``: shrink ``d_model`` as depth grows, keeping ``d_mlp`` near ``mlp_ratio * d_model``
  (``d_model`` is a multiple of ``n_heads``; ``d_mlp`` absorbs the rounding so the count still
  meets the budget).

Parameters are counted exactly as Hugging Face's ``GPT2LMHeadModel`` has them (token and
position embeddings, an untied output embedding unless ``tie_embeddings``, per block
``4 d^2 + 2 d f + 9 d + f``, final layer norm ``2 d``); every member must be within
``tolerance`` (default 1%) of the budget, else a :class:`~probekit.errors.ConfigError` says
which depth cannot be met and what to change.

Example:
    >>> fam = depth_family(1_000_000, depths=[2, 4, 8], style="mlp", d_model=128, n_heads=4)
    >>> fam.df[["depth", "d_model", "d_mlp"]].values.tolist()
    [[2, 128, 1583], [4, 128, 662], [8, 128, 201]]
    >>> bool((fam.df.budget_error.abs() < 0.01).all())
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from probekit import figures
from probekit.errors import ConfigError
from probekit.result import Result
from probekit.training.checks import check_int, check_real, is_int
from probekit.training.models import ModelConfig
from probekit.words import SETTINGS, figure_words


def gpt2_parameter_count(
    n_layers: int,
    d_model: int,
    d_mlp: int,
    vocab_size: int,
    n_positions: int,
    tie_embeddings: bool = False,
) -> int:
    """Exact parameter count of a Hugging Face GPT-2 LM with these settings."""
    d, f = d_model, d_mlp
    embeddings = vocab_size * d * (1 if tie_embeddings else 2) + n_positions * d
    per_block = 4 * d * d + 2 * d * f + 9 * d + f
    return embeddings + n_layers * per_block + 2 * d


def _mlp_width_for(budget: int, n_layers: int, d_model: int, fixed: dict[str, Any]) -> int:
    """The MLP width that brings a model of this depth and width closest to the budget."""
    d = d_model
    base = gpt2_parameter_count(n_layers, d, 0, **fixed)
    return round((budget - base) / (n_layers * (2 * d + 1)))


class FamilyResult(Result):
    """A depth/width family. ``df``: ``depth``, ``d_model``, ``d_mlp``, ``n_heads``,
    ``params``, ``budget_error`` (relative), ``d_model_over_d_mlp``. ``summary``: ``budget``,
    ``style``, ``max_abs_budget_error``. :meth:`model_configs` gives the trainer's configs."""

    kind = "family"

    def model_configs(self, **overrides: Any) -> list[ModelConfig]:
        """One :class:`ModelConfig` per member (``overrides`` set e.g. gamma or activation)."""
        base = {**self.meta.get("fixed", {}), **overrides}
        base.pop("tie_embeddings", None)
        return [
            ModelConfig(
                n_layers=int(row.depth),
                d_model=int(row.d_model),
                d_mlp=int(row.d_mlp),
                n_heads=int(row.n_heads),
                tie_embeddings=bool(self.meta.get("fixed", {}).get("tie_embeddings", False)),
                **base,
            )
            for row in self.df.itertuples()
        ]

    def figure(self) -> go.Figure:
        from plotly.subplots import make_subplots

        fig = make_subplots(specs=[[{"secondary_y": True}]])
        for i, column in enumerate(("d_model", "d_mlp")):
            fig.add_trace(
                go.Scatter(
                    x=self.df.depth,
                    y=self.df[column],
                    name=figure_words("family", column),
                    mode="lines+markers",
                    line={"color": figures.PALETTE[i]},
                ),
                secondary_y=False,
            )
        fig.add_trace(
            go.Bar(
                x=self.df.depth,
                y=self.df.params,
                name=figure_words("family", "params"),
                opacity=0.25,
                marker_color=figures.PALETTE[2],
            ),
            secondary_y=True,
        )
        fig.update_xaxes(title_text=SETTINGS["depth"])
        figures.integer_axis(fig, "x", n=int(self.df.depth.max()) + 1)
        fig.update_yaxes(title_text=figure_words("family", "y"), secondary_y=False)
        fig.update_yaxes(title_text=figure_words("family", "y_params"), secondary_y=True)
        return figures.base_layout(fig, figure_words("family", **self.summary))


def _check_family(budget: int, depths: Sequence[int], style: str) -> None:
    if style not in ("mlp", "width"):
        raise ConfigError(f"unknown family style {style!r}", fix="use style='mlp' or 'width'")
    if isinstance(depths, str) or not isinstance(depths, Sequence | range):
        raise ConfigError(f"depths {depths!r:.60} is not a list", fix="e.g. [2, 4, 8]")
    if not depths or any(not is_int(L) or L < 1 for L in depths):
        raise ConfigError(f"depths {list(depths)} must be positive integers", fix="e.g. [2, 4, 8]")
    check_real("budget", budget, positive=True, example="a parameter count, e.g. 200000")


def _width_for(budget: int, depth: int, n_heads: int, mlp_ratio: float, fixed: dict) -> int:
    """The width (a multiple of ``n_heads``) of a ``depth``-layer model near ``budget``."""
    # solve (4 + 2r) L d^2 + (emb + (9 + r) L + 2) d = budget for d, then round to heads
    emb = fixed["vocab_size"] * (1 if fixed["tie_embeddings"] else 2) + fixed["n_positions"]
    a = (4 + 2 * mlp_ratio) * depth
    b = emb + (9 + mlp_ratio) * depth + 2
    exact = (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)
    return max(n_heads, round(exact / n_heads) * n_heads)


def _member(
    budget: int, depth: int, width: int, n_heads: int, tolerance: float, fixed: dict
) -> dict[str, Any]:
    """One row of the family: the MLP width that meets the budget at this depth and width."""
    d_mlp = _mlp_width_for(budget, depth, width, fixed)
    if d_mlp < 1:
        raise ConfigError(
            f"a {depth}-layer model of width {width} already exceeds the budget of "
            f"{budget:,} parameters without any MLP",
            fix="raise the budget, lower d_model, or drop the deepest depths",
        )
    params = gpt2_parameter_count(depth, width, d_mlp, **fixed)
    error = (params - budget) / budget
    if abs(error) > tolerance:
        raise ConfigError(
            f"depth {depth} reaches {params:,} parameters, {error:+.2%} off the budget "
            f"{budget:,} (tolerance {tolerance:.0%})",
            fix="use a larger budget or a finer width (fewer heads)",
        )
    return {
        "depth": depth,
        "d_model": width,
        "d_mlp": d_mlp,
        "n_heads": n_heads,
        "params": params,
        "budget_error": error,
        "d_model_over_d_mlp": width / d_mlp,
    }


def depth_family(
    budget: int,
    depths: Sequence[int],
    *,
    style: str = "mlp",
    d_model: int = 64,
    n_heads: int = 4,
    mlp_ratio: float = 4.0,
    vocab_size: int = 201,
    n_positions: int = 9,
    tie_embeddings: bool = False,
    tolerance: float = 0.01,
) -> FamilyResult:
    """Model shapes of one family: every depth at (within ``tolerance`` of) ``budget``.

    ``style="mlp"`` keeps ``d_model`` and shrinks ``d_mlp``; ``style="width"`` shrinks
    ``d_model`` (a multiple of ``n_heads``) with ``d_mlp`` near ``mlp_ratio * d_model``.
    """
    _check_family(budget, depths, style)
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("vocab_size", vocab_size)):
        check_int(name, value)
    check_int("n_positions", n_positions)
    check_real("mlp_ratio", mlp_ratio, positive=True, example="e.g. 4.0")
    check_real("tolerance", tolerance, 0, example="e.g. 0.01")
    fixed = {
        "vocab_size": vocab_size,
        "n_positions": n_positions,
        "tie_embeddings": tie_embeddings,
    }
    rows = []
    for depth in sorted(set(depths)):
        width = d_model if style == "mlp" else _width_for(budget, depth, n_heads, mlp_ratio, fixed)
        rows.append(_member(budget, depth, width, n_heads, tolerance, fixed))
    df = pd.DataFrame(rows)
    summary = {
        "budget": int(budget),
        "style": style,
        "max_abs_budget_error": float(df.budget_error.abs().max()),
        "n_members": len(df),
    }
    return FamilyResult(df, summary, {"fixed": fixed, "mlp_ratio": mlp_ratio})


__all__ = ["FamilyResult", "depth_family", "gpt2_parameter_count"]
