"""Checkpoint I/O of a stack of anchor runs: save every run's folder, resume them together.

Each run's folder (``checkpoint/`` for a single run, ``checkpoint/<name>/`` in a stack) holds
the Hugging Face model, ``optimizer.safetensors`` (the run's AdamW moments and the process's
torch/numpy RNG state), ``trainer_state.json`` (step, loss sums, divergence, schedule, numpy and
python RNG state) and ``run_config.json`` (kind ``"anchor"``). The whole ``checkpoint`` folder
is replaced atomically.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from probekit.tasks import AnchorTask
    >>> from probekit.training import ModelConfig, TrainConfig, train
    >>> cfg = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), steps=1, batch_size=8,
    ...                   eval_every=1, task=AnchorTask(n_train=64, n_test=16))
    >>> out = train(cfg, tempfile.mkdtemp(), progress=False)
    >>> sorted(p.name for p in out.checkpoint.iterdir())[-3:]
    ['optimizer.safetensors', 'run_config.json', 'trainer_state.json']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch

from probekit.errors import CheckpointError
from probekit.io import atomic_directory, atomic_write_text
from probekit.training.checkpoint import (
    check_same_settings,
    load_moments,
    read_run_config,
    recover_checkpoint,
    rng_state,
    save_moments,
    save_quietly,
    set_rng_state,
    unreadable,
    write_run_config,
)
from probekit.training.evaluation import read_metrics
from probekit.training.models import ModelConfig, to_hf_model
from probekit.training.optim import StackedAdamW


class _Stack(Protocol):
    """What this module reads and restores of a stack (``trainer._Stack``)."""

    cfgs: list[Any]  # the runs' TrainConfigs
    out: Path
    mcfg: ModelConfig
    params: dict[str, torch.Tensor]
    optimizer: StackedAdamW
    device: torch.device
    M: int
    step: int
    loss_sum: list[float]
    loss_count: int
    diverged: list[int | None]
    elapsed: float
    metrics: list[dict[str, Any]]
    hf: Any  # the GPT2LMHeadModel checkpoints are written through

    def run_dir(self, root: Path, m: int) -> Path: ...


def _trainer_state(stack: _Stack, m: int, rng: dict[str, Any]) -> dict[str, Any]:
    cfg, last = stack.cfgs[m], max(0, stack.step - 1)
    return {
        "step": stack.step,
        "loss_sum": stack.loss_sum[m],
        "loss_count": stack.loss_count,
        "diverged_at": stack.diverged[m],
        "elapsed_s": stack.elapsed,
        "scheduler": {
            "kind": "warmup_cosine",
            "last_lr": cfg.lr_at(last),
            "multiplier": cfg.schedule(last),
        },
        **rng,
    }


def save_stack(stack: _Stack) -> None:
    """Write every run's checkpoint folder under ``stack.out / "checkpoint"``."""
    with atomic_directory(stack.out / "checkpoint") as tmp:
        for m, cfg in enumerate(stack.cfgs):
            d = stack.run_dir(tmp, m)
            d.mkdir(parents=True, exist_ok=True)
            stack.hf = to_hf_model(stack.mcfg, stack.params, m, model=stack.hf)
            save_quietly(stack.hf, d)
            rng_tensors, rng = rng_state()
            moments = stack.optimizer.state_dict(index=m)
            save_moments(
                d / "optimizer.safetensors",
                moments["exp_avg"],
                moments["exp_avg_sq"],
                extra=rng_tensors,
            )
            state = _trainer_state(stack, m, rng)
            atomic_write_text(d / "trainer_state.json", json.dumps(state))
            write_run_config(d, "anchor", cfg.to_dict())


def _read_run(stack: _Stack, d: Path, m: int) -> tuple[dict, dict, tuple]:
    """One run's trainer state, weights and optimizer file, checked against its config."""
    from safetensors.torch import load_file

    try:
        saved = read_run_config(d)
        if saved is None:
            raise OSError("no run_config.json")
        state = json.loads((d / "trainer_state.json").read_text())
        weights = load_file(str(d / "model.safetensors"))
        optimizer = load_moments(d / "optimizer.safetensors")
    except (OSError, ValueError, CheckpointError) as err:
        raise unreadable(d, err) from err
    saved = {k: v for k, v in saved.items() if k not in ("device", "kind")}
    check_same_settings(d, saved, stack.cfgs[m].comparable())
    return state, weights, optimizer


@torch.no_grad()
def _restore(stack: _Stack, states: list[tuple[dict, dict, tuple]]) -> None:
    for m, (state, weights, (exp_avg, exp_avg_sq, _)) in enumerate(states):
        for k in stack.params:
            src = weights.get(k)
            if src is None and k == "lm_head.weight":  # pragma: no cover
                src = weights["transformer.wte.weight"]
            stack.params[k][m] = src.to(stack.device)
        stack.optimizer.load_state_dict({"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, index=m)
        stack.loss_sum[m] = state["loss_sum"]
        stack.diverged[m] = state["diverged_at"]
    state, _, (_, _, rng_tensors) = states[0]
    stack.loss_count = state["loss_count"]
    stack.step = state["step"]
    stack.elapsed = state.get("elapsed_s", 0.0)
    set_rng_state(rng_tensors, state)


def resume_stack(stack: _Stack) -> bool:
    """Load the stack's last checkpoint, if any; True when it resumed."""
    root = stack.out / "checkpoint"
    recover_checkpoint(root)
    if not root.exists():
        return False
    states = [_read_run(stack, stack.run_dir(root, m), m) for m in range(stack.M)]
    steps = {state["step"] for state, _, _ in states}
    if len(steps) != 1:
        raise CheckpointError(
            f"checkpoints under {root} are at different steps {steps}",
            fix="delete the folder and train again",
        )
    _restore(stack, states)
    stack.metrics = read_metrics(stack.out / "metrics.jsonl", stack.step)
    return True


__all__ = ["resume_stack", "save_stack"]
