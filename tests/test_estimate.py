"""The estimate of a diagnosis (probekit.model.estimate and ``probekit diagnose --estimate``):
its plan is what a real diagnosis runs, its FLOPs and bytes are the model's, ``--estimate``
loads no weights, and a diagnosis that would not fit in memory is refused before loading."""

from __future__ import annotations

import collections
import json

import pytest
import torch

from probekit import report
from probekit.model import estimate as est
from probekit.model import storage
from probekit.model.inputs import stacked_variants
from probekit.toy import toy_hf_model, toy_model, toy_tokens


def _counted_diagnosis(monkeypatch, model, data, **settings) -> dict[str, est.Passes]:
    """Per analysis, the block passes, heads and backwards a real diagnosis runs: every block
    a trace resumes (``Trace.run_module``), every full forward (L blocks and the model's own
    head), every head applied to a residual (``OutputHead.__call__``), every backward."""
    from probekit.model import output, runtime, trace

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    current = ["-"]
    n_layers = model.n_layers

    def wrap(owner, name, count):
        original = getattr(owner, name)

        def counted(*args, **kwargs):
            count(*args)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    def blocks(self, module, call, residuals):
        counts[current[0]]["blocks"] += len(residuals)
        counts[current[0]]["runs"] += 1

    def forward(self, *args):
        counts[current[0]]["blocks"] += n_layers
        counts[current[0]]["runs"] += n_layers
        counts[current[0]]["heads"] += 1

    wrap(trace.Trace, "run_module", blocks)
    wrap(runtime.Runtime, "forward", forward)
    wrap(output.OutputHead, "__call__", lambda *a: counts[current[0]].update(["heads"]))
    wrap(torch.Tensor, "backward", lambda *a: counts[current[0]].update(["backwards"]))
    run_analyses = report.run_analyses

    def each_counted(steps, progress):
        def named(name, call):
            def run():
                current[0] = name
                try:
                    return call()
                finally:
                    current[0] = "-"

            return run

        return run_analyses({name: named(name, call) for name, call in steps.items()}, progress)

    monkeypatch.setattr(report, "run_analyses", each_counted)
    report.diagnose(model, data, n_bootstrap=2, **settings)
    assert "-" not in counts, counts["-"]  # nothing ran outside an analysis
    return {
        name: est.Passes(c["blocks"], c["heads"], c["backwards"], c["runs"])
        for name, c in counts.items()
    }


def _planned(n_layers: int, n_batches: int, **settings) -> dict[str, est.Passes]:
    plan = est.diagnosis_plan(n_layers, n_batches, **settings)
    return {name: passes for name, passes in plan.items() if passes != est.Passes()}


@pytest.mark.parametrize(
    "arch, n_layers, batch_size, settings",
    [
        ("llama", 3, None, {}),
        ("gpt2", 2, None, {"pairs": "all", "token_lens": True}),
        ("llama", 2, 2, {"similarity": False}),
        ("gpt2", 3, 2, {"pairs": "all", "token_lens": True}),
    ],
)
def test_the_plan_is_what_a_diagnosis_runs(monkeypatch, arch, n_layers, batch_size, settings):
    model = toy_model(arch, n_layers=n_layers)
    counted = _counted_diagnosis(
        monkeypatch, model, toy_tokens(4, 8), batch_size=batch_size, **settings
    )
    n_batches = 1 if batch_size is None else 4 // batch_size
    chunk = stacked_variants(8 * (batch_size or 4))  # the variants a CPU block run stacks
    assert counted == _planned(n_layers, n_batches, chunk=chunk, **settings)


def test_one_variant_per_run_plans_one_run_per_block_pass(monkeypatch):
    """``variants_per_pass=1`` runs every block pass alone: as many runs as passes."""
    model = toy_model("llama", n_layers=3)
    counted = _counted_diagnosis(monkeypatch, model, toy_tokens(4, 8), variants_per_pass=1)
    assert counted == _planned(3, 1)
    assert all(p.block_runs == p.block_passes for p in counted.values())


def test_the_workload_splits_the_data_as_the_model_does():
    model = toy_model("gpt2", n_layers=2, vocab_size=50257)
    shapes = est.Shapes.from_config(model.hf_model.config.to_dict())
    work = est.workload(shapes, n_sequences=5, seq_len=128)
    assert work.batch == model.default_batch_size(128) == 2
    assert work.gradient_batch == model.default_batch_size(128, backward=True)
    assert work.plan == est.diagnosis_plan(2, n_batches=3, gradient_batches=5)
    assert est.workload(shapes, 5, 128, batch_size=5).plan == est.diagnosis_plan(2, 1)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_shapes_count_the_models_weights(arch):
    hf = toy_hf_model(arch, n_layers=3)
    shapes = est.Shapes.from_config(hf.config.to_dict())
    positions = "transformer.wpe.weight"  # GPT-2's learned positions: no block's weight
    matrices = sum(p.numel() for n, p in hf.named_parameters() if p.ndim == 2 and n != positions)
    embeddings = shapes.vocab * shapes.d_model * (1 if shapes.tied else 2)
    assert shapes.n_layers * shapes.block_parameters + embeddings == matrices


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_block_and_head_flops_are_the_ones_torch_counts(arch):
    from torch.utils.flop_counter import FlopCounterMode

    hf = toy_hf_model(arch, n_layers=1)
    shapes = est.Shapes.from_config(hf.config.to_dict())
    x = torch.randn(2, 8, shapes.d_model)
    base = hf.base_model
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        base(inputs_embeds=x, use_cache=False)
    assert counter.get_total_flops() == pytest.approx(est.block_flops(shapes, 2, 8), rel=0.02)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hf.lm_head(x)
    assert counter.get_total_flops() == est.head_flops(shapes, 2, 8)


def test_weight_bytes_keep_the_stored_dtype_with_one_block_computed_apart():
    config = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 100, "hidden_act": "silu"}  # fmt: skip
    shapes = est.Shapes.from_config(config, parameters=10_000)
    assert est.weight_bytes(shapes, "float32", "float32") == 40_000
    assert est.weight_bytes(shapes, "bfloat16", "bfloat16") == 20_000
    assert shapes.block_parameters == 4 * 64 * 64 + 3 * 64 * 128
    assert shapes.largest == 64 * 128  # the MLP's, larger than the 100-token unembedding
    block = shapes.block_parameters  # one block's weights computed at a time
    assert est.weight_bytes(shapes, "bfloat16", "float32") == 20_000 + 4 * block
    wide = est.Shapes.from_config({**config, "vocab_size": 10**6}, parameters=10_000)
    slice_ = storage.UNEMBED_SLICE * 64  # the unembedding in slices, larger than a block here
    assert est.weight_bytes(wide, "bfloat16", "float32") == 20_000 + 4 * slice_


def test_the_peak_counts_the_load_or_the_work_with_one_weights_gradient():
    shapes = est.Shapes.from_config(toy_hf_model("llama").config.to_dict(), parameters=10**9)
    work = est.workload(shapes, 4, 16)
    assert work.gradient_batches == 1
    forward = est.activation_bytes(shapes, 4, 16, backward=False)
    backward = est.activation_bytes(shapes, 4, 16, backward=True)
    largest = shapes.largest_block_weight  # one batch: one weight's gradient at a time
    base = est.BASE_PROCESS_BYTES
    stacked = est.stacked_bytes(shapes, 4, 16, work.chunk)  # the variants resumed together
    as_stored = est.peak_bytes(work, "bfloat16", "bfloat16", "bfloat16")
    assert as_stored == base + 2 * 10**9 + forward + max(backward + 2 * largest, stacked)
    converted = est.peak_bytes(work, "float32", "float32", "bfloat16")  # the load's copy
    assert converted == base + 4 * 10**9 + 2 * 10**9
    kept = est.peak_bytes(work, "bfloat16", "float32", "bfloat16")  # float32, then its bf16
    weights = est.weight_bytes(shapes, "bfloat16", "float32")
    assert kept == base + weights + forward + max(backward + (4 + 2) * largest, stacked)
    headless = est.workload(shapes, 4, 16, vocabulary=False)  # no backward: no gradients
    assert est.peak_bytes(headless, "bfloat16", "bfloat16", "bfloat16") == (
        base + 2 * 10**9 + est.activation_bytes(shapes, 4, 16, backward=False) + stacked
    )


def test_several_gradient_batches_hold_every_blocks_gradients():
    shapes = est.Shapes.from_config(toy_hf_model("llama").config.to_dict(), parameters=10**9)
    work = est.workload(shapes, 4, 16, batch_size=1)
    assert work.gradient_batches == 4
    every = shapes.n_layers * shapes.block_parameters
    assert est.gradient_bytes(work, "bfloat16", "float32") == 2 * every  # summed in bf16
    assert est.gradient_bytes(work, "float32", "float32") == 4 * every
    forward = est.activation_bytes(shapes, 1, 16, backward=False)
    backward = est.activation_bytes(shapes, 1, 16, backward=True)
    weights = est.weight_bytes(shapes, "bfloat16", "float32")
    stacked = est.stacked_bytes(shapes, 1, 16, work.chunk)
    assert est.peak_bytes(work, "bfloat16", "float32", "bfloat16") == (
        est.BASE_PROCESS_BYTES + weights + forward + max(backward + 2 * every, stacked)
    )


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_largest_block_weight_bounds_every_blocks_weights(arch):
    hf = toy_hf_model(arch, n_layers=2)
    shapes = est.Shapes.from_config(hf.config.to_dict())
    block = max(p.numel() for n, p in hf.named_parameters() if ".0." in n and p.ndim == 2)
    assert block == shapes.largest_block_weight  # the MLP's


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("estimate") / "llama"
    toy_hf_model("llama", n_layers=2).to(torch.bfloat16).save_pretrained(folder)
    return folder


def _no_load(monkeypatch):
    import probekit.model.loading
    import probekit.sources

    def refused(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(probekit.model.loading, "load", refused)
    monkeypatch.setattr(probekit.sources, "resolve", refused)


def test_estimate_prints_the_plan_and_loads_no_weights(checkpoint, tmp_path, monkeypatch, capsys):
    from probekit.cli import main

    _no_load(monkeypatch)
    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "r"), "--random-tokens"]
    assert main([*argv, "--n-sequences", "4", "--seq-len", "8", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert "stored in bfloat16, kept in bfloat16, computed in bfloat16" in out
    plan = est.diagnosis_plan(2, 1)
    passes = sum(p.block_passes for p in plan.values())
    assert f"{passes} block passes" in out and "one block pass" in out
    assert "expected peak" in out and not (tmp_path / "r").exists()
    assert main([*argv, "--estimate", "--dtype", "float32"]) == 0
    assert "kept in float32, computed in float32" in capsys.readouterr().out


def test_a_diagnosis_that_would_not_fit_is_refused_before_loading(
    checkpoint, tmp_path, monkeypatch, capsys
):
    import probekit.numerics
    from probekit.cli import main

    _no_load(monkeypatch)
    monkeypatch.setattr(probekit.numerics, "available_memory", lambda device="cpu": 2**28)
    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "r"), "--random-tokens"]
    assert main([*argv, "--dtype", "float32", "--no-images"]) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "GiB are free" in err
    assert "--dtype bfloat16" in err and "a machine with more memory" in err
    assert main([*argv, "--estimate"]) == 0  # the estimate says so too, and exits 0
    assert "does not fit in the free memory" in capsys.readouterr().out


def test_auto_storage_keeps_the_weights_as_stored_when_only_that_peak_fits(
    checkpoint, tmp_path, monkeypatch, capsys
):
    """--storage auto weighs the whole peak, not the weights alone: a float32 copy whose
    weights fit but whose diagnosis would not is kept in bf16 (float32 numbers)."""
    import probekit.numerics
    from probekit.cli import main
    from probekit.cli.common import estimate_diagnosis

    settings = dict(n_sequences=4, seq_len=8, dtype="float32", timed=False)
    copied = estimate_diagnosis(str(checkpoint), keep="dtype", **settings)
    kept = estimate_diagnosis(str(checkpoint), keep="stored", **settings)
    assert kept.peak < copied.peak
    free = (kept.peak + copied.peak) // 2
    monkeypatch.setattr(probekit.numerics, "available_memory", lambda device="cpu": free)
    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "r"), "--random-tokens"]
    argv += ["--n-sequences", "4", "--seq-len", "8", "--dtype", "float32", "--estimate"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "--storage auto keeps the weights as stored" in err
    assert "kept in bfloat16, computed in float32" in out and "does not fit" not in out
    assert main([*argv, "--storage", "dtype"]) == 0  # asked for a float32 copy: refused
    assert "does not fit in the free memory" in capsys.readouterr().out


def test_when_the_weights_fit_fewer_tokens_per_batch_are_the_remedy(checkpoint, monkeypatch):
    import probekit.numerics
    from probekit.cli.common import estimate_diagnosis

    settings = dict(n_sequences=64, seq_len=64, batch_size=64, timed=False)
    roomy = estimate_diagnosis(str(checkpoint), **settings)
    weights = est.weight_bytes(est.read_shapes(checkpoint)[0], "bfloat16", "bfloat16")
    tight = est.BASE_PROCESS_BYTES + weights + 2**20
    assert roomy.fits and roomy.peak > tight
    monkeypatch.setattr(probekit.numerics, "available_memory", lambda device="cpu": tight)
    found = estimate_diagnosis(str(checkpoint), **settings)
    assert not found.fits and found.remedies[0].startswith("--batch-size 1")


def test_the_estimate_reads_a_sharded_checkpoint(tmp_path):
    from benchmarks import bench_scale

    folder = bench_scale.build_checkpoint("tiny-llama", tmp_path / "tiny")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    shapes, stored, _ = est.read_shapes(folder)
    config = bench_scale.SHAPES["tiny-llama"]
    assert stored == "bfloat16" and shapes.n_layers == 2 and not shapes.tied
    matrices = shapes.n_layers * shapes.block_parameters + 2 * shapes.vocab * shapes.d_model
    norms = (2 * shapes.n_layers + 1) * shapes.d_model
    assert shapes.parameters == matrices + norms == index["metadata"]["total_size"] // 2
    assert config["num_key_value_heads"] * 16 == shapes.kv_dim


def test_a_diagnosis_of_more_than_seconds_says_its_estimate_first(
    checkpoint, tmp_path, monkeypatch, capsys
):
    from probekit.cli import common, main

    argv = ["diagnose", str(checkpoint), "--out", str(tmp_path / "r"), "--random-tokens"]
    argv += ["--n-sequences", "2", "--seq-len", "8", "--bootstrap", "2", "--no-images"]
    assert main(argv) == 0
    assert "estimate" not in capsys.readouterr().err  # seconds of work: no line
    monkeypatch.setattr(common, "TIMED_FLOPS", 0.0)
    assert main([*argv, "--force"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("probekit: estimate: about ") and "at the peak" in err[0]
    assert err[1].startswith("contributions: ")


def test_the_weights_are_kept_as_the_load_keeps_them():
    from benchmarks.bench_scale import SHAPES
    from probekit.cli.common import weight_dtypes

    assert weight_dtypes("bfloat16", "stored") == ("bfloat16", "bfloat16")
    assert weight_dtypes("bfloat16", "float32") == ("float32", "float32")
    assert weight_dtypes("bfloat16", "stored", "stored") == ("bfloat16", "float32")
    assert weight_dtypes("float16", "float32", "stored") == ("float16", "float32")
    assert weight_dtypes("float32", "float32", "stored") == ("float32", "float32")
    config = SHAPES["llama-3.1-8b"]  # 32 GB in float32, 16 GB in bf16
    assert weight_dtypes("bfloat16", "float32", "auto", config, 20 * 2**30)[0] == "bfloat16"
    assert weight_dtypes("bfloat16", "float32", "auto", config, 64 * 2**30)[0] == "float32"
    assert weight_dtypes("bfloat16", "float32", "auto", config, 10 * 2**30)[0] == "float32"


@pytest.mark.parametrize("storage", [None, "bfloat16"])
def test_one_block_and_one_head_are_timed_as_the_weights_are_kept(storage):
    config = toy_hf_model("llama").config.to_dict()
    timing = est.time_block_and_head(config, 2, 8, "float32", repeats=1, storage=storage)
    assert timing.block > 0 and timing.head > 0
    work = est.workload(est.Shapes.from_config(config), 2, 8)
    seconds = timing.seconds(work, work.plan["contributions"])
    passes = work.plan["contributions"]
    assert seconds == pytest.approx(passes.block_passes * timing.block + passes.heads * timing.head)


def test_a_stacked_run_reads_its_weights_once_and_adds_arithmetic_per_variant():
    config = toy_hf_model("llama").config.to_dict()
    timing = est.time_block_and_head(config, 2, 8, "float32", repeats=1, chunk=4)
    assert timing.chunk == 4 and timing.stacked > 0 and 0 <= timing.per_variant <= timing.block
    made = est.Timing(block=1.0, head=0.0, stacked=3.0, chunk=5)  # 0.5 + 5 x 0.5
    assert made.per_variant == 0.5
    work = est.workload(est.Shapes.from_config(config), 2, 8)
    assert made.seconds(work, est.Passes(10, 0, 0, 4)) == pytest.approx(4 * 0.5 + 10 * 0.5)


def test_stacked_runs_group_as_the_trace_does():
    """Three variants resumed at 1, 2 and 3 of four layers, two per run: one run at
    position 1, one at 2 (two variants), two at 3 (three variants)."""
    assert est.stacked_runs([1, 2, 3], None, 4, chunk=2) == 4
    # a swap of layers 0 and 1 runs block 1 then 0: alone at positions 0 and 1
    assert est.stacked_runs([0, 1], [[1, 0, 2], [1, 2]], 3, chunk=2) == 1 + 2 + 1


def test_compare_estimates_each_checkpoint_and_loads_none(
    checkpoint, tmp_path, monkeypatch, capsys
):
    import shutil

    import probekit.compare
    from probekit.cli import main

    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    monkeypatch.setattr(probekit.compare, "compare_checkpoints", _refused)
    argv = ["compare", str(checkpoint), str(other), "--out", str(tmp_path / "c"), "--estimate"]
    assert main([*argv, "--random-tokens", "--n-sequences", "2", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    assert "estimate: llama: plan:" in out and "estimate: other: plan:" in out
    assert "2 of 2 checkpoints" in out and not (tmp_path / "c").exists()


def _refused(*args, **kwargs):
    raise AssertionError("a checkpoint was diagnosed")


@pytest.mark.parametrize(
    "arch, n_layers, batch_size, settings",
    [("llama", 3, None, {}), ("gpt2", 2, 2, {"pairs": "all", "token_lens": True})],
)
def test_the_progress_lines_count_the_planned_block_passes(
    monkeypatch, arch, n_layers, batch_size, settings
):
    """Each analysis's progress line counts the block passes the plan says, the clean trace's
    once (``benchmarks/bench_scale.py`` reads these counts from the lines)."""
    from contextlib import contextmanager

    done: dict[str, int] = {}
    shown = report.phase

    @contextmanager
    def keeping(name, **kwargs):
        with shown(name, **kwargs) as line:
            yield line
        done[name] = line.done

    monkeypatch.setattr(report, "phase", keeping)
    model = toy_model(arch, n_layers=n_layers)
    report.diagnose(model, toy_tokens(4, 8), n_bootstrap=2, batch_size=batch_size, **settings)
    n_batches = 1 if batch_size is None else 4 // batch_size
    plan = est.diagnosis_plan(n_layers, n_batches, **settings)
    assert done == {name: passes.block_passes for name, passes in plan.items()}
