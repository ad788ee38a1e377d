"""Future-mode positions against the reference port (tests/reference.py): the attention and
MLP ablations redrawing their positions t as analyze_future_effects.py's run() does, and
several given positions per prompt as skip_max_depth.py's Math variant does."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import probekit
from probekit.errors import InputError
from probekit.interventions import InterventionSetting
from tests import reference as ref
from tests.test_conventions import VARIABLE, model_twin_and_prompts

TOL = 1e-6
LENGTHS = (30, 30, 21, 13, 9)  # n_future=1 picks 2 of 3 positions in the longest: draws matter
PARTS = {"layer": "layer", "mlp": "mlp", "attn": "attention"}
ONE_FUTURE = InterventionSetting("csordas2025", "future", n_future=1)


def _profiles(res) -> dict[str, np.ndarray]:
    return {c: res.profile("prob_l2", c).to_numpy() for c in PARTS}


def _reference_outputs(per_part: dict) -> dict[str, np.ndarray]:
    return {c: ref.csordas_max_over_prompts(per_part[p])[1].numpy() for c, p in PARTS.items()}


def _drawn(prompts, seed=123, n=1) -> dict[str, list]:
    """The positions run() draws per part: one stream, layer then mlp then attention."""
    rng = random.Random(seed)
    return {c: [ref.csordas_future_positions(len(p), rng, n) for p in prompts] for c in PARTS}


@pytest.fixture(scope="module")
def llama():
    return model_twin_and_prompts("llama", LENGTHS)


def test_redrawn_positions_equal_the_reference_run(llama):
    model, plain, data, prompts = llama
    res = probekit.contributions(model, data, setting=ONE_FUTURE, batch_size=2)
    assert res.meta["component_positions"] == "redrawn"  # the default under csordas2025
    want = _reference_outputs(ref.csordas_future_run(plain, prompts, n_chunks=1))
    for component, values in _profiles(res).items():
        assert np.abs(values - want[component]).max() < TOL, component
    drawn = _drawn(prompts)
    assert res.meta["future_t"] == drawn["layer"]
    assert res.meta["future_t_mlp"] == drawn["mlp"]
    assert res.meta["future_t_attn"] == drawn["attn"]
    assert drawn["attn"] != drawn["layer"] and drawn["mlp"] != drawn["layer"]
    skips = probekit.skip_effects(model, data, setting=ONE_FUTURE)
    assert skips.meta["future_t"] == drawn["layer"]  # the layer's draws are the first either way


def test_one_component_still_draws_after_the_layer_and_mlp(llama):
    model, plain, data, prompts = llama
    attn = probekit.contributions(model, data, components=["attn"], setting=ONE_FUTURE)
    want = _reference_outputs(ref.csordas_future_run(plain, prompts, n_chunks=1))["attn"]
    assert np.abs(attn.profile("prob_l2", "attn").to_numpy() - want).max() < TOL


def test_shared_positions_reuse_the_layers_draws(llama):
    model, plain, data, prompts = llama
    res = probekit.contributions(
        model,
        data,
        setting=InterventionSetting(
            "csordas2025", "future", n_future=1, component_positions="shared"
        ),
    )
    assert "future_t_attn" not in res.meta and res.meta["component_positions"] == "shared"
    got = _profiles(res)
    for component, part in PARTS.items():
        per_prompt = ref.csordas_effects(plain, prompts, "future", part, n_chunks=1)
        _, out = ref.csordas_max_over_prompts(per_prompt)
        assert np.abs(got[component] - out.numpy()).max() < TOL, component
    run = _reference_outputs(ref.csordas_future_run(plain, prompts, n_chunks=1))
    for component in ("attn", "mlp"):  # the reference's own run draws other positions
        assert not np.allclose(got[component], run[component], rtol=1e-4, atol=0)
    default = probekit.contributions(
        model, data, setting=InterventionSetting(mode="future", n_future=1)
    )
    assert default.meta["component_positions"] == "shared"  # the default under probekit
    redrawn = probekit.contributions(
        model,
        data,
        setting=InterventionSetting(mode="future", n_future=1, component_positions="redrawn"),
    )
    shared, redrawn = _profiles(default), _profiles(redrawn)  # token means see every t
    assert np.array_equal(shared["layer"], redrawn["layer"])
    for component in ("attn", "mlp"):
        assert not np.allclose(shared[component], redrawn[component], rtol=1e-3, atol=0)


@pytest.mark.parametrize(
    "starts",
    [[[20, 9, 25], 11, [5, 12], []], (np.array([20, 9]), torch.tensor(11), [7], [3, 4, 8])],
    ids=["lists", "arrays"],
)
def test_several_answer_starts_equal_the_reference(starts):
    model, plain, data, prompts = model_twin_and_prompts("llama", VARIABLE)
    plain_starts = [np.asarray(t).reshape(-1).tolist() for t in starts]
    given = InterventionSetting("csordas2025", "future", answer_start=starts)
    res = probekit.skip_effects(model, data, setting=given, batch_size=3)
    per_prompt = ref.csordas_effects(plain, prompts, "future", starts=plain_starts)
    d_max, out_max = ref.csordas_max_over_prompts(per_prompt)
    upper = np.triu(np.ones((4, 4), dtype=bool), 1)
    assert np.abs(res.matrix().to_numpy()[upper] - d_max.numpy()[upper]).max() < TOL
    assert np.abs(res.output_effect().to_numpy() - out_max.numpy()).max() < TOL
    layer_score, output_score = ref.csordas_depth_scores(d_max, out_max)
    assert res.summary["depth_score_layer"] == pytest.approx(layer_score, abs=TOL)
    assert res.summary["depth_score"] == pytest.approx(output_score, abs=TOL)
    assert res.meta["future_t"] == plain_starts
    assert res.summary["n_prompts_skipped"] == sum(not t for t in plain_starts)
    contrib = probekit.contributions(model, data, setting=given)
    for component, part in PARTS.items():
        per_prompt = ref.csordas_effects(plain, prompts, "future", part, starts=plain_starts)
        _, out = ref.csordas_max_over_prompts(per_prompt)
        got = contrib.profile("prob_l2", component).to_numpy()
        assert np.abs(got - out.numpy()).max() < TOL, component


@pytest.mark.parametrize(
    "kwargs",
    [
        {"answer_start": [[9.5], 9]},
        {"answer_start": [[9, True], 9]},
        {"answer_start": [[[9]], 9]},  # nested one level too deep
        {"answer_start": ["9", 9]},
        {"answer_start": "99"},
        {"answer_start": 9},
        {"answer_start": [[9, 30], 9]},  # beyond the first prompt
        {"answer_start": [[9, 1], 9]},  # position 1 leaves nothing to intervene on
        {"answer_start": [[], []]},  # no position for any prompt
        {"answer_start": [[9], [9], [9]]},  # three prompts' worth for two
        {"component_positions": "separate"},
        {"component_positions": "redrawn", "answer_start": [9, 9]},
        {"component_positions": "redrawn", "mode": "current"},
    ],
)
def test_positions_arguments_are_validated(kwargs):
    model, _, data, _ = model_twin_and_prompts("gpt2", (30, 20))
    kwargs = {"mode": "future", "convention": "csordas2025", **kwargs}
    with pytest.raises(InputError) as err:
        setting = InterventionSetting(**kwargs)
        probekit.contributions(model, data, components=["mlp"], setting=setting)
    assert err.value.fix
    if "component_positions" not in kwargs:
        with pytest.raises(InputError):
            probekit.skip_effects(model, data, setting=InterventionSetting(**kwargs))
