"""Benchmark: ``probekit diagnose`` on checkpoints of real size (0.5B to 8B parameters).

Researchers diagnose the checkpoints they have: Qwen2.5 0.5B, Llama 3.2 1B and 3B, Pythia
1B, Llama 3.1 8B. No weights can be downloaded here, so this builds a checkpoint of each one's
real architecture and shapes (:data:`SHAPES`: the fields of its public ``config.json``; the
real vocabulary, tied or untied embeddings as the real model, its rope settings) with random
weights (seeded; normal with std 0.02 as the real init, norms 1, biases 0), saved as the Hub
ships it: safetensors in the real model's dtype, sharded with ``model.safetensors.index.json``
where the real one is (Llama 3.1 8B: 4 shards, Llama 3.2 3B: 2). The tensors are made one at a
time, shard by shard (``safetensors.torch.save_file`` per shard), so building the 8B checkpoint
never holds more than one shard.

Then it runs ``probekit diagnose`` on it in a fresh process (``--random-tokens --n-sequences
4 --seq-len 128``, ``--n-sequences 1`` for 8B; ``--dtype float32 --storage auto --threads 2
--device cpu --no-images`` unless told otherwise: float32 numbers, the weights kept in their
stored bf16 where a float32 copy would not fit) and prints:

- ``uptime`` before and after (the machine may be shared) and the float32 matmul rate on the
  model's own block products (``[tokens, d] x`` each weight of a block, the threads used; the
  median of about 2 s of repeats, measured before the diagnosis, at one batch's tokens and,
  where hook-free variants run stacked, at the rows of a stacked run: the higher is the limit
  no block pass beats);
- the estimate the diagnosis printed first (``probekit: estimate: ...``);
- per analysis: its seconds (the plain progress line each analysis writes when stderr is no
  terminal, :class:`probekit.progress.PlainBar`), its planned block passes, block runs and heads
  (:func:`probekit.model.estimate.diagnosis_plan`, the count ``tests/test_estimate.py``
  checks against a real diagnosis), their FLOPs and the achieved fraction of the matmul rate;
- the child's wall and CPU seconds and peak resident memory (``ru_maxrss`` of that process,
  from ``os.wait4``) against the size of its weights in memory;
- one line ``<shape>: diagnosis N min, peak M GiB (weights W GiB), F% of the matmul limit``,
  the estimate's error, and the goals of issue 36 met or not, with the arithmetic behind.

Usage (from the repository root)::

    python benchmarks/bench_scale.py --shape qwen2.5-0.5b
    python benchmarks/bench_scale.py --shape llama-3.1-8b --out /data/ckpt --keep
    python benchmarks/bench_scale.py --shape llama-3.2-1b --dtype bfloat16
    python benchmarks/bench_scale.py --shape llama-3.2-1b --storage stored
    python benchmarks/bench_scale.py --shape llama-3.2-3b --build-only --out /data/ckpt3b

``--shape tiny-llama`` (2 layers, 2 shards) runs the whole path in seconds (the test's).
``--diagnose-args`` appends flags to the diagnosis (one string, e.g. ``"--batch-size 1"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (benchmarks/common.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import uptime  # noqa: E402

LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_type": "llama3"}

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen2.5-0.5B config.json (one model.safetensors, bf16)
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "max_window_layers": 24,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Llama-3.2-1B config.json (one model.safetensors, bf16)
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "original_max_position_embeddings": 8192,
            **LLAMA3_ROPE,
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Llama-3.2-3B config.json (model-0000{1,2}-of-00002.safetensors, bf16)
    "llama-3.2-3b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 32.0,
            "original_max_position_embeddings": 8192,
            **LLAMA3_ROPE,
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    # EleutherAI/pythia-1b config.json (one model.safetensors, float16 as the Hub ships it)
    "pythia-1b": {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 8,
        "hidden_act": "gelu",
        "max_position_embeddings": 2048,
        "layer_norm_eps": 1e-05,
        "rotary_emb_base": 10000,
        "rotary_pct": 0.25,
        "use_parallel_residual": True,
        "tie_word_embeddings": False,
        "vocab_size": 50304,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "initializer_range": 0.02,
        "torch_dtype": "float16",
    },
    # meta-llama/Llama-3.1-8B config.json (model-0000{1..4}-of-00004.safetensors, bf16)
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            **LLAMA3_ROPE,
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
    # not a real model: two layers and two shards, the whole path in seconds (the test's)
    "tiny-llama": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "vocab_size": 512,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
    },
}
"""Each benchmark shape's config.json fields, as its public config on the Hugging Face Hub
has them (the comment names it)."""

SHARDS = {"llama-3.2-3b": 2, "llama-3.1-8b": 4, "tiny-llama": 2}
"""The shape's safetensors files where the real checkpoint is sharded (else one file)."""

DATA = {"llama-3.1-8b": (1, 128)}
"""(sequences, tokens) of the diagnosis where not 4 x 128."""

GOALS = {
    "qwen2.5-0.5b": (3, None),
    "llama-3.2-1b": (6, None),
    "llama-3.2-3b": (20, None),
    "llama-3.1-8b": (30, 20),
}
"""Issue 36's goals per shape on a 2-core machine, two threads, idle: (minutes, peak GiB or
None); every shape besides at 60% or more of the matmul rate on its own FLOPs."""

RATE_GOAL = 0.6
INIT_STD = 0.02


def parameter_shapes(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """The names and shapes of the checkpoint's tensors, as ``save_pretrained`` writes them
    (a tied unembedding once, as the embedding): the model built on the meta device."""
    import torch
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def initial_value(name: str, shape: tuple[int, ...], dtype: Any, generator: Any) -> Any:
    """One tensor of random weights: norms' scales 1, biases 0, matrices normal with std
    :data:`INIT_STD`, made in row blocks of at most 2**24 values (no float32 copy of a whole
    embedding)."""
    import torch

    out = torch.empty(shape, dtype=dtype)
    if len(shape) == 1:
        return out.fill_(1.0 if "norm" in name or "ln" in name else 0.0)
    rows = max(1, 2**24 // max(1, math.prod(shape[1:])))
    for start in range(0, shape[0], rows):
        stop = min(shape[0], start + rows)
        block = torch.randn((stop - start, *shape[1:]), generator=generator)
        out[start:stop] = block.mul_(INIT_STD)
    return out


def shard_plan(
    tensors: list[tuple[str, tuple[int, ...]]], shards: int, itemsize: int
) -> list[list[tuple[str, tuple[int, ...]]]]:
    """The tensors in order, cut into ``shards`` files of about equal bytes."""
    total = sum(math.prod(shape) * itemsize for _, shape in tensors)
    per, plan, size = total / shards, [[]], 0
    for name, shape in tensors:
        if size >= per and len(plan) < shards:
            plan.append([])
            size = 0
        plan[-1].append((name, shape))
        size += math.prod(shape) * itemsize
    return plan


def build_checkpoint(shape: str, out: Path, seed: int = 0) -> Path:
    """Write the checkpoint of ``shape`` into ``out`` (config.json, safetensors shard by
    shard, the index where sharded); returns ``out``."""
    import torch
    from safetensors.torch import save_file

    config = SHAPES[shape]
    dtype = getattr(torch, config["torch_dtype"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tensors = parameter_shapes(config)
    shards = SHARDS.get(shape, 1)
    generator = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    weight_map, total = {}, 0
    for i, group in enumerate(shard_plan(tensors, shards, itemsize)):
        name = (
            "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        )
        data = {key: initial_value(key, dims, dtype, generator) for key, dims in group}
        save_file(data, str(out / name), metadata={"format": "pt"})
        total += sum(t.numel() * itemsize for t in data.values())
        weight_map.update(dict.fromkeys(data, name))
        del data
    if shards > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out


def is_built(shape: str, folder: Path) -> bool:
    """Whether ``folder`` holds a complete checkpoint of ``shape`` already (a kept one): its
    config is the shape's and every weight file the index (or the single file) names exists."""
    try:
        if json.loads((folder / "config.json").read_text()) != SHAPES[shape]:
            return False
        index = folder / "model.safetensors.index.json"
        if SHARDS.get(shape, 1) == 1:
            return (folder / "model.safetensors").is_file()
        names = set(json.loads(index.read_text())["weight_map"].values())
        return len(names) == SHARDS[shape] and all((folder / n).is_file() for n in names)
    except (OSError, ValueError, KeyError):
        return False


def block_products(shapes: Any) -> list[tuple[int, int]]:
    """The (in, out) shapes of one block's weight products (query, keys and values, output,
    the MLP's gate and up or its one input matrix, and its down matrix)."""
    d, kv, m = shapes.d_model, shapes.kv_dim, shapes.d_mlp
    mlp_in = [(d, m), (d, m)] if shapes.gated else [(d, m)]
    return [(d, d), (d, kv), (d, kv), (d, d), *mlp_in, (m, d)]


def matmul_rate(shapes: Any, tokens: int, threads: int, seconds: float = 2.0) -> float:
    """Median GFLOP/s of ``torch.mm`` over one block's weight products at ``tokens`` rows, on
    ``threads`` threads: the float32 limit a block pass of this model cannot beat."""
    import statistics

    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randn(tokens, a, generator=g), torch.randn(a, b, generator=g))
             for a, b in block_products(shapes)]  # fmt: skip
    flops = sum(2 * tokens * a * b for a, b in block_products(shapes))
    for x, w in pairs:
        torch.mm(x, w)
    rates: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 5:
        start = time.perf_counter()
        for x, w in pairs:
            torch.mm(x, w)
        rates.append(flops / max(time.perf_counter() - start, 1e-9) / 1e9)
    return statistics.median(rates)


PHASE_LINE = re.compile(
    r"^([a-z_]+): [\d,]+/[\d,]+ [a-z ]+?, ([\d,]+) block passes \(([\d.]+) s\)$"
)
"""A plain progress line of one analysis: ``contributions: 9/9 variants, 21 block passes
(0.1 s)``."""


def phase_seconds(stderr: str) -> dict[str, tuple[float, int]]:
    """Per analysis, the seconds and counted block passes of its progress line."""
    out = {}
    for line in stderr.splitlines():
        found = PHASE_LINE.match(line.strip())
        if found:
            out[found.group(1)] = (float(found.group(3)), int(found.group(2).replace(",", "")))
    return out


def run_diagnosis(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``probekit diagnose`` on ``folder`` in a fresh process: its stdout, stderr, wall and
    CPU seconds, exit status and peak resident memory (``ru_maxrss`` of that process)."""
    report = folder.parent / f"{folder.name}-report"
    argv = [
        sys.executable, "-m", "probekit", "diagnose", str(folder), "--out", str(report),
        "--force", "--random-tokens", "--n-sequences", str(args.n_sequences),
        "--seq-len", str(args.seq_len), "--dtype", args.dtype, "--storage", args.storage,
        "--threads", str(args.threads),
        "--device", "cpu", "--no-images", *shlex.split(args.diagnose_args),
    ]  # fmt: skip
    print(f"running: {shlex.join(argv[1:])}", flush=True)
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return {
        "status": child.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak": usage.ru_maxrss * 1024,
        "report": report,
    }


def estimate_line(stderr: str) -> tuple[str, float | None, float | None]:
    """The estimate the diagnosis printed, its minutes and its peak GiB (None: not found)."""
    line = next((x for x in stderr.splitlines() if x.startswith("probekit: estimate:")), "")
    minutes = re.search(r"about ([\d.]+) (min|s)\b", line)
    peak = re.search(r"and ([\d.]+) GiB at the peak", line)
    if minutes is None or peak is None:
        return line, None, None
    scale = 60 if minutes.group(2) == "s" else 1
    return line, float(minutes.group(1)) / scale, float(peak.group(1))


def report(shape: str, args: argparse.Namespace, run: dict[str, Any], rate: float) -> list[str]:
    """The per-analysis table, the one-line result, the estimate's error and the goals."""
    from probekit.cli.common import weight_dtypes
    from probekit.model import estimate as est

    shapes, stored, config = est.read_shapes(args.folder)
    keep = args.storage  # as the diagnosis chose: --storage auto may weigh its whole peak
    if "--storage auto keeps the weights as stored" in run["stderr"]:
        keep = "stored"
    storage, compute = weight_dtypes(stored, args.dtype, keep, config, args.free)
    work = est.workload(shapes, args.n_sequences, args.seq_len, kept=storage)
    weights = est.weight_bytes(shapes, storage, compute) / 2**30
    phases = phase_seconds(run["stderr"])
    lines = [f"{'analysis':18s} {'seconds':>8s} {'block passes':>12s} {'runs':>6s} "
             f"{'heads':>6s} {'TFLOP':>7s} {'of the limit':>12s}"]  # fmt: skip
    for name, passes in work.plan.items():
        seconds, _ = phases.get(name, (float("nan"), 0))
        flops = work.flops(passes)
        # an analysis with no work of its own (skip effects: read from the shared cache
        # that contributions filled) has no rate: said in words, not as nan%
        share = f"{'(shared)':>12s}"
        if seconds > 0 and flops:
            share = f"{flops / seconds / 1e9 / rate:12.0%}"
        lines.append(
            f"{name:18s} {seconds:8.1f} {passes.block_passes:12,d} {passes.block_runs:6,d} "
            f"{passes.heads:6,d} {flops / 1e12:7.3f} {share}"
        )
    flops = work.flops(work.total)
    analyses = sum(s for s, _ in phases.values())
    fraction = flops / max(analyses, 1e-9) / 1e9 / rate
    minutes, peak = run["wall"] / 60, run["peak"] / 2**30
    lines.append(
        f"the analyses {analyses:.1f} s of the process's {run['wall']:.1f} s wall "
        f"({run['cpu']:.1f} CPU s); {flops / 1e12:.2f} TFLOP at the limit take "
        f"{flops / rate / 1e9:.1f} s"
    )
    said, est_minutes, est_peak = estimate_line(run["stderr"])
    if est_minutes is not None and est_peak is not None:
        measured = max(analyses, 1e-9) / 60  # the estimate's time is the analyses'
        errors = (est_minutes / measured - 1, est_peak / peak - 1)
        lines.append(
            f"estimate: {est_minutes:.1f} min of analyses and a peak of {est_peak:.2f} GiB "
            f"against the measured {measured:.1f} min ({errors[0]:+.0%}) and {peak:.2f} GiB "
            f"({errors[1]:+.0%}); within 30%: {'yes' if max(map(abs, errors)) <= 0.3 else 'no'}"
        )
    lines.append(
        f"{shape}: diagnosis {minutes:.1f} min, peak {peak:.2f} GiB (weights {weights:.2f} GiB), "
        f"{fraction:.0%} of the matmul limit"
    )
    measures = None
    if shape in GOALS and minutes > GOALS[shape][0]:  # the time the arithmetic leaves out
        measures = work.total.heads * measures_seconds(shapes, work.batch, args.seq_len)
    lines += goal_lines(shape, minutes, peak, fraction, flops, rate, measures)
    return lines


def measures_seconds(shapes: Any, sequences: int, seq_len: int) -> float:
    """Median seconds of the output measures of one head's logits (every measure of
    :func:`probekit.analyses.common.output_change` over the vocabulary, against a clean side
    made once) at ``sequences`` x ``seq_len`` tokens: work on every head that is no matrix
    product, so the matmul limit does not count it."""
    import statistics

    import torch

    from probekit.analyses.common import clean_side, output_change

    g = torch.Generator().manual_seed(0)
    clean = torch.randn(sequences, seq_len, shapes.vocab, generator=g)
    changed = clean + 0.1 * torch.randn(clean.shape, generator=g)
    labels = torch.randint(0, shapes.vocab, (sequences, seq_len), generator=g)
    side = clean_side(clean, labels)
    output_change(side, changed, labels)  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        output_change(side, changed, labels)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def goal_lines(
    shape: str,
    minutes: float,
    peak: float,
    fraction: float,
    flops: float,
    rate: float,
    measures: float | None = None,
) -> list[str]:
    """Issue 36's goals for ``shape``, each met or not with the arithmetic behind it (and,
    ``measures`` seconds given, the heads' output measures beside it)."""
    if shape not in GOALS:
        return []
    limit, memory = GOALS[shape]
    floor = flops / rate / 1e9 / 60
    beside = ""
    if measures is not None:
        total = floor + measures / 60
        beside = (
            f"; the output measures over the vocabulary on every head, timed here, add "
            f"{measures / 60:.1f} min: {total:.1f} min, {total / limit:.0%} of the goal"
        )
    out = [
        f"goal: <= {limit} min: {'met' if minutes <= limit else 'not met'} ({minutes:.1f} min;"
        f" the arithmetic alone at the measured matmul rate {rate:.0f} GFLOP/s takes "
        f"{floor:.1f} min, {floor / limit:.0%} of the goal{beside})",
        f"goal: >= {RATE_GOAL:.0%} of the matmul limit: "
        f"{'met' if fraction >= RATE_GOAL else 'not met'} ({fraction:.0%})",
    ]
    if memory is not None:
        out.append(
            f"goal: peak <= {memory} GiB: {'met' if peak <= memory else 'not met'} ({peak:.2f} GiB)"
        )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(SHAPES), required=True)
    p.add_argument("--out", type=Path, help="folder for the checkpoint (default: a temporary one)")
    p.add_argument("--n-sequences", type=int, help="sequences (default 4; 1 for llama-3.1-8b)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 128)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoint and the report")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", help="the diagnosis's --dtype (default float32)")
    p.add_argument(
        "--storage",
        choices=["auto", "stored", "dtype"],
        default="auto",
        help="the diagnosis's --storage (default auto: the weights kept as stored when their "
        "--dtype copy would not fit)",
    )
    p.add_argument("--diagnose-args", default="", help="more flags for probekit diagnose")
    p.add_argument("--build-only", action="store_true", help="build the checkpoint, no diagnosis")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument(
        "--stacking",
        action="store_true",
        help="build nothing: time one block of the shape at one batch's tokens, alone and "
        "with 2-16 variants stacked, its weights in float32 and kept in bf16",
    )
    args = p.parse_args(argv)
    sequences, tokens = DATA.get(args.shape, (4, 128))
    args.n_sequences = args.n_sequences or sequences
    args.seq_len = args.seq_len or tokens
    return args


def stacking(args: argparse.Namespace) -> list[str]:
    """One block of ``args.shape`` (a one-layer copy from its config, random weights) timed
    on one batch's tokens alone and with 2, 4, 8 and 16 variants stacked along the batch
    (:func:`probekit.model.estimate.time_block_and_head`, medians of 3 after a warm-up), its
    weights in float32 and kept in bf16 (each copied to float32 as it is read): per stacked
    count, the time of one run and per variant per batch."""
    import torch

    from probekit.model import estimate as est

    torch.set_num_threads(args.threads)
    config = SHAPES[args.shape]
    shapes = est.Shapes.from_config(config)
    batch = est.workload(shapes, args.n_sequences, args.seq_len).batch
    lines = [f"{args.shape}: one block at {batch} x {args.seq_len} tokens, {args.threads} "
             f"thread(s); per stacked count: one run / per variant"]  # fmt: skip
    for storage in ("float32", "bfloat16"):
        cells = []
        for chunk in (1, 2, 4, 8, 16):
            timing = est.time_block_and_head(
                config, batch, args.seq_len, "float32", storage=storage, chunk=chunk
            )
            cells.append(
                f"{chunk}: {timing.stacked * 1e3:.0f} / {timing.stacked / chunk * 1e3:.0f} ms"
            )
        lines.append(f"weights in {storage}: " + ", ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stacking:
        print(f"before: {uptime()}", flush=True)
        for line in stacking(args):
            print(line, flush=True)
        print(f"after:  {uptime()}")
        return 0
    temporary = args.out is None
    base = Path(tempfile.mkdtemp(prefix="bench-scale-")) if temporary else args.out
    args.folder = base / args.shape
    try:
        print(f"before: {uptime()}", flush=True)
        start = time.perf_counter()
        if is_built(args.shape, args.folder):
            print(f"reusing the checkpoint in {args.folder} (its config is the shape's)")
        else:
            build_checkpoint(args.shape, args.folder, args.seed)
        files = sorted(p.name for p in args.folder.iterdir())
        size = sum(p.stat().st_size for p in args.folder.iterdir()) / 2**30
        print(f"built {args.folder} in {time.perf_counter() - start:.1f} s: {size:.2f} GiB, "
              f"{', '.join(files)}", flush=True)  # fmt: skip
        if args.build_only:
            return 0
        from probekit.model import estimate as est

        shapes, _, _ = est.read_shapes(args.folder)
        work = est.workload(shapes, args.n_sequences, args.seq_len)
        seconds = 0.2 if args.shape.startswith("tiny") else 2.0  # the test's shape: quick
        rate = 0.0
        for rows in sorted({work.batch * args.seq_len, work.chunk * work.batch * args.seq_len}):
            at = matmul_rate(shapes, rows, args.threads, seconds)
            print(f"float32 matmul rate on the block's products at {rows} rows, "
                  f"{args.threads} thread(s): {at:.1f} GFLOP/s", flush=True)  # fmt: skip
            rate = max(rate, at)  # the limit: the higher (stacked runs take more rows)
        from probekit.numerics import available_memory

        args.free = available_memory("cpu")  # what the diagnosis's --storage auto sees
        run = run_diagnosis(args.folder, args)
        said, _, _ = estimate_line(run["stderr"])
        print(said or "no estimate printed")
        if run["status"] != 0:
            print(run["stderr"][-3000:])
            print(f"{args.shape}: the diagnosis failed (exit status {run['status']})")
            return 1
        for line in report(args.shape, args, run, rate):
            print(line, flush=True)
        print(f"after:  {uptime()}")
        return 0
    finally:
        if not args.keep:  # only what this benchmark wrote
            shutil.rmtree(args.folder, ignore_errors=True)
            shutil.rmtree(args.folder.parent / f"{args.folder.name}-report", ignore_errors=True)
            if temporary:
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
