"""The verdict a reader wants first: a diagnosis's headline numbers and sentences.

:func:`headline_and_verdict` reads the depth analyses' results of one model and says, in
words and with the measure's own units, how much of the output change the second half
carries, which layers can be skipped, which form permutable blocks and where the logit lens
forms the prediction (a model without an LM head: the relative change of its output); layer
ranges are written as people write them (:func:`human_layers`).

Example:
    >>> human_layers(0, 8), blocks_line([(0, 1), (1, 2)], {1: 1.0}).startswith("No permutable")
    ('layers 0–7', True)
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from probekit.analyses.depth.contributions import ContributionResult
from probekit.analyses.depth.swaps import SwapResult
from probekit.errors import InputError
from probekit.model import Model
from probekit.result import Result, layer_ranges
from probekit.sources import is_random_tokens
from probekit.words import swap_cost

WARNING = "Warning: "
"""How a verdict line that warns begins (the numbers below it may not mean what they seem)."""


def warnings_in(verdict: list[str]) -> list[str]:
    """The lines of ``verdict`` that warn (begin with :data:`WARNING`), without that word.

    Example:
        >>> warnings_in(["Warning: at chance.", "The second half ..."])
        ['at chance.']
    """
    return [line.removeprefix(WARNING) for line in verdict if line.startswith(WARNING)]


SKIPPABLE_FRACTION = 0.01
"""A layer is called skippable when removing it raises the loss by less than this fraction of
the clean loss."""


ResultT = TypeVar("ResultT", bound=Result)


def _result_of(results: dict[str, Result], name: str, kind: type[ResultT]) -> ResultT:
    """``results[name]``, which must be a ``kind`` (the analyzer of that name's result)."""
    result = results[name]
    if not isinstance(result, kind):
        raise InputError(
            f"results[{name!r}] is a {type(result).__name__}, not a {kind.__name__}",
            fix=f"pass the result of {name}() under {name!r}",
        )
    return result


def _ablation(contributions: Result) -> str:
    """The ablation kind the contributions used (zero in results saved before there was a
    choice)."""
    return str(contributions.meta.get("ablation", "zero"))


def headline_and_verdict(
    model: Model, results: dict[str, Result], data_source: str | None = None
) -> tuple[dict, list[str]]:
    """The headline numbers and the verdict lines of a diagnosis; ``data_source`` names the
    data in words (:func:`probekit.sources.data_source`; None: not known)."""
    if model.output_kind != "logits":
        return _hidden_verdict(model, results)
    contrib = _result_of(results, "contributions", ContributionResult)
    swaps = _result_of(results, "layer_swaps", SwapResult)
    lens = results["logit_lens"]
    n = model.n_layers
    share = contrib.summary["second_half_share"]
    clean_loss = contrib.summary["clean_loss"]
    loss_delta = contrib.profile("loss_delta")
    threshold = SKIPPABLE_FRACTION * clean_loss
    skippable = [int(layer) for layer, value in loss_delta.items() if value < threshold]
    blocks = swaps.summary["blocks"]
    confidence = swaps.boundary_confidence()
    headline = {
        "n_layers": n,
        "chance_loss": math.log(model.d_vocab),
        "second_half_share": share,
        "clean_loss": clean_loss,
        "skippable_layers": skippable,
        "skippable_threshold": threshold,
        "permutable_blocks": blocks,
        "permutable_blocks_convention": "half-open [start, stop) layer indices, counted from 0",
        "depth_score": results["skip_effects"].summary["depth_score"],
        "prediction_formed_at_depth": lens.summary["formed_at_depth"],
        "convention": results["skip_effects"].meta.get("convention", "probekit"),
        "ablation": _ablation(contrib),
        "output": model.output_description,
        "measure": "prob_l2",
    }
    first_late = (n + 1) // 2
    late = f"layer {first_late}" if first_late == n - 1 else f"layers {first_late}–{n - 1}"
    verdict = _chance_warning(clean_loss, model.d_vocab, is_random_tokens(data_source)) + [
        f"The second half of the network ({late}) accounts for "
        f"{share:.1%} of the output change under {_ablation(contrib)} ablation (||Δsoftmax||₂ "
        "share"
        + (
            "; static pre-LN models typically stay below 15%, a depth-using model nears 50%)."
            if n > 2 and not model.post_norm and _ablation(contrib) == "zero"
            else "; no reference range: the published ones are for zero ablation)."
            if _ablation(contrib) != "zero"
            else "; no reference range: the published ones are for pre-LN models of more than "
            "2 layers)."
        ),
        _skip_line(n, {layer: loss_delta[layer] for layer in skippable}, clean_loss),
        blocks_line(blocks, confidence),
        _lens_line(lens, n),
    ]
    if "tuned_lens" in results:
        tuned = results["tuned_lens"].summary
        headline["tuned_lens_formed_at_depth"] = tuned["formed_at_depth"]
        headline["tuned_lens_top1_formed_at_depth"] = tuned["top1_formed_at_depth"]
        verdict.append(
            f"The tuned lens reaches it after {tuned['formed_at_depth']} of {n} blocks; its "
            f"top-1 agrees with the final one on half the tokens from depth "
            f"{tuned['top1_formed_at_depth']}."
        )
    return headline, verdict


def _hidden_verdict(model: Model, results: dict[str, Result]) -> tuple[dict, list[str]]:
    """The headline and verdict of a model without an LM head: every number is the relative
    change ||z' - z|| / ||z|| of its output z (final hidden state or pooled embedding); a layer
    is skippable when removing it changes z by less than :data:`SKIPPABLE_FRACTION`."""
    contrib = _result_of(results, "contributions", ContributionResult)
    swaps = _result_of(results, "layer_swaps", SwapResult)
    n, share = model.n_layers, contrib.summary["second_half_share"]
    change = contrib.profile("rel_l2")
    skippable = {int(layer): v for layer, v in change.items() if v < SKIPPABLE_FRACTION}
    headline = {
        "n_layers": n,
        "output": model.output_description,
        "measure": "rel_l2",
        "second_half_share": share,
        "skippable_layers": list(skippable),
        "skippable_threshold": SKIPPABLE_FRACTION,
        "permutable_blocks": swaps.summary["blocks"],
        "depth_score": results["skip_effects"].summary["depth_score"],
        "convention": results["skip_effects"].meta.get("convention", "probekit"),
        "ablation": _ablation(contrib),
    }
    listed = ", ".join(f"{layer} ({v:.2%})" for layer, v in skippable.items()) or "none"
    verdict = [
        f"Output compared: the {model.output_description}; measure ||z' - z|| / ||z|| "
        "(no vocabulary: no loss, KL or lens).",
        f"The second half of the network accounts for {share:.1%} of the output change under "
        f"{_ablation(contrib)} ablation (relative-change share).",
        f"Layers whose removal changes the output by less than {SKIPPABLE_FRACTION:.0%}: {listed}.",
        blocks_line(swaps.summary["blocks"], swaps.boundary_confidence(), "rel_l2"),
    ]
    return headline, verdict


def _lens_line(lens: Result, n: int) -> str:
    """The logit-lens verdict by its stated criterion (the first depth whose mean KL from the
    final prediction is below the threshold), with the top-k overlap the table shows there,
    so a near-uniform model whose read-outs are close in KL but not in their top tokens is
    not said to have formed its prediction early without that number beside it."""
    s = lens.summary
    formed, threshold, k = s["formed_at_depth"], s["kl_threshold"], s["k"]
    if formed is None or (isinstance(formed, float) and math.isnan(formed)):
        return (
            f"The logit lens does not come within KL {threshold} of the final prediction "
            f"before the last of {n} blocks."
        )
    part = lens.df[(lens.df["measure"] == "topk_overlap") & (lens.df["depth"] == formed)]
    overlap = f"{float(part['value'].iloc[0]):.0%}" if len(part) else "n/a"
    return (
        f"The logit lens comes within KL {threshold} of the final prediction (mean over tokens) "
        f"after {formed} of {n} blocks; there its top-{k} tokens overlap the final top-{k} by "
        f"{overlap}."
    )


def _chance_warning(clean_loss: float, d_vocab: int, random_tokens: bool = False) -> list[str]:
    """A warning line when the clean loss is near ln(vocab), the loss of a uniform guess; on
    ``random_tokens`` it says that no model can do better there."""
    chance = math.log(d_vocab)
    if not clean_loss >= 0.9 * chance:
        return []
    why = " (random tokens are unpredictable to any model)" if random_tokens else ""
    return [
        f"{WARNING}the clean loss {clean_loss:.3f} is close to ln(vocabulary) = {chance:.3f}, "
        f"the loss of a uniform guess: the model looks untrained or at chance on this "
        f"data{why}, so the depth measures below describe an untrained network, not learned "
        "computation."
    ]


def _skip_line(n: int, skippable: dict[int, float], clean_loss: float) -> str:
    """The verdict on skippable layers (``skippable``: layer -> loss change)."""
    if not skippable:
        return (
            f"No layer can be skipped at little cost: removing any one raises the loss by at "
            f"least {SKIPPABLE_FRACTION:.0%} of the clean loss {clean_loss:.4f}."
        )
    listed = ", ".join(f"{layer} (Δloss {delta:+.4f})" for layer, delta in skippable.items())
    return (
        f"{len(skippable)} of {n} layers could be skipped at little cost "
        f"(Δloss < {SKIPPABLE_FRACTION:.0%} of the clean loss {clean_loss:.4f}): {listed}."
    )


def blocks_line(blocks: list, confidence: Any, measure: str | None = None) -> str:
    """The verdict on permutable blocks ``[(start, stop), ...]`` (half-open) and their
    boundaries, written for people: "layers 0–7" counts from 0 and includes both ends; the
    cost is named by the headline ``measure`` (the loss, or the output of a model without an
    LM head)."""
    conf_text = ", ".join(
        f"before layer {k}: {confidence[k]:.0%}" for k in [b[0] for b in blocks[1:]]
    )
    conf = f" (bootstrap boundary confidence {conf_text})." if conf_text else "."
    wide = [(start, stop) for start, stop in blocks if stop - start > 1]
    if not wide:
        return (
            f"No permutable block: swapping any two layers {swap_cost(measure)['rises']}, so "
            f"every layer stands alone{conf}"
        )
    parts = "; ".join(human_layers(start, stop) for start, stop in wide)
    return f"Permutable block(s), whose layers can be reordered at little cost: {parts}{conf}"


def human_layers(start: int, stop: int) -> str:
    """A half-open layer range ``[start, stop)`` for people (:func:`~probekit.result.
    layer_ranges` of one range).

    Example:
        >>> human_layers(0, 8), human_layers(3, 4)
        ('layers 0–7', 'layer 3')
    """
    return layer_ranges([[start, stop]])


__all__ = [
    "SKIPPABLE_FRACTION",
    "WARNING",
    "blocks_line",
    "headline_and_verdict",
    "human_layers",
    "warnings_in",
]
