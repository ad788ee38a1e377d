"""The results of the depth-against-width studies, from synthetic members tables with planted
structure: a saturating accuracy curve, a planted effect of depth at equal perplexity (and a
planted absence of one), and Levine-style loss curves with a known transition line. The
results recover the planted numbers within their intervals, say so in sentences, record a
failed fit with its reason, draw figures in words, save and load, write the page, and refuse
bad tables before any work."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from probekit.errors import ConfigError, InputError
from probekit.result import Result
from probekit.studies import (
    DepthWidthResult,
    TransitionResult,
    depth_width_result,
    l_star,
    transition_result,
    write_study_page,
)
from probekit.studies.results import DEPTH_WIDTH_COLUMNS, size_words

# --- planted tables --------------------------------------------------------------------------

CURVE = {"a": 0.70, "b": 0.50, "c": 3.0}
"""Held-out accuracy a - b exp(-L / c) (fractions): 20% at depth 0, 70% in the limit."""

PETTY_DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16)
BOOT = {"n_boot": 200}


def planted_saturation_depth(threshold: float = 0.005) -> float:
    """The depth where the planted curve's gain of one more layer falls to ``threshold``."""
    a, b, c = CURVE.values()
    return c * math.log(b * -math.expm1(-1 / c) / threshold)


def petty_members(
    budgets=(1_000_000,), seeds=4, noise=0.01, depth_effect=0.0, loss_effect=-0.10, draw=0
) -> pd.DataFrame:
    """A depth-width members table whose LM loss falls with depth and scatters per member.
    Held-out accuracy (fractions): with ``depth_effect=None`` the planted saturating curve
    (:data:`CURVE`), otherwise ``0.6 + depth_effect·L + loss_effect·loss`` (a planted b of the
    regression at equal perplexity); plus ``noise`` per member. Seen accuracy is 0.15 above."""
    rng = np.random.default_rng(draw)
    rows = []
    for budget in budgets:
        for depth in PETTY_DEPTHS:
            for seed in range(seeds):
                loss = 2.6 - 0.03 * depth - 0.05 * math.log10(budget) + rng.normal(0, 0.05)
                if depth_effect is None:
                    a, b, c = CURVE.values()
                    held = a - b * math.exp(-depth / c)
                else:
                    held = 0.6 + depth_effect * depth + loss_effect * loss
                held += rng.normal(0, noise)
                rows.append(
                    {
                        "budget": budget,
                        "depth": depth,
                        "d_model": 64,
                        "d_mlp": 256,
                        "n_heads": 4,
                        "n_params": budget,
                        "seed": seed,
                        "lm_val_loss": loss,
                        "lm_perplexity": math.exp(loss),
                        "acc_seen": min(1.0, held + 0.15),
                        "acc_heldout": float(np.clip(held, 0, 1)),
                        "pretrain_flops": 6.0 * budget * 1e5,
                        "finetune_flops": 6.0 * budget * 1e4,
                        "seconds": 10.0 * depth,
                    }
                )
    return pd.DataFrame(rows)


LINE = {"slope": 0.15, "intercept": 3.0}
"""The planted transition: the deeper model's log-width at its crossing, slope·L' + intercept."""

LEVINE_DEPTHS = (2, 4, 6, 8)
WIDTHS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192)


def levine_members(seeds=6, noise=0.002, draw=0) -> pd.DataFrame:
    """A transition members table with ``n_params = 12 L w²`` and each depth's loss a straight
    line in ``x = ln n_params``, ``5 - 0.1 (L x - h(L))``, with ``h`` built so that adjacent
    depths cross where the deeper one's log-width is the planted line."""
    h = {LEVINE_DEPTHS[0]: 0.0}
    for shallow, deep in zip(LEVINE_DEPTHS, LEVINE_DEPTHS[1:], strict=False):
        log_width = LINE["slope"] * deep + LINE["intercept"]
        crossing = 2 * log_width + math.log(12 * deep)  # ln n_params of the deeper model there
        h[deep] = h[shallow] + (deep - shallow) * crossing
    rng = np.random.default_rng(draw)
    rows = []
    for depth in LEVINE_DEPTHS:
        for width in WIDTHS:
            n = 12 * depth * width**2
            for seed in range(seeds):
                loss = 5 - 0.1 * (depth * math.log(n) - h[depth]) + rng.normal(0, noise)
                rows.append(
                    {
                        "depth": depth,
                        "width": width,
                        "d_mlp": 4 * width,
                        "n_heads": 4,
                        "n_params": n,
                        "seed": seed,
                        "lm_val_loss": loss,
                        "pretrain_flops": 6.0 * n * 1e5,
                        "seconds": 1.0,
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def saturating() -> DepthWidthResult:
    return depth_width_result(petty_members(depth_effect=None), BOOT)


@pytest.fixture(scope="module")
def transition() -> TransitionResult:
    return transition_result(levine_members(), BOOT)


# --- the depth-width study ---------------------------------------------------------------------


def test_the_planted_saturation_depth_is_recovered_within_its_interval(saturating):
    entry = saturating.summary["saturation"]["1000000"]
    assert entry["reason"] == "" and entry["form"] == "exp"
    planted = planted_saturation_depth()
    assert entry["saturation_depth_low"] <= planted <= entry["saturation_depth_high"]
    assert entry["a_low"] <= 100 * CURVE["a"] <= entry["a_high"]
    assert entry["c_low"] <= CURVE["c"] <= entry["c_high"]
    assert entry["bootstrap"] == "seeds"
    assert saturating.summary["threshold"] == 0.005


def test_the_l_star_check_is_a_computed_sentence(saturating):
    entry = saturating.summary["saturation"]["1000000"]
    claim = l_star(1_000_000)
    assert entry["l_star"] == pytest.approx(claim)
    # the planted curve saturates near depth 8, far below L* = 13.3: the claim does not hold
    assert entry["l_star_holds"] is False
    sentence = entry["l_star_sentence"]
    assert f"L* = (2/3) log2(N) = {claim:.1f}" in sentence and "at N = 1.0M" in sentence
    assert "does not hold at this size" in sentence
    assert f"the best measured depth was {entry['best_depth']}" in sentence
    assert f"{entry['saturation_depth']:.1f} (" in sentence
    assert sentence in saturating.summary["sentences"]
    assert "0.5 points" in entry["sentence"]


def test_the_claim_holds_when_l_star_lies_in_the_interval():
    # a budget whose L* is near the planted saturation depth (about 8.6)
    budget = 2 ** (1.5 * planted_saturation_depth())
    result = depth_width_result(petty_members(budgets=(round(budget),), depth_effect=None), BOOT)
    (entry,) = result.summary["saturation"].values()
    assert (
        entry["l_star_holds"] is True
        and "the claim holds at this size" in (entry["l_star_sentence"])
    )


def test_a_failed_fit_is_recorded_with_its_reason_not_a_number():
    members = petty_members(depth_effect=0.0, loss_effect=0.0, noise=0.0)  # at chance everywhere
    result = depth_width_result(members, BOOT)
    entry = result.summary["saturation"]["1000000"]
    assert entry["reason"] and "saturation_depth" not in entry
    assert entry["l_star_holds"] is None and "not checked" in entry["l_star_sentence"]
    assert entry["best_depth"] is None and "no depth is best" in entry["l_star_sentence"]
    equal = result.summary["equal_perplexity"]
    assert equal["deeper_better"] is None and "nothing to regress" in equal["reason"]
    assert any("no fit" in s for s in result.summary["sentences"])
    fig = result.figure()
    lines = [t for t in fig.data if t.mode == "lines" and t.fill != "toself" and t.xaxis == "x"]
    assert lines and all(tuple(t.x) == (None,) for t in lines)  # the reason in the legend, no line
    assert any("no fit" in t.name for t in lines)


def test_equal_perplexity_recovers_a_planted_positive_depth_effect():
    covered = 0
    for draw in range(8):
        members = petty_members(depth_effect=0.01, loss_effect=-0.2, noise=0.01, draw=draw)
        entry = depth_width_result(members, BOOT).summary["equal_perplexity"]
        assert entry["reason"] == "" and entry["b_low"] > 0 and entry["deeper_better"] is True
        assert entry["sentence"].startswith("deeper is better at equal perplexity:")
        covered += entry["b_low"] <= 1.0 <= entry["b_high"]  # 0.01 per layer is 1 point
    assert covered >= 6  # 95% intervals from 32 members: about 8 of 8, rarely under 6
    assert entry["c_low"] < 0 < 1.0 < entry["b_high"]


def test_equal_perplexity_does_not_claim_a_planted_zero_effect():
    members = petty_members(depth_effect=0.0, loss_effect=-0.3, noise=0.01)
    result = depth_width_result(members, BOOT)
    entry = result.summary["equal_perplexity"]
    assert entry["b_low"] <= 0 <= entry["b_high"]
    assert entry["deeper_better"] is False
    assert "is not shown: the interval of b covers 0" in entry["sentence"]
    # accuracy still rises with depth overall: through the loss, not at equal perplexity
    means = result.depth_summary().query("measure == 'acc_heldout'").groupby("depth")["mean"]
    assert means.mean().iloc[-1] > means.mean().iloc[0]


def test_several_budgets_get_their_own_fit_colour_and_intercept():
    members = petty_members(budgets=(1_000_000, 4_000_000), depth_effect=None)
    result = depth_width_result(members, BOOT)
    assert sorted(result.summary["saturation"]) == ["1000000", "4000000"]
    assert sorted(result.summary["equal_perplexity"]["intercepts"]) == ["1000000", "4000000"]
    fig = result.figure()
    names = [t.name for t in fig.data if t.showlegend is not False and t.name]
    assert "budget 1.0M parameters" in names and "budget 4.0M parameters" in names
    colors = {t.line.color for t in fig.data if t.mode == "markers"}
    assert len(colors) == 2


def test_the_depth_summary_has_means_and_intervals_over_seeds(saturating):
    table = saturating.depth_summary()
    assert set(table.measure) == {"acc_heldout", "acc_seen", "lm_perplexity", "lm_val_loss"}
    assert (table.n_seeds == 4).all() and len(table) == 4 * len(PETTY_DEPTHS)
    assert ((table.low <= table["mean"]) & (table["mean"] <= table.high)).all()


# --- the transition study ----------------------------------------------------------------------


def test_the_planted_transition_slope_is_recovered_within_its_interval():
    covered = 0
    for draw in range(1, 5):
        fit = transition_result(levine_members(draw=draw), BOOT).summary["transition_fit"]
        covered += fit["slope_low"] <= LINE["slope"] <= fit["slope_high"]
    assert covered >= 3  # the seeds' spread from 6 seeds is rough: about 5 of 6 cover


def test_the_planted_transitions_are_found_where_planted(transition):
    rows = transition.transitions()
    assert len(rows) == len(LEVINE_DEPTHS) - 1 and (rows.reason == "").all()
    assert (rows.deeper_better == "above").all()
    planted = LINE["slope"] * rows.depth + LINE["intercept"]
    assert np.allclose(rows.log_width, planted, atol=0.05)
    fit = transition.summary["transition_fit"]
    assert fit["slope_low"] <= LINE["slope"] <= fit["slope_high"]
    assert fit["intercept_low"] <= LINE["intercept"] <= fit["intercept_high"]
    assert fit["weighted"] is True and fit["reduced_chi2"] is not None and fit["r2"] > 0.99


def test_the_optimal_depth_is_read_from_the_fit_at_the_given_sizes():
    depth = 6.0
    width = math.exp(LINE["slope"] * depth + LINE["intercept"])
    size = 12 * depth * width**2
    result = transition_result(levine_members(), BOOT | {"sizes": [size]})
    (row,) = result.summary["optimal_depths"]
    assert row["reason"] == "" and row["optimal_depth_low"] <= depth <= row["optimal_depth_high"]
    said = [s for s in result.summary["sentences"] if s.startswith("a model of ")]
    assert said == [
        f"a model of {size_words(size)} parameters: optimal depth "
        f"{row['optimal_depth']:.1f} ({row['optimal_depth_low']:.1f}–"
        f"{row['optimal_depth_high']:.1f}) read from the fit (sizes counted as the grid's "
        "models are counted, exactly)"
    ]


def test_pairs_that_do_not_cross_keep_their_reason_and_the_fit_says_why():
    members = levine_members()
    members = members[members.depth <= 6]  # 3 depths: 2 transitions, no line with an error
    result = transition_result(members, BOOT)
    fit = result.summary["transition_fit"]
    assert fit["reason"] == (
        "2 of 2 pairs of adjacent depths crossed: a line with an error needs at least 3 transitions"
    )
    assert "slope" not in fit
    assert any("no fit" in s for s in result.summary["sentences"])
    assert all(row["reason"] for row in result.summary["optimal_depths"])
    fig = result.figure("transition")
    assert any(tuple(t.x) == (None,) and "no fit" in t.name for t in fig.data)
    # a pair that never crosses: the shallow model's loss raised everywhere
    members = levine_members()
    members.loc[members.depth == 2, "lm_val_loss"] += 5
    rows = transition_result(members, BOOT).transitions()
    assert "better at every size measured" in rows.reason.iloc[0]


# --- figures, save/load, the page ------------------------------------------------------------

DEPTH_AXIS = re.compile(r"\bdepth\b")


def _integer_depth_axes(fig) -> int:
    checked = 0
    for name in fig.layout:
        if name.startswith("xaxis") and fig.layout[name].title.text:
            axis = fig.layout[name]
            if DEPTH_AXIS.search(axis.title.text):
                assert axis.tickmode == "linear" and float(axis.dtick).is_integer()
                checked += 1
    return checked


def test_the_figures_have_integer_depth_axes_words_and_a_log_size_axis(saturating, transition):
    from probekit.words import FIGURES

    depth = saturating.figure()
    assert _integer_depth_axes(depth) == 3
    titles = [a.text for a in depth.layout.annotations]
    words = FIGURES["depth_width_study"]
    assert titles == [words["heldout"], words["seen"], words["perplexity"]]
    fits = [
        t.name.replace("<br>", " ") for t in depth.data if t.mode == "lines" and t.fill != "toself"
    ]
    assert fits and all(n.startswith("fit of ") and "a − b·exp(−L/c)" in n for n in fits)
    assert any(n.startswith("fit of held-out combinations, budget 1.0M:") for n in fits)
    assert any("points from depth" in n for n in fits)
    bands = [t for t in depth.data if t.fill == "toself"]
    assert len(bands) == 3
    equal = saturating.figure("equal_perplexity")
    assert equal.layout.xaxis.title.text == words["loss"]
    assert equal.data[0].marker.colorbar.title.text == words["depth_colorbar"]
    loss = transition.figure()
    assert loss.layout.xaxis.type == "log" and loss.layout.xaxis.exponentformat == "power"
    legend = {t.name for t in loss.data if t.showlegend is not False}
    assert {f"depth {d}" for d in LEVINE_DEPTHS} <= legend
    assert FIGURES["transition_study"]["transition"] in legend
    width = transition.figure("transition")
    assert _integer_depth_axes(width) == 1
    assert any(t.name.startswith("fit: ln width = ") and "reduced χ²" in t.name for t in width.data)
    with pytest.raises(InputError, match="no figure"):
        saturating.figure("nonsense")


def test_save_and_load_round_trip(saturating, transition, tmp_path):
    for result in (saturating, transition):
        path = result.save(tmp_path / f"{result.kind}.json")
        loaded = Result.load(path)
        assert type(loaded) is type(result)
        pd.testing.assert_frame_equal(loaded.df, result.df)
        assert loaded.summary == json.loads(json.dumps(result.summary))
        pd.testing.assert_frame_equal(loaded.depth_summary(), result.depth_summary())
        for name, fig in result.figures().items():
            assert loaded.figure(name).to_json() == fig.to_json()


def test_the_summary_is_json_ready(saturating, transition):
    for result in (saturating, transition):
        json.dumps(result.summary, allow_nan=False)


def test_the_page_holds_every_figure_and_sentence_and_is_written_atomically(
    saturating, transition, tmp_path
):
    for result, csvs in ((saturating, {"depth_summary.csv"}), (transition, {"transitions.csv"})):
        out = tmp_path / result.kind
        out.mkdir()
        (out / "keep.txt").write_text("a member's run folder stays")
        page = write_study_page(result, out)
        assert page == out / "index.html" and (out / "keep.txt").exists()
        text = page.read_text()
        assert text.count('class="plotly-graph-div"') == len(result.figures()) == 2
        assert "Plotly" in text[:5_000_000] and "<script src=" not in text  # plotly.js embedded
        import html

        for sentence in result.summary["sentences"]:
            assert html.escape(sentence) in text
        names = {p.name for p in out.iterdir()}
        assert csvs | {"index.html", "depth_summary.csv", "keep.txt"} <= names
        assert not [n for n in names if n.startswith(".")]  # no temporary left
        table = pd.read_csv(out / "depth_summary.csv")
        assert {"depth", "mean", "low", "high", "n_seeds"} <= set(table.columns)


# --- refusals ----------------------------------------------------------------------------------


def test_bad_depth_width_tables_are_refused_naming_the_problem():
    good = petty_members(depth_effect=None, seeds=2)
    with pytest.raises(InputError, match="lacks the column"):
        depth_width_result(good.drop(columns=["acc_heldout"]))
    few = good[good.depth <= 2]
    with pytest.raises(InputError, match=r"2 depth\(s\) at budget 1.0M"):
        depth_width_result(few)
    mixed = pd.concat([good, petty_members(budgets=(4_000_000,), seeds=2).query("depth < 3")])
    with pytest.raises(InputError, match="at budget 4.0M"):
        depth_width_result(mixed)
    bad = good.copy()
    bad.loc[3, "acc_seen"] = math.nan
    with pytest.raises(InputError, match="non-finite or missing 'acc_seen'"):
        depth_width_result(bad)
    percent = good.assign(acc_heldout=100 * good.acc_heldout)
    with pytest.raises(InputError, match="outside 0–1"):
        depth_width_result(percent)
    with pytest.raises(InputError, match="repeated member"):
        depth_width_result(pd.concat([good, good.iloc[:1]]))
    with pytest.raises(InputError, match="not a pandas DataFrame"):
        depth_width_result(good.to_dict())
    assert set(DEPTH_WIDTH_COLUMNS) == set(good.columns)
    for meta in ({"threshold": 5}, {"n_boot": 3}, {"level": 95}, {"seed": -1}):
        with pytest.raises(ConfigError, match=next(iter(meta))):
            depth_width_result(good, meta)


def test_bad_transition_tables_are_refused_naming_the_problem():
    good = levine_members(seeds=2)
    with pytest.raises(InputError, match="lacks the column"):
        transition_result(good.drop(columns=["width"]))
    with pytest.raises(InputError, match=r"2 depth\(s\)"):
        transition_result(good[good.depth <= 4])
    bad = good.copy()
    bad.loc[0, "lm_val_loss"] = math.inf
    with pytest.raises(InputError, match="non-finite"):
        transition_result(bad)
    with pytest.raises(InputError, match="page takes a study result"):
        write_study_page(good, "/tmp/nowhere")  # type: ignore[arg-type]


def test_one_seed_gives_fits_without_bands_and_says_so():
    result = depth_width_result(petty_members(seeds=1, depth_effect=None), BOOT)
    entry = result.summary["saturation"]["1000000"]
    assert entry["reason"] == "" and entry["bootstrap"] == "residuals"
    assert result.depth_summary()[["low", "high"]].isna().all().all()
    assert "one seed: no interval" in result.figure().layout.title.text
    levine = transition_result(levine_members(seeds=1), BOOT)
    fit = levine.summary["transition_fit"]
    assert fit["weighted"] is False and fit["reduced_chi2"] is None
    assert "reduced χ² not defined" in fit["sentence"]


def test_a_caller_s_configuration_is_kept_as_meta_and_saves(tmp_path):
    from pathlib import Path

    meta = {"budgets": [1_000_000], "depths": {1_000_000: [1, 2]}, "corpus": Path("/x"), **BOOT}
    result = depth_width_result(petty_members(seeds=2, depth_effect=None), meta)
    assert result.meta["corpus"] == "/x" and result.meta["depths"] == {"1000000": [1, 2]}
    assert result.meta["threshold"] == 0.005 and result.meta["n_boot"] == 200
    assert Result.load(result.save(tmp_path / "r.json")).meta == result.meta


def test_a_table_of_objects_reads_as_numbers_with_whole_counts():
    members = petty_members(seeds=2, depth_effect=None).astype(object)
    result = depth_width_result(members, BOOT)
    assert result.df.depth.dtype == np.int64 and result.df.budget.dtype == np.int64
    assert result.df.acc_heldout.dtype == float
    assert result.depth_summary().depth.dtype == np.int64


def test_members_trained_from_scratch_have_no_perplexity_and_say_so(tmp_path):
    members = petty_members(seeds=2, depth_effect=None)
    members[["lm_val_loss", "lm_perplexity"]] = math.nan  # no pretraining
    result = depth_width_result(members, BOOT)
    entry = result.summary["equal_perplexity"]
    assert entry["deeper_better"] is None and "from scratch" in entry["reason"]
    assert result.summary["saturation"]["1000000"]["reason"] == ""
    assert set(result.depth_summary().measure) == {"acc_heldout", "acc_seen"}
    title = result.figure("equal_perplexity").layout.title.text.replace("<br>", " ")
    assert "equal perplexity: not measured" in title
    write_study_page(result, tmp_path)
    partly = petty_members(seeds=2, depth_effect=None)
    partly.loc[0, "lm_val_loss"] = math.nan
    with pytest.raises(InputError, match="'lm_val_loss'"):
        depth_width_result(partly, BOOT)
