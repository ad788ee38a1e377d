"""What a diagnosis of a checkpoint costs, from its config alone (no weight is read): the
model's shapes, the FLOPs of one block pass and one output head, the bytes of its weights and
of a batch's activations, and the block passes and heads each analysis of a diagnosis runs.

The plan (:func:`diagnosis_plan`) counts what the exact-resumption diagnosis runs per batch
(:class:`probekit.analyses.depth.shared.Shared`): the clean trace (one full forward, L block
passes and a head); ``contributions`` resumes each whole-layer skip after the skipped block
(L - 1 - l blocks) and each of the 2L sublayer ablations at the ablated block (L - l blocks),
one head each; ``skip_effects`` reads the skips already run; ``layer_swaps`` resumes each
swap of layers i < j at i (L - i blocks) with one head; the logit lens applies the head to
each of the L residuals of the clean trace; the residual statistics and the layer similarity
run one full forward each and the gradients one forward and its backward. With several
batches the shared trace holds the latest batch only, so the swaps and the lens trace each
batch again. ``tests/test_estimate.py`` checks these counts against the block and head calls
of a real diagnosis.

Example:
    >>> config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    ...           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    ...           "vocab_size": 100, "hidden_act": "silu", "tie_word_embeddings": True}
    >>> shapes = Shapes.from_config(config)
    >>> shapes.n_layers, shapes.kv_dim, shapes.gated
    (2, 32, True)
    >>> plan = diagnosis_plan(2, n_batches=1)
    >>> plan["contributions"].block_passes, plan["contributions"].heads
    (9, 7)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.model.checkpoint import (
    _config_int,
    check_checkpoint_dir,
    estimate_parameters,
    largest_weight,
)
from probekit.model.inputs import default_batch_size

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per value of the dtypes a checkpoint is stored or computed in."""

BASE_PROCESS_BYTES = 768 * 2**20
"""The resident memory of a ``probekit diagnose`` process besides its weights and its work:
Python, torch, transformers, TransformerLens and the report's libraries imported (about half
a GiB), and what a loaded model holds beside its weights (about a quarter GiB, measured)."""

GATED_ACTIVATIONS = ("silu", "swiglu", "gelu_pytorch_tanh", "geglu", "swish")
"""``hidden_act`` values of configs whose MLP is gated (three matrices: gate, up, down)."""


@dataclass(frozen=True)
class Shapes:
    """The sizes of a decoder (or encoder) that set its cost: layers, widths, heads, the
    vocabulary, whether the MLP is gated and the unembedding tied, and the parameters (from
    the safetensors headers when read from a folder, else from the config)."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    vocab: int
    gated: bool
    tied: bool
    parameters: int
    largest: int

    @classmethod
    def from_config(cls, config: dict[str, Any], parameters: int | None = None) -> Shapes:
        """The shapes a Hugging Face ``config.json`` describes (GPT-2, GPT-NeoX, Llama, Qwen2
        and alike field names)."""
        d = _config_int(config, "hidden_size", "n_embd", "d_model")
        heads = _config_int(config, "num_attention_heads", "n_head", "num_heads", default=1)
        d_mlp = _config_int(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * d
        return cls(
            n_layers=_config_int(config, "num_hidden_layers", "n_layer", "n_layers", "num_layers"),
            d_model=d,
            n_heads=heads,
            n_kv_heads=_config_int(config, "num_key_value_heads", default=heads) or heads,
            d_mlp=d_mlp,
            vocab=_config_int(config, "vocab_size"),
            gated=config.get("hidden_act", config.get("activation_function")) in GATED_ACTIVATIONS,
            tied=bool(config.get("tie_word_embeddings", True)),
            parameters=parameters or estimate_parameters(config),
            largest=largest_weight(config),
        )

    @property
    def kv_dim(self) -> int:
        """The width of the keys (and of the values): kv heads x head width."""
        return self.n_kv_heads * (self.d_model // max(self.n_heads, 1))

    @property
    def largest_block_weight(self) -> int:
        """The values of a block's largest weight matrix: an MLP matrix, or the attention's
        fused query-key-value one where that is larger (an upper bound for unfused ones)."""
        return self.d_model * max(self.d_mlp, self.d_model + 2 * self.kv_dim)

    @property
    def block_parameters(self) -> int:
        """The weights of one block (its matrices; norms and biases are negligible)."""
        attention = 2 * self.d_model * self.d_model + 2 * self.d_model * self.kv_dim
        return attention + (3 if self.gated else 2) * self.d_model * self.d_mlp


def read_shapes(folder: str | Path) -> tuple[Shapes, str, dict[str, Any]]:
    """The :class:`Shapes` of the checkpoint in ``folder`` (config.json and the safetensors
    headers: the exact parameter count, no weight read), the dtype it stores them in and its
    config."""
    from probekit.model.checkpoint import stored_dtype

    config, stored = check_checkpoint_dir(Path(folder))
    dtype = str(stored_dtype(folder, config)).removeprefix("torch.")
    return Shapes.from_config(config, parameters=stored), dtype, config


def block_flops(shapes: Shapes, sequences: int, seq_len: int) -> float:
    """FLOPs of one block pass over ``sequences`` x ``seq_len`` tokens: the weight products
    (2 per weight and token) and attention's scores and weighted values over all
    ``seq_len`` positions (2 x 2 x T x d per token)."""
    tokens = sequences * seq_len
    return tokens * (2 * shapes.block_parameters + 4 * seq_len * shapes.d_model)


def head_flops(shapes: Shapes, sequences: int, seq_len: int) -> float:
    """FLOPs of one output head (the unembedding) over ``sequences`` x ``seq_len`` tokens."""
    return 2.0 * sequences * seq_len * shapes.d_model * shapes.vocab


def weight_bytes(shapes: Shapes, storage: str, compute: str) -> int:
    """Bytes of the weights in memory kept in the ``storage`` dtype and run in ``compute``:
    the parameters in their dtype when the two agree; else the stored weights and one weight
    matrix at a time in the compute dtype, made when it is read (the largest: the unembedding,
    or an MLP matrix where that is larger; :mod:`probekit.model.storage`)."""
    kept = shapes.parameters * DTYPE_BYTES[storage]
    if storage == compute:
        return kept
    return kept + shapes.largest * DTYPE_BYTES[compute]


def activation_bytes(shapes: Shapes, sequences: int, seq_len: int, backward: bool) -> int:
    """Bytes one batch's work holds besides the weights: the clean trace's L + 1 residuals
    and a few output-sized float32 tensors (the clean side, a variant's logits and their
    measures); a backward: its saved activations too (float32)."""
    tokens = sequences * seq_len
    residuals = (shapes.n_layers + 1) * tokens * shapes.d_model
    outputs = 6 * tokens * max(shapes.vocab, shapes.d_model)
    saved = 24 * shapes.n_layers * tokens * shapes.d_model if backward else 0
    return 4 * (residuals + outputs + saved)


@dataclass(frozen=True)
class Passes:
    """What one analysis runs: block passes and output heads (each at one batch's tokens),
    and full forwards differentiated (each a backward of about twice a forward's work)."""

    block_passes: int = 0
    heads: int = 0
    backwards: int = 0

    def __add__(self, other: Passes) -> Passes:
        return Passes(
            self.block_passes + other.block_passes,
            self.heads + other.heads,
            self.backwards + other.backwards,
        )

    def times(self, n: int) -> Passes:
        return Passes(n * self.block_passes, n * self.heads, n * self.backwards)


def swap_pairs(n_layers: int, pairs: str = "adjacent") -> list[tuple[int, int]]:
    """The layer pairs ``layer_swaps`` swaps: neighbours, or every pair i < j (``"all"``)."""
    if pairs == "adjacent":
        return [(i, i + 1) for i in range(n_layers - 1)]
    return [(i, j) for i in range(n_layers) for j in range(i + 1, n_layers)]


def diagnosis_plan(
    n_layers: int,
    n_batches: int,
    *,
    pairs: str = "adjacent",
    similarity: bool = True,
    token_lens: bool = False,
    vocabulary: bool = True,
    gradient_batches: int | None = None,
) -> dict[str, Passes]:
    """The block passes and heads of each analysis of a diagnosis over ``n_batches`` batches
    (``gradient_batches``: the gradients' own, default the same), in the order they run (see
    the module)."""
    L = n_layers
    forward = Passes(L, 1)
    retrace = forward if n_batches > 1 else Passes()  # the shared trace keeps one batch
    skips = sum(L - 1 - layer for layer in range(L))
    ablations = 2 * sum(L - layer for layer in range(L))
    swaps = swap_pairs(L, pairs)
    plan = {
        "contributions": forward + Passes(skips + ablations, 3 * L),
        "skip_effects": Passes(),
        "layer_swaps": retrace + Passes(sum(L - i for i, _ in swaps), len(swaps)),
        "residual": forward,
        "logit_lens": retrace + Passes(0, L),
        "token_lens": retrace + Passes(0, L),
        "gradients": Passes(L, 1, 1),
        "layer_similarity": forward,
    }
    if not token_lens:
        del plan["token_lens"]
    if not similarity:
        del plan["layer_similarity"]
    if not vocabulary:  # no lens, no loss to differentiate
        del plan["logit_lens"], plan["gradients"]
        plan.pop("token_lens", None)
    out = {name: passes.times(n_batches) for name, passes in plan.items()}
    if "gradients" in out:
        out["gradients"] = plan["gradients"].times(gradient_batches or n_batches)
    return out


@dataclass(frozen=True)
class Workload:
    """A diagnosis of a model of ``shapes`` on ``n_sequences`` x ``seq_len`` tokens: how it
    is split into batches, and its :func:`diagnosis_plan`."""

    shapes: Shapes
    n_sequences: int
    seq_len: int
    batch: int
    gradient_batch: int
    plan: dict[str, Passes]

    @property
    def gradient_batches(self) -> int:
        """The batches ``gradient_norms`` splits the sequences into (one backward each)."""
        return math.ceil(self.n_sequences / max(self.gradient_batch, 1))

    @property
    def total(self) -> Passes:
        out = Passes()
        for passes in self.plan.values():
            out = out + passes
        return out

    def flops(self, passes: Passes) -> float:
        """FLOPs of ``passes`` (at this workload's batch; a backward twice its forward)."""
        block = block_flops(self.shapes, self.batch, self.seq_len)
        head = head_flops(self.shapes, self.batch, self.seq_len)
        backward = 2 * (self.shapes.n_layers * block + head) * self.gradient_batch / self.batch
        return passes.block_passes * block + passes.heads * head + passes.backwards * backward


def workload(
    shapes: Shapes,
    n_sequences: int,
    seq_len: int,
    batch_size: int | None = None,
    **plan: Any,
) -> Workload:
    """The :class:`Workload` of a diagnosis; its batches as :meth:`probekit.model.Model.prepare`
    splits them (``batch_size``, else :func:`~probekit.model.inputs.default_batch_size`);
    ``plan`` goes to :func:`diagnosis_plan`."""
    width = shapes.vocab if plan.get("vocabulary", True) else shapes.d_model
    batch = batch_size or default_batch_size(seq_len, width, shapes.d_model, shapes.n_layers)
    grad = batch_size or default_batch_size(
        seq_len, width, shapes.d_model, shapes.n_layers, backward=True
    )
    batch, grad = min(batch, n_sequences), min(grad, n_sequences)
    counts = diagnosis_plan(
        shapes.n_layers,
        math.ceil(n_sequences / batch),
        gradient_batches=math.ceil(n_sequences / grad),
        **plan,
    )
    return Workload(shapes, n_sequences, seq_len, batch, grad, counts)


def gradient_bytes(work: Workload, storage: str, compute: str) -> int:
    """Bytes of the weight gradients ``gradient_norms`` holds at its peak
    (:mod:`probekit.analyses.depth.gradients`: each weight's gradient is freed once its norm is
    taken). With one batch: one weight's gradient at a time, the largest block weight's,
    computed in ``compute`` and, for weights kept in another ``storage`` dtype, its copy in
    that dtype beside it. With several batches every block's gradients are summed over them
    (in ``storage``) until the last backward, so all of them."""
    shapes = work.shapes
    if work.gradient_batches > 1:
        return shapes.n_layers * shapes.block_parameters * DTYPE_BYTES[storage]
    kept = DTYPE_BYTES[storage] if storage != compute else 0
    return shapes.largest_block_weight * (DTYPE_BYTES[compute] + kept)


def peak_bytes(work: Workload, storage: str, compute: str, stored: str) -> int:
    """The peak resident memory of the diagnosis: the process itself
    (:data:`BASE_PROCESS_BYTES`), the weights (:func:`weight_bytes`), and the larger of the
    load's conversion (the checkpoint's ``stored`` weights read beside the weights made from
    them, when the two dtypes differ) and the analyses' work: a batch's forward work
    (:func:`activation_bytes`), which the allocator keeps once it has been used, and on top
    of it the gradients' backward (its saved activations and the weight gradients
    :func:`gradient_bytes` counts: one weight's with one batch, every block's with several).

    Measured on Qwen2.5-0.5B's shape (bf16 files loaded in float32, 4 x 128 tokens): 5.55 GiB
    at the peak, in the gradients, against 5.07 GiB from this sum. After a load the process
    holds its weights and about a quarter GiB besides, whatever their dtype and size
    (measured at 4 and 12 layers of that shape, bf16 and float32), counted in the base."""
    shapes = work.shapes
    weights = weight_bytes(shapes, storage, compute)
    loading = shapes.parameters * DTYPE_BYTES[stored] if stored != storage else 0
    analyses = activation_bytes(shapes, work.batch, work.seq_len, backward=False)
    if work.total.backwards:
        analyses += gradient_bytes(work, storage, compute) + activation_bytes(
            shapes, work.gradient_batch, work.seq_len, backward=True
        )
    return BASE_PROCESS_BYTES + weights + max(loading, analyses)


@dataclass(frozen=True)
class Timing:
    """Median seconds of one block pass and of one head with its output measures' share
    (``head``) at one batch's tokens on this machine, in the compute dtype."""

    block: float
    head: float

    def seconds(self, work: Workload, passes: Passes) -> float:
        """The time ``passes`` take at these timings (a backward twice its forward)."""
        forward = work.shapes.n_layers * self.block + self.head
        backward = 2 * forward * work.gradient_batch / work.batch
        return (
            passes.block_passes * self.block
            + passes.heads * self.head
            + (passes.backwards * backward)
        )


def _median_seconds(fn: Any, repeats: int, device: str) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after a warm-up (CUDA work waited
    for)."""
    import statistics
    import time

    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


MEASURES_PER_HEAD = 0.5
"""The time of the output measures of one head's logits (softmax, KL, loss and alike over the
vocabulary) as a share of the head's product: about a half at Qwen2.5-0.5B's shape (151,936
x 896 at 128 tokens, CPU seconds, two threads)."""

NO_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
"""The special tokens of the one-layer copy timed (its vocabulary is 8: none of the model's)."""

HEAD_SLICE = 16384
"""Vocabulary rows the head timing multiplies by (its time scaled to the whole vocabulary),
so that timing a 128k-vocabulary head does not allocate its whole float32 matrix."""


def time_block_and_head(
    config: dict[str, Any],
    sequences: int,
    seq_len: int,
    compute: str = "float32",
    device: str = "cpu",
    repeats: int = 3,
    storage: str | None = None,
) -> Timing:
    """:class:`Timing` of the model ``config`` describes: one block of its real shape with
    random weights (a one-layer copy of the model, built from the config) run on
    ``sequences`` x ``seq_len`` random residuals, and one unembedding product (a
    :data:`HEAD_SLICE`-row slice of the vocabulary, scaled to the whole), medians of
    ``repeats`` after a warm-up, in inference mode on ``device`` (on a CPU: the threads torch
    uses now). Weights kept in a ``storage`` dtype apart from ``compute`` are copied to it on
    each read, as :func:`probekit.model.storage.compute_in` makes them. A head's output
    measures add :data:`MEASURES_PER_HEAD` of its product's time."""
    import torch
    import transformers

    from probekit.model.storage import compute_in

    dtype = getattr(torch, compute)
    kept = getattr(torch, storage or compute)
    one = transformers.AutoConfig.for_model(
        **{**config, "num_hidden_layers": 1, "n_layer": 1, "vocab_size": 8, **NO_TOKENS}
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = transformers.AutoModel.from_config(one, dtype=kept).eval().to(device)
        shapes = Shapes.from_config(config)
        x = torch.randn(sequences, seq_len, shapes.d_model, dtype=dtype, device=device)
        rows = min(HEAD_SLICE, max(shapes.vocab, 1))
        unembed = torch.randn(rows, shapes.d_model, dtype=kept, device=device)
    if kept != dtype:
        compute_in(hf, hf, dtype)
    flat = x.reshape(-1, shapes.d_model)
    with torch.inference_mode():
        block = _median_seconds(lambda: hf(inputs_embeds=x, use_cache=False), repeats, device)
        head = _median_seconds(lambda: torch.mm(flat, unembed.to(dtype).T), repeats, device)
    whole = head * max(shapes.vocab, 1) / rows
    return Timing(block=block, head=(1 + MEASURES_PER_HEAD) * whole)


__all__ = [
    "BASE_PROCESS_BYTES",
    "DTYPE_BYTES",
    "Passes",
    "Shapes",
    "Timing",
    "Workload",
    "activation_bytes",
    "block_flops",
    "diagnosis_plan",
    "gradient_bytes",
    "head_flops",
    "peak_bytes",
    "read_shapes",
    "swap_pairs",
    "time_block_and_head",
    "weight_bytes",
    "workload",
]
