"""The CPU reproduction of docs/anchor-training.md: large init -> symmetric, small -> inferential.

Slow (two ~2-4 minute runs on one core): ``pytest -m slow tests/test_anchor_reproduction.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from probekit.analyses.mechanisms.solutions import solution_types
from probekit.training import anchor_cpu_config, train_stack
from probekit.training.runs import load_run

torch.set_num_threads(1)

LARGE_INIT = dict(gamma=0.5, seed=0)   # documented: symmetric
SMALL_INIT = dict(gamma=0.8, seed=0)   # documented: inferential


@pytest.mark.slow
def test_large_init_is_symmetric_small_init_is_inferential(tmp_path: Path) -> None:
    # the two runs train as one stack of two, exactly as documented (a run trained alone
    # agrees within float noise, which 1500 AdamW steps can amplify by a few points)
    large, small = train_stack([anchor_cpu_config(**LARGE_INIT), anchor_cpu_config(**SMALL_INIT)],
                               tmp_path / "pair", progress=False)
    fl, fs = large.final, small.final
    print(f"large init: {fl}\nsmall init: {fs}")
    assert fl["test_data_acc"] >= 0.9 and fs["test_data_acc"] >= 0.9
    assert fl["test_task_symmetric"] >= 0.8, fl
    assert fs["test_task_inferential"] >= 0.8, fs
    # the classifier, through probekit.load, agrees with the trainer's own evaluation
    rl, rs = (solution_types(r.checkpoint, load_run(r.checkpoint).task.solution_data())
              for r in (large, small))
    assert rl.summary["solution"] == "symmetric" and rs.summary["solution"] == "inferential"
    assert rl.summary["heldout_symmetric"] == pytest.approx(fl["test_task_symmetric"])
    assert rs.summary["heldout_inferential"] == pytest.approx(fs["test_task_inferential"])
