"""Words for probekit's keys: the measures, components and summary numbers of every result,
as figures, tables and reports show them. One home, below everything that draws or writes.

Example:
    >>> words("rel_l2")
    'relative change of the output (‖z′ − z‖ ÷ ‖z‖)'
    >>> label("second_half_share_kl")
    'share of the output change from the second half, by KL divergence from the clean output (nats)'
    >>> label("threshold", "probes")
    'score a probe needs to count as decodable'
    >>> label("cos_out_in_second_half")
    'cos(layer output, layer input), mean over the second half of the layers'
"""

from __future__ import annotations

from collections.abc import Callable

WORDS = {
    # output-change measures (depth and mechanism analyses)
    "prob_l2": "change of the output probabilities (L2)",
    "logit_l2": "change of the logits (L2)",
    "kl": "KL divergence from the clean output (nats)",
    "loss_delta": "change of the loss (nats)",
    "p_target_delta": "change of the target's probability",
    "accuracy_delta": "change of the accuracy (fraction)",
    "pred_changed": "predictions changed (fraction)",
    "rel_l2": "relative change of the output (‖z′ − z‖ ÷ ‖z‖)",
    "cos_dist": "cosine distance from the clean output (1 − cos)",
    # components
    "layer": "whole layer",
    "attn": "attention",
    "mlp": "MLP",
    # residual stream
    "cos_out_in": "cos(layer output, layer input)",
    "cos_attn_in": "cos(attention update, layer input)",
    "cos_mlp_mid": "cos(MLP update, MLP input)",
    "cos_update_in": "cos(layer update, layer input)",
    "attn_rel": "attention update ÷ input norm",
    "mlp_rel": "MLP update ÷ input norm",
    "update_rel": "layer update ÷ input norm",
    # gradients
    "mean_param_grad_norm": "mean over the layer's weights",
    "grad_norm": "all the layer's weights",
    "resid_grad_norm": "residual stream at the layer's output",
    # timelines
    "second_half_share": "second-half share of the output change (fraction)",
    "depth_score_normalized": "skip-effect depth score (centre of mass ÷ layers − 1)",
    "depth_score": "skip-effect depth score (centre of mass, layer)",
    # probes
    "score": "probe score (accuracy or R²)",
    "selectivity": "selectivity over shuffled labels",
}
"""Words for the keys of probekit's tables, used in legends, axis and colorbar titles."""


def words(key: str) -> str:
    """``key`` (a measure, component, ...) in words for a figure.

    Example:
        >>> words("cos_out_in"), words("some_new_measure")
        ('cos(layer output, layer input)', 'some new measure')
    """
    return WORDS.get(str(key), str(key).replace("_", " "))


LABELS = {
    "second_half_share": "share of the output change from the second half",
    "clean_loss": "loss of the unmodified model (nats)",
    "loss": "loss (nats)",
    "perplexity": "perplexity",
    "depth_score": (
        "depth score: where skipping a layer changes the output, as a centre of mass over the "
        "skipped layers (0 to layers − 1; layers that all matter alike give (layers − 1) ÷ 2)"
    ),
    "depth_score_normalized": "depth score ÷ (layers − 1)",
    "depth_score_layer": (
        "later-layer depth score: where skipping a layer changes the later layers' updates, as "
        "a centre of mass over the skipped layers (the last layer has no later layer, so 0 "
        "with 2 layers)"
    ),
    "depth_score_layer_normalized": "later-layer depth score ÷ (layers − 1)",
    "max_downstream_effect": "largest effect of skipping a layer on a later layer",
    "formed_at_depth": "blocks until the logit lens matches the final prediction",
    "mean_kl_second_half": "mean KL from the final output over the second half (nats)",
    "kl_threshold": "KL below which the lens matches the final prediction (nats)",
    "k": "k of the top-k overlap",
    "n_layers": "layers",
    "n_prompts": "prompts measured",
    "n_prompts_skipped": "prompts left out (no future position: too short, or none given)",
    "n_bootstrap": "bootstrap replicates",
    "n_sequences": "sequences",
    "seq_len": "tokens per sequence (at most)",
    "n_future": "future positions t drawn per prompt (at most)",
    "measure": "output change measured by",
    "output": "output compared",
    "blocks": "permutable blocks",
    "permutable_blocks": "permutable blocks",
    "n_blocks": "number of permutable blocks",
    "pairs": "layer pairs swapped",
    "tolerance": "clustering tolerance (the change a swap may make inside a block)",
    "max_adjacent_swap_delta": "largest change from swapping two adjacent layers",
    "mean_adjacent_swap_delta": "mean change from swapping two adjacent layers",
    "min_boundary_confidence": "lowest bootstrap confidence of a block boundary",
    "second_half_over_first_half": "mean gradient norm, second half ÷ first half of the layers",
    "heldout_diff_mode": "most frequent prediction − target on held-out inputs",
    "seen_test_accuracy": "accuracy on seen pairs (test inputs)",
    "strongest_edges": "strongest edges (largest drops)",
    "n_tokens": "tokens",
    "neighbour_ratio": "distance between consecutive tokens ÷ mean distance",
    "order_corr": "largest |rank correlation| of token value with a map axis",
    "mean_score": "mean condensation score",
    "min_selectivity": "selectivity a probe needs to count as decodable",
    "method": "method",
    "most_important_layer": "layer whose removal changes the output most",
    "least_important_layer": "layer whose removal changes the output least",
    "memorizing": "memorizing (the seen groups below the accuracy threshold)",
}
"""Summary keys in words (the tables of reports and notebooks)."""

KIND_LABELS = {
    ("probes", "threshold"): "score a probe needs to count as decodable",
    ("condensation", "threshold"): "cosine similarity at which neurons group",
}
"""Keys whose words depend on the analysis (``(result kind, key)``)."""

TARGET_GROUPS = ("attention_knockout", "token_masking")
"""Analyses whose ``n_<group>`` counts the targets of a group of the task data."""

_PATTERNS: tuple[tuple[str, str, Callable[[str], str]], ...] = (
    # (prefix, suffix, the words of what lies between them)
    ("second_half_share_", "", lambda m: f"{LABELS['second_half_share']}, by {words(m)}"),
    ("", "_first_half", lambda m: f"{words(m)}, mean over the first half of the layers"),
    ("", "_second_half", lambda m: f"{words(m)}, mean over the second half of the layers"),
    ("", "_prompt_mean", lambda k: f"{label(k)}, mean over prompts"),
    ("clean_accuracy_", "", lambda g: f"accuracy of the unmodified model ({words(g)} targets)"),
    ("clean_p_target_", "", lambda g: f"target probability, unmodified model ({words(g)} targets)"),
    ("n_", "", lambda g: f"number of {words(g)}"),
    ("explained_variance_", "", lambda i: f"variance explained by map axis {i}"),
    ("heldout_", "_train_keys", lambda c: f"held-out pair, training keys: {words(c)} (fraction)"),
    ("heldout_", "", lambda c: f"held-out pair: {words(c)} outputs (fraction)"),
)
"""Families of keys (a measure, a group or a category inside a fixed prefix or suffix)."""


def label(key: str, kind: str | None = None) -> str:
    """A summary key in words (:data:`LABELS`, :data:`KIND_LABELS`, then the families of
    :data:`_PATTERNS`, else the key with spaces).

    Example:
        >>> label("clean_p_target_all"), label("some_new_key")
        ('target probability, unmodified model (all targets)', 'some new key')
    """
    key = str(key)
    if (kind, key) in KIND_LABELS:
        return KIND_LABELS[(kind, key)]
    if key in LABELS:
        return LABELS[key]
    if kind in TARGET_GROUPS and key.startswith("n_"):
        return f"{words(key[2:])} targets"
    for prefix, suffix, say in _PATTERNS:
        middle = (
            key.removeprefix(prefix).removesuffix(suffix) if suffix else key.removeprefix(prefix)
        )
        if key.startswith(prefix) and key.endswith(suffix) and middle and middle != key:
            return say(middle)
    return key.replace("_", " ")


VALUE_WORDS = {
    "measure": words,
    "pairs": lambda v: {"adjacent": "adjacent layers", "all": "every pair"}.get(v, v),
}
"""Summary values that are keys themselves, in words."""


__all__ = ["KIND_LABELS", "LABELS", "TARGET_GROUPS", "VALUE_WORDS", "WORDS", "label", "words"]
