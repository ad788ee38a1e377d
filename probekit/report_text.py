"""What each section of a report says in words: its heading, what its figure shows, and one
sentence on what its numbers say.

:data:`TITLES`, :data:`EXPLAIN` (their words live in :mod:`probekit.words`, with every
figure's) and the built-in conclusions speak of the depth and mechanism analyses; a result that
brings its task's words (:func:`own_words`: the solution types carry the task data's
:class:`~probekit.data.SolutionWording`) is described by them instead, so a new task needs no
change here.

Example:
    >>> import pandas as pd
    >>> from probekit.result import Result
    >>> heading("skip_effects", Result(pd.DataFrame(), {}))
    'Skip effects'
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from probekit.result import Result, readable_value
from probekit.words import SECTION_EXPLAIN, SECTION_TITLES, ablation_words, swap_cost

TITLES = SECTION_TITLES
"""The heading of each report section (:data:`probekit.words.SECTION_TITLES`)."""

EXPLAIN = SECTION_EXPLAIN
"""What each section's figure shows (:data:`probekit.words.SECTION_EXPLAIN`)."""


def own_words(result: Result) -> dict[str, Any]:
    """The words a result brings from its task: its meta's ``wording`` (a
    :class:`~probekit.data.SolutionWording` as a dict: ``title``, ``explain`` and the
    ``conclusion`` template), or ``{}``. They take the place of :data:`TITLES`,
    :data:`EXPLAIN` and the built-in conclusion of the result's section.

    Example:
        >>> import pandas as pd
        >>> own_words(Result(pd.DataFrame(), {}, {"wording": {"title": "Copying"}}))
        {'title': 'Copying'}
    """
    words = result.meta.get("wording") if isinstance(result.meta, dict) else None
    return words if isinstance(words, dict) else {}


class _SummaryFormatter(string.Formatter):
    """Fills a conclusion template from a summary; a missing number reads "n/a (...)"."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        return readable_value(value) if value is None else super().format_field(value, format_spec)


def conclusion(name: str, result: Result) -> str:
    """One sentence in words: what a section's numbers say (the result's own ``conclusion``
    template where it brings one, :func:`own_words`).

    Example:
        >>> import pandas as pd
        >>> conclusion("gradients", Result(pd.DataFrame(), {"second_half_over_first_half": 2.0}))
        'The second half of the layers gets 2 times the gradient norm of the first half.'
    """
    s = result.summary
    template = own_words(result).get("conclusion")
    try:
        if isinstance(template, str):
            return _SummaryFormatter().format(template, **s)
        pick = _CONCLUSIONS.get(name)
        return pick(s) if pick is not None else ""
    except (KeyError, IndexError, TypeError, ValueError):
        return ""


def _share(value: Any) -> str:
    return readable_value(value) if value is None else f"{value:.1%}"


_CONCLUSIONS: dict[str, Callable[[dict], str]] = {
    "attention_knockout": lambda s: (
        "The strongest edges (change of the target's probability): "
        f"{', '.join(s['strongest_edges'])}."
    ),
    "probes": lambda s: (
        f"A quantity counts as decodable at accuracy ≥ {s['threshold']} and "
        f"selectivity ≥ {s['min_selectivity']}; the table below gives where each one is."
    ),
    "condensation": lambda s: (
        f"Mean condensation score {s['mean_score']:.3f} (the share of "
        f"neuron pairs with cosine ≥ {s['threshold']}; 0 means no two neurons align)."
    ),
    "embedding_map": lambda s: (
        f"Neighbour ratio {s['neighbour_ratio']:.2f} (below 1: "
        "neighbouring numbers sit closer than random pairs) and rank correlation of the first "
        f"axis with the value {s['order_corr']:.2f}."
    ),
    "contributions": lambda s: (
        f"Layer {s['most_important_layer']} matters most and layer "
        f"{s['least_important_layer']} least; the second half carries "
        f"{_share(s['second_half_share'])} of the output change."
    ),
    "skip_effects": lambda s: (
        f"Depth score {s['depth_score']:.2f} on a scale of 0 to {s['n_layers'] - 1}: where in "
        "depth skipping a layer changes the output, as a centre of mass over the skipped "
        "layers (0 = the first), not how much; a model whose layers all matter alike (a "
        f"random one) is near {(s['n_layers'] - 1) / 2:g}."
    ),
    "layer_swaps": lambda s: (
        f"{s['n_blocks']} block(s) at a tolerance of {s['tolerance']:.3g} "
        f"({swap_cost(s.get('measure'))['unit']}); the largest adjacent swap changes it by "
        f"{s['max_adjacent_swap_delta']:.3g}."
    ),
    "residual": lambda s: (
        "Each block's output keeps a cosine of "
        f"{s['cos_out_in_first_half']:.2f} (first half) and {s['cos_out_in_second_half']:.2f} "
        "(second half) with its input."
    ),
    "logit_lens": lambda s: (
        f"The logit lens matches the final prediction (KL < "
        f"{s['kl_threshold']}) after {readable_value(s['formed_at_depth'])} of the "
        f"{s['n_layers']} layers."
    ),
    "token_lens": lambda s: (  # token-resolved lens
        f"Token by token, the logit lens settles on the final top token after "
        f"{s['mean_prediction_depth_resid_out']:.2f} of the {s['n_layers']} layers on average "
        f"({s['n_tokens']} tokens)."
    ),
    "gradients": lambda s: (
        "The second half of the layers gets "
        f"{s['second_half_over_first_half']:.3g} times the gradient norm of the first half."
    ),
}


def heading(name: str, result: Result) -> str:
    """The heading of the section of analysis ``name``: the result's own ``title``, else
    :data:`TITLES` (else the name in words)."""
    title = str(own_words(result).get("title") or TITLES.get(name, name.replace("_", " ")))
    kind = _ablation(result)
    if kind is None:
        return title
    return title.replace(ablation_words("zero"), ablation_words(kind))  # the kind used


def explanation(name: str, result: Result) -> str:
    """What the section's figure shows: the result's own ``explain``, else :data:`EXPLAIN`."""
    said = str(own_words(result).get("explain") or EXPLAIN.get(name, ""))
    said = said.replace("{cost}", swap_cost(result.summary.get("measure"))["cost"])
    kind = _ablation(result)
    return said if kind is None else f"{said} {ablation_words(kind, 'explain')}"


def _ablation(result: Result) -> str | None:
    """The ablation kind an intervention result records (its meta's ``ablation``), or None.

    Example:
        >>> import pandas as pd
        >>> _ablation(Result(pd.DataFrame(), {}, {"ablation": "mean"}))
        'mean'
    """
    kind = result.meta.get("ablation") if isinstance(result.meta, dict) else None
    return kind if isinstance(kind, str) else None


# --- layer similarity ---
def _layer_set(blocks: Any, least: int = 1) -> list[set[int]]:
    return [set(range(int(a), int(b))) for a, b in (blocks or []) if int(b) - int(a) >= least]


def similarity_beside_swaps(s: dict) -> str:
    """The layer-similarity conclusion: the near-identity runs (layers inside a block of alike
    states) and, where the diagnosis swapped layers, each permutable block of two or more
    layers with how many of its layers are near-identity, in words.

    Example:
        >>> said = similarity_beside_swaps({"measure": "cka", "block_threshold": 0.9,
        ...     "near_identity_layers": [[3, 6]], "swap_blocks": [[0, 1], [1, 6]]})
        >>> said.split(": ")[-1]
        '3 of its 5 layers are near-identity, so it is partly a run of them.'
    """
    from probekit.result import layer_ranges
    from probekit.words import words

    runs = layer_ranges(s.get("near_identity_layers") or [])
    said = (
        f"Near-identity layers (output and input alike, {words(s['measure'])} ≥ "
        f"{s['block_threshold']:g}): {runs}; blocks of mutually alike layers (−1 = the "
        f"embeddings): {layer_ranges(s.get('similar_blocks') or [])}."
    )
    near = set().union(*_layer_set(s.get("near_identity_layers")))
    for block in _layer_set(s.get("swap_blocks"), least=2):
        inside, size = len(block & near), len(block)
        kind = (
            "a run of near-identity layers"
            if inside == size
            else "layers that change the stream yet can trade places"
            if inside == 0
            else "partly a run of them"
        )
        said += (
            f" Permutable block {layer_ranges([[min(block), max(block) + 1]])}: {inside} of "
            f"its {size} layers are near-identity, so it is {kind}."
        )
    return said


_CONCLUSIONS["layer_similarity"] = similarity_beside_swaps

__all__ = ["EXPLAIN", "TITLES", "conclusion", "explanation", "heading", "own_words"]
