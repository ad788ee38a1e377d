"""Every public analyzer has the one shape probekit.analyses describes: typed (model, data),
keyword-only settings, batch_size defaulting to the automatic choice, and the same meta keys."""

from __future__ import annotations

import inspect

import pytest

import probekit
from probekit import analyses
from probekit.analyses.depth.tuned_lens import TunedLens
from probekit.anchor import AnchorTask
from probekit.result import Result
from probekit.toy import TOY_VOCAB, toy_model, toy_tokens

NOT_OF_DATA = {"condensation", "spectra", "embedding_map"}
"""Analyzers of the weights alone: ``(model, *, ...)``."""

OWN_SHAPE = {"timeline", "depth_timeline", "condensation_timeline", "perplexity"}
"""Across checkpoints (their first argument is the checkpoints), and the perplexity helper."""

QUERY_AT_LAST = {"attention_knockout", "token_masking", "hidden_state_map", "pair_cosines"}
"""Analyzers that read one position per sequence, where the answer is predicted."""
QUERY_AT_LAST |= {"direct_logit_attribution"}

TWO_RUNS = {"activation_patching"}
"""Analyzers of two runs of the same shape: ``(model, clean, corrupted, *, ...)``."""


NOT_YET: dict[str, str] = {}
"""Analyzers still out of shape, with the reason."""


def _analyzers() -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(reason=NOT_YET[name], strict=True))
        if name in NOT_YET
        else name
        for name in analyses.__all__
        if inspect.isfunction(getattr(analyses, name)) and name not in OWN_SHAPE
    ]


@pytest.mark.parametrize("name", _analyzers())
def test_every_analyzer_has_the_one_signature(name):
    params = inspect.signature(getattr(analyses, name)).parameters
    if name in TWO_RUNS:
        assert list(params)[:3] == ["model", "clean", "corrupted"]
        first = list(params)[:3]
    else:
        first = list(params)[: 1 if name in NOT_OF_DATA else 2]
        assert first == ["model", "data"][: len(first)]
    assert params["model"].annotation == "Model"
    rest = [p for p in params.values() if p.name not in first]
    assert all(p.kind is p.KEYWORD_ONLY for p in rest), name
    if name in NOT_OF_DATA:
        return
    assert params["batch_size"].default is None
    assert params["batch_size"].annotation == "int | None"
    if "positions" in params:
        want = "last" if name in QUERY_AT_LAST else "all"
        assert params["positions"].default == want, name
    return_class = inspect.signature(getattr(analyses, name)).return_annotation
    assert issubclass(getattr(analyses, return_class), Result)


def test_every_result_of_data_holds_model_positions_and_batch_size():
    model = toy_model("gpt2", n_layers=2)
    tokens = toy_tokens(8, 8)
    task = AnchorTask(n_train=64, n_test=32, item_high=40, vocab_size=TOY_VOCAB)
    test_data = task.dataset("test_task")
    results = {
        "contributions": probekit.contributions(model, tokens),
        "skip_effects": probekit.skip_effects(model, tokens),
        "residual_stats": probekit.residual_stats(model, tokens),
        "logit_lens": probekit.logit_lens(model, tokens),
        "gradient_norms": probekit.gradient_norms(model, tokens),
        "layer_swaps": probekit.layer_swaps(model, tokens, n_bootstrap=0),
        "tuned_lens": probekit.tuned_lens(model, tokens, lens=TunedLens.zeros(model)),
        "model_loss": probekit.model_loss(model, tokens),
        "token_masking": probekit.token_masking(model, test_data, by="role"),
        "attention_knockout": probekit.attention_knockout(model, test_data, layers=[1]),
        "hidden_state_map": probekit.hidden_state_map(model, task.solution_data(), layers=[1]),
        "pair_cosines": probekit.pair_cosines(model, task.solution_data(), layers=[1]),
        "solution_types": probekit.solution_types(model, task.solution_data()),
        "activation_patching": probekit.activation_patching(
            model, tokens, tokens.flip(0), metric="kl", positions="last"
        ),
        "direct_logit_attribution": probekit.direct_logit_attribution(model, tokens, targets=1),
    }
    for name, res in results.items():
        assert {"model", "positions", "batch_size"} <= set(res.meta), name
        assert res.meta["batch_size"] is None, name
    flow = probekit.information_flow(model, toy_tokens(4, 5))
    assert {"model", "batch_size"} <= set(flow.meta)
