"""The fits of the depth-against-width studies: a saturating curve of a score against depth
(Petty et al. 2024), the width at which a deeper model of the same size overtakes a shallower
one and the straight line of that width's logarithm against depth (Levine et al. 2020), and the
claim L* = (2/3) log2(N) as a formula to hold the fits against.

Every fit returns a small frozen value with its numbers, their intervals (:class:`Estimate`),
``describe()`` (one sentence with the numbers) and ``to_dict()`` (flat, for a summary file).
Bad input is refused before any work with an :class:`~probekit.errors.InputError` or
:class:`~probekit.errors.ConfigError` naming the problem and the fix; a fit that does not
converge raises :class:`~probekit.errors.NumericalError`: never a silent number.

Logarithms of widths and parameter counts are natural logarithms.

Example:
    >>> from probekit.studies import fit_saturation
    >>> fit = fit_saturation([4, 8, 12, 18, 24], [45.2, 58.7, 64.1, 67.8, 68.3], n_boot=200)
    >>> fit.form, fit.preferred_form, round(fit.params["a"].value, 1)
    ('exp', 'exp', 68.8)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from probekit.errors import ConfigError, InputError, NumericalError

FORMS = ("exp", "log")
"""The saturating forms :func:`fit_saturation` fits: ``a - b exp(-L / c)`` and ``a + b ln L``."""

PARAMETERS = {"exp": ("a", "b", "c"), "log": ("a", "b")}
"""Each form's parameters, in the order of :attr:`SaturationFit.samples`' columns."""

GRID_COLUMNS = ("depth", "width", "n_params", "loss")
"""The columns :func:`transition_width` needs (``seed`` is optional)."""

METHODS = ("piecewise", "line")
"""How :func:`transition_width` reads a depth's loss between its sizes."""

SCALE_RANGE = (1 / 50, 100)
"""The depth scales ``c`` the exponential form may take, as multiples of the shallowest and
deepest depth measured: outside them the curve is a step or a straight line over the data, and
no asymptote can be read from them."""

MIN_BOOT = 20
"""The fewest bootstrap resamples an interval is read from."""


# --- numbers in words ----------------------------------------------------------------------


def as_text(value: float) -> str:
    """A number for a sentence: 3 significant digits, thousands written out.

    Example:
        >>> as_text(68.7856), as_text(0.0123456), as_text(123456.7)
        ('68.8', '0.0123', '123,457')
    """
    if not math.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _percent(level: float) -> str:
    return f"{100 * level:g}%"


@dataclass(frozen=True)
class Estimate:
    """A fitted number with its interval at ``level`` (e.g. 0.95: the 2.5th to 97.5th
    percentile of the bootstrap, or the normal/Student-t interval of a linear fit).

    Example:
        >>> str(Estimate(68.8, 67.1, 70.2, 0.95))
        '68.8 (95% interval 67.1–70.2)'
    """

    value: float
    low: float
    high: float
    level: float

    def covers(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval (ends included)."""
        return bool(self.low <= value <= self.high)

    def __str__(self) -> str:
        span = f"{as_text(self.low)}–{as_text(self.high)}"
        return f"{as_text(self.value)} ({_percent(self.level)} interval {span})"

    def to_dict(self, name: str) -> dict[str, float]:
        """``{name: value, name_low: low, name_high: high}``."""
        return {name: self.value, f"{name}_low": self.low, f"{name}_high": self.high}


def _interval(value: float, samples: np.ndarray, level: float) -> Estimate:
    """``value`` with the percentile interval of ``samples`` (non-finite samples left out)."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return Estimate(float(value), math.nan, math.nan, level)
    low, high = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(float(value), float(low), float(high), level)


# --- checks --------------------------------------------------------------------------------


def _check_level(level: Any) -> None:
    if not isinstance(level, int | float) or not 0 < level < 1:
        raise ConfigError(f"level = {level!r} must be a number in (0, 1)", fix="pass e.g. 0.95")


def _check_count(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(
            f"{name} = {value!r} must be an integer >= {low}", fix=f"pass {name} >= {low}"
        )


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{name} = {value!r} must be a finite number > 0", fix=f"pass {name} > 0")


def _numbers(name: str, values: Any) -> np.ndarray:
    """``values`` as a 1-D float array, refused when not numbers, empty or not finite."""
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} are not numbers ({err})", fix=f"pass {name} as numbers") from None
    if array.ndim != 1 or array.size == 0:
        raise InputError(
            f"{name} must be a non-empty 1-D sequence, got shape {array.shape}",
            fix=f"pass one number per point in {name}",
        )
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise InputError(
            f"{name} has {bad.size} non-finite value(s) (first at index {bad[0]})",
            fix="drop the failed or missing points (or rerun them) before fitting",
        )
    return array


def _same_length(**arrays: np.ndarray) -> None:
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise InputError(
            f"mismatched lengths {lengths}", fix="pass one entry per point in each sequence"
        )


def _check_depths(depths: np.ndarray, need: int) -> None:
    if (depths <= 0).any():
        raise InputError(
            f"depths must be > 0, got {sorted(set(depths[depths <= 0].tolist()))}",
            fix="pass the number of layers of each model",
        )
    distinct = np.unique(depths)
    if distinct.size < need:
        raise InputError(
            f"{distinct.size} distinct depth(s) {distinct.tolist()}: a fit needs at least {need}",
            fix=f"measure at least {need} depths",
        )


# --- the saturating fit --------------------------------------------------------------------


def form_values(form: str, depths: np.ndarray, params: np.ndarray) -> np.ndarray:
    """The form's values at ``depths``; ``params`` one row (or a matrix of rows)."""
    p = np.asarray(params, dtype=float)
    if p.ndim == 2:
        depths = depths[None, :]
        p = p[:, :, None]
    if form == "exp":
        return p[0] - p[1] * np.exp(-depths / p[2])
    return p[0] + p[1] * np.log(depths)


def _linear_part(depths: np.ndarray, values: np.ndarray, scale: float) -> tuple[np.ndarray, float]:
    """For a fixed depth scale ``c`` the exponential form is linear in (a, b): their least
    squares and its residual sum of squares."""
    design = np.column_stack([np.ones_like(depths), -np.exp(-depths / scale)])
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    return coef, float(np.sum((values - design @ coef) ** 2))


def _scale_bounds(depths: np.ndarray) -> tuple[float, float]:
    return float(depths.min() * SCALE_RANGE[0]), float(depths.max() * SCALE_RANGE[1])


def _exp_start(depths: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, str]:
    """A start for the exponential form: the depth scale with the least residual on a
    logarithmic grid (a, b solved exactly for each), and ``""`` or why none is inside."""
    low, high = _scale_bounds(depths)
    scales = np.geomspace(low, high, 241)
    rss = [_linear_part(depths, values, c)[1] for c in scales]
    best = int(np.argmin(rss))
    coef, _ = _linear_part(depths, values, scales[best])
    why = ""
    if best == len(scales) - 1:
        why = (
            f"the values do not level off within the depths measured (the best depth scale is "
            f"past {as_text(high)} layers, a straight line over the data): no asymptote can be read"
        )
    elif best == 0:
        why = "the values are already level from the shallowest depth: there is no rise to fit"
    return np.array([coef[0], coef[1], scales[best]]), why


def _fit_once(form: str, depths: np.ndarray, values: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Least squares of one form from ``start``; NaNs where it does not converge or leaves the
    depth scales it may take."""
    failed = np.full(len(PARAMETERS[form]), np.nan)
    if np.unique(depths).size < len(PARAMETERS[form]):
        return failed
    if form == "log":
        design = np.column_stack([np.ones_like(depths), np.log(depths)])
        return np.linalg.lstsq(design, values, rcond=None)[0]
    from scipy.optimize import OptimizeWarning, curve_fit

    def model(d: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return a - b * np.exp(-d / c)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", OptimizeWarning)
            params, _ = curve_fit(model, depths, values, p0=start, maxfev=5000)
    except (RuntimeError, OptimizeWarning, ValueError, FloatingPointError):
        return failed
    low, high = _scale_bounds(depths)
    if not np.isfinite(params).all() or not low <= params[2] <= high:
        return failed
    return np.asarray(params, dtype=float)


def _aic(values: np.ndarray, fitted: np.ndarray, n_params: int) -> float:
    """Akaike's criterion of a least-squares fit with Gaussian errors, ``n ln(RSS/n) + 2k``."""
    n = len(values)
    rss = max(float(np.sum((values - fitted) ** 2)), np.finfo(float).tiny)
    return n * math.log(rss / n) + 2 * n_params


def _r2(values: np.ndarray, fitted: np.ndarray, weights: np.ndarray | None = None) -> float:
    w = np.ones_like(values) if weights is None else weights
    mean = np.sum(w * values) / np.sum(w)
    total = float(np.sum(w * (values - mean) ** 2))
    return 1 - float(np.sum(w * (values - fitted) ** 2)) / total if total > 0 else math.nan


def _resample(
    depths: np.ndarray,
    values: np.ndarray,
    fitted: np.ndarray,
    members: list[np.ndarray] | None,
    n_params: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """One bootstrap sample: whole groups' curves drawn with replacement, or (no groups) the
    fit plus its residuals drawn with replacement, centred and scaled by sqrt(n / (n - k))
    for the degrees of freedom the fit used."""
    if members is not None:
        chosen = rng.integers(len(members), size=len(members))
        index = np.concatenate([members[g] for g in chosen])
        return depths[index], values[index]
    n = len(values)
    residuals = values - fitted
    residuals = (residuals - residuals.mean()) * math.sqrt(n / max(n - n_params, 1))
    return depths, fitted + rng.choice(residuals, size=n, replace=True)


def _group_members(groups: Any, n: int) -> list[np.ndarray]:
    labels = np.asarray(groups)
    if labels.ndim != 1 or len(labels) != n:
        raise InputError(
            f"groups has {labels.size} entries for {n} points",
            fix="pass one group label (e.g. the seed) per point",
        )
    codes = pd.factorize(pd.Series(labels))[0]
    if (codes < 0).any():
        raise InputError("groups has missing labels", fix="label every point with its seed")
    if codes.max() < 1:
        raise InputError(
            "groups has one group: whole curves cannot be resampled",
            fix="pass several seeds' curves, or groups=None to resample residuals",
        )
    return [np.flatnonzero(codes == g) for g in range(codes.max() + 1)]


@dataclass(frozen=True, eq=False)
class SaturationFit:
    """A saturating fit of a score against depth (:func:`fit_saturation`).

    ``params`` maps each parameter of ``form`` to its :class:`Estimate`: for ``"exp"``,
    ``a - b exp(-L / c)``, the asymptote ``a``, the gain ``b`` from depth 0 and the depth
    scale ``c`` (layers); for ``"log"``, ``a + b ln L``. ``aic`` holds Akaike's criterion of
    both forms on the same points (lower is better; a difference under about 2 prefers
    neither; infinite for a form that could not be fitted, with the reason in ``unfitted``),
    ``r2`` the chosen form's R², ``samples`` the bootstrap refits (one row each, columns in
    :data:`PARAMETERS` order), ``bootstrap`` what was resampled (``"seeds"``: whole
    curves of the groups; ``"residuals"``: the points' residuals), ``n_failed`` the resamples
    whose refit did not converge (left out of the intervals).
    """

    form: str
    params: dict[str, Estimate]
    r2: float
    aic: dict[str, float]
    depths: tuple[float, ...]
    n_points: int
    bootstrap: str
    n_boot: int
    n_failed: int
    level: float
    samples: np.ndarray = field(repr=False)
    unfitted: dict[str, str] = field(default_factory=dict)

    @property
    def preferred_form(self) -> str:
        """The form with the lower AIC on these points."""
        return min(self.aic, key=lambda form: self.aic[form])

    @property
    def asymptote(self) -> Estimate | None:
        """The level the score approaches with depth (``a`` of the exponential form; the
        logarithmic form has none)."""
        return self.params["a"] if self.form == "exp" else None

    def _point(self) -> np.ndarray:
        return np.array([self.params[name].value for name in PARAMETERS[self.form]])

    def predict(self, depths: Any) -> np.ndarray:
        """The fitted score at ``depths``."""
        return form_values(self.form, np.asarray(depths, dtype=float), self._point())

    def gain(self, depths: Any) -> np.ndarray:
        """The fitted gain of one more layer, ``f(L + 1) - f(L)``, at ``depths``."""
        at = np.asarray(depths, dtype=float)
        return self.predict(at + 1) - self.predict(at)

    def _saturation(self, params: np.ndarray, threshold: float) -> np.ndarray:
        """The depth where ``|f(L + 1) - f(L)|`` falls to ``threshold`` (0 if it is below it
        from the start); ``params`` one row per parameter set."""
        b = np.abs(params[:, 1])
        if self.form == "exp":
            c = params[:, 2]
            with np.errstate(divide="ignore"):
                depth = c * np.log(b * -np.expm1(-1 / c) / threshold)
        else:
            with np.errstate(divide="ignore"):
                depth = 1 / np.expm1(threshold / b)
        return np.maximum(depth, 0.0)

    def saturation_depth(self, threshold: float) -> Estimate:
        """The depth from which one more layer adds less than ``threshold`` to the fitted score
        (in the score's units: 0.5 for half a point of a percentage), with its bootstrap
        interval. Depths are continuous; a depth past the deepest measured is an extrapolation.

        Example:
            >>> fit = fit_saturation([4, 8, 12, 18, 24], [45.2, 58.7, 64.1, 67.8, 68.3],
            ...                      n_boot=200)
            >>> depth = fit.saturation_depth(0.5)
            >>> 12 < depth.value < 18 and depth.low <= depth.value <= depth.high
            True
        """
        _check_positive("threshold", threshold)
        value = self._saturation(self._point()[None, :], threshold)[0]
        return _interval(value, self._saturation(self.samples, threshold), self.level)

    def describe(
        self, threshold: float | None = None, *, what: str = "the score", unit: str = ""
    ) -> str:
        """One sentence with the numbers: the asymptote (or the gain per doubling of depth),
        the saturation depth at ``threshold`` when given, which form AIC prefers, R².
        ``unit`` follows each score (``"%"``: gains are then written as points).

        Example:
            >>> fit = fit_saturation([4, 8, 12, 18, 24], [45.2, 58.7, 64.1, 67.8, 68.3],
            ...                      n_boot=200)
            >>> print(fit.describe(0.5, what="accuracy", unit="%"))
            ... # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
            accuracy saturates at 68.8% (95% interval ...%), approached on a depth scale of 4.78
            layers (...); one more layer adds less than 0.5 points from depth 14.5 (...); the exp
            form fits better than the log form by AIC (difference 22.2), R² = 1.000, intervals
            from 200 bootstrap resamples of residuals
        """
        level = _percent(self.level)
        if self.form == "exp":
            a, c = self.params["a"], self.params["c"]
            text = (
                f"{what} saturates at {as_text(a.value)}{unit} ({level} interval "
                f"{as_text(a.low)}–{as_text(a.high)}{unit}), approached on a depth scale of "
                f"{as_text(c.value)} layers ({as_text(c.low)}–{as_text(c.high)})"
            )
        else:
            b = self.params["b"]
            ln2 = math.log(2)
            per_doubling = Estimate(ln2 * b.value, ln2 * b.low, ln2 * b.high, b.level)
            text = (
                f"{what} changes by {per_doubling}{unit} per doubling of depth, with no asymptote"
            )
        if threshold is not None:
            depth = self.saturation_depth(threshold)
            step = f"{as_text(threshold)} points" if unit == "%" else f"{as_text(threshold)}{unit}"
            text += (
                f"; one more layer adds less than {step} from depth {depth.value:.1f} "
                f"({depth.low:.1f}–{depth.high:.1f})"
            )
            if depth.value > max(self.depths):
                text += (
                    f", past the deepest depth measured ({max(self.depths):g}): an extrapolation"
                )
        other = next(form for form in FORMS if form != self.form)
        if other in self.unfitted:
            text += f"; {self.unfitted[other]}"
        else:
            delta = self.aic[other] - self.aic[self.form]
            verdict = "better" if delta > 0 else "worse"
            text += (
                f"; the {self.form} form fits {verdict} than the {other} form by AIC "
                f"(difference {abs(delta):.1f})"
            )
        text += (
            f", R² = {self.r2:.3f}, intervals from {self.n_boot} bootstrap resamples of "
            f"{self.bootstrap}"
        )
        if self.n_failed:
            text += f" ({self.n_failed} refits did not converge and are left out)"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The numbers, flat (for a summary file)."""
        out: dict[str, Any] = {"form": self.form, "preferred_form": self.preferred_form}
        for name, estimate in self.params.items():
            out |= estimate.to_dict(name)
        out |= {
            f"aic_{form}": value if math.isfinite(value) else None
            for form, value in self.aic.items()
        }
        out |= {
            "r2": self.r2,
            "n_points": self.n_points,
            "n_depths": len(self.depths),
            "bootstrap": self.bootstrap,
            "n_boot": self.n_boot,
            "n_failed": self.n_failed,
            "level": self.level,
        }
        return out


def fit_saturation(
    depths: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    *,
    groups: Sequence[Any] | np.ndarray | None = None,
    form: str = "exp",
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> SaturationFit:
    """A saturating fit of a score (accuracy, or any score) against depth.

    The form: ``form="exp"``, ``f(L) = a - b exp(-L / c)``: three parameters with a meaning
    each (the asymptote ``a``, the gain ``b`` over depth 0, the depth scale ``c`` in layers),
    monotone with diminishing returns, the shape Petty et al. report (45.2 / 58.7 / 64.1 /
    67.8 / 68.3% at depths 4 / 8 / 12 / 18 / 24), and the gain of one more layer falls by the
    same factor ``exp(-1 / c)`` with every layer, so a saturation depth is one formula. The
    logarithmic form ``f(L) = a + b ln L`` (no asymptote, gains falling as 1 / L) is fitted to
    the same points too and both forms' AIC are kept, so whether the data saturate is checked,
    not assumed; ``form="log"`` makes it the reported one.

    The fit: least squares (:func:`scipy.optimize.curve_fit`), started at the depth scale with
    the least residual on a grid (for a fixed ``c`` the form is linear in ``a`` and ``b``,
    which are then exact). The intervals, at ``level``: percentiles of ``n_boot`` refits on
    bootstrap samples: with ``groups`` (e.g. each point's seed), whole groups' curves are
    drawn with replacement, so the seed-to-seed spread is the uncertainty; without, the
    residuals are (scaled by sqrt(n / (n - k)) for the parameters fitted). A few groups (under
    about 5) or points give rough intervals.

    Refused before any work: mismatched lengths, non-finite values, depths <= 0, fewer than 3
    distinct depths, a single group. Raised after the fit: values that do not level off within
    the depths (or do not rise at all) and a least squares that does not converge
    (:class:`~probekit.errors.NumericalError`), and bootstraps where more than half the refits
    fail.

    Example:
        >>> fit = fit_saturation([4, 8, 12, 18, 24], [45.2, 58.7, 64.1, 67.8, 68.3],
        ...                      n_boot=200)
        >>> fit.asymptote.covers(68.8), fit.r2 > 0.99, fit.aic["exp"] < fit.aic["log"]
        (True, True, True)
        >>> fit.predict([24]).round(1)
        array([68.4])
    """
    if form not in FORMS:
        raise ConfigError(f"form = {form!r} is not one of {FORMS}", fix="pass form='exp' or 'log'")
    _check_count("n_boot", n_boot, MIN_BOOT)
    _check_count("seed", seed, 0)
    _check_level(level)
    at, ys = _numbers("depths", depths), _numbers("values", values)
    _same_length(depths=at, values=ys)
    _check_depths(at, 3)
    members = None if groups is None else _group_members(groups, len(at))
    if np.ptp(ys) == 0:
        raise InputError(
            "the values are the same at every depth: there is nothing to fit",
            fix="check the scores (a task at chance or always solved gives this)",
        )
    point = _main_fit(form, at, ys)
    fitted = form_values(form, at, point)
    aic = {form: _aic(ys, fitted, len(point))}
    unfitted = {}
    for other in FORMS:
        if other != form:
            try:
                rival = _main_fit(other, at, ys)
                aic[other] = _aic(ys, form_values(other, at, rival), len(rival))
            except NumericalError as err:  # the comparison says so; the chosen form stands
                aic[other], unfitted[other] = math.inf, err.problem
    samples = _bootstrap(form, at, ys, fitted, point, members, n_boot, seed)
    n_failed = int(np.isnan(samples).any(axis=1).sum())
    if n_failed > n_boot / 2:
        raise NumericalError(
            f"{n_failed} of {n_boot} bootstrap refits of the {form} form did not converge: "
            "the fit is unstable on these points",
            fix="measure more depths or seeds, or try form='log'",
        )
    samples = samples[~np.isnan(samples).any(axis=1)]
    params = {
        name: _interval(point[i], samples[:, i], level) for i, name in enumerate(PARAMETERS[form])
    }
    return SaturationFit(
        form=form,
        params=params,
        r2=_r2(ys, fitted),
        aic=aic,
        depths=tuple(float(d) for d in np.unique(at)),
        n_points=len(at),
        bootstrap="residuals" if members is None else "seeds",
        n_boot=n_boot,
        n_failed=n_failed,
        level=float(level),
        samples=samples,
        unfitted=unfitted,
    )


def _main_fit(form: str, depths: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The least-squares fit of ``form`` on all points, or the reason it has none."""
    if form == "log":
        return _fit_once("log", depths, values, np.zeros(2))
    start, why = _exp_start(depths, values)
    if why:
        raise NumericalError(
            f"the exponential form cannot be fitted: {why}",
            fix="measure deeper (or shallower) models, or fit form='log'",
        )
    params = _fit_once("exp", depths, values, start)
    if np.isnan(params).any():
        raise NumericalError(
            "the least squares of the exponential form did not converge on these points",
            fix="check the values against depth (a plot), measure more depths, or fit form='log'",
        )
    return params


def _bootstrap(
    form: str,
    depths: np.ndarray,
    values: np.ndarray,
    fitted: np.ndarray,
    point: np.ndarray,
    members: list[np.ndarray] | None,
    n_boot: int,
    seed: int,
) -> np.ndarray:
    """``n_boot`` refits (rows; NaN where a refit failed), each started at the fit; with
    groups, their deviations from the fit widened by sqrt(G / (G - 1)) for the G groups."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_boot):
        at, ys = _resample(depths, values, fitted, members, len(point), rng)
        rows.append(_fit_once(form, at, ys, point))
    samples = np.array(rows)
    if members is None:
        return samples
    # resampling G groups spreads a mean by (G - 1) / G of its variance: widened back
    return point + (samples - point) * math.sqrt(len(members) / (len(members) - 1))


# --- Levine's transition -------------------------------------------------------------------


@dataclass(frozen=True)
class _Curve:
    """One depth's loss against log parameter count (sorted), per seed, and its log-widths."""

    log_params: np.ndarray
    log_width: np.ndarray
    loss: np.ndarray  # seeds x sizes, NaN where a seed lacks a size


def check_columns(table: Any, columns: Sequence[str], name: str, fix: str) -> None:
    """Refuse (:class:`InputError`, ``fix`` its fix) a ``table`` that is not a pandas
    DataFrame or lacks one of ``columns``; ``name`` names it in the message ("grid", "the
    transition members table")."""
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"{name} is a {type(table).__name__}, not a pandas DataFrame", fix=fix)
    missing = [column for column in columns if column not in table.columns]
    if missing:
        raise InputError(f"{name} lacks the column(s) {missing}", fix=fix)


def _check_grid(grid: Any) -> pd.DataFrame:
    check_columns(
        grid,
        GRID_COLUMNS,
        "grid",
        fix=f"pass one row per member with {list(GRID_COLUMNS)} (and optionally seed)",
    )
    table = grid.loc[:, [*GRID_COLUMNS, *(["seed"] if "seed" in grid.columns else [])]].copy()
    if "seed" not in table.columns:
        table["seed"] = 0
    for column in GRID_COLUMNS:
        table[column] = _numbers(f"grid column {column!r}", table[column])
        if column != "loss" and (table[column] <= 0).any():
            raise InputError(f"grid column {column!r} has values <= 0", fix="pass positive sizes")
    duplicated = table.duplicated(["depth", "width", "seed"])
    if duplicated.any():
        row = table[duplicated].iloc[0]
        raise InputError(
            f"grid has {int(duplicated.sum())} repeated member(s), e.g. depth {row.depth:g}, "
            f"width {row.width:g}, seed {row.seed}",
            fix="keep one row per depth, width and seed",
        )
    counts = table.groupby(["depth", "width"]).n_params.nunique()
    if (counts > 1).any():
        raise InputError(
            "grid gives one depth and width different parameter counts across seeds",
            fix="give each (depth, width) its one parameter count",
        )
    if table.depth.nunique() < 2:
        raise InputError("grid has one depth: there is no pair to compare", fix="add depths")
    return table


def _curves(table: pd.DataFrame) -> dict[float, _Curve]:
    seeds = sorted(table.seed.unique())
    curves = {}
    for depth, rows in table.groupby("depth"):
        sizes = rows.drop_duplicates("width").sort_values("n_params")
        loss = rows.pivot(index="seed", columns="width", values="loss")
        loss = loss.reindex(index=seeds, columns=sizes.width)
        curves[float(depth)] = _Curve(
            np.log(sizes.n_params.to_numpy()), np.log(sizes.width.to_numpy()), loss.to_numpy()
        )
    return curves


def _mean_curve(curve: _Curve, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean loss over ``seeds`` (rows) at the sizes any of them measured."""
    rows = curve.loss[seeds]
    seen = ~np.isnan(rows).all(axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(rows[:, seen], axis=0)
    return curve.log_params[seen], mean


def _crossing(
    shallow: tuple[np.ndarray, np.ndarray], deep: tuple[np.ndarray, np.ndarray], method: str
) -> tuple[float, str, str]:
    """Where the deeper curve's loss minus the shallower's changes sign, in log parameters,
    which side the deeper is better on (``"above"``/``"below"``), and ``""`` or why there is
    no one crossing."""
    (xs, ys), (xd, yd) = shallow, deep
    if len(xs) < 2 or len(xd) < 2:
        return math.nan, "", "a depth has fewer than 2 sizes: no curve to cross"
    low, high = max(xs.min(), xd.min()), min(xs.max(), xd.max())
    if low >= high:
        return math.nan, "", "the two depths' parameter counts do not overlap: not extrapolated"
    span = f"log n_params {low:.2f}–{high:.2f}"
    if method == "line":
        (bs, as_), (bd, ad) = np.polyfit(xs, ys, 1), np.polyfit(xd, yd, 1)
        if bd == bs:
            return math.nan, "", "the fitted lines are parallel: they never cross"
        x = (as_ - ad) / (bd - bs)
        side = "above" if bd < bs else "below"
        if not low <= x <= high:
            return (
                math.nan,
                side,
                f"the fitted lines cross at log n_params {x:.2f}, outside {span}: not extrapolated",
            )
        return float(x), side, ""
    knots = np.unique(np.concatenate([xs, xd, [low, high]]))
    knots = knots[(knots >= low) & (knots <= high)]
    diff = np.interp(knots, xd, yd) - np.interp(knots, xs, ys)
    side = "above" if diff[-1] < diff[0] else "below"
    sign = np.sign(diff)
    changes = np.flatnonzero(sign[:-1] * sign[1:] < 0)
    zeros = np.flatnonzero(sign == 0)
    where = sorted(
        [float(knots[i]) for i in zeros]
        + [
            float(knots[i] - diff[i] * (knots[i + 1] - knots[i]) / (diff[i + 1] - diff[i]))
            for i in changes
        ]
    )
    if not where:
        better = "deeper" if diff[0] < 0 else "shallower"
        return math.nan, "", f"the {better} model is better at every size measured ({span})"
    if len(where) > 1:
        at = ", ".join(f"{x:.2f}" for x in where)
        return (
            math.nan,
            side,
            (
                f"the curves cross {len(where)} times (log n_params {at}): noise or a non-monotone "
                "difference; average more seeds or use method='line'"
            ),
        )
    return where[0], side, ""


def _log_width_of(curve: _Curve, log_params: float) -> float:
    """The depth's log-width at a size between its measured ones (NaN for NaN)."""
    if not math.isfinite(log_params):
        return math.nan
    return float(np.interp(log_params, curve.log_params, curve.log_width))


def _pair_row(
    depth: float,
    deeper: float,
    curves: dict[float, _Curve],
    method: str,
    n_boot: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    shallow, deep = curves[depth], curves[deeper]
    n_seeds = shallow.loss.shape[0]
    everyone = np.arange(n_seeds)
    x, side, reason = _crossing(_mean_curve(shallow, everyone), _mean_curve(deep, everyone), method)
    log_width = _log_width_of(deep, x)
    row: dict[str, Any] = {
        "shallow_depth": depth,
        "depth": deeper,
        "log_n_params": x,
        "n_params": math.exp(x),
        "log_width": log_width,
        "width": math.exp(log_width),
        "log_width_shallow": _log_width_of(shallow, x),
        "deeper_better": side,
        "sigma": math.nan,
        "crossed_fraction": math.nan,
        "reason": reason,
    }
    if reason or n_seeds < 2:
        return row
    widths = []
    for _ in range(n_boot):
        seeds = np.asarray(rng.integers(n_seeds, size=n_seeds))
        xb, _, why = _crossing(_mean_curve(shallow, seeds), _mean_curve(deep, seeds), method)
        widths.append(math.nan if why else _log_width_of(deep, xb))
    found = np.array(widths)[np.isfinite(widths)]
    row["crossed_fraction"] = found.size / n_boot
    if found.size < n_boot / 2:
        row |= {
            "log_width": math.nan,
            "width": math.nan,
            "log_n_params": math.nan,
            "n_params": math.nan,
        }
        row["reason"] = (
            f"one crossing in only {found.size} of {n_boot} resamples of the seeds: the "
            "transition is not resolved by these seeds; train more seeds or sizes near it"
        )
        return row
    # resampling G seeds spreads a mean by (G - 1) / G of its variance: widened back
    row["sigma"] = float(np.std(found, ddof=1)) * math.sqrt(n_seeds / (n_seeds - 1))
    return row


def transition_width(
    grid: pd.DataFrame, *, method: str = "piecewise", n_boot: int = 200, seed: int = 0
) -> pd.DataFrame:
    """For each pair of adjacent depths (L, L') of a depth x width grid, the size at which the
    two depths' loss curves cross (Levine et al. 2020): on one side of it the deeper model of
    the same parameter count has the lower loss, on the other the shallower.

    ``grid``: one row per trained member, columns ``depth``, ``width``, ``n_params``, ``loss``
    and optionally ``seed``. Each depth's loss (its mean over seeds) is read against
    ``ln n_params``; ``method="piecewise"`` (the default) joins the measured sizes by straight
    lines, which follow any curve shape the grid resolves and cross where the data cross;
    ``method="line"`` fits one straight line per depth, steadier with noisy points but blind
    to curvature. Only the sizes both depths cover are used: a crossing outside them is NaN
    with its ``reason`` (never extrapolated), and so are curves that cross several times.

    Returns one row per pair: ``shallow_depth``, ``depth`` (the deeper, L'), the crossing's
    ``log_n_params`` and ``n_params``, ``log_width`` and ``width`` (the deeper model's width at
    that size, natural log), ``log_width_shallow``, ``deeper_better`` (``"above"``: the deeper
    model wins above the crossing's size, as Levine's theory predicts, depth being efficient
    when L < log3(width); ``"below"``: the reverse), ``sigma`` (the standard deviation of
    ``log_width`` over ``n_boot`` resamples of whole seeds, widened by sqrt(G / (G - 1)) for
    G seeds; NaN with one seed),
    ``crossed_fraction`` (the resamples with one crossing; under half makes the row NaN) and
    ``reason`` (empty when there is a crossing).

    Example:
        >>> import numpy as np, pandas as pd
        >>> rows = [dict(depth=L, width=w, n_params=12 * L * w**2,
        ...              loss=5 - 0.1 * L * (np.log(12 * L * w**2) - 8 - L / 2))
        ...         for L in (2, 4) for w in (16, 32, 64, 128)]
        >>> row = transition_width(pd.DataFrame(rows)).iloc[0]
        >>> int(row.depth), row.deeper_better, round(float(row.log_n_params), 6), row.reason
        (4, 'above', 11.0, '')
    """
    if method not in METHODS:
        raise ConfigError(
            f"method = {method!r} is not one of {METHODS}", fix="pass 'piecewise' or 'line'"
        )
    _check_count("n_boot", n_boot, MIN_BOOT)
    _check_count("seed", seed, 0)
    curves = _curves(_check_grid(grid))
    depths = sorted(curves)
    rng = np.random.default_rng(seed)
    rows = [
        _pair_row(a, b, curves, method, n_boot, rng)
        for a, b in zip(depths, depths[1:], strict=False)
    ]
    columns = [
        "shallow_depth",
        "depth",
        "log_n_params",
        "n_params",
        "log_width",
        "width",
        "log_width_shallow",
        "deeper_better",
        "sigma",
        "crossed_fraction",
        "reason",
    ]
    return pd.DataFrame(rows, columns=columns)


def gpt2_blocks_parameters(depth: Any, width: Any) -> Any:
    """``12 L d^2``: the parameters of ``L`` GPT-2 blocks of width ``d`` with an MLP of
    ``4 d`` (attention ``4 d^2``, MLP ``8 d^2``; biases, norms and embeddings left out). The
    default relation between size and width of :meth:`TransitionFit.optimal_depth`; for exact
    counts pass e.g. ``lambda L, d: gpt2_parameter_count(L, d, 4 * d, vocab, positions)``
    (:func:`probekit.training.families.gpt2_parameter_count`).

    Example:
        >>> gpt2_blocks_parameters(12, 768)
        84934656
    """
    return 12 * depth * width**2


@dataclass(frozen=True, eq=False)
class TransitionFit:
    """The straight line ``ln(transition width) = slope * L + intercept`` (:func:`fit_transition`):
    the transition width multiplied by ``exp(slope)`` per layer. ``reduced_chi2`` is
    ``sum(((y - fit) / sigma)^2) / (n - 2)``, defined only when sigmas were given (None
    otherwise); ``r2`` is weighted by ``1 / sigma^2`` when they were; ``cov`` the covariance of
    (slope, intercept)."""

    slope: Estimate
    intercept: Estimate
    r2: float
    reduced_chi2: float | None
    depths: tuple[float, ...]
    n_points: int
    weighted: bool
    level: float
    cov: np.ndarray = field(repr=False)

    def predict(self, depths: Any) -> np.ndarray:
        """The fitted transition log-width at ``depths``."""
        return self.slope.value * np.asarray(depths, dtype=float) + self.intercept.value

    def optimal_depth(
        self,
        n_params: float,
        *,
        n_params_of: Callable[[Any, Any], Any] = gpt2_blocks_parameters,
        n_draws: int = 1000,
        seed: int = 0,
    ) -> Estimate:
        """The depth ``L*`` a model of ``n_params`` parameters should have, read from the fit:
        the depth whose width at this size equals its transition width. A depth-L model of
        ``N`` parameters has the width ``d`` with ``n_params_of(L, d) = N`` (by default
        ``12 L d^2``, :func:`gpt2_blocks_parameters`), which falls with depth while the
        transition width rises; shallower than ``L*`` the model is wider than its transition
        and one more layer helps, deeper it hurts. This assumes Levine's direction (the
        deeper model wins above the transition: ``deeper_better == "above"`` in
        :func:`transition_width`). Depths are continuous, searched from 1 to 4 times the deepest
        fitted (at least 64); the interval is from ``n_draws`` draws of (slope, intercept)
        from the fit's normal approximation. ``n_params_of`` takes numpy arrays.

        Example:
            >>> fit = fit_transition([6, 12, 18, 24], [4.0, 5.0, 6.0, 7.0])
            >>> L = 12.0; n = gpt2_blocks_parameters(L, np.exp(fit.predict(L)))
            >>> round(fit.optimal_depth(float(n)).value, 3)
            12.0
        """
        _check_positive("n_params", n_params)
        _check_count("n_draws", n_draws, MIN_BOOT)
        _check_count("seed", seed, 0)
        if self.slope.value <= 0:
            raise NumericalError(
                f"the transition width does not grow with depth (slope {self.slope.value:.3g}): "
                "no optimal depth can be read from the fit",
                fix="check the transitions (transition_width's deeper_better and reason columns)",
            )
        depths = np.linspace(1.0, max(64.0, 4 * max(self.depths)), 4001)
        log_width = _log_width_at(n_params, depths, n_params_of)
        point = np.array([[self.slope.value, self.intercept.value]])
        value = _optimal(point, depths, log_width)[0]
        if not math.isfinite(value):
            raise NumericalError(
                f"no depth from 1 to {depths[-1]:g} has its transition width at the width of a "
                f"model of {as_text(n_params)} parameters",
                fix="ask for a size nearer the grid's, or check n_params_of",
            )
        draws = np.random.default_rng(seed).multivariate_normal(point[0], self.cov, size=n_draws)
        return _interval(value, _optimal(draws, depths, log_width), self.level)

    def describe(self) -> str:
        """One sentence with the numbers.

        Example:
            >>> print(fit_transition([6, 12, 18, 24], [4.0, 5.1, 5.9, 7.0]).describe())
            ... # doctest: +NORMALIZE_WHITESPACE
            the transition width grows exponentially with depth: its log by 0.163 (95% interval
            0.133–0.194) per layer, a factor 1.18 (1.14–1.21) per layer, intercept 3.05
            (2.55–3.55), over 4 transitions at depths 6–24; R² = 0.996, reduced χ² not defined
            without the transitions' uncertainties
        """
        s = self.slope
        factor = "–".join(as_text(math.exp(x)) for x in (s.low, s.high))
        i = self.intercept
        chi2 = (
            f"reduced χ² = {self.reduced_chi2:.3f}"
            if self.reduced_chi2 is not None
            else "reduced χ² not defined without the transitions' uncertainties"
        )
        return (
            f"the transition width grows exponentially with depth: its log by {s} per layer, "
            f"a factor {as_text(math.exp(s.value))} ({factor}) per layer, intercept "
            f"{as_text(i.value)} ({as_text(i.low)}–{as_text(i.high)}), over {self.n_points} "
            f"transitions at depths {min(self.depths):g}–{max(self.depths):g}; "
            f"R² = {self.r2:.3f}, {chi2}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The numbers, flat (for a summary file)."""
        return {
            **self.slope.to_dict("slope"),
            **self.intercept.to_dict("intercept"),
            "r2": self.r2,
            "reduced_chi2": self.reduced_chi2,
            "n_points": self.n_points,
            "weighted": self.weighted,
            "level": self.level,
        }


def _log_width_at(
    n_params: float, depths: np.ndarray, n_params_of: Callable[[Any, Any], Any]
) -> np.ndarray:
    """ln of the width with ``n_params_of(L, width) = n_params`` at each depth (bisection in
    log width over 1e-6..1e9; NaN where no width in that range gives the size)."""
    low, high = np.full_like(depths, math.log(1e-6)), np.full_like(depths, math.log(1e9))
    reachable = (np.asarray(n_params_of(depths, np.exp(low))) <= n_params) & (
        np.asarray(n_params_of(depths, np.exp(high))) >= n_params
    )
    for _ in range(80):
        middle = (low + high) / 2
        above = np.asarray(n_params_of(depths, np.exp(middle))) > n_params
        high, low = np.where(above, middle, high), np.where(above, low, middle)
    return np.where(reachable, (low + high) / 2, np.nan)


def _optimal(lines: np.ndarray, depths: np.ndarray, log_width: np.ndarray) -> np.ndarray:
    """Per (slope, intercept) row, the first depth where the model's log-width falls to the
    line (linear between grid depths); NaN where it does not within the grid."""
    gap = log_width[None, :] - (lines[:, :1] * depths[None, :] + lines[:, 1:])
    below = gap <= 0
    first = np.argmax(below, axis=1)
    found = below.any(axis=1) & (first > 0) & (gap[:, 0] > 0)
    i = np.clip(first, 1, len(depths) - 1)
    rows = np.arange(len(lines))
    g0, g1 = gap[rows, i - 1], gap[rows, i]
    with np.errstate(invalid="ignore", divide="ignore"):
        depth = depths[i - 1] + (depths[i] - depths[i - 1]) * g0 / (g0 - g1)
    return np.where(found, depth, np.nan)


def fit_transition(
    depths: Sequence[float] | np.ndarray,
    log_widths: Sequence[float] | np.ndarray,
    sigmas: Sequence[float] | np.ndarray | None = None,
    *,
    level: float = 0.95,
) -> TransitionFit:
    """The straight line of the transition log-width against depth (Levine et al. 2020: the
    transition width grows exponentially with depth, so its natural log is linear in depth;
    they report R² = 0.998 and a reduced χ² of 0.854): ``ln w_t(L) = slope * L + intercept``,
    depth on the x axis, log-width on the y axis, as :func:`transition_width` gives them
    (``depth``, ``log_width``, ``sigma``; drop the rows with a ``reason`` first).

    With ``sigmas`` (each log-width's standard deviation) the fit is weighted least squares
    and the intervals take the sigmas as the true errors (normal quantiles); the reduced χ²
    then says whether they are (about 1: the line fits within the errors; much more: the
    errors are too small or the line is wrong). Without them it is ordinary least squares,
    the errors read from the residuals (Student-t quantiles, n - 2 degrees of freedom), and
    there is no reduced χ²: it would be 1 by construction.

    Refused: mismatched lengths, non-finite values, sigmas <= 0, fewer than 3 points or 2
    distinct depths (a line through 2 points has no error to read).

    Example:
        >>> fit = fit_transition([6, 12, 18, 24], [4.1, 4.9, 6.0, 7.0], [0.1, 0.1, 0.1, 0.1])
        >>> round(fit.slope.value, 3), fit.slope.covers(1 / 6), round(fit.reduced_chi2, 2)
        (0.163, True, 0.9)
    """
    _check_level(level)
    x, y = _numbers("depths", depths), _numbers("log_widths", log_widths)
    _same_length(depths=x, log_widths=y)
    sigma = None if sigmas is None else _numbers("sigmas", sigmas)
    if sigma is not None:
        _same_length(depths=x, sigmas=sigma)
        if (sigma <= 0).any():
            raise InputError("sigmas must be > 0", fix="pass each log-width's standard deviation")
    if len(x) < 3:
        raise InputError(
            f"{len(x)} transition(s): a line with an error needs at least 3",
            fix="measure at least 4 depths (3 adjacent pairs)",
        )
    _check_depths(x, 2)
    weights = np.ones_like(y) if sigma is None else 1 / sigma**2
    design = np.column_stack([x, np.ones_like(x)])
    information = design.T @ (weights[:, None] * design)
    beta = np.linalg.solve(information, design.T @ (weights * y))
    residuals = y - design @ beta
    dof = len(x) - 2
    from scipy import stats

    if sigma is None:
        cov = np.linalg.inv(information) * float(residuals @ residuals) / dof
        quantile = float(stats.t.ppf((1 + level) / 2, dof))
        chi2 = None
    else:
        cov = np.linalg.inv(information)
        quantile = float(stats.norm.ppf((1 + level) / 2))
        chi2 = float(np.sum(weights * residuals**2)) / dof
    errors = np.sqrt(np.diag(cov))
    slope, intercept = (
        Estimate(float(b), float(b - quantile * e), float(b + quantile * e), float(level))
        for b, e in zip(beta, errors, strict=True)
    )
    return TransitionFit(
        slope=slope,
        intercept=intercept,
        r2=_r2(y, design @ beta, weights),
        reduced_chi2=chi2,
        depths=tuple(float(d) for d in np.unique(x)),
        n_points=len(x),
        weighted=sigma is not None,
        level=float(level),
        cov=cov,
    )


def l_star(n_params: Any) -> Any:
    """The claim under test, not a result: an optimal depth ``L* = (2/3) log2(N)`` for a model
    of ``N`` parameters, as the summary of Petty et al. (2024) the study works from states it.
    Only the formula, so a study can print its fitted optimum beside it; a number or an array.

    Example:
        >>> round(l_star(134e6), 2), l_star([2**12, 2**24]).tolist()
        (18.0, [8.0, 16.0])
    """
    n = np.asarray(n_params, dtype=float)
    if not np.isfinite(n).all() or (n <= 0).any():
        raise InputError(
            f"n_params = {n_params!r} must be finite and > 0", fix="pass parameter counts"
        )
    value = 2 / 3 * np.log2(n)
    return float(value) if value.ndim == 0 else value


__all__ = [
    "Estimate",
    "FORMS",
    "SaturationFit",
    "TransitionFit",
    "fit_saturation",
    "fit_transition",
    "gpt2_blocks_parameters",
    "l_star",
    "transition_width",
]
