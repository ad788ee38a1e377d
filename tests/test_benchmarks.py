"""The side-by-side benchmark at a tiny size: every way runs and gives probekit's numbers."""

from __future__ import annotations

import json
import math
import re

import pytest


def test_peers_agree_at_tiny_size(capsys):
    from benchmarks import bench_peers

    code = bench_peers.main(
        ["--model", "tiny", "--ways", "probekit,hf,tl", "--no-memory", "--no-warmup"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    # 3 layers: 36 contribution numbers, 6 skip effects, 2 swaps, the same keys in every way
    assert out.count("44 numbers") == 3 and "(0 unmatched)" in out
    pattern = r"probekit vs the fastest peer: (\d+\.\d\d)x \(max \|difference\| (\S+)\)"
    final = re.search(pattern, out)
    assert final and float(final.group(2)) <= 1e-5
    assert "of the limit" in out and "arithmetic needed" in out


def test_peers_hf_way_sees_an_ablation():
    """The plain-hooks way measures a change: a broken hook would give zeros everywhere."""
    from benchmarks import bench_peers

    spec = bench_peers.spec_of(bench_peers.parse_args(["--model", "tiny"]))
    numbers = bench_peers.setup(spec, ["hf"])["hf"]()
    assert all(numbers[f"contrib/{c}/0/kl"] > 0 for c in ("layer", "attn", "mlp"))
    assert numbers["skip/0/2"] > 0


def test_peers_rejects_an_unknown_way():
    from benchmarks import bench_peers

    with pytest.raises(SystemExit):
        bench_peers.parse_args(["--ways", "probekit,transformerlens"])


def test_diagnosis_arithmetic_counts_resumed_passes():
    from benchmarks.machine import diagnosis_flops, passes_of_each_way

    work = diagnosis_flops(layers=24, d=256, batch=8, seq=64, vocab=512)
    assert work.block_passes == 1199 and work.heads == 96
    assert work.block_flops == pytest.approx(0.839e9, rel=1e-3)
    # 3 layers by hand: probekit 3 clean + 3 skips + 12 ablations + 5 swaps; one forward per
    # variant 3 + 6 + 18 + 6 (a skipped block not run); the bridge loop 15 full forwards
    ways = passes_of_each_way(3)
    assert ways == {"probekit": (23, 12), "hf": (33, 12), "nnsight": (33, 12), "tl": (45, 15)}


def test_the_ceiling_times_probekit_at_its_own_block_and_the_peers_at_hugging_faces():
    from benchmarks.machine import BlockTimes, ceiling_line, parts_line

    times = BlockTimes(hf=2.0, probekit=1.0, head=0.0, products=0.5, gelu=0.25)
    line = ceiling_line(3, times)  # 3 layers: probekit 23 passes, the peers 33 and 45
    assert "probekit 23 passes + 12 heads = 23.0 s" in line
    assert "hf 33 passes + 12 heads = 66.0 s (2.87x)" in line
    # products at the limit 0.5 s of a 1 s pass whose GELU and rest take 0.25 s each
    assert "reaches at most 50% of it" in parts_line(times, block_flops=0.5e9, rate=1.0)


def test_the_parts_count_every_head_and_measure_and_put_the_functions_back(capsys):
    from benchmarks import bench_peers
    from probekit.model.handle import Model

    head = Model.head
    assert bench_peers.main(["--model", "tiny", "--parts"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "in parts" in x)
    # 3 layers, one batch: 3 skips + 6 sublayer ablations + 2 swaps, each one head and measure
    assert "(11 calls), output measures" in line and "clean traces" in line
    assert "output measures" in line and line.count("(11 calls)") == 2
    assert Model.head is head


def test_the_gpt2_diagnosis_benchmark_times_each_analysis():
    from types import SimpleNamespace

    from benchmarks import bench_diagnose_gpt2

    args = SimpleNamespace(layers=1, batch=1, seq=8, device="cpu", bootstrap=0, batch_size=None)
    out = bench_diagnose_gpt2.run_diagnose(args)
    assert out["mode"] == "diagnose" and out["seconds"] > 0
    assert {"contributions", "skip_effects"} <= set(out["per_analysis_s"])
    from probekit import report

    assert report.run_analyses.__name__ == "run_analyses"  # put back


def test_bench_load_reads_the_demo_phase_lines_with_or_without_escapes():
    from benchmarks import bench_load

    stderr = (
        "probekit demo: training the two models as one stack (300 steps each); step\n"
        "\x1b[2K\rprobekit demo: training (14.0 s)\n"
        "probekit demo: anchor_inferential: probes (2.5 s)\r\n"
        "probekit demo: anchor_symmetric: probes (4.5 s)\n"
    )
    assert bench_load.phase_times(stderr) == {"training": 14.0, "probes": 7.0}


def test_bench_load_gives_the_demo_no_wait_policy_of_its_own(monkeypatch):
    from benchmarks import bench_load

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # what benchmarks.common sets
    assert "OMP_WAIT_POLICY" not in bench_load.demo_environment(None)
    assert bench_load.demo_environment("ACTIVE")["OMP_WAIT_POLICY"] == "ACTIVE"
    assert bench_load.LAUNCHES["torch-first"][1].startswith("import torch;")


# --- real-size checkpoints (bench_scale) ---


def test_bench_scale_builds_a_sharded_checkpoint_and_diagnoses_it(tmp_path, capsys):
    """The whole path at the tiny shape: two shards and their index, a diagnosis in a fresh
    process, per analysis its seconds and planned passes, the one-line result."""
    from benchmarks import bench_scale

    argv = ["--shape", "tiny-llama", "--out", str(tmp_path), "--keep"]
    assert bench_scale.main([*argv, "--n-sequences", "2", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    shards = sorted(p.name for p in (tmp_path / "tiny-llama").glob("*.safetensors"))
    assert shards == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    assert (tmp_path / "tiny-llama" / "model.safetensors.index.json").is_file()
    table = {line.split()[0]: line.split() for line in out.splitlines() if line}
    contributions, swaps = table["contributions"], table["layer_swaps"]
    assert contributions[2] == contributions[3] == "9"  # passes, runs (2 layers: none shared)
    assert swaps[4] == "1"  # heads
    assert re.search(r"tiny-llama: diagnosis [\d.]+ min, peak [\d.]+ GiB \(weights 0.00 GiB\)", out)
    assert bench_scale.main([*argv, "--build-only"]) == 0  # a kept checkpoint is reused
    assert "reusing the checkpoint" in capsys.readouterr().out


def test_bench_scale_times_one_block_alone_and_stacked(capsys):
    from benchmarks import bench_scale

    assert bench_scale.main(["--shape", "tiny-llama", "--stacking", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    for storage in ("float32", "bfloat16"):
        line = next(x for x in out.splitlines() if x.startswith(f"weights in {storage}: "))
        assert re.findall(r"(\d+): \d+ / \d+ ms", line) == ["1", "2", "4", "8", "16"]


def test_bench_scale_shapes_are_the_real_models():
    from benchmarks import bench_scale
    from probekit.model import estimate as est

    sizes = {  # parameters of the published checkpoints, rounded to 10M
        "qwen2.5-0.5b": 0.49e9,
        "llama-3.2-1b": 1.24e9,
        "llama-3.2-3b": 3.21e9,
        "pythia-1b": 1.01e9,
        "llama-3.1-8b": 8.03e9,
    }
    for shape, size in sizes.items():
        tensors = bench_scale.parameter_shapes(bench_scale.SHAPES[shape])
        total = sum(math.prod(dims) for _, dims in tensors)
        assert abs(total - size) < 0.01e9, (shape, total)
        shapes = est.Shapes.from_config(bench_scale.SHAPES[shape], parameters=total)
        assert shapes.tied == (shape not in ("pythia-1b", "llama-3.1-8b"))


def test_report_drift_finds_the_value_that_moved(tmp_path, capsys):
    """Two report folders alike but for one table value: the drift names that value."""
    from benchmarks import report_drift

    for name, share in (("a", 0.25), ("b", 0.26)):
        folder = tmp_path / name
        folder.mkdir()
        headline = {"second_half_share": share, "skippable_layers": [0]}
        summary = {"model": "toy", "verdict": ["v"], "headline": headline}
        (folder / "summary.json").write_text(json.dumps(summary))
        (folder / "contributions.csv").write_text(
            f"layer,component,measure,value\n0,layer,kl,1.0\n1,layer,kl,{4 * share}\n"
        )
    assert report_drift.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"second_half_share\s+0.25\s+0.26\s+\+0.01", out)
    assert re.search(r"contributions\s+2\s+4.00e-02\s+value \(layer 1, component layer", out)
    assert "verdict sentences the same: True" in out


def test_bench_scale_says_what_the_arithmetic_leaves_out_of_a_missed_time_goal():
    from benchmarks import bench_scale
    from probekit.model import estimate as est

    shapes = est.Shapes.from_config(bench_scale.SHAPES["tiny-llama"])
    assert bench_scale.measures_seconds(shapes, 1, 8) > 0
    [time_goal, _] = bench_scale.goal_lines("qwen2.5-0.5b", 3.6, 5.0, 0.66, 38.9e12, 288, 60.0)
    assert "not met (3.6 min; the arithmetic alone" in time_goal
    assert "timed here, add 1.0 min: 3.3 min, 108% of the goal" in time_goal
