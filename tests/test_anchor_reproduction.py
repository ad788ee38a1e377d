"""The CPU reproductions of docs/results.md: large init -> symmetric, small init -> inferential.

Slow: ``pytest -m slow tests/test_anchor_reproduction.py``. The first test is the seed-0 table
(two ~5 minute runs on one free core), measured with the task rules before ``key_split``
existed (``probekit_v1``: bit-identical to that data). The second trains three seeds, each
resampling data and init (``task_seed`` follows the seed), with setting 0 of the docs'
seed search (about 17 minutes a seed on one free core).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from probekit.analyses.mechanisms.solutions import solution_types
from probekit.anchor import AnchorTask, anchor_cpu_config, train_stack
from probekit.run_folders import load_run
from probekit.training import ModelConfig

torch.set_num_threads(1)

LARGE_INIT = dict(gamma=0.5, seed=0)  # documented: symmetric
SMALL_INIT = dict(gamma=0.8, seed=0)  # documented: inferential
#: the data rules the seed-0 table was measured with
V1_TASK = AnchorTask(n_train=20000, n_test=2000, key_split="probekit_v1")


@pytest.mark.slow
def test_large_init_is_symmetric_small_init_is_inferential(tmp_path: Path) -> None:
    # the two runs train as one stack of two, exactly as documented (a run trained alone
    # agrees within float noise, which 1500 AdamW steps can amplify by a few points)
    large, small = train_stack(
        [
            anchor_cpu_config(**LARGE_INIT, task=V1_TASK),
            anchor_cpu_config(**SMALL_INIT, task=V1_TASK),
        ],
        tmp_path / "pair",
        progress=False,
    )
    fl, fs = large.final, small.final
    print(f"large init: {fl}\nsmall init: {fs}")
    assert fl["test_data_acc"] >= 0.9 and fs["test_data_acc"] >= 0.9
    assert fl["test_task_symmetric"] >= 0.8, fl
    assert fs["test_task_inferential"] >= 0.8, fs
    # the classifier, through probekit.load, agrees with the trainer's own evaluation
    rl, rs = (
        solution_types(r.checkpoint, load_run(r.checkpoint).task.solution_data())
        for r in (large, small)
    )
    assert rl.summary["solution"] == "symmetric" and rs.summary["solution"] == "inferential"
    assert rl.summary["heldout_symmetric"] == pytest.approx(fl["test_task_symmetric"])
    assert rs.summary["heldout_inferential"] == pytest.approx(fs["test_task_inferential"])


#: setting 0 of the docs' seed search (``benchmarks/anchor_seeds.py`` with
#: ``--n-heads 1 --init-scheme official --steps 2000``): official split and init, one head
SEED_GAMMAS = (0.3, 0.8)  # large, small init
SEEDS = (0, 1, 2)


def seed_configs(seed: int) -> list:
    """The large- and small-init runs of one seed (they share that seed's data)."""
    return [
        anchor_cpu_config(
            g,
            seed=seed,
            steps=2000,
            model=ModelConfig(n_layers=2, d_model=64, n_heads=1, gamma=g, init_scheme="official"),
            task=AnchorTask(n_train=20000, n_test=2000),
        )  # official split
        for g in SEED_GAMMAS
    ]


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="documented negative result (docs, seed search): no "
    "CPU setting tried makes small init inferential in 3/3 seeds",
)
def test_three_seeds_large_symmetric_small_inferential(tmp_path: Path) -> None:
    solutions = {g: [] for g in SEED_GAMMAS}
    for seed in SEEDS:
        cfgs = seed_configs(seed)
        assert {c.task.seed for c in cfgs} == {seed}  # each seed resamples the data
        for cfg, out in zip(
            cfgs, train_stack(cfgs, tmp_path / f"s{seed}", progress=False), strict=True
        ):
            s = solution_types(out.checkpoint, load_run(out.checkpoint).task.solution_data())
            print(seed, cfg.model.gamma, s.summary)
            solutions[cfg.model.gamma].append(s.summary["solution"])
            assert s.summary["seen_test_accuracy"] >= 0.9
    assert solutions == {0.3: ["symmetric"] * 3, 0.8: ["inferential"] * 3}, solutions
