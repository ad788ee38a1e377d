"""The fits of the depth-against-width studies recover planted parameters within their stated
intervals, read Petty et al.'s published points, find Levine-style transitions on synthetic
grids, say why when there is none, and refuse bad input before any work."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from probekit.errors import ConfigError, InputError, NumericalError
from probekit.studies import (
    SaturationFit,
    fit_saturation,
    fit_transition,
    gpt2_blocks_parameters,
    l_star,
    transition_width,
)
from probekit.training.families import gpt2_parameter_count

# --- the saturating fit --------------------------------------------------------------------

PLANTED = {"a": 0.70, "b": 0.50, "c": 5.0}
"""An accuracy curve a - b exp(-L / c): 20% at depth 0, 70% in the limit, a 5-layer scale."""

DEPTHS = np.array([2, 4, 6, 8, 12, 16, 24, 32], dtype=float)
NOISE = 0.01
"""Each member's accuracy scatters by one point around the curve (seed to seed)."""

DRAWS = 12
ENOUGH = 9
"""Of ``DRAWS`` noise draws, the 95% intervals must cover the planted value in at least
``ENOUGH``: an interval that covers as often as it says fails this with probability 0.2%
(binomial, 12 draws at 0.95); one of no width (no noise model) or around the wrong curve
covers almost never. The bootstrap over a few seeds covers somewhat less often than its level
(about 88% here), which this still passes with probability about 0.9."""


def _planted_sat_depth(threshold: float) -> float:
    """The depth where the planted curve's gain of one more layer falls to ``threshold``."""
    a, b, c = PLANTED.values()
    return c * math.log(b * -math.expm1(-1 / c) / threshold)


def _noisy_curves(draw: int, n_seeds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + draw)
    depths = np.tile(DEPTHS, n_seeds)
    a, b, c = PLANTED.values()
    values = a - b * np.exp(-depths / c) + rng.normal(0, NOISE, depths.size)
    return depths, values, np.repeat(np.arange(n_seeds), DEPTHS.size)


@pytest.mark.parametrize("bootstrap", ["seeds", "residuals"])
def test_planted_saturation_is_recovered_within_its_intervals(bootstrap):
    covered = dict.fromkeys([*PLANTED, "saturation_depth"], 0)
    for draw in range(DRAWS):
        depths, values, seeds = _noisy_curves(draw, n_seeds=5)
        groups = seeds if bootstrap == "seeds" else None
        fit = fit_saturation(depths, values, groups=groups, n_boot=200, seed=draw)
        assert fit.bootstrap == bootstrap and fit.n_failed == 0
        for name, value in PLANTED.items():
            covered[name] += fit.params[name].covers(value)
        covered["saturation_depth"] += fit.saturation_depth(0.005).covers(_planted_sat_depth(0.005))
    assert min(covered.values()) >= ENOUGH, covered


def test_intervals_shrink_with_the_noise_and_follow_the_level():
    depths, values, seeds = _noisy_curves(0, n_seeds=5)
    a, b, c = PLANTED.values()
    quiet = a - b * np.exp(-depths / c) + (values - (a - b * np.exp(-depths / c))) / 10
    loud = fit_saturation(depths, values, groups=seeds, n_boot=200)
    calm = fit_saturation(depths, quiet, groups=seeds, n_boot=200)
    narrow = fit_saturation(depths, values, groups=seeds, n_boot=200, level=0.5)
    width = {
        name: fit.params["a"].high - fit.params["a"].low
        for name, fit in (("loud", loud), ("calm", calm), ("narrow", narrow))
    }
    assert width["calm"] < width["loud"] / 5 and width["narrow"] < width["loud"]


def test_aic_prefers_the_planted_form():
    """A curve that saturates is told from one that keeps growing as ln L: the comparison is
    checked on the data, not assumed."""
    depths, values, _ = _noisy_curves(0, n_seeds=3)
    assert fit_saturation(depths, values, n_boot=20).preferred_form == "exp"
    rng = np.random.default_rng(7)
    growing = 0.2 + 0.12 * np.log(depths) + rng.normal(0, NOISE, depths.size)
    fit = fit_saturation(depths, growing, form="log", n_boot=200)
    assert fit.preferred_form == "log" and fit.asymptote is None
    assert fit.params["b"].covers(0.12)
    assert "no asymptote" in fit.describe()


# Petty et al. 2024: compositional generalization accuracy (%) at depths 4 / 8 / 12 / 18 / 24
PETTY_DEPTHS = [4, 8, 12, 18, 24]
PETTY_ACCURACY = [45.2, 58.7, 64.1, 67.8, 68.3]


def test_pettys_published_points_saturate_where_their_steps_say():
    """The gain of one more layer falls below half a point between the depths the measured
    steps bracket: over 12..18 the mean gain per layer is 3.7 / 6 = 0.62 points (above 0.5
    somewhere in that stretch), over 18..24 it is 0.5 / 6 = 0.08 (below 0.5 somewhere there);
    for gains that shrink with depth the depth where ``f(L + 1) - f(L)`` reaches 0.5 therefore
    lies in (12 - 1, 24). The asymptote is above the last point less the fit's scatter."""
    fit = fit_saturation(PETTY_DEPTHS, PETTY_ACCURACY, n_boot=500)
    depth = fit.saturation_depth(0.5)
    print(fit.describe(0.5, what="accuracy", unit="%"))
    assert 11 < depth.value < 24, f"fitted saturation depth {depth}"
    assert depth.low <= depth.value <= depth.high
    scatter = float(np.sqrt(np.mean((fit.predict(PETTY_DEPTHS) - PETTY_ACCURACY) ** 2)))
    assert fit.params["a"].value > max(PETTY_ACCURACY) - 2 * scatter
    assert fit.preferred_form == "exp" and fit.r2 > 0.99
    assert np.all(np.diff(fit.gain([4, 8, 12, 18, 24])) < 0)  # diminishing returns


def test_the_description_names_the_numbers():
    fit = fit_saturation(PETTY_DEPTHS, PETTY_ACCURACY, n_boot=100)
    text = fit.describe(0.5, what="accuracy", unit="%")
    a, depth = fit.params["a"], fit.saturation_depth(0.5)
    assert text.startswith(f"accuracy saturates at {a.value:.3g}% (95% interval {a.low:.3g}")
    assert f"less than 0.5 points from depth {depth.value:.1f}" in text
    far = fit.describe(0.001)
    assert "an extrapolation" in far  # a thousandth of a point per layer is past depth 24
    summary = fit.to_dict()
    assert summary["a"] == a.value and summary["form"] == "exp" and summary["n_points"] == 5
    assert isinstance(fit, SaturationFit)


def test_values_that_do_not_level_off_are_refused_not_fitted():
    depths = np.arange(2.0, 34.0, 2.0)
    with pytest.raises(NumericalError, match="do not level off"):
        fit_saturation(depths, 0.1 + 0.01 * depths, n_boot=20)
    fit = fit_saturation(depths, 0.1 + 0.01 * depths, form="log", n_boot=20)
    assert fit.preferred_form == "log" and "exp" in fit.unfitted
    assert "; the exponential form cannot be fitted: the values do not level off" in fit.describe()
    assert fit.to_dict()["aic_exp"] is None


def _forbidden(*args, **kwargs):
    raise AssertionError("a fit ran before the input was checked")


@pytest.mark.parametrize(
    ("depths", "values", "options", "error", "words"),
    [
        ([4, 8], [0.5, 0.6], {}, InputError, "at least 3"),
        ([4, 8, 8, 4], [0.5, 0.6, 0.6, 0.5], {}, InputError, "at least 3"),
        ([4, 8, 12], [0.5, math.nan, 0.7], {}, InputError, "non-finite"),
        ([4, 8, 12], [0.5, 0.6], {}, InputError, "mismatched lengths"),
        ([0, 8, 12], [0.5, 0.6, 0.7], {}, InputError, "depths must be > 0"),
        ([4, 8, 12], [0.5, 0.5, 0.5], {}, InputError, "nothing to fit"),
        ([4, 8, 12], [0.5, 0.6, 0.7], {"groups": [0, 0]}, InputError, "one group label"),
        ([4, 8, 12], [0.5, 0.6, 0.7], {"groups": [1, 1, 1]}, InputError, "one group"),
        ([4, 8, 12], [0.5, 0.6, 0.7], {"form": "power"}, ConfigError, "form"),
        ([4, 8, 12], [0.5, 0.6, 0.7], {"n_boot": 5}, ConfigError, "n_boot"),
        ([4, 8, 12], [0.5, 0.6, 0.7], {"level": 95}, ConfigError, "level"),
    ],
)
def test_bad_saturation_input_is_refused_before_any_fit(
    monkeypatch, depths, values, options, error, words
):
    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "curve_fit", _forbidden)
    with pytest.raises(error, match=words) as caught:
        fit_saturation(depths, values, **options)
    assert "Fix:" in str(caught.value)


def test_a_saturation_threshold_must_be_positive():
    fit = fit_saturation(PETTY_DEPTHS, PETTY_ACCURACY, n_boot=20)
    with pytest.raises(ConfigError, match="threshold"):
        fit.saturation_depth(0)


# --- Levine's transition -------------------------------------------------------------------

SLOPE, INTERCEPT = 0.35, 2.0
"""The planted transition: ln(width of the deeper model at the crossing) = 0.35 L' + 2."""

GRID_DEPTHS = (2, 4, 6, 8, 10, 12)
LOG_SIZES = np.arange(9.0, 19.01, 0.5)
"""One grid of sizes (ln n_params) for every depth; each depth's width follows from
n_params = 12 L d^2."""


def _planted_crossing(depth: float) -> float:
    """ln n_params where depth ``depth`` overtakes the depth below it."""
    return math.log(12 * depth) + 2 * (SLOPE * depth + INTERCEPT)


def _grid(n_seeds: int = 1, noise: float = 0.0, draw: int = 0) -> pd.DataFrame:
    """Loss curves ``base(x) - k L (x - t_L)`` in x = ln n_params: the difference of adjacent
    depths is linear in x and crosses zero at the planted size, the deeper better above it."""
    shift = {GRID_DEPTHS[0]: 10.0}
    for shallow, deep in zip(GRID_DEPTHS, GRID_DEPTHS[1:], strict=False):
        x = _planted_crossing(deep)
        shift[deep] = (x * (deep - shallow) + shallow * shift[shallow]) / deep
    rng = np.random.default_rng(draw)
    rows = []
    for seed in range(n_seeds):
        for depth in GRID_DEPTHS:
            for x in LOG_SIZES:
                loss = 4 + 3 * math.exp(-0.3 * (x - 9)) - 0.05 * depth * (x - shift[depth])
                rows.append(
                    {
                        "depth": depth,
                        "width": math.sqrt(math.exp(x) / (12 * depth)),
                        "n_params": math.exp(x),
                        "loss": loss + rng.normal(0, noise),
                        "seed": seed,
                    }
                )
    return pd.DataFrame(rows)


def _planted_log_width(depth: float) -> float:
    return SLOPE * depth + INTERCEPT


@pytest.mark.parametrize("method", ["piecewise", "line"])
def test_noiseless_transitions_are_found_where_they_were_planted(method):
    table = transition_width(_grid(), method=method)
    assert list(table.depth) == list(GRID_DEPTHS[1:])
    assert (table.reason == "").all() and (table.deeper_better == "above").all()
    planted = [_planted_log_width(depth) for depth in table.depth]
    np.testing.assert_allclose(table.log_width, planted, atol=1e-9)
    np.testing.assert_allclose(table.width, np.exp(planted), rtol=1e-9)
    assert table.sigma.isna().all()  # one seed: no spread to read
    fit = fit_transition(table.depth, table.log_width)
    assert fit.slope.value == pytest.approx(SLOPE) and fit.r2 == pytest.approx(1.0)
    assert fit.reduced_chi2 is None and "not defined" in fit.describe()


def test_planted_transition_is_recovered_from_noisy_seeds():
    """Six seeds, loss noise 0.01: the seeds' bootstrap gives each transition its sigma, the
    weighted line covers the planted slope and intercept."""
    covered = {"slope": 0, "intercept": 0}
    draws = 8
    for draw in range(draws):
        table = transition_width(_grid(n_seeds=6, noise=0.01, draw=draw), n_boot=200, seed=draw)
        assert (table.reason == "").all(), table.reason.tolist()
        fit = fit_transition(table.depth, table.log_width, table.sigma)
        covered["slope"] += fit.slope.covers(SLOPE)
        covered["intercept"] += fit.intercept.covers(INTERCEPT)
        assert fit.r2 > 0.99
    assert min(covered.values()) >= draws - 2, covered


def test_reduced_chi2_is_about_one_when_the_sigmas_are_the_noise():
    """400 draws of 8 transitions with known errors: the mean reduced chi^2 is 1 within
    0.1 (its standard error is sqrt(2 / 6) / 20 = 0.03), and the 95% intervals cover the
    planted slope in 92-98% of draws (standard error 1.1%). Sigmas stated twice too large
    give about 1/4."""
    rng = np.random.default_rng(3)
    depths = np.arange(4.0, 36.0, 4.0)
    sigmas = np.linspace(0.05, 0.2, depths.size)
    chi2: list[float] = []
    doubled: list[float] = []
    covered, covered_ols = 0, 0
    for _ in range(400):
        log_widths = SLOPE * depths + INTERCEPT + rng.normal(0, sigmas)
        fit = fit_transition(depths, log_widths, sigmas)
        wide = fit_transition(depths, log_widths, 2 * sigmas)
        assert fit.reduced_chi2 is not None and wide.reduced_chi2 is not None
        chi2.append(fit.reduced_chi2)
        doubled.append(wide.reduced_chi2)
        covered += fit.slope.covers(SLOPE)
        covered_ols += fit_transition(depths, log_widths).slope.covers(SLOPE)
    assert np.mean(chi2) == pytest.approx(1.0, abs=0.1)
    assert np.mean(doubled) == pytest.approx(0.25, abs=0.05)
    assert 0.92 <= covered / 400 <= 0.98
    assert 0.92 <= covered_ols / 400 <= 0.98


def _two_depths(shallow_loss, deep_loss, deep_sizes=(1e4, 1e5, 1e6)) -> pd.DataFrame:
    rows = [
        {"depth": 2, "width": 10 * (i + 1), "n_params": n, "loss": loss}
        for i, (n, loss) in enumerate(zip((1e4, 1e5, 1e6), shallow_loss, strict=True))
    ]
    rows += [
        {"depth": 4, "width": 10 * (i + 1), "n_params": n, "loss": loss}
        for i, (n, loss) in enumerate(zip(deep_sizes, deep_loss, strict=True))
    ]
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("grid", "method", "words"),
    [
        (_two_depths([3, 2, 1], [2.5, 1.5, 0.5]), "piecewise", "deeper model is better at every"),
        (_two_depths([3, 2, 1], [3.5, 2.5, 1.5]), "piecewise", "shallower model is better"),
        (_two_depths([3, 2, 1], [2, 1, 0.5], (1e7, 1e8, 1e9)), "piecewise", "do not overlap"),
        (_two_depths([3, 2, 1], [3.5, 1.5, 1.5]), "piecewise", "cross 2 times"),
        (_two_depths([3, 2, 1], [3.1, 2.05, 1.0]), "line", "outside"),
    ],
)
def test_curves_that_do_not_cross_once_give_nan_with_the_reason(grid, method, words):
    row = transition_width(grid, method=method).iloc[0]
    assert math.isnan(row.log_width) and math.isnan(row.width)
    assert words in row.reason


def _grid_without(column: str) -> pd.DataFrame:
    return _grid().drop(columns=column)


def _grid_with(**changes) -> pd.DataFrame:
    grid = _grid()
    for column, value in changes.items():
        grid.loc[0, column] = value
    return grid


@pytest.mark.parametrize(
    ("grid", "options", "error", "words"),
    [
        ({"depth": [2, 4]}, {}, InputError, "not a pandas DataFrame"),
        (_grid_without("n_params"), {}, InputError, "lacks the column"),
        (_grid_with(loss=math.inf), {}, InputError, "non-finite"),
        (_grid_with(width=0.0), {}, InputError, "values <= 0"),
        (pd.concat([_grid(), _grid().iloc[:1]]), {}, InputError, "repeated member"),
        (_grid()[_grid().depth == 2], {}, InputError, "one depth"),
        (_grid(), {"method": "spline"}, ConfigError, "method"),
        (_grid(), {"n_boot": 1}, ConfigError, "n_boot"),
    ],
)
def test_bad_grids_are_refused_before_any_work(grid, options, error, words):
    with pytest.raises(error, match=words) as caught:
        transition_width(grid, **options)
    assert "Fix:" in str(caught.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (([4, 8, 12], [1.0, 2.0]), "mismatched lengths"),
        (([4, 8], [1.0, 2.0]), "at least 3"),
        (([4, 4, 4], [1.0, 2.0, 3.0]), "distinct depth"),
        (([4, 8, 12], [1.0, math.nan, 3.0]), "non-finite"),
        (([4, 8, 12], [1.0, 2.0, 3.0], [0.1, 0.0, 0.1]), "sigmas must be > 0"),
    ],
)
def test_bad_transition_fits_are_refused(args, words):
    with pytest.raises(InputError, match=words):
        fit_transition(*args)


def test_the_optimal_depth_is_read_back_from_the_fit():
    """For a size whose depth-L model sits exactly on its transition width, the optimal depth
    is L; with exact GPT-2 counts it agrees with a search over depths."""
    fit = fit_transition([4, 8, 12, 16], [_planted_log_width(d) for d in (4, 8, 12, 16)])
    for depth in (6.0, 10.0, 14.0):
        n = gpt2_blocks_parameters(depth, math.exp(_planted_log_width(depth)))
        found = fit.optimal_depth(n)
        assert found.value == pytest.approx(depth, abs=1e-3) and found.covers(found.value)

    def exact(depth, width):
        return gpt2_parameter_count(depth, width, 4 * width, vocab_size=256, n_positions=128)

    n = 5e6
    optimum = fit.optimal_depth(n, n_params_of=exact).value
    depths = np.linspace(1, 64, 63001)
    widths = np.array([_width_for(exact, depth, n) for depth in depths[::100]])
    gap = np.log(widths) - fit.predict(depths[::100])
    searched = depths[::100][np.argmax(gap <= 0)]
    assert abs(optimum - searched) <= 0.1


def _width_for(n_params_of, depth: float, n: float) -> float:
    low, high = 1e-3, 1e6
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (low, middle) if n_params_of(depth, middle) > n else (middle, high)
    return low


def test_an_optimal_depth_needs_a_rising_transition():
    fit = fit_transition([4, 8, 12], [5.0, 4.0, 3.0])
    with pytest.raises(NumericalError, match="does not grow with depth"):
        fit.optimal_depth(1e6)


def test_the_claimed_optimal_depth_is_only_the_formula():
    assert l_star(2**24) == pytest.approx(16.0)
    assert l_star(134e6) == pytest.approx(2 / 3 * math.log2(134e6))
    np.testing.assert_allclose(l_star([2**12, 2**24]), [8.0, 16.0])
    with pytest.raises(InputError, match="n_params"):
        l_star(0)


def test_the_studies_package_exports_lazily_and_is_typed():
    import ast
    from pathlib import Path

    import probekit.studies

    source = Path(probekit.studies.__file__).read_text()
    typed = {
        alias.name
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert typed == set(probekit.studies.__all__)
    assert probekit.studies.fit_saturation is fit_saturation
