"""Words for probekit's keys and figures: the measures, components and summary numbers of every
result, the titles, axis titles (with their units), colour-bar titles and legend names of every
figure, and what each report section is headed and shows. One home, below everything that draws
or writes.

A task's own words (its answer categories, what one group is, the heading of its solution
section) come with its data (``TaskData.solution_wording()``, ``categories()``,
``group_label``; the anchor task's are in :mod:`probekit.anchor.solutions`), so a new task
needs no change here: the figures below fill them into their templates.

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
from typing import Any

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
    if kind is not None and (kind, key) in KIND_LABELS:
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


VALUE_WORDS: dict[str, Callable[[str], str]] = {
    "measure": words,
    "pairs": lambda v: {"adjacent": "adjacent layers", "all": "every pair"}.get(v, v),
}
"""Summary values that are keys themselves, in words."""


# ---------------------------------------------------------------- figures
AXES = {
    "layer": "layer",
    "depth": "depth: layers applied (0 = embeddings)",
    "topk_overlap": "top-k overlap (fraction)",
    "training_step": "training step",
    "position": "position",
    "stable_rank": "stable rank (dimensions)",
    "second_half": "second half",
}
"""Axis titles (with their units), colour-bar titles and marks that several figures share."""

SETTINGS = {
    "gamma": "γ, initialization rate (std = d_in^−γ)",
    "depth": "depth (layers)",
    "weight_decay": "weight decay",
    "seed": "seed",
    "lr": "learning rate",
    # --- paper architecture and reference-width init ---
    "init_std": "initialization std d^−γ (d = d_model, or the reference width)",
}
"""Training settings as axis titles (sweeps, model families)."""

FIGURES: dict[str, dict[str, str]] = {
    # depth
    "contributions": {
        "title": "{ablation} contribution per layer: {measure}; second-half share {share:.1%}",
    },
    "skip_effects": {
        "title": "Effect of skipping layer s on the update of each later layer l, "
        "‖D_l − D'_l‖ ÷ ‖D_l‖ (where skipping matters, as a centre of mass over s: "
        "later-layer depth score {depth_score_layer:.2f}, output depth score {depth_score:.2f})",
        "x": "affected layer l",
        "y": "skipped layer s",
        "colorbar": "relative change of the update",
    },
    "swaps": {
        "title": "{cost}; permutable blocks framed, bootstrap confidence of each block boundary "
        "on top",
        "x": "layer j",
        "y": "layer i",
    },
    "gradients": {
        "title": "Gradient norm per layer (of the mean token loss)",
        "y": "gradient L2 norm (log scale)",
    },
    "residual": {
        "title": "Residual stream: similarity and relative update size",
        "left": "cosine similarities",
        "right": "update norms relative to the input",
        "y_left": "cosine",
        "y_right": "ratio of L2 norms",
    },
    "logit_lens": {
        "title": "Logit lens",
        "y": "KL (nats)",
        "kl": "KL(p_l ‖ p_final)",
        "overlap": "top-{k} overlap with the final output",
    },
    "tuned_lens": {"title": "Tuned lens"},
    "compare_lenses": {
        "title": "Logit lens and tuned lens (dotted: top-k overlap)",
        "y": "KL(p_l ‖ p_final) (nats)",
        "kl": "{name}: KL",
        "overlap": "{name}: top-{k} overlap",
    },
    "model_loss": {
        "title": "Loss per sequence (perplexity over all tokens {perplexity:.4g})",
        "x": "sequence",
        "y": "mean cross-entropy (nats)",
    },
    "timeline": {"title": "{measure} over training, one line per run"},
    # weights
    "condensation": {
        "title": "Condensation: cosine between neurons' input weights (clustered, threshold "
        "{threshold})",
        "panel": "L{layer} {matrix}: {groups} groups, score {score:.2f}",
        "colorbar": "cosine<br>similarity",
        "x": "neuron (clustered order)",
        "y": "neuron",
    },
    "condensation_timeline": {
        "title": "Condensation over training (onset step: {onset}); one line per layer, "
        "darker = deeper",
        "score": "condensation score",
        "groups": "groups of neurons",
        "stable_rank": "stable rank",
        "y_score": "score (0 to 1)",
        "y_groups": "number of groups",
    },
    "embedding_map": {
        "title": "Token embeddings ({method}): neighbour ratio {neighbour_ratio:.2f}, |rank corr| "
        "with an axis {order_corr:.2f}",
        "x": "{method} axis 1 (arbitrary units)",
        "y": "{method} axis 2 (arbitrary units)",
        "colorbar": "token id",
    },
    "spectra": {
        "title": "Spectra: stable rank of W_E {stable_rank:.2f}, embedding covariance top share "
        "{top_share:.2f}; one line per layer",
        "singular": "normalized singular values",
        "ranks": "stable rank per layer",
        "covariance": "token-embedding covariance eigenvalues",
        "covariance_legend": "embedding covariance",
        "x_singular": "singular value index",
        "y_singular": "σ_i ÷ σ_1 (log scale)",
        "x_covariance": "eigenvalue index",
        "y_covariance": "eigenvalue (log scale)",
    },
    # mechanisms
    "solutions": {
        "title": "Solution: {solution} (held-out {shares}; seen {groups} on {seen_scope} "
        "{accuracy:.2f})",
        "empty": "Solution types",
        "left": "Outputs per {group} (seen: {seen_scope}; held-out: {heldout_scope})",
        "right": "Held-out {groups}: prediction − {reference}",
        "y_left": "fraction of outputs",
        "y_right": "fraction of held-out outputs",
        "x_left": "{group} (seen, then held-out)",
        "x_right": "prediction − {reference} (tokens)",
        "seen": "seen {groups}",
        "heldout": "held-out {groups}",
        "correct": "correct ({target})",
        "wrong": "wrong",
        "heldout_group": "held-out {group} {name}",
        "difference": "prediction − {reference}",
    },
    "information_flow": {
        "title": "Information flow: attention moved by each layer (line width: attention weight, "
        "at least {min_weight})",
        "single": "one input",
        "single_labelled": "one input ({label})",
        "mean": "mean over {n_mean} inputs",
        "x_tokens": "position and token",
        "y": "residual stream: layers applied",
    },
    "hidden_state_map": {
        "title": "States at {positions!r} ({method}), coloured by group; diamonds: held-out "
        "groups and their mirrors",
        "panel": "{site} of layer {layer}",
        "mirror": " (mirror ratio {ratio:.2f})",
        "x": "{axis} 1 (arbitrary units)",
        "y": "{axis} 2 (arbitrary units)",
    },
    "pair_cosines": {
        "title": "Cosine of states ({site}) between {groups} at equal {answer} answers",
        "panel": "{site} of layer {layer}",
        "colorbar": "cosine similarity",
    },
    "attention_knockout": {
        "title": "Attention knockout into the query position ({heads}, {group} inputs): {measure}",
        "all_heads": "all heads",
        "head": "head {head}",
        "x": "blocked source {by}",
    },
    "token_masking": {
        "title": "Token masking ({mode}): {measure} at the query position, per group of inputs",
        "x": "masked {by}",
    },
    "probes": {
        "title": "Linear probes at site {site!r} ({value}; decodable: score >= {threshold} and "
        "selectivity >= {min_selectivity})",
        "not_decodable": "not decodable",
        "decodable_from": "decodable from depth {depth}",
        "first_panel": "first decodable depth (blank: none)",
        "first_colorbar": "first<br>decodable<br>depth",
        "y": "depth (layers applied)",
        "y_first": "variable",
    },
    # training
    "sweep": {
        "title": "Phase diagrams on the held-out pair (mean over seeds; blank: no run or all "
        "diverged)",
        "panel": "held-out pair {category} (fraction): γ × {y}",
        "colorbar": "fraction of<br>outputs",
        "phase_diagram": "{which} {metric} over {x} × {y} (mean over the other settings)",
        "phase_colorbar": "{metric}<br>(fraction)",
    },
    "family": {
        "title": "Depth/width family at {budget:,} parameters ({style} style)",
        "d_model": "residual width d_model",
        "d_mlp": "MLP width d_mlp",
        "params": "parameters",
        "y": "width (units)",
        "y_params": "parameters (count)",
    },
}
"""Each figure's own words, by the kind of result that draws it, as :meth:`str.format`
templates over the figure's numbers (``title``, axis titles ``x`` / ``y``, subplot titles,
colour bars, legend names); :data:`AXES` holds the words several figures share."""


# --- token-resolved lens ---
FIGURES["token_lens"] = {
    "title": "Token-resolved {lens}, {which}: the top token at each depth, coloured by {colour}",
    "panel": "{site}",
    "resid_out": "residual after each depth's blocks",
    "resid_mid": "residual inside block d, after its attention, before its MLP",
    "targets_panel": "log-probability of each target against depth",
    "top_prob": "probability of the lens' top token",
    "entropy": "entropy of the lens' distribution (nats)",
    "x": "position: input token",
    "x_sequences": "sequence (its last token)",
    "own": "{name} (sequence {sequence})",
    "mean": "{name} (mean over sequences)",
    "y_targets": "log p(target) (nats)",
}
LABELS.update(
    {
        f"{key}_{site}": f"{words} ({where})"
        for site, where in (
            ("resid_out", "after whole blocks"),
            ("resid_mid", "after each block's attention"),
        )
        for key, words in (
            (
                "mean_prediction_depth",
                "mean prediction depth: first depth from which the lens' top token is the final "
                "one and stays so (tokens that settle)",
            ),
            ("n_never_settled", "tokens whose lens never settles on the final top token"),
            ("never_settled_fraction", "fraction of tokens that never settle"),
            ("mean_kl_final", "mean KL(final ‖ lens) below the output (nats)"),
            ("mean_entropy_by_depth", "mean entropy of the lens per depth (nats)"),
        )
    }
)
# --- end token-resolved lens ---

COMPARISON_HEADINGS = {
    "second_half_share": "second-half share of the output change",
    "depth_score": "skip-effect depth score (centre of mass, layer)",
    "prediction_formed_at_depth": "logit lens matches the final prediction after (blocks)",
    "clean_loss": LABELS["clean_loss"],
    "n_layers": LABELS["n_layers"],
}
"""The column headings of the comparison table (``probekit compare``/``timeline``), short
enough for a table; the same measures' longer words are :data:`LABELS`."""

FIGURES.update(
    {
        # several checkpoints (compare, timeline, diagnose_many)
        "contribution_overlay": {
            "title": "Zero-ablation contribution of each layer, per checkpoint",
            "x": AXES["layer"],
            "x_relative": "relative depth ((layer + ½) ÷ layers)",
        },
        "lens_overlay": {
            "title": "Logit lens: KL divergence from the final prediction",
            "x": "blocks read (depth)",
            "x_relative": "relative depth (blocks read ÷ layers)",
            "y": "KL(final ‖ lens) (nats)",
        },
        "depth_use_timeline": {
            "title": "Depth use over training",
            "x": AXES["training_step"],
            "x_order": "checkpoint (in the order given)",
            "second_half_share": "share (%)",
            "depth_score": "depth score<br>(layer)",
        },
        "diagnoses": {
            "title": "{measure} per checkpoint",
            "x": "checkpoint",
        },
    }
)


def figure_words(figure: str, part: str = "title", **values: Any) -> str:
    """The words of ``part`` of ``figure`` (:data:`FIGURES`), filled with ``values``.

    Example:
        >>> figure_words("logit_lens")
        'Logit lens'
        >>> figure_words("model_loss", perplexity=12.345)
        'Loss per sequence (perplexity over all tokens 12.35)'
    """
    return FIGURES[figure][part].format(**values)


SWAP_COSTS = {
    "loss": {
        "title": "Loss change of swapping layers i and j",
        "colorbar": "Δ loss (nats)",
        "unit": "nats of loss",
        "rises": "raises the loss",
        "cost": "loss change",
    },
    "rel_l2": {
        "title": "Output change of swapping layers i and j (‖z′ − z‖ ÷ ‖z‖)",
        "colorbar": "relative output change",
        "unit": "relative change of the output",
        "rises": "changes the output",
        "cost": "output change",
    },
}
"""Words of the cost a layer order is judged by: the loss with a vocabulary, the relative
change of the output (final hidden state or embedding) without one."""


def swap_cost(measure: str | None) -> dict[str, str]:
    """The words of :data:`SWAP_COSTS` for a result whose headline ``measure`` is given
    (``rel_l2`` for models without an LM head, else the loss).

    Example:
        >>> swap_cost("rel_l2")["colorbar"], swap_cost("prob_l2")["colorbar"]
        ('relative output change', 'Δ loss (nats)')
    """
    return SWAP_COSTS["rel_l2" if measure == "rel_l2" else "loss"]


# ---------------------------------------------------------------- report sections
SECTION_TITLES = {
    "solutions": "Solution types",
    "attention_knockout": "Attention-edge knockout",
    "probes": "Linear probes of the intermediate results",
    "condensation": "Condensation of the weights",
    "embedding_map": "Token-embedding map",
    "contributions": "Zero-ablation contributions",
    "skip_effects": "Skip effects",
    "layer_swaps": "Layer swaps and permutable blocks",
    "residual": "Residual stream",
    "logit_lens": "Logit lens",
    "gradients": "Gradient norms",
    "tuned_lens": "Tuned lens",
}
"""The heading of each report section (a result that brings its task's words, such as the
solution types, is headed by them: ``probekit.report_text.own_words``)."""

SECTION_EXPLAIN = {
    "attention_knockout": "Each cell is the change of the target's probability when one "
    "attention edge (a layer's attention from the last token to one role) is blocked; large "
    "negative cells are the edges the answer flows through.",
    "probes": "Accuracy of a linear probe for each intermediate quantity at each layer and "
    "role position, against a control with shuffled labels (selectivity).",
    "condensation": "Cosine similarity between the input weights of the neurons of each "
    "matrix, neurons sorted into groups; bright blocks are groups of neurons that point the "
    "same way (condensed).",
    "embedding_map": "The item tokens' embeddings projected to two dimensions, coloured by "
    "their value; an ordered curve means the model embeds numbers by their order.",
    "contributions": "How much the output changes when one layer (or its attention or MLP) is "
    "removed, per layer and measure.",
    "skip_effects": "Row s, column l: how much skipping layer s changes what the later layer l "
    "writes (‖D_l − D′_l‖ ÷ ‖D_l‖); the change of the output for each skipped layer is in "
    "skip_effects.csv (the rows whose target is output).",
    "layer_swaps": "The {cost} for swapping each pair of layers; low cells mean the two layers "
    "can change places, and runs of them form permutable blocks.",
    "residual": "Cosine between each block's output and input, and the relative size of the "
    "attention and MLP updates, per layer.",
    "logit_lens": "KL divergence of each layer's read-out from the final prediction, and top-k "
    "overlap; where it drops to near zero the prediction is formed.",
    "gradients": "Gradient norm of each layer's weights and at its residual input.",
    "tuned_lens": "The tuned lens (a learned affine read-out per layer) over the logit lens.",
}
"""What each section's figure shows, written above it (``{cost}``: the words of the
swap cost, :data:`SWAP_COSTS`)."""

# --- token-resolved lens (report section) ---
SECTION_TITLES["token_lens"] = "Token-resolved logit lens"
SECTION_EXPLAIN["token_lens"] = (
    "The logit lens token by token, for the first sequence: each cell is the token the lens "
    "reads at that depth (row) and position (column), coloured by its probability; a token's "
    "prediction depth is the first depth from which the lens' top token is the model's final "
    "one and stays so. The table has every sequence's rows (token_lens.csv)."
)
# --- end token-resolved lens (report section) ---


# --- ablation kinds ---------------------------------------------------------------------------
ABLATION_WORDS: dict[str, dict[str, str]] = {
    "zero": {
        "title": "Zero-ablation",
        "explain": "Ablation: zero (a removed update is set to zero; a skipped block returns "
        "its input).",
    },
    "mean": {
        "title": "Mean-ablation",
        "explain": "Ablation: mean (a removed update is replaced by its mean over the data's "
        "real tokens).",
    },
    "resample": {
        "title": "Resample-ablation",
        "explain": "Ablation: resample (a removed update is replaced, at each position, by the "
        "same update in another sequence of the batch, drawn with the seed).",
    },
}
"""The words of each ablation kind (:data:`probekit.interventions.ABLATIONS`): the prefix of
a title and the sentence a report section adds."""


def ablation_words(kind: object, part: str = "title") -> str:
    """The words of ablation ``kind`` (zero when none is recorded, as in older results).

    Example:
        >>> ablation_words("mean"), ablation_words(None)
        ('Mean-ablation', 'Zero-ablation')
    """
    return ABLATION_WORDS.get(str(kind) if kind is not None else "zero", ABLATION_WORDS["zero"])[
        part
    ]


# --- activation patching and direct logit attribution ---
FIGURES.update(
    {
        "activation_patching": {
            "title": "Activation patching ({direction}): {measure} at the last token",
            "site": "patched site: {site}",
            "x": "patched position: token",
            "score": "normalised score (0 = corrupted, 1 = clean)",
            "logit_diff": "logit difference, correct − wrong answer",
            "target_prob": "probability of the answer",
            "kl": "KL(clean ‖ patched) (nats)",
        },
        "direct_logit_attribution": {
            "title": "Direct logit attribution of the {target} at {where} (frozen final-norm "
            "scale; embedding {embedding:.3g}, bias {bias:.3g}, logit {logit:.3g})",
            "logit": "target's logit",
            "difference": "logit difference, target − other",
            "y": "contribution to the logit",
        },
    }
)
WORDS.update(
    {
        "corrupted_into_clean": "corrupted patched into clean",
        "clean_into_corrupted": "clean patched into corrupted",
    }
)


__all__ = [
    "ABLATION_WORDS",
    "AXES",
    "FIGURES",
    "KIND_LABELS",
    "LABELS",
    "SECTION_EXPLAIN",
    "SECTION_TITLES",
    "SETTINGS",
    "SWAP_COSTS",
    "TARGET_GROUPS",
    "VALUE_WORDS",
    "WORDS",
    "ablation_words",
    "figure_words",
    "label",
    "swap_cost",
    "words",
]


# --- layer similarity ---
WORDS.update(
    {
        "cka": "linear CKA",
        "cosine": "mean cosine of the centred states",
        "linear_map": "held-out R² of a linear map",
    }
)
KIND_LABELS.update(
    {
        ("layer_similarity", "measure"): "similarity measure",
        ("layer_similarity", "n_tokens"): "tokens measured",
        ("layer_similarity", "n_layers_other"): "layers of the other model",
    }
)
LABELS.update(
    {
        "debiased": "debiased CKA (the unbiased HSIC estimator)",
        "block_threshold": "similarity every pair of layers inside a block reaches",
        "blocks_site": "site the blocks are read at",
        "similar_blocks": "blocks of mutually similar adjacent layers (−1 = embeddings)",
        "near_identity_layers": "near-identity layers (output alike their input)",
        "mean_adjacent": "mean similarity of adjacent layers",
        "swap_blocks": "permutable blocks of the layer swaps (beside the similar blocks)",
    }
)
FIGURES["layer_similarity"] = {
    "title": "Layer similarity: {measure} ({site})",
    "axis": "layer of the {name} (−1 = embeddings)",
    "resid_out": "residual stream after each layer",
    "attn_out": "attention updates",
    "mlp_out": "MLP updates",
}
SECTION_TITLES["layer_similarity"] = "Layer similarity"
SECTION_EXPLAIN["layer_similarity"] = (
    "Linear CKA between the residual streams after every two layers (layer −1: the embeddings); "
    "bright squares on the diagonal are runs of layers whose states are alike, where layers "
    "change the stream little."
)

_SIMILARITY_SCALES: dict[str, tuple[str, tuple[float, float], str]] = {
    "cka": ("linear CKA (0–1)", (0.0, 1.0), "Viridis"),
    "cosine": ("mean cosine of the centred states", (-1.0, 1.0), "RdBu_r"),
    "linear_map": ("held-out R² of a linear map (≤ 0 shown as 0)", (0.0, 1.0), "Viridis"),
}


def similarity_words(measure: str, debiased: bool = True) -> dict[str, Any]:
    """The words, colour range and scale of a layer-similarity ``measure``'s figure.

    Example:
        >>> similarity_words("cka")["title"], similarity_words("cosine")["range"]
        ('linear CKA (debiased)', (-1.0, 1.0))
    """
    colorbar, bounds, scale = _SIMILARITY_SCALES[measure]
    title = words(measure)
    if measure == "cka":
        title += " (debiased)" if debiased else " (biased estimator)"
    return {"title": title, "colorbar": colorbar, "range": bounds, "scale": scale}


__all__ += ["similarity_words"]


# --- depth-against-width study results ---
FIGURES.update(
    {
        "depth_width_study": {
            "title": "Depth at a fixed parameter budget ({bands})",
            "bands": "mean of {n} seeds, {level} bootstrap bands over seeds",
            "one_seed": "one seed: no interval",
            "heldout": "held-out combinations",
            "seen": "seen combinations",
            "perplexity": "language modelling",
            "y_accuracy": "accuracy (%)",
            "y_perplexity": "LM validation perplexity",
            "budget": "budget {budget} parameters",
            "fit": "fit of {what}: {words}",
            "no_fit": "no fit of {what}: {reason}",
            "equal_perplexity": "Held-out accuracy against LM validation loss, coloured by "
            "depth: {words}",
            "loss": "LM validation loss (nats per token)",
            "depth_colorbar": "depth<br>(layers)",
            "at_depth": "regression at depth {depth}, budget {budget}",
        },
        "transition_study": {
            "title": "LM validation loss against parameter count, one line per depth ({bands})",
            "x": "parameters (count, log scale)",
            "y": "LM validation loss (nats per token)",
            "depth": "depth {depth}",
            "transition": "transition: the deeper model overtakes the shallower one",
            "width_title": "Transition width against depth: {words}",
            "width_y": "transition width, ln(width of the deeper model)",
            "width_points": "transition between adjacent depths (± its seed spread)",
            "fit": "fit: {words}",
            "no_fit": "no fit: {reason}",
        },
    }
)
LABELS.update(
    {
        "sentences": "what the study found",
        "budgets": "parameter budgets",
        "saturation": "saturating fit of held-out accuracy against depth, per budget",
        "seen_saturation": "saturating fit of seen accuracy against depth, per budget",
        "equal_perplexity": "held-out accuracy at equal perplexity (regression on depth and loss)",
        "transitions": "transitions between adjacent depths",
        "transition_fit": "fit of the transition log-width against depth",
        "optimal_depths": "optimal depth per size, read from the fit",
        "n_members": "members",
        "n_seeds": "seeds",
        "level": "interval level",
    }
)
KIND_LABELS.update(
    {
        ("depth_width_study", "threshold"): (
            "gain of one more layer below which accuracy counts as saturated (fraction)"
        ),
    }
)
# --- end depth-against-width study results ---


# --- anchor runs: per-pair convergence curves ---
FIGURES["pair_curves"] = {
    "title": "Accuracy of each anchor {unit} over training (seen {unit}s reach {threshold:.0%} "
    "on their training keys between step {first_learned_step} and step {last_learned_step})",
    "y": "accuracy",
    "legend": "{unit} {pair}",
    "train": "seen {unit}s, training keys",
    "test_data": "seen {unit}s, test keys",
    "test_task": "held-out {unit}s, all keys",
}
SECTION_TITLES["pair_curves"] = "Per-pair accuracy over training"
SECTION_EXPLAIN["pair_curves"] = (
    "The accuracy of each anchor pair at every evaluation of the run (metrics.jsonl), one line "
    "per pair: on the training keys of the seen pairs, on their test keys, and on the held-out "
    "pairs (where accuracy is the share of inferential answers). Pairs learned at different "
    "times rise at different steps."
)
