"""The results of the depth-against-width studies, from their members tables: numbers with
intervals, sentences, figures and one HTML page.

- :func:`depth_width_result` (Petty et al. 2024): per budget, held-out and seen accuracy and LM
  perplexity against depth with bootstrap intervals over seeds, a saturating fit of accuracy
  against depth (:func:`~probekit.studies.fits.fit_saturation`) and the depth from which one
  more layer adds less than a threshold, held-out accuracy at equal perplexity (a regression on
  depth and LM loss) and the claim L* = (2/3) log2(N) held against the fit;
- :func:`transition_result` (Levine et al. 2020): LM loss against parameter count per depth,
  the transition between adjacent depths (:func:`~probekit.studies.fits.transition_width`),
  the line of its log-width against depth (:func:`~probekit.studies.fits.fit_transition`) and
  the optimal depth for given sizes read from it;
- :func:`write_study_page`: ``index.html`` (figures, sentences, tables) and tidy CSVs.

Both results keep the members table as ``.df`` (one row per trained member) and the numbers
and sentences in ``.summary`` (JSON-ready); the per-depth aggregates (:meth:`depth_summary`)
and the figures are drawn again from them, so a loaded result draws the same figures. A table
with missing columns, non-finite scores or fewer than 3 depths is refused before any work; a
fit that fails is recorded with its reason instead of a number, and its figure shows the
points without a line.

Accuracies are fractions in the table (0 to 1) and percentages in the sentences and figures.

Example:
    >>> import numpy as np, pandas as pd
    >>> rows = [dict(budget=1_000_000, depth=L, d_model=64, d_mlp=256, n_heads=4,
    ...              n_params=1_000_000, seed=s, lm_val_loss=2.5 - 0.02 * L + 0.01 * s,
    ...              lm_perplexity=float(np.exp(2.5 - 0.02 * L + 0.01 * s)),
    ...              acc_seen=0.9 - 0.4 * np.exp(-L / 3) + 0.01 * s,
    ...              acc_heldout=0.7 - 0.5 * np.exp(-L / 3) + 0.01 * s,
    ...              pretrain_flops=1e12, finetune_flops=1e11, seconds=60.0)
    ...         for L in (1, 2, 4, 6, 8, 12) for s in (0, 1, 2)]
    >>> result = depth_width_result(pd.DataFrame(rows), {"n_boot": 200})
    >>> result.summary["saturation"]["1000000"]["form"]
    'exp'
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from probekit import figures
from probekit.errors import ConfigError, InputError, NumericalError
from probekit.result import Result, json_ready
from probekit.studies.fits import (
    MIN_BOOT,
    PARAMETERS,
    Estimate,
    as_text,
    check_columns,
    fit_saturation,
    fit_transition,
    form_values,
    l_star,
    transition_width,
)
from probekit.words import SETTINGS, figure_words

DEPTH_WIDTH_COLUMNS = (
    "budget", "depth", "d_model", "d_mlp", "n_heads", "n_params", "seed", "lm_val_loss",
    "lm_perplexity", "acc_seen", "acc_heldout", "pretrain_flops", "finetune_flops", "seconds",
)  # fmt: skip
"""The columns of a depth-width (Petty) members table, one row per member."""

TRANSITION_COLUMNS = (
    "depth", "width", "d_mlp", "n_heads", "n_params", "seed", "lm_val_loss", "pretrain_flops",
    "seconds",
)  # fmt: skip
"""The columns of a transition (Levine) members table, one row per member."""

WHOLE = ("budget", "depth", "seed", "width", "n_params")
"""Columns of counts, kept as integers when every value is whole (e.g. from an object column)."""

MEASURES = ("acc_heldout", "acc_seen", "lm_perplexity", "lm_val_loss")
"""What :meth:`DepthWidthResult.depth_summary` aggregates per budget and depth."""

DEFAULTS = {"threshold": 0.005, "n_boot": 1000, "seed": 0, "level": 0.95}
"""The settings a study's ``meta`` may override: the saturation ``threshold`` (a fraction of
accuracy: 0.005 is half a point), bootstrap resamples, their seed and the interval level."""


# --- words -----------------------------------------------------------------------------------


def size_words(n: float) -> str:
    """A parameter count as people write it.

    Example:
        >>> size_words(1_000_000), size_words(41e6), size_words(134e6), size_words(250_000)
        ('1.0M', '41M', '134M', '250k')
    """
    if n >= 1e9:
        value, unit = n / 1e9, "B"
    elif n >= 1e6:
        value, unit = n / 1e6, "M"
    else:
        value, unit = n / 1e3, "k"
    return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"


def _span(estimate: Estimate, digits: int = 1) -> str:
    """``value (low–high)`` with ``digits`` decimals."""
    return f"{estimate.value:.{digits}f} ({estimate.low:.{digits}f}–{estimate.high:.{digits}f})"


def _estimate(entry: dict[str, Any], name: str) -> Estimate:
    """The :class:`Estimate` ``name`` of a flat summary entry (``name``, ``name_low``,
    ``name_high``, ``level``)."""
    return Estimate(entry[name], entry[f"{name}_low"], entry[f"{name}_high"], entry["level"])


def _key(budget: float) -> str:
    """A budget as the key of the summary's per-budget entries (JSON object keys are text)."""
    return str(int(budget)) if float(budget).is_integer() else repr(float(budget))


# --- checks ----------------------------------------------------------------------------------


def _settings(meta: dict[str, Any] | None) -> dict[str, Any]:
    """:data:`DEFAULTS` updated by ``meta``, checked (:class:`~probekit.errors.ConfigError`)."""
    if meta is not None and not isinstance(meta, dict):
        raise InputError(f"meta is a {type(meta).__name__}, not a dict", fix="pass a dict or {}")
    settings = {**DEFAULTS, **(meta or {})}
    threshold, level = settings["threshold"], settings["level"]
    if not _real(threshold) or not 0 < threshold < 1:
        raise ConfigError(
            f"threshold = {threshold!r} is not a fraction of accuracy in (0, 1)",
            fix="pass e.g. 0.005 (half a point)",
        )
    if not _real(level) or not 0 < level < 1:
        raise ConfigError(f"level = {level!r} is not in (0, 1)", fix="pass e.g. 0.95")
    for name, low in (("n_boot", MIN_BOOT), ("seed", 0)):
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ConfigError(
                f"{name} = {value!r} is not an integer >= {low}", fix=f"pass {name} >= {low}"
            )
    return settings


def _meta(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings as the result's ``meta``: JSON values (anything else as its text), so the
    result saves whatever the caller's configuration holds."""
    return json.loads(json.dumps(json_ready(settings), default=str))


def _real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _checked_table(
    members: Any, columns: tuple[str, ...], finite: tuple[str, ...], what: str
) -> pd.DataFrame:
    """``members`` with every column of ``columns``, the ``finite`` ones as finite floats."""
    fix = f"pass one row per member with the columns {list(columns)}"
    check_columns(members, columns, f"the {what} members table", fix)
    if members.empty:
        raise InputError(f"the {what} members table has no rows", fix="train the members first")
    table = members.reset_index(drop=True).copy()
    for column in finite:
        values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            row = table.iloc[bad[0]]
            raise InputError(
                f"the {what} members table has {bad.size} non-finite or missing {column!r} "
                f"value(s), first at depth {row['depth']}, seed {row['seed']}",
                fix="rerun or drop the failed members before building the result",
            )
        if pd.api.types.is_integer_dtype(table[column]):
            continue
        whole = column in WHOLE and bool(np.all(values == np.round(values)))
        table[column] = values.astype(np.int64) if whole else values  # counts stay whole
    depths = table["depth"].to_numpy()
    if (depths < 1).any() or not np.all(depths == np.round(depths)):
        raise InputError(
            f"the {what} members table has depths that are not whole numbers >= 1",
            fix="give each member its number of layers",
        )
    return table


def _check_accuracies(table: pd.DataFrame) -> None:
    for column in ("acc_seen", "acc_heldout"):
        values = table[column]
        if ((values < 0) | (values > 1)).any():
            raise InputError(
                f"{column!r} has values outside 0–1 (largest {values.max():.4g})",
                fix="give accuracies as fractions (0.45, not 45%)",
            )


def _check_depth_counts(table: pd.DataFrame, by: str | None, what: str) -> None:
    """At least 3 distinct depths (per ``by`` group when given)."""
    groups = [(None, table)] if by is None else list(table.groupby(by))
    for name, part in groups:
        depths = sorted(part.depth.unique().tolist())
        if len(depths) < 3:
            where = "" if name is None else f" at budget {size_words(float(name))} ({name:g})"
            raise InputError(
                f"the {what} has {len(depths)} depth(s){where} ({depths}): a fit against "
                "depth needs at least 3",
                fix="train at least 3 depths (for the transition line, 4 or more)",
            )


def _check_duplicates(table: pd.DataFrame, keys: list[str], what: str) -> None:
    repeated = table.duplicated(keys)
    if repeated.any():
        row = table[repeated].iloc[0]
        where = ", ".join(f"{k} {row[k]}" for k in keys)
        raise InputError(
            f"the {what} members table has {int(repeated.sum())} repeated member(s), e.g. {where}",
            fix=f"keep one row per {', '.join(keys)}",
        )


# --- bootstrap of means over seeds -------------------------------------------------------------


def _mean_interval(values: np.ndarray, n_boot: int, seed: int, level: float) -> tuple[float, ...]:
    """The mean of ``values`` (one per seed) and the percentile interval of its bootstrap over
    the seeds (NaN with one seed: no spread to read)."""
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = values[rng.integers(len(values), size=(n_boot, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return mean, float(low), float(high)


def _aggregate(
    table: pd.DataFrame, by: list[str], measures: tuple[str, ...], settings: dict[str, Any]
) -> pd.DataFrame:
    """One row per ``by`` group and measure: ``n_seeds``, ``mean``, ``low``, ``high``."""
    rows = []
    for key, part in table.groupby(by, sort=True):
        keys = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        for measure in measures:
            mean, low, high = _mean_interval(
                part[measure].to_numpy(dtype=float),
                int(settings["n_boot"]),
                int(settings["seed"]),
                float(settings["level"]),
            )
            rows.append(
                {**keys, "measure": measure, "n_seeds": len(part), "mean": mean}
                | {"low": low, "high": high}
            )
    return pd.DataFrame(rows)


# --- the depth-width study ---------------------------------------------------------------------


def _saturation_entry(
    part: pd.DataFrame, column: str, settings: dict[str, Any], what: str
) -> dict[str, Any]:
    """The saturating fit of ``column`` (in %) against depth, flat, with the saturation depth
    and the sentence; or ``{"reason": ...}`` when the fit fails."""
    groups = part.seed.to_numpy() if part.seed.nunique() > 1 else None
    points = 100 * settings["threshold"]
    try:
        fit = fit_saturation(
            part.depth.to_numpy(dtype=float),
            100 * part[column].to_numpy(dtype=float),
            groups=groups,
            n_boot=int(settings["n_boot"]),
            seed=int(settings["seed"]),
            level=float(settings["level"]),
        )
        depth = fit.saturation_depth(points)
    except (NumericalError, InputError) as err:  # refused tables were refused before
        return {"reason": err.problem, "sentence": f"{what}: no fit ({err.problem})"}
    entry = fit.to_dict() | depth.to_dict("saturation_depth")
    entry["sentence"] = fit.describe(points, what=what, unit="%")
    entry["reason"] = ""
    return entry


def _l_star_check(budget: float, part: pd.DataFrame, entry: dict[str, Any]) -> dict[str, Any]:
    """L* = (2/3) log2(budget) beside the fitted saturation depth and the best measured depth,
    and whether the claim holds: L* inside the saturation depth's interval."""
    means = part.groupby("depth").acc_heldout.mean()
    tied = bool(means.max() == means.min())
    best = None if tied else int(means.idxmax())
    claim = l_star(budget)
    head = f"at N = {size_words(budget)}, L* = (2/3) log2(N) = {claim:.1f}"
    check: dict[str, Any] = {"l_star": claim, "best_depth": best}
    check["best_heldout_accuracy"] = float(means.max())
    said = (
        f"held-out accuracy is {100 * means.max():.1f}% at every depth measured: no depth is best"
        if tied
        else f"the best measured depth was {best} ({100 * means.max():.1f}% held-out)"
    )
    if entry.get("reason"):
        check["l_star_holds"] = None
        check["l_star_sentence"] = (
            f"{head}; the saturating fit failed ({entry['reason']}); {said}; the claim is not "
            "checked without the fit"
        )
        return check
    sat = _estimate(entry, "saturation_depth")
    holds = bool(sat.covers(claim))
    if holds:
        verdict = "L* lies inside the saturation depth's interval: the claim holds at this size"
    else:
        side = "above" if claim > sat.high else "below"
        verdict = (
            f"L* lies {side} the saturation depth's interval: the claim does not hold at this size"
        )
    check["l_star_holds"] = holds
    check["l_star_sentence"] = (
        f"{head}; the fitted gain of one more layer drops below {100 * entry['threshold']:g} "
        f"points at depth {_span(sat)}; {said}: {verdict}"
    )
    return check


LM_MEASURES = ("lm_val_loss", "lm_perplexity")
"""The language model's scores of a member: missing in every row when the members were trained
on the task from scratch (no pretraining)."""


def _pretrained(members: Any) -> bool:
    """Whether the members were pretrained: not every LM score is missing (a table without the
    columns is refused later, naming them)."""
    if not isinstance(members, pd.DataFrame) or not set(LM_MEASURES) <= set(members.columns):
        return True
    scores = members.loc[:, list(LM_MEASURES)].apply(pd.to_numeric, errors="coerce")
    return not scores.isna().all().all()


def _not_pretrained() -> dict[str, Any]:
    reason = (
        "no language model was pretrained (the members were trained on the task from scratch): "
        "there is no perplexity to hold equal"
    )
    sentence = f"held-out accuracy at equal perplexity: not measured ({reason})"
    return {"reason": reason, "deeper_better": None, "sentence": sentence}


def _design(table: pd.DataFrame, budgets: list[float]) -> np.ndarray:
    """Columns: depth, LM validation loss, one intercept per budget."""
    ones = [(table.budget.to_numpy() == b).astype(float) for b in budgets]
    return np.column_stack([table.depth.to_numpy(float), table.lm_val_loss.to_numpy(float), *ones])


def _least_squares(design: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """The coefficients, or None when the design is rank-deficient."""
    if np.linalg.matrix_rank(design) < design.shape[1]:
        return None
    return np.linalg.lstsq(design, y, rcond=None)[0]


def _equal_perplexity(table: pd.DataFrame, settings: dict[str, Any]) -> dict[str, Any]:
    """Held-out accuracy (%) ~ b depth + c LM loss + one intercept per budget, over members,
    with a pairs bootstrap (members resampled within each budget) for b and c."""
    budgets = sorted(table.budget.unique().tolist())
    design, y = _design(table, budgets), 100 * table.acc_heldout.to_numpy(float)
    model = "held-out accuracy (%) = a + b·depth + c·LM loss" + (
        " (one a per budget)" if len(budgets) > 1 else ""
    )
    entry: dict[str, Any] = {"model": model, "n_members": len(table)}
    if np.ptp(y) == 0:
        reason = f"held-out accuracy is {y[0]:.3g}% for every member: there is nothing to regress"
        return entry | {"reason": reason, "deeper_better": None, "sentence": f"{model}: {reason}"}
    beta = _least_squares(design, y) if len(y) > design.shape[1] + 1 else None
    if beta is None:
        reason = (
            "depth, LM loss and the budgets are collinear or too few members "
            f"({len(y)} for {design.shape[1]} coefficients): depth cannot be told from perplexity"
        )
        return entry | {"reason": reason, "deeper_better": None, "sentence": f"{model}: {reason}"}
    rng = np.random.default_rng(int(settings["seed"]))
    rows = [np.flatnonzero(table.budget.to_numpy() == b) for b in budgets]
    draws = []
    for _ in range(int(settings["n_boot"])):
        index = np.concatenate([rng.choice(r, size=len(r)) for r in rows])
        refit = _least_squares(design[index], y[index])
        draws.append(refit[:2] if refit is not None else [math.nan, math.nan])
    samples = np.array(draws)
    level = float(settings["level"])
    try:
        b, c = (_interval_of(float(beta[i]), samples[:, i], level, "bc"[i]) for i in (0, 1))
    except NumericalError as err:
        return entry | {
            "reason": err.problem,
            "deeper_better": None,
            "sentence": f"{model}: {err.problem}",
        }
    fitted = design @ beta
    r2 = 1 - float(np.sum((y - fitted) ** 2)) / float(np.sum((y - y.mean()) ** 2) or math.nan)
    entry |= b.to_dict("b") | c.to_dict("c") | {"r2": r2, "level": level, "reason": ""}
    entry["intercepts"] = {_key(budget): float(beta[2 + i]) for i, budget in enumerate(budgets)}
    entry["deeper_better"] = bool(b.low > 0)
    entry["sentence"] = _equal_perplexity_sentence(b, c, r2, len(y), model)
    return entry


def _interval_of(value: float, samples: np.ndarray, level: float, name: str) -> Estimate:
    finite = samples[np.isfinite(samples)]
    if finite.size < len(samples) / 2:
        raise NumericalError(
            f"most bootstrap refits of {name} were rank-deficient", fix="train more members"
        )
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(value, float(low), float(high), level)


def _equal_perplexity_sentence(b: Estimate, c: Estimate, r2: float, n: int, model: str) -> str:
    numbers = (
        f"at equal LM validation loss one more layer changes held-out accuracy by {b} points "
        f"(c = {as_text(c.value)} points per nat of loss, R² = {r2:.2f}; {model}, over {n} "
        "members, members resampled within each budget)"
    )
    if b.low > 0:
        return f"deeper is better at equal perplexity: {numbers}"
    if b.high < 0:
        return f"deeper is worse at equal perplexity: {numbers}"
    return (
        f"deeper is better at equal perplexity is not shown: the interval of b covers 0; {numbers}"
    )


def depth_width_result(
    members: pd.DataFrame, meta: dict[str, Any] | None = None
) -> DepthWidthResult:
    """The result of a depth-width study (Petty et al. 2024) from its members table (one row per
    trained member, the columns of :data:`DEPTH_WIDTH_COLUMNS`; accuracies as fractions).

    Per budget: the saturating fit of held-out accuracy (in %) against depth
    (:func:`~probekit.studies.fits.fit_saturation`, whole seeds resampled when there are
    several) with the depth from which one more layer adds less than ``meta["threshold"]``
    (default 0.005: half a point), the same fit of seen accuracy, and the claim L* = (2/3)
    log2(N) held against it (it holds when L* lies inside the saturation depth's interval).
    Across members: held-out accuracy at equal perplexity, the regression ``accuracy = a +
    b·depth + c·LM loss`` with one ``a`` per budget; deeper is better at equal perplexity when
    b's bootstrap interval lies above 0. ``meta`` also sets ``n_boot``, ``seed`` and ``level``
    (:data:`DEFAULTS`) and is kept as the result's ``meta``.

    Refused (:class:`~probekit.errors.InputError`): missing columns, non-finite or missing
    depths, seeds, losses, perplexities or accuracies, accuracies outside 0–1, fewer than 3
    depths at a budget, repeated members. A fit that fails is recorded with its ``reason``.
    """
    settings = _settings(meta)
    pretrained = _pretrained(members)
    table = _checked_table(
        members,
        DEPTH_WIDTH_COLUMNS,
        (
            "budget",
            "depth",
            "seed",
            "acc_seen",
            "acc_heldout",
            *(LM_MEASURES if pretrained else ()),
        ),
        "depth-width",
    )
    _check_accuracies(table)
    _check_duplicates(table, ["budget", "depth", "seed"], "depth-width")
    _check_depth_counts(table, "budget", "depth-width members table")
    saturation, seen, sentences = {}, {}, []
    budgets = sorted(table.budget.unique().tolist())
    for budget, part in table.groupby("budget", sort=True):
        name = f"budget {size_words(float(budget))}: held-out accuracy"
        entry = _saturation_entry(part, "acc_heldout", settings, name)
        entry |= _l_star_check(float(budget), part, entry | {"threshold": settings["threshold"]})
        saturation[_key(budget)] = entry
        seen[_key(budget)] = _saturation_entry(
            part, "acc_seen", settings, f"budget {size_words(float(budget))}: seen accuracy"
        )
        sentences += [entry["sentence"], entry["l_star_sentence"], seen[_key(budget)]["sentence"]]
    equal = _equal_perplexity(table, settings) if pretrained else _not_pretrained()
    summary = {
        "n_members": len(table),
        "n_seeds": int(table.seed.nunique()),
        "budgets": [int(b) if float(b).is_integer() else float(b) for b in budgets],
        "threshold": float(settings["threshold"]),
        "level": float(settings["level"]),
        "sentences": [*sentences, equal["sentence"]],
        "saturation": saturation,
        "seen_saturation": seen,
        "equal_perplexity": equal,
    }
    return DepthWidthResult(table, json_ready(summary), _meta(settings))


def _fit_line(entry: dict[str, Any], depths: np.ndarray) -> np.ndarray:
    """The saturating fit recorded in ``entry`` at ``depths``."""
    form = entry["form"]
    return form_values(form, depths, np.array([entry[name] for name in PARAMETERS[form]]))


def _band(x: Any, low: Any, high: Any, color: str, group: str) -> go.Scatter:
    """A shaded interval band between ``low`` and ``high`` (gaps where undefined)."""
    xs = np.concatenate([np.asarray(x, float), np.asarray(x, float)[::-1]])
    ys = np.concatenate([np.asarray(high, float), np.asarray(low, float)[::-1]])
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines",
        fill="toself",
        fillcolor=_faint(color),
        line={"width": 0},
        hoverinfo="skip",
        showlegend=False,
        legendgroup=group,
    )


def _bands(result: Result) -> str:
    """What a figure's points and bands are, in words (one seed has no interval)."""
    n = int(result.df.seed.nunique())
    if n < 2:
        return figure_words("depth_width_study", "one_seed")
    level = f"{100 * float(result.summary.get('level', 0.95)):g}%"
    return figure_words("depth_width_study", "bands", n=n, level=level)


def _faint(color: str, alpha: float = 0.18) -> str:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{alpha})"


class DepthWidthResult(Result):
    """A depth-width study (:func:`depth_width_result`). ``df``: the members table, one row per
    member. ``summary``: ``sentences`` (what the study found, with numbers), ``saturation`` and
    ``seen_saturation`` (per budget key: the fit's numbers, ``saturation_depth`` and its
    interval, ``best_depth``, ``l_star``, ``l_star_holds``, or a ``reason``),
    ``equal_perplexity`` (``b``, ``c`` with intervals, ``r2``, ``deeper_better``, or a
    ``reason``), ``threshold``, ``level``, ``budgets``, counts. :meth:`depth_summary`: the
    per-depth means with their intervals."""

    kind = "depth_width_study"

    def depth_summary(self) -> pd.DataFrame:
        """One row per budget, depth and measure (:data:`MEASURES`): ``n_seeds``, ``mean``,
        ``low``, ``high`` (the bootstrap interval of the mean over seeds)."""
        measured = tuple(m for m in MEASURES if self.df[m].notna().any())
        return _aggregate(self.df, ["budget", "depth"], measured, _settings(self.meta))

    def figure(self, which: str = "depth") -> go.Figure:
        """``"depth"``: held-out and seen accuracy (%) and LM perplexity against depth, one
        colour per budget, bands over seeds, the saturating fits with their numbers in the
        legend; ``"equal_perplexity"``: held-out accuracy against LM validation loss, coloured
        by depth, with the regression's lines."""
        if which == "equal_perplexity":
            return self._equal_perplexity_figure()
        if which != "depth":
            raise InputError(f"no figure {which!r}", fix="pass 'depth' or 'equal_perplexity'")
        return self._depth_figure()

    def figures(self) -> dict[str, go.Figure]:
        """Every figure, by name (the page's)."""
        return {name: self.figure(name) for name in ("depth", "equal_perplexity")}

    def _depth_figure(self) -> go.Figure:
        from plotly.subplots import make_subplots

        words = "depth_width_study"
        panels = (("acc_heldout", "heldout"), ("acc_seen", "seen"), ("lm_perplexity", "perplexity"))
        fig = make_subplots(
            rows=1,
            cols=3,
            horizontal_spacing=0.08,
            subplot_titles=[figure_words(words, name) for _, name in panels],
        )
        aggregates = self.depth_summary()
        deepest = int(self.df.depth.max())
        for i, budget in enumerate(sorted(self.df.budget.unique())):
            color = figures.PALETTE[i % len(figures.PALETTE)]
            label = figure_words(words, "budget", budget=size_words(float(budget)))
            for col, (measure, _) in enumerate(panels, start=1):
                part = aggregates[(aggregates.budget == budget) & (aggregates.measure == measure)]
                scale = 100 if measure.startswith("acc") else 1
                fig.add_trace(
                    _band(part.depth, scale * part.low, scale * part.high, color, label),
                    row=1,
                    col=col,
                )
                fig.add_trace(
                    go.Scatter(
                        x=part.depth,
                        y=scale * part["mean"],
                        mode="markers" if measure.startswith("acc") else "lines+markers",
                        line={"color": color},
                        marker={"color": color, "size": 8},
                        name=label,
                        legendgroup=label,
                        showlegend=col == 1,
                    ),
                    row=1,
                    col=col,
                )
                fits = {"acc_heldout": "saturation", "acc_seen": "seen_saturation"}
                if measure in fits:
                    entry = self.summary[fits[measure]][_key(budget)]
                    what = figure_words(words, panels[col - 1][1])
                    trace = self._fit_trace(entry, f"{what}, budget {size_words(budget)}", color)
                    fig.add_trace(trace, row=1, col=col)
        for col in (1, 2, 3):
            fig.update_xaxes(title_text=SETTINGS["depth"], rangemode="tozero", row=1, col=col)
            figures.integer_axis(fig, "x", n=deepest + 1, row=1, col=col)
        for col in (1, 2):  # accuracies are never negative, even when all are 0
            fig.update_yaxes(
                title_text=figure_words(words, "y_accuracy"),
                rangemode="nonnegative",
                row=1,
                col=col,
            )
        fig.update_yaxes(title_text=figure_words(words, "y_perplexity"), row=1, col=3)
        title = figure_words(words, bands=_bands(self))
        return figures.base_layout(fig, title, width=1200, height=480)

    def _fit_trace(self, entry: dict[str, Any], what: str, color: str) -> go.Scatter:
        """The fit's line over the depths measured with its numbers in the legend, or (a failed
        fit) a legend entry with the reason and no line."""
        if entry.get("reason"):
            name = figure_words("depth_width_study", "no_fit", what=what, reason=entry["reason"])
            return go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line={"color": color, "dash": "dot"},
                name=figures.wrap(name, 110),
            )
        depths = np.linspace(float(self.df.depth.min()), float(self.df.depth.max()), 200)
        if entry["form"] == "exp":
            head = f"a − b·exp(−L/c), saturates at {_span(_estimate(entry, 'a'))}%"
        else:
            head = "a + b·ln L, no asymptote"
        text = (
            f"{head}; one more layer adds < {100 * self.summary['threshold']:g} points from depth "
            f"{_span(_estimate(entry, 'saturation_depth'))}; R² = {entry['r2']:.3f}"
        )
        return go.Scatter(
            x=depths,
            y=_fit_line(entry, depths),
            mode="lines",
            line={"color": color},
            name=figures.wrap(figure_words("depth_width_study", "fit", what=what, words=text), 130),
        )

    def _equal_perplexity_figure(self) -> go.Figure:
        words = "depth_width_study"
        entry = self.summary["equal_perplexity"]
        depths = sorted(int(d) for d in self.df.depth.unique())
        low, high = min(depths), max(depths)
        symbols = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star")
        fig = go.Figure()
        for i, budget in enumerate(sorted(self.df.budget.unique())):
            part = self.df[self.df.budget == budget]
            fig.add_trace(
                go.Scatter(
                    x=part.lm_val_loss,
                    y=100 * part.acc_heldout,
                    mode="markers",
                    name=figure_words(words, "budget", budget=size_words(float(budget))),
                    marker={
                        "color": part.depth,
                        "cmin": low,
                        "cmax": high,
                        "colorscale": figures.SEQUENTIAL,
                        "symbol": symbols[i % len(symbols)],
                        "size": 9,
                        "showscale": i == 0,
                        "colorbar": {
                            "title": {"text": figure_words(words, "depth_colorbar")},
                            "tickmode": "linear",
                            "tick0": 0,
                            "dtick": figures.round_step(max(high - low, 1), 6)
                            if high - low > 12
                            else 1,
                        },
                    },
                )
            )
            if not entry.get("reason"):
                for trace in self._regression_lines(part, budget, low, high):
                    fig.add_trace(trace)
        said = entry["sentence"]
        return figures.base_layout(
            fig,
            figure_words(words, "equal_perplexity", words=said),
            figure_words(words, "loss"),
            figure_words(words, "y_accuracy"),
            width=1000,
            height=520,
        )

    def _regression_lines(
        self, part: pd.DataFrame, budget: float, low: int, high: int
    ) -> list[go.Scatter]:
        """The regression at each depth of a budget, over that depth's loss range: parallel
        lines whose vertical gaps are b per layer."""
        from plotly.colors import sample_colorscale

        entry = self.summary["equal_perplexity"]
        intercept = entry["intercepts"][_key(budget)]
        lines = []
        for depth, rows in part.groupby("depth"):
            losses = np.array([rows.lm_val_loss.min(), rows.lm_val_loss.max()])
            where = (float(depth) - low) / max(high - low, 1)
            lines.append(
                go.Scatter(
                    x=losses,
                    y=intercept + entry["b"] * float(depth) + entry["c"] * losses,
                    mode="lines",
                    line={"color": sample_colorscale(figures.SEQUENTIAL, [where])[0], "width": 1},
                    showlegend=False,
                    hovertext=figure_words(
                        "depth_width_study",
                        "at_depth",
                        depth=int(depth),
                        budget=size_words(float(budget)),
                    ),
                )
            )
        return lines


# --- the transition study ----------------------------------------------------------------------


def _count_fit(table: pd.DataFrame) -> tuple[np.ndarray, float]:
    """The members' parameter counts as ``p0 L d² + p1 L d + p2 d + p3`` (the shape of a
    GPT-2 count with an MLP a fixed multiple of the width), least squares relative to each
    count: its coefficients and the largest relative error over the members."""
    depth, width = table.depth.to_numpy(float), table.width.to_numpy(float)
    n = table.n_params.to_numpy(float)
    design = np.column_stack([depth * width**2, depth * width, width, np.ones_like(width)])
    coef = np.linalg.lstsq(design / n[:, None], np.ones_like(n), rcond=None)[0]
    error = float(np.max(np.abs(design @ coef / n - 1)))
    return coef, error


def _counter(coef: np.ndarray) -> Callable[[Any, Any], Any]:
    def n_params_of(depth: Any, width: Any) -> Any:
        return coef[0] * depth * width**2 + coef[1] * depth * width + coef[2] * width + coef[3]

    return n_params_of


def _pair_sentence(row: Any) -> str:
    pair = f"depths {row.shallow_depth:g} → {row.depth:g}"
    if row.reason:
        return f"{pair}: no transition ({row.reason})"
    where = "above" if row.deeper_better == "above" else "below"
    spread = "" if not math.isfinite(row.sigma) else f" ± {as_text(row.sigma)}"
    return (
        f"{pair}: the deeper model is better {where} {size_words(row.n_params)} parameters, "
        f"where its width is {row.width:.0f} (ln width {row.log_width:.2f}{spread})"
    )


def _transition_fit(transitions: pd.DataFrame, level: float) -> tuple[Any, dict[str, Any]]:
    """The fit of the crossed transitions' log-width against depth (weighted when every one
    has a spread), and its summary entry (or the reason there is none)."""
    crossed = transitions[(transitions.reason == "") & np.isfinite(transitions.log_width)]
    if len(crossed) < 3:
        reason = (
            f"{len(crossed)} of {len(transitions)} pairs of adjacent depths crossed: a line with "
            "an error needs at least 3 transitions"
        )
        return None, {"reason": reason, "sentence": f"transition line: no fit ({reason})"}
    sigmas = crossed.sigma.to_numpy(float)
    weighted = len(crossed) > 0 and bool(np.isfinite(sigmas).all() and (sigmas > 0).all())
    try:
        fit = fit_transition(
            crossed.depth.to_numpy(float),
            crossed.log_width.to_numpy(float),
            sigmas if weighted else None,
            level=level,
        )
    except (InputError, NumericalError) as err:
        reason = f"{err.problem} ({len(crossed)} of {len(transitions)} pairs crossed)"
        return None, {"reason": reason, "sentence": f"transition line: no fit ({reason})"}
    directions = sorted(set(crossed.deeper_better))
    entry = fit.to_dict() | {"reason": "", "directions": directions}
    sentence = fit.describe()
    if directions != ["above"]:
        sentence += (
            "; not every transition has the deeper model better above it (Levine's direction): "
            "read the line with care"
        )
    return fit, entry | {"sentence": sentence}


def _optimal_depths(
    fit: Any, table: pd.DataFrame, sizes: list[float], level: float
) -> tuple[list[dict[str, Any]], list[str]]:
    coef, error = _count_fit(table)
    rows, sentences = [], []
    for size in sizes:
        row: dict[str, Any] = {"n_params": float(size), "count_error": error}
        if fit is None:
            row["reason"] = "no transition line"
        else:
            try:
                depth = fit.optimal_depth(float(size), n_params_of=_counter(coef))
                row |= depth.to_dict("optimal_depth") | {"reason": ""}
            except NumericalError as err:
                row["reason"] = err.problem
        if row["reason"]:
            said = f"no optimal depth ({row['reason']})"
        else:
            depth = _estimate(row | {"level": level}, "optimal_depth")
            counted = "exactly" if error < 1e-6 else f"within {100 * error:.2g}%"
            said = (
                f"optimal depth {_span(depth)} read from the fit (sizes counted as the grid's "
                f"models are counted, {counted})"
            )
        sentences.append(f"a model of {size_words(size)} parameters: {said}")
        rows.append(row)
    return rows, sentences


def _grid_sizes(table: pd.DataFrame) -> list[float]:
    """The smallest, geometric middle and largest member's size (2 significant digits)."""
    n = table.n_params.to_numpy(float)
    picks = (n.min(), math.sqrt(n.min() * n.max()), n.max())
    return sorted({float(f"{p:.2g}") for p in picks})


def transition_result(
    members: pd.DataFrame, meta: dict[str, Any] | None = None
) -> TransitionResult:
    """The result of a transition study (Levine et al. 2020) from its members table (one row per
    trained member, the columns of :data:`TRANSITION_COLUMNS`).

    The LM validation loss against parameter count per depth (means over seeds with bootstrap
    intervals), the transition between each pair of adjacent depths
    (:func:`~probekit.studies.fits.transition_width` on the LM loss; ``meta["method"]``,
    default ``"piecewise"``), the straight line of the transition log-width against depth
    (:func:`~probekit.studies.fits.fit_transition`, weighted by the transitions' seed spreads
    when each has one, so with a reduced χ²) and the optimal depth at ``meta["sizes"]`` (default:
    the smallest, middle and largest member's size) read from it, sizes counted as the grid's
    members are (a least-squares fit of ``n_params`` on ``L d²``, ``L d``, ``d`` and 1, exact for
    GPT-2 models whose MLP is a fixed multiple of the width). Rows that did not cross keep
    their reason; a failed fit is recorded with its reason.

    Refused (:class:`~probekit.errors.InputError`): missing columns, non-finite or missing
    depths, widths, sizes, seeds or losses, fewer than 3 depths, repeated members.
    """
    settings = _settings(meta)
    settings.setdefault("method", "piecewise")
    settings.setdefault("n_boot_transitions", 200)
    table = _checked_table(
        members,
        TRANSITION_COLUMNS,
        ("depth", "width", "n_params", "seed", "lm_val_loss"),
        "transition",
    )
    _check_duplicates(table, ["depth", "width", "seed"], "transition")
    _check_depth_counts(table, None, "transition members table")
    grid = table.rename(columns={"lm_val_loss": "loss"})[
        ["depth", "width", "n_params", "loss", "seed"]
    ]
    transitions = transition_width(
        grid,
        method=str(settings["method"]),
        n_boot=int(settings["n_boot_transitions"]),
        seed=int(settings["seed"]),
    )
    level = float(settings["level"])
    fit, entry = _transition_fit(transitions, level)
    sizes = [float(s) for s in settings.get("sizes") or _grid_sizes(table)]
    optimal, said = _optimal_depths(fit, table, sizes, level)
    pairs = [_pair_sentence(row) for row in transitions.itertuples()]
    summary = {
        "n_members": len(table),
        "n_seeds": int(table.seed.nunique()),
        "depths": sorted(int(d) for d in table.depth.unique()),
        "level": level,
        "sentences": [*pairs, entry["sentence"], *said],
        "transitions": transitions.to_dict(orient="records"),
        "transition_fit": entry,
        "optimal_depths": optimal,
    }
    return TransitionResult(table, json_ready(summary), _meta(settings))


class TransitionResult(Result):
    """A transition study (:func:`transition_result`). ``df``: the members table, one row per
    member. ``summary``: ``sentences``, ``transitions`` (one record per pair of adjacent depths,
    as :func:`~probekit.studies.fits.transition_width` gives them, with a ``reason`` where
    there is no crossing), ``transition_fit`` (slope, intercept, R², reduced χ² with intervals,
    or a ``reason``), ``optimal_depths`` (per size), counts. :meth:`depth_summary`: the loss per
    depth and width with its interval; :meth:`transitions`: the pairs as a table."""

    kind = "transition_study"

    def depth_summary(self) -> pd.DataFrame:
        """One row per depth and width: ``n_params``, ``n_seeds``, the LM validation loss'
        ``mean``, ``low``, ``high`` (the bootstrap interval of the mean over seeds)."""
        table = _aggregate(self.df, ["depth", "width"], ("lm_val_loss",), _settings(self.meta))
        sizes = self.df.groupby(["depth", "width"]).n_params.first().rename("n_params")
        return table.join(sizes, on=["depth", "width"]).sort_values(["depth", "n_params"])

    def transitions(self) -> pd.DataFrame:
        """The transitions between adjacent depths (one row per pair)."""
        rows = self.summary.get("transitions") or []
        frame = pd.DataFrame(rows)
        for column in frame.columns:
            if column not in ("deeper_better", "reason"):
                frame[column] = pd.to_numeric(frame[column]).astype(float)
        return frame

    def figure(self, which: str = "loss") -> go.Figure:
        """``"loss"``: LM validation loss against parameter count (log axis), one line per depth
        with its band over seeds, and the transitions; ``"transition"``: the transition
        log-width against depth with the fit line and its numbers in the legend."""
        if which == "transition":
            return self._width_figure()
        if which != "loss":
            raise InputError(f"no figure {which!r}", fix="pass 'loss' or 'transition'")
        return self._loss_figure()

    def figures(self) -> dict[str, go.Figure]:
        """Every figure, by name (the page's)."""
        return {name: self.figure(name) for name in ("loss", "transition")}

    def _loss_figure(self) -> go.Figure:
        words = "transition_study"
        aggregates = self.depth_summary()
        fig = go.Figure()
        for i, (depth, part) in enumerate(aggregates.groupby("depth")):
            color = figures.PALETTE[i % len(figures.PALETTE)]
            label = figure_words(words, "depth", depth=int(depth))
            fig.add_trace(_band(part.n_params, part.low, part.high, color, label))
            fig.add_trace(
                go.Scatter(
                    x=part.n_params,
                    y=part["mean"],
                    mode="lines+markers",
                    line={"color": color},
                    name=label,
                    legendgroup=label,
                )
            )
        crossed = self.transitions()
        if len(crossed):
            crossed = crossed[crossed.reason == ""]
        if len(crossed):
            fig.add_trace(self._transition_points(crossed, aggregates))
        fig = figures.base_layout(
            fig,
            figure_words(words, bands=_bands(self)),
            figure_words(words, "x"),
            figure_words(words, "y"),
            width=1000,
            height=520,
        )
        return figures.log_axis(fig, "x", values=aggregates.n_params)

    def _transition_points(self, crossed: pd.DataFrame, aggregates: pd.DataFrame) -> go.Scatter:
        losses = []
        for row in crossed.itertuples():
            deep = aggregates[aggregates.depth == row.depth]
            losses.append(float(np.interp(row.log_n_params, np.log(deep.n_params), deep["mean"])))
        return go.Scatter(
            x=crossed.n_params,
            y=losses,
            mode="markers",
            marker={"symbol": "x", "size": 12, "color": "#222"},
            name=figure_words("transition_study", "transition"),
            hovertext=[
                f"depth {a:g} → {b:g}"
                for a, b in zip(crossed.shallow_depth, crossed.depth, strict=True)
            ],
        )

    def _width_figure(self) -> go.Figure:
        words = "transition_study"
        entry = self.summary["transition_fit"]
        crossed = self.transitions()
        if len(crossed):
            crossed = crossed[crossed.reason == ""]
        fig = go.Figure()
        sigma = crossed.sigma if len(crossed) else []
        fig.add_trace(
            go.Scatter(
                x=crossed.depth if len(crossed) else [],
                y=crossed.log_width if len(crossed) else [],
                mode="markers",
                marker={"size": 10, "color": figures.PALETTE[0]},
                error_y={"type": "data", "array": list(sigma), "visible": bool(len(crossed))},
                name=figure_words(words, "width_points"),
            )
        )
        depths = [int(d) for d in self.df.depth.unique()]
        if entry.get("reason"):
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines",
                    line={"color": figures.PALETTE[1], "dash": "dot"},
                    name=figures.wrap(figure_words(words, "no_fit", reason=entry["reason"]), 110),
                )
            )
        else:
            xs = np.linspace(min(depths), max(depths), 50)
            slope = _estimate(entry, "slope")
            chi2 = entry.get("reduced_chi2")
            text = (
                f"ln width = {slope.value:.3f}·L + {entry['intercept']:.2f}, slope "
                f"{_span(slope, 3)} per layer, R² = {entry['r2']:.3f}"
                + (f", reduced χ² = {chi2:.2f}" if chi2 is not None else "")
            )
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=entry["slope"] * xs + entry["intercept"],
                    mode="lines",
                    line={"color": figures.PALETTE[1]},
                    name=figures.wrap(figure_words(words, "fit", words=text), 110),
                )
            )
        fig = figures.base_layout(
            fig,
            figure_words(words, "width_title", words=entry["sentence"]),
            SETTINGS["depth"],
            figure_words(words, "width_y"),
            width=1000,
            height=520,
        )
        return figures.integer_axis(fig, "x", n=max(depths) + 1)


# --- the page ----------------------------------------------------------------------------------

PAGE_TITLES = {
    "depth_width_study": "Depth at a fixed parameter budget (Petty et al. 2024)",
    "transition_study": "The depth-to-width transition (Levine et al. 2020)",
}


def _table_html(table: pd.DataFrame) -> str:
    shown = table.copy()
    shown.columns = [str(c).replace("_", " ") for c in shown.columns]
    return shown.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="n/a", border=0)


def write_study_page(result: DepthWidthResult | TransitionResult, out: str | os.PathLike) -> Path:
    """Write ``out/index.html`` (one self-contained page: plotly.js embedded, the figures, the
    sentences with the numbers, the per-depth table and the members table) and the tidy CSVs
    ``out/depth_summary.csv`` (and, for a transition study, ``out/transitions.csv``), each file
    atomically (the rest of ``out``, e.g. the members' run folders, is left as it is). Returns
    the page's path. ``summary.json`` is ``result.summary`` (JSON-ready), written by the caller.
    """
    from probekit.io import atomic_write_text
    from probekit.page import figure_section, html_page

    if not isinstance(result, DepthWidthResult | TransitionResult):
        raise InputError(
            f"write_study_page takes a study result, not a {type(result).__name__}",
            fix="pass depth_width_result(...) or transition_result(...)",
        )
    folder = Path(out)
    aggregates = result.depth_summary()
    atomic_write_text(folder / "depth_summary.csv", aggregates.to_csv(index=False))
    tables = [("Per depth: means over seeds and their intervals", aggregates)]
    if isinstance(result, TransitionResult):
        transitions = result.transitions()
        atomic_write_text(folder / "transitions.csv", transitions.to_csv(index=False))
        tables.append(("Transitions between adjacent depths", transitions))
    tables.append(("Members (one row per trained model)", result.df))
    sentences = "".join(f"<li>{html.escape(s)}</li>" for s in result.summary["sentences"])
    body = (
        f"<section><h2>What the study found</h2><ul class='verdict'>{sentences}</ul></section>"
        + "".join(figure_section(fig) for fig in result.figures().values())
        + "".join(
            f"<section><h2>{html.escape(title)}</h2>{_table_html(table)}</section>"
            for title, table in tables
        )
    )
    page = html_page(PAGE_TITLES[result.kind], body)
    return atomic_write_text(folder / "index.html", page)


__all__ = [
    "DEFAULTS",
    "DEPTH_WIDTH_COLUMNS",
    "DepthWidthResult",
    "MEASURES",
    "TRANSITION_COLUMNS",
    "TransitionResult",
    "depth_width_result",
    "size_words",
    "transition_result",
    "write_study_page",
]
