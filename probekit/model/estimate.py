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
from probekit.model.inputs import (
    default_batch_size,
    swap_pairs,
    swapped_order,
    variants_per_run,
)
from probekit.model.storage import UNEMBED_SLICE

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
    the parameters in their dtype when the two agree; else the stored weights and one block's
    weights in the compute dtype (:mod:`probekit.model.storage`: made when read, held for a
    step of stacked variants; the unembedding is computed by slices of
    :data:`~probekit.model.storage.UNEMBED_SLICE` rows and the embedding read as stored, so
    neither is copied whole)."""
    kept = shapes.parameters * DTYPE_BYTES[storage]
    if storage == compute:
        return kept
    unembedding = min(shapes.vocab, UNEMBED_SLICE) * shapes.d_model
    return kept + max(shapes.block_parameters, unembedding) * DTYPE_BYTES[compute]


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
    full forwards differentiated (each a backward of about twice a forward's work), and the
    block runs the block passes take (``block_runs``; -1: one pass per run): hook-free
    variants stacked along the batch run several passes in one run
    (:meth:`probekit.model.Trace.resume_stacked`)."""

    block_passes: int = 0
    heads: int = 0
    backwards: int = 0
    block_runs: int = -1

    def __post_init__(self) -> None:
        if self.block_runs == -1:
            object.__setattr__(self, "block_runs", self.block_passes)

    def __add__(self, other: Passes) -> Passes:
        return Passes(
            self.block_passes + other.block_passes,
            self.heads + other.heads,
            self.backwards + other.backwards,
            self.block_runs + other.block_runs,
        )

    def times(self, n: int) -> Passes:
        return Passes(
            n * self.block_passes, n * self.heads, n * self.backwards, n * self.block_runs
        )


def stacked_runs(
    starts: list[int], orders: list[list[int]] | None, n_layers: int, chunk: int
) -> int:
    """Block runs of hook-free variants resumed together, grouped as
    :meth:`probekit.model.Trace.resume_stacked` groups them: per position, the variants that
    run the same block, ``chunk`` at a time (``orders[v]``: variant v's blocks from its
    start; default the remaining layers in order).

    Example:
        >>> stacked_runs([1, 2, 3], None, n_layers=3, chunk=2)  # block 1 alone, block 2 for two
        2
        >>> stacked_runs([1, 2, 3], None, n_layers=3, chunk=1)  # one per pass: 3 passes
        3
    """
    plan = [
        list(range(start, n_layers)) if orders is None else list(orders[v])
        for v, start in enumerate(starts)
    ]
    runs = 0
    for pos in range(min(starts, default=n_layers), n_layers):
        sizes: dict[int, int] = {}
        for v, start in enumerate(starts):
            if start <= pos:
                layer = plan[v][pos - start]
                sizes[layer] = sizes.get(layer, 0) + 1
        runs += sum(math.ceil(size / chunk) for size in sizes.values())
    return runs


def diagnosis_plan(
    n_layers: int,
    n_batches: int,
    *,
    pairs: str = "adjacent",
    similarity: bool = True,
    token_lens: bool = False,
    vocabulary: bool = True,
    gradient_batches: int | None = None,
    chunk: int = 1,
) -> dict[str, Passes]:
    """The block passes, heads and block runs of each analysis of a diagnosis over
    ``n_batches`` batches (``gradient_batches``: the gradients' own, default the same), in
    the order they run (see the module); ``chunk``: the hook-free variants one block run
    stacks (:func:`~probekit.model.inputs.variants_per_run`)."""
    L = n_layers
    forward = Passes(L, 1)
    retrace = forward if n_batches > 1 else Passes()  # the shared trace keeps one batch
    after = [layer + 1 for layer in range(L)]  # a skipped or ablated layer's variant resumes
    skip_runs = stacked_runs(after, None, L, chunk)
    skips = Passes(sum(L - 1 - layer for layer in range(L)), L, 0, skip_runs)
    ablations = Passes(L, 0, 0, L) + skips  # the ablated block alone, then as a skip
    swaps = swap_pairs(L, pairs)
    orders = [swapped_order(L, (i, i + 1), (j, j + 1))[i:] for i, j in swaps]
    swapped = Passes(
        sum(L - i for i, _ in swaps),
        len(swaps),
        0,
        stacked_runs([i for i, _ in swaps], orders, L, chunk),
    )
    plan = {
        "contributions": forward + skips + ablations.times(2),
        "skip_effects": Passes(),
        "layer_swaps": retrace + swapped,
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
    chunk: int = 1

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
    device: str = "cpu",
    free: int | None = None,
    kept: str = "float32",
    **plan: Any,
) -> Workload:
    """The :class:`Workload` of a diagnosis; its batches as :meth:`probekit.model.Model.prepare`
    splits them (``batch_size``, else :func:`~probekit.model.inputs.default_batch_size`, the
    gradients' weighing their backward against the blocks' gradient sums in the ``kept``
    dtype of the weights) and the variants one block run stacks on ``device`` (``free``
    bytes there, for an accelerator: :func:`~probekit.model.inputs.variants_per_run`);
    ``plan`` goes to :func:`diagnosis_plan`."""
    width = shapes.vocab if plan.get("vocabulary", True) else shapes.d_model
    batch = batch_size or default_batch_size(seq_len, width, shapes.d_model, shapes.n_layers)
    sums = shapes.n_layers * shapes.block_parameters * DTYPE_BYTES[kept]
    grad = batch_size or default_batch_size(
        seq_len, width, shapes.d_model, shapes.n_layers, True, n_sequences, sums
    )
    batch, grad = min(batch, n_sequences), min(grad, n_sequences)
    chunk = variants_per_run(
        batch * seq_len,
        device.split(":")[0],
        d_model=shapes.d_model,
        d_vocab=shapes.vocab,
        n_layers=shapes.n_layers,
        free=free,
    )
    counts = diagnosis_plan(
        shapes.n_layers,
        math.ceil(n_sequences / batch),
        gradient_batches=math.ceil(n_sequences / grad),
        chunk=chunk,
        **plan,
    )
    return Workload(shapes, n_sequences, seq_len, batch, grad, counts, chunk)


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
    forward = activation_bytes(shapes, work.batch, work.seq_len, backward=False)
    backward = 0
    if work.total.backwards:
        backward = gradient_bytes(work, storage, compute) + activation_bytes(
            shapes, work.gradient_batch, work.seq_len, backward=True
        )
    stacked = stacked_bytes(shapes, work.batch, work.seq_len, work.chunk)
    analyses = forward + max(backward, stacked)
    return BASE_PROCESS_BYTES + weights + max(loading, analyses)


def stacked_bytes(shapes: Shapes, sequences: int, seq_len: int, chunk: int) -> int:
    """Bytes the stacked variants of a batch of ``sequences`` x ``seq_len`` tokens hold
    besides the clean trace: the input and output residual of each of the L variants resumed
    together (a component's skips or sublayer ablations), and one block run of ``chunk`` of
    them (its MLP's hidden layers, attention's projections and scores, in float32)."""
    tokens = sequences * seq_len
    residuals = 2 * shapes.n_layers * tokens * shapes.d_model
    hidden = chunk * tokens * ((3 if shapes.gated else 2) * shapes.d_mlp + 6 * shapes.d_model)
    scores = chunk * sequences * shapes.n_heads * seq_len * seq_len
    return 4 * (residuals + hidden + scores)


@dataclass(frozen=True)
class Timing:
    """Median seconds of one block pass and of one head with its output measures' share
    (``head``) at one batch's tokens on this machine, in the compute dtype; ``stacked``: of
    one block run of ``chunk`` variants stacked (the block pass's time when ``chunk`` is 1).

    A block run costs ``overhead + chunk x per_variant`` (the weights read once per run, the
    arithmetic per variant), the two parts from the two timings."""

    block: float
    head: float
    stacked: float = 0.0
    chunk: int = 1

    @property
    def per_variant(self) -> float:
        """Seconds each variant adds to a block run (the block pass's time when unstacked)."""
        if self.chunk <= 1:
            return self.block
        return min(self.block, max(0.0, (self.stacked - self.block) / (self.chunk - 1)))

    def seconds(self, work: Workload, passes: Passes) -> float:
        """The time ``passes`` take at these timings (a backward twice its forward)."""
        overhead = self.block - self.per_variant
        forward = work.shapes.n_layers * self.block + self.head
        backward = 2 * forward * work.gradient_batch / work.batch
        return (
            passes.block_runs * overhead
            + passes.block_passes * self.per_variant
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
    chunk: int = 1,
) -> Timing:
    """:class:`Timing` of the model ``config`` describes: one block of its real shape with
    random weights (a one-layer copy of the model, built from the config) run on
    ``sequences`` x ``seq_len`` random residuals, and one unembedding product (a
    :data:`HEAD_SLICE`-row slice of the vocabulary, scaled to the whole), medians of
    ``repeats`` after a warm-up, in inference mode on ``device`` (on a CPU: the threads torch
    uses now). Weights kept in a ``storage`` dtype apart from ``compute`` are copied to it on
    each read, as :func:`probekit.model.storage.compute_in` makes them. A head's output
    measures add :data:`MEASURES_PER_HEAD` of its product's time. With ``chunk`` above 1 the
    block is also timed on ``chunk`` times the residuals (a stacked run)."""
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
        stacked = block
        if chunk > 1:
            xs = x.repeat(chunk, 1, 1)
            stacked = _median_seconds(
                lambda: hf(inputs_embeds=xs, use_cache=False), repeats, device
            )
    whole = head * max(shapes.vocab, 1) / rows
    return Timing(block, (1 + MEASURES_PER_HEAD) * whole, stacked, chunk)


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
    "stacked_bytes",
    "stacked_runs",
    "swap_pairs",
    "time_block_and_head",
    "weight_bytes",
    "workload",
]
