"""Depth use across checkpoints equals the analyzers run on each checkpoint alone."""

from __future__ import annotations

import pytest

import probekit
from probekit.analyses.across_checkpoints import depth_timeline
from probekit.errors import InputError
from tests.conftest import make_hf, sample_tokens


def test_timeline_gathers_each_checkpoint(tmp_path):
    data = sample_tokens()
    series = []
    for run, seed in (("static", 0), ("grown", 1)):
        for step in (10, 20):
            path = tmp_path / f"{run}-{step}"
            make_hf("gpt2", seed=seed + step, scale=2.0).save_pretrained(path)
            series.append((run, step, path))
    tl = depth_timeline(series, data)
    assert set(tl.df.run) == {"static", "grown"} and set(tl.df.step) == {10, 20}
    for run, step, path in series:
        alone = probekit.contributions(probekit.load(path, device="cpu"), data)
        row = tl.df[
            (tl.df.run == run) & (tl.df.step == step) & (tl.df.measure == "second_half_share")
        ]
        assert float(row.value.iloc[0]) == pytest.approx(alone.summary["second_half_share"])
    assert tl.last("second_half_share")["grown"] == pytest.approx(
        float(tl.table().loc[("grown", 20), "second_half_share"])
    )
    fig = tl.figure()
    assert len(fig.data) == 2


def test_timeline_bad_input():
    with pytest.raises(InputError, match="no checkpoints"):
        depth_timeline([], sample_tokens())
    with pytest.raises(InputError, match="not \\(run, step, model\\)"):
        depth_timeline([("a", 1)], sample_tokens())


def test_timeline_takes_any_analyzer(tmp_path):
    """The generic timeline equals the analyzer run on each checkpoint alone, for an analyzer
    of activations and one of weights alike."""
    from probekit.analyses.across_checkpoints import timeline

    data = sample_tokens()
    series = [("run", step, make_hf("gpt2", seed=step)) for step in (1, 2)]
    tl = timeline(series, probekit.skip_effects, data)
    for _, step, hf in series:
        alone = probekit.skip_effects(probekit.load(hf), data).summary["depth_score"]
        row = tl.df[(tl.df.step == step) & (tl.df.measure == "depth_score")]
        assert float(row.value.iloc[0]) == pytest.approx(alone)
    assert tl.summary["n_checkpoints"] == 2 and tl.summary["runs"] == ["run"]


def test_timeline_refuses_a_step_that_is_not_a_number():
    with pytest.raises(InputError, match="is not a number"):
        depth_timeline([("a", "late", make_hf("gpt2"))], sample_tokens())
