"""Run folders for tests: a tiny probekit anchor run on disk, and a count of how often a test's
code reads run folders (:func:`probekit.run_folders.load_run`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def anchor_run(tmp_path: Path) -> tuple[Path, Any]:
    """A probekit anchor run folder: a GPT-2 over the task's vocabulary in checkpoint/; returns
    the run folder and its task."""
    import transformers

    from probekit.anchor import AnchorTask, TrainConfig
    from probekit.training.checkpoint import write_run_config

    task = AnchorTask(n_train=64, n_test=32)
    config = transformers.GPT2Config(
        vocab_size=task.vocab_size, n_positions=16, n_embd=16, n_layer=2, n_head=2
    )
    run = tmp_path / "run"
    transformers.GPT2LMHeadModel(config).save_pretrained(run / "checkpoint")
    write_run_config(run / "checkpoint", "anchor", TrainConfig(batch_size=8, task=task).to_dict())
    return run, task


def count_run_reads(monkeypatch: Any) -> list[Any]:
    """The paths :func:`probekit.run_folders.load_run` is called with from now on (the list
    grows as it is called), counted in every loaded module that imported it."""
    from probekit import run_folders

    real, reads = run_folders.load_run, []

    def counted(path: Any) -> Any:
        reads.append(path)
        return real(path)

    for module in [m for m in sys.modules.values() if getattr(m, "load_run", None) is real]:
        monkeypatch.setattr(module, "load_run", counted)
    return reads
