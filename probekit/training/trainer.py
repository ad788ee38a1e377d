"""The built-in trainer for the anchor-function tasks.

One run trains a GPT-2-style decoder (:mod:`probekit.training.models`) on the last token of the
task's training split with AdamW (linear warmup, cosine decay, decoupled weight decay, gradient
clipping), evaluates every split at a fixed interval into ``metrics.jsonl`` (also shown on a
progress bar), and checkpoints to a Hugging Face directory that ``GPT2LMHeadModel.from_pretrained``
opens. CUDA with bf16 autocast when present, CPU otherwise.

A run's output folder::

    out/config.json          the run's settings (TrainConfig.to_dict())
    out/metrics.jsonl        one JSON row per evaluation
    out/checkpoint/          config.json + model.safetensors (Hugging Face), optimizer.safetensors
                             (AdamW moments, torch/numpy RNG state), trainer_state.json (step,
                             schedule, python RNG state), run_config.json

Nothing is pickled. Each step's batch is a function of (seed, step) alone, so a run killed at any
point and started again with the same command resumes from its last checkpoint and ends with
weights bit-identical (on CPU) to an uninterrupted run. A NaN loss stops the run with a
:class:`~probekit.errors.NumericalError` and keeps the last good checkpoint.

Several runs of one shape train together as one stacked model (``train_stack``); that is what
:mod:`probekit.training.sweep` uses. A single run is a stack of one.

Example:
    >>> import tempfile
    >>> from probekit.tasks import AnchorTask
    >>> cfg = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), steps=3, batch_size=8,
    ...                   eval_every=3, task=AnchorTask(n_train=64, n_test=16))
    >>> out = train(cfg, tempfile.mkdtemp(), progress=False)
    >>> int(out.metrics["step"].iloc[-1])
    3
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from probekit.errors import CheckpointError, ConfigError, NumericalError, check_known_keys
from probekit.io import atomic_directory, atomic_write_text
from probekit.tasks.anchor import AnchorTask
from probekit.training.checkpoint import RUN_CONFIG, read_run_config, write_run_config
from probekit.training.models import (
    ModelConfig,
    decays,
    init_stacked_params,
    stacked_forward,
    to_hf_model,
)

#: settings that may differ between runs trained together in one stack
PER_RUN = ("name", "seed", "lr", "weight_decay", "grad_clip")


@dataclass
class TrainConfig:
    """Everything that defines a training run.

    ``grad_clip`` <= 0 disables clipping. ``min_lr_ratio`` is the final fraction of ``lr``
    reached by the cosine decay. ``eval_train_samples`` caps the training-split evaluation.

    Example:
        >>> TrainConfig(lr=3e-3).lr_at(0) < TrainConfig(lr=3e-3).lr_at(100)
        True
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    task: AnchorTask = field(default_factory=AnchorTask)
    name: str = "run"
    seed: int = 0
    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    eval_every: int = 100
    checkpoint_every: int = 500
    eval_train_samples: int = 2000
    eval_at_start: bool = True
    device: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        if isinstance(self.task, dict):
            self.task = AnchorTask.from_dict(self.task)
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the bad setting and a fix."""
        positive = ("steps", "batch_size", "eval_every", "checkpoint_every", "eval_train_samples")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"{name} = {value!r} must be a positive integer", fix=f"set {name} >= 1"
                )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr = {self.lr!r} must be a positive number", fix="use e.g. 1e-3")
        if self.weight_decay < 0:
            raise ConfigError(
                f"weight_decay = {self.weight_decay} is negative",
                fix="use 0 or a positive value such as 0.01",
            )
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ConfigError(
                f"warmup_steps = {self.warmup_steps!r} must be an integer >= 0",
                fix="use e.g. 100 (a run shorter than its warmup only warms up)",
            )
        if not (0 <= self.min_lr_ratio <= 1):
            raise ConfigError(
                f"min_lr_ratio = {self.min_lr_ratio} is not in [0, 1]", fix="use e.g. 0.0 or 0.1"
            )
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0):
            raise ConfigError(
                "AdamW betas must lie in [0, 1) and eps be positive",
                fix="use beta1=0.9, beta2=0.999, eps=1e-8",
            )
        if self.batch_size > self.task.n_train:
            raise ConfigError(
                f"batch_size {self.batch_size} exceeds the {self.task.n_train} training samples",
                fix="lower batch_size or raise the task's n_train",
            )
        if self.model.vocab_size != self.task.vocab_size:
            raise ConfigError(
                f"model vocabulary {self.model.vocab_size} != task vocabulary "
                f"{self.task.vocab_size}",
                fix="set both to the same size (default 201)",
            )
        if self.model.n_positions < self.task.seq_len:
            raise ConfigError(
                f"model n_positions {self.model.n_positions} < task seq_len {self.task.seq_len}",
                fix="raise n_positions to at least seq_len",
            )
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(
                f"run name {self.name!r} is not a plain folder name",
                fix="use letters, digits, '-', '_' and '.'",
            )
        if self.device != "auto" and not self.device.startswith(("cpu", "cuda")):
            raise ConfigError(f"unknown device {self.device!r}", fix="use auto, cpu or cuda")

    def lr_at(self, step: int) -> float:
        """Learning rate of update ``step`` (0-based): linear warmup then cosine decay."""
        return self.lr * self.schedule(step)

    def schedule(self, step: int) -> float:
        """The schedule's multiplier of ``lr`` at update ``step``."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (nested model and task)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["model"] = self.model.to_dict()
        d["task"] = self.task.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`."""
        check_known_keys(d, {f.name for f in fields(cls)}, "training")
        return cls(**d)

    def stack_key(self) -> str:
        """Runs with equal keys can train together in one stack."""
        d = self.to_dict()
        for k in PER_RUN + ("device",):
            d.pop(k)
        m = d.pop("model")
        d["shape"] = list(self.model.shape_key())
        del m
        return json.dumps(d, sort_keys=True)

    def comparable(self) -> dict[str, Any]:
        """The settings a resumed run must share with its checkpoint (all but the device)."""
        d = self.to_dict()
        d.pop("device")
        return d


@dataclass
class RunOutput:
    """What a finished run leaves behind."""

    name: str
    out_dir: Path
    checkpoint: Path
    metrics: pd.DataFrame
    status: str = "ok"
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> dict[str, Any]:
        """The last metrics row."""
        return self.metrics.iloc[-1].to_dict()


def _recover_checkpoint(root: Path) -> None:
    """Undo what a kill in the middle of an atomic checkpoint swap leaves behind.

    ``atomic_directory`` moves the old checkpoint aside (``.checkpoint.*.old/old``) before it
    renames the new one into place; a kill between the two renames leaves no ``checkpoint``.
    Put the old one back, and remove half-written ``.checkpoint.*.tmp`` folders.
    """
    parent = root.parent
    if not parent.is_dir():
        return
    for tmp in parent.glob(f".{root.name}.*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
    olds = sorted(parent.glob(f".{root.name}.*.old"), key=lambda p: p.stat().st_mtime)
    for old in olds:
        if not root.exists() and (old / "old").is_dir():
            os.replace(old / "old", root)
        shutil.rmtree(old, ignore_errors=True)


@functools.lru_cache(maxsize=256)
def _permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7919 + 0x5EED) % (2**63))
    return torch.randperm(n, generator=gen)


def batch_indices(seed: int, step: int, n: int, batch_size: int) -> torch.Tensor:
    """Training-set indices of the batch of update ``step``: a function of (seed, step) only.

    Each epoch (``n // batch_size`` steps) walks a permutation seeded by (seed, epoch), so a
    resumed run needs no data-loader state.

    Example:
        >>> bool((batch_indices(0, 3, 100, 10) == batch_indices(0, 3, 100, 10)).all())
        True
    """
    epoch, within = divmod(step, n // batch_size)
    return _permutation(int(seed), epoch, int(n))[within * batch_size:(within + 1) * batch_size]


class _Interrupted(Exception):
    """Raised by the test hook ``_interrupt_at`` to simulate a kill."""


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device cuda requested but CUDA is not available", fix="use --device cpu or auto"
        )
    return dev


def _save_quietly(model, path: Path) -> None:
    """``save_pretrained`` without the Hugging Face progress bar."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class _Stack:
    """Train ``M`` runs of one shape as one stacked model (internal)."""

    def __init__(self, configs: list[TrainConfig], out_dir: Path, single: bool) -> None:
        if not configs:
            raise ConfigError("no runs to train", fix="pass at least one TrainConfig")
        keys = {c.stack_key() for c in configs}
        if len(keys) != 1:
            raise ConfigError(
                "runs in one stack differ in more than " + ", ".join(PER_RUN) + " and gammas",
                fix="group runs by TrainConfig.stack_key()",
            )
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ConfigError(f"run names repeat: {names}", fix="give every run its own name")
        self.cfgs = configs
        self.c0 = configs[0]
        self.M = len(configs)
        self.out = Path(out_dir)
        self.single = single
        self.device = _resolve_device(self.c0.device)
        self.mcfg = self.c0.model
        task = self.c0.task
        self.task = task
        dev = self.device
        self.lr = torch.tensor([c.lr for c in configs], device=dev)
        self.wd = torch.tensor([c.weight_decay for c in configs], device=dev)
        self.clip = torch.tensor([c.grad_clip for c in configs], device=dev)
        train = task.dataset("train")
        self.train_tokens = train.tokens.to(dev)
        self.train_targets = train.targets.to(dev)
        self.evals = self._eval_sets(train)
        self.params = {
            k: v.to(dev).requires_grad_(True)
            for k, v in init_stacked_params(
                [c.model for c in configs], [c.seed for c in configs]
            ).items()
        }
        self.exp_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.step = 0
        self.loss_sum = [0.0] * self.M
        self.loss_count = 0
        self.diverged: list[int | None] = [None] * self.M
        self.metrics: list[dict[str, Any]] = []
        self._hf = None
        self.elapsed = 0.0

    # ------------------------------------------------------------------ data
    def _eval_sets(self, train):
        n = self.c0.eval_train_samples
        from probekit.tasks.anchor import AnchorData

        head = AnchorData(
            **{k: (v[:n] if torch.is_tensor(v) else v) for k, v in train.__dict__.items()}
        )
        sets = {
            "train": head,
            "test_data": self.task.dataset("test_data"),
            "test_task": self.task.dataset("test_task"),
        }
        return {
            k: {
                f: (getattr(v, f).to(self.device))
                for f in ("tokens", "targets", "composite", "symmetric")
            }
            for k, v in sets.items()
        }

    def _batch_indices(self, m: int, step: int) -> torch.Tensor:
        """Batch of run ``m`` at ``step`` (see :func:`batch_indices`)."""
        return batch_indices(self.cfgs[m].seed, step, self.train_tokens.shape[0],
                             self.c0.batch_size)

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    # ------------------------------------------------------------------ training
    def train_step(self) -> torch.Tensor:
        M, s = self.M, self.step
        idx = torch.stack([self._batch_indices(m, s) for m in range(M)]).to(self.device)
        tokens = self.train_tokens[idx]
        targets = self.train_targets[idx]
        names = list(self.params)
        plist = [self.params[k] for k in names]
        with self._autocast():
            logits = stacked_forward(self.params, tokens, self.mcfg)
        V = logits.shape[-1]
        loss = (
            F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1), reduction="none")
            .view(M, -1)
            .mean(1)
        )
        grads = torch.autograd.grad(loss.sum(), plist)
        with torch.no_grad():
            finite = torch.isfinite(loss)
            for g in grads:
                finite &= torch.isfinite(g.reshape(M, -1)).all(1)
            active = finite.clone()
            for m in range(M):
                if self.diverged[m] is not None:
                    active[m] = False
            frozen = [m for m in range(M) if not bool(active[m])]
            saved = {
                m: [
                    (t[m].clone(), a[m].clone(), b[m].clone())
                    for t, a, b in zip(
                        plist,
                        (self.exp_avg[k] for k in names),
                        (self.exp_avg_sq[k] for k in names),
                        strict=True,
                    )
                ]
                for m in frozen
            }
            norm = torch.stack([g.float().pow(2).reshape(M, -1).sum(1) for g in grads]).sum(0)
            norm = norm.sqrt()
            coef = torch.where(
                self.clip > 0, (self.clip / (norm + 1e-6)).clamp(max=1.0), torch.ones_like(norm)
            )
            t = s + 1
            sched = self.c0.schedule(s)
            lr_t = self.lr * sched
            b1, b2, eps = self.c0.beta1, self.c0.beta2, self.c0.eps
            bc1 = 1 - b1**t
            bc2_sqrt = math.sqrt(1 - b2**t)
            step_size = lr_t / bc1
            for k, p, g in zip(names, plist, grads, strict=False):
                shape = (M,) + (1,) * (p.dim() - 1)
                g = g * coef.view(shape)
                if decays(k):
                    p.mul_((1 - lr_t * self.wd).view(shape))
                ea, eas = self.exp_avg[k], self.exp_avg_sq[k]
                ea.lerp_(g, 1 - b1)
                eas.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (eas.sqrt() / bc2_sqrt).add_(eps)
                p.sub_(step_size.view(shape) * ea / denom)
            for m in frozen:
                for (pv, av, bv), k in zip(saved[m], names, strict=False):
                    self.params[k][m] = pv
                    self.exp_avg[k][m] = av
                    self.exp_avg_sq[k][m] = bv
        self.step += 1
        lcpu = loss.detach().float().cpu()
        for m in range(M):
            if self.diverged[m] is None and not bool(finite[m]):
                self.diverged[m] = self.step
            elif self.diverged[m] is None:
                self.loss_sum[m] += float(lcpu[m])
        self.loss_count += 1
        return lcpu

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> list[dict[str, Any]]:
        M = self.M
        rows = [
            {
                "step": self.step,
                "run": c.name,
                "lr": c.lr_at(max(0, self.step - 1)),
                "batch_loss": (
                    self.loss_sum[m] / self.loss_count if self.loss_count else float("nan")
                ),
            }
            for m, c in enumerate(self.cfgs)
        ]
        for split, d in self.evals.items():
            n = d["tokens"].shape[0]
            preds, losses = [], []
            chunk = max(1, 8192 // M)
            for i in range(0, n, chunk):
                tok = d["tokens"][i : i + chunk]
                with self._autocast():
                    logits = stacked_forward(
                        self.params, tok[None].expand(M, -1, -1), self.mcfg
                    ).float()
                tgt = d["targets"][i : i + chunk]
                losses.append(
                    F.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), tgt.repeat(M), reduction="none"
                    ).view(M, -1)
                )
                preds.append(logits.argmax(-1))
            pred = torch.cat(preds, 1)
            loss = torch.cat(losses, 1).mean(1).cpu()
            acc = (pred == d["targets"]).float().mean(1).cpu()
            inf = (pred == d["composite"]).float().mean(1).cpu()
            sym = (pred == d["symmetric"]).float().mean(1).cpu()
            for m in range(M):
                rows[m][f"{split}_loss"] = float(loss[m])
                rows[m][f"{split}_acc"] = float(acc[m])
                if split == "test_task":
                    rows[m]["test_task_inferential"] = float(inf[m])
                    rows[m]["test_task_symmetric"] = float(sym[m])
                    rows[m]["test_task_other"] = float(
                        1
                        - (
                            ((pred[m] == d["composite"]) | (pred[m] == d["symmetric"]))
                            .float()
                            .mean()
                        )
                    )
        for m in range(M):
            rows[m]["diverged_at"] = self.diverged[m]
            rows[m]["elapsed_s"] = round(self.elapsed, 3)
        self.loss_sum = [0.0] * M
        self.loss_count = 0
        self.metrics.extend(rows)
        return rows

    def write_metrics(self) -> None:
        text = "".join(
            json.dumps({k: _jsonable(v) for k, v in r.items()}) + "\n" for r in self.metrics
        )
        atomic_write_text(self.out / "metrics.jsonl", text)

    # ------------------------------------------------------------------ checkpoints
    def run_dir(self, root: Path, m: int) -> Path:
        return root if self.single else root / self.cfgs[m].name

    def save(self) -> None:
        from safetensors.torch import save_file

        np_state = np.random.get_state()
        py_state = random.getstate()
        with atomic_directory(self.out / "checkpoint") as tmp:
            for m, cfg in enumerate(self.cfgs):
                d = self.run_dir(tmp, m)
                d.mkdir(parents=True, exist_ok=True)
                self._hf = to_hf_model(self.mcfg, self.params, m, model=self._hf)
                _save_quietly(self._hf, d)
                tensors = {}
                for k in self.params:
                    tensors["exp_avg." + k] = self.exp_avg[k][m].detach().cpu().contiguous()
                    tensors["exp_avg_sq." + k] = self.exp_avg_sq[k][m].detach().cpu().contiguous()
                tensors["rng.torch"] = torch.get_rng_state()
                tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
                save_file(tensors, str(d / "optimizer.safetensors"))
                state = {
                    "step": self.step,
                    "loss_sum": self.loss_sum[m],
                    "loss_count": self.loss_count,
                    "diverged_at": self.diverged[m],
                    "elapsed_s": self.elapsed,
                    "scheduler": {
                        "kind": "warmup_cosine",
                        "last_lr": cfg.lr_at(max(0, self.step - 1)),
                        "multiplier": cfg.schedule(max(0, self.step - 1)),
                    },
                    "rng_numpy": {
                        "kind": np_state[0],
                        "pos": int(np_state[2]),
                        "has_gauss": int(np_state[3]),
                        "cached_gaussian": float(np_state[4]),
                    },
                    "rng_python": {
                        "version": py_state[0],
                        "state": list(py_state[1]),
                        "gauss": py_state[2],
                    },
                }
                atomic_write_text(d / "trainer_state.json", json.dumps(state))
                write_run_config(d, "anchor", cfg.to_dict())

    def try_resume(self) -> bool:
        from safetensors.torch import load_file

        root = self.out / "checkpoint"
        _recover_checkpoint(root)
        if not root.exists():
            return False
        steps, states = set(), []
        for m, cfg in enumerate(self.cfgs):
            d = self.run_dir(root, m)
            try:
                saved_cfg = read_run_config(d)
                if saved_cfg is None:
                    raise OSError(f"no {RUN_CONFIG}")
                state = json.loads((d / "trainer_state.json").read_text())
                weights = load_file(str(d / "model.safetensors"))
                opt = load_file(str(d / "optimizer.safetensors"))
            except (OSError, ValueError) as err:
                raise CheckpointError(
                    f"checkpoint {d} is incomplete or unreadable ({err})",
                    fix="delete it to start over, or pass resume=False / --no-resume",
                ) from err
            saved_cfg.pop("device", None)
            saved_cfg.pop("kind", None)
            if saved_cfg != cfg.comparable():
                raise ConfigError(
                    f"the checkpoint in {d} was written by a run with other settings",
                    fix="use a new output folder, the original settings, or --no-resume",
                )
            steps.add(state["step"])
            states.append((state, weights, opt))
        if len(steps) != 1:
            raise CheckpointError(
                f"checkpoints under {root} are at different steps {steps}",
                fix="delete the folder and train again",
            )
        with torch.no_grad():
            for m, (state, weights, opt) in enumerate(states):
                for k in self.params:
                    src = weights.get(k)
                    if src is None and k == "lm_head.weight":  # pragma: no cover
                        src = weights["transformer.wte.weight"]
                    self.params[k][m] = src.to(self.device)
                    self.exp_avg[k][m] = opt["exp_avg." + k].to(self.device)
                    self.exp_avg_sq[k][m] = opt["exp_avg_sq." + k].to(self.device)
                self.loss_sum[m] = state["loss_sum"]
                self.diverged[m] = state["diverged_at"]
            state, _, opt = states[0]
            self.loss_count = state["loss_count"]
            self.step = state["step"]
            self.elapsed = state.get("elapsed_s", 0.0)
            torch.set_rng_state(opt["rng.torch"])
            npk = state["rng_numpy"]
            np.random.set_state(
                (
                    npk["kind"],
                    opt["rng.numpy"].numpy().astype(np.uint32),
                    npk["pos"],
                    npk["has_gauss"],
                    npk["cached_gaussian"],
                )
            )
            py = state["rng_python"]
            random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        path = self.out / "metrics.jsonl"
        if path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            self.metrics = [r for r in rows if r["step"] <= self.step]
        return True

    # ------------------------------------------------------------------ loop
    def run(self, progress: bool = True, _interrupt_at: int | None = None) -> None:
        from tqdm.auto import tqdm

        c0 = self.c0
        if self.step == 0 and not self.metrics and c0.eval_at_start:
            self.evaluate()
            self.write_metrics()
        desc = self.cfgs[0].name if self.M == 1 else f"{self.M} stacked runs"
        bar = tqdm(
            total=c0.steps,
            initial=self.step,
            disable=not progress,
            desc=desc,
            dynamic_ncols=True,
            leave=False,
        )
        try:
            while self.step < c0.steps:
                t0 = time.perf_counter()
                loss = self.train_step()
                self.elapsed += time.perf_counter() - t0
                if self.single and self.diverged[0] is not None:
                    raise NumericalError(
                        f"run {self.cfgs[0].name!r}: the loss became NaN/inf at step {self.step}"
                        f" (loss {float(loss[0])}); the last good checkpoint under "
                        f"{self.out / 'checkpoint'} is kept",
                        fix="lower lr, raise gamma (smaller init) or keep grad_clip on",
                    )
                if self.step % c0.eval_every == 0 or self.step == c0.steps:
                    rows = self.evaluate()
                    self.write_metrics()
                    r = (
                        rows[0]
                        if self.M == 1
                        else {
                            k: float(np.nanmean([row[k] for row in rows]))
                            for k in (
                                "test_data_acc",
                                "test_task_inferential",
                                "test_task_symmetric",
                            )
                        }
                    )
                    bar.set_postfix(
                        loss=f"{float(loss.nanmean()):.3f}",
                        data=f"{r['test_data_acc']:.2f}",
                        inf=f"{r['test_task_inferential']:.2f}",
                        sym=f"{r['test_task_symmetric']:.2f}",
                        refresh=False,
                    )
                if _interrupt_at is not None and self.step == _interrupt_at:
                    raise _Interrupted(self.step)
                if self.step % c0.checkpoint_every == 0 or self.step == c0.steps:
                    self.save()
                bar.update(1)
        finally:
            bar.close()


def train_stack(
    configs: list[TrainConfig],
    out_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
    single: bool = False,
    _interrupt_at: int | None = None,
) -> list[RunOutput]:
    """Train runs of one shape together as one stacked model; each gets its own checkpoint.

    Checkpoints go to ``out_dir/checkpoint/<run name>/`` (or ``out_dir/checkpoint/`` when
    ``single``), metrics of all runs to ``out_dir/metrics.jsonl`` (column ``run``).

    Example:
        >>> import tempfile
        >>> from probekit.tasks import AnchorTask
        >>> task = AnchorTask(n_train=64, n_test=16)
        >>> cfgs = [TrainConfig(model=ModelConfig(d_model=16, n_heads=2, gamma=g), task=task,
        ...         name=f"g{g}", steps=2, batch_size=8, eval_every=2) for g in (0.3, 0.8)]
        >>> [o.name for o in train_stack(cfgs, tempfile.mkdtemp(), progress=False)]
        ['g0.3', 'g0.8']
    """
    out = Path(out_dir)
    stack = _Stack(list(configs), out, single=single)
    if resume:
        stack.try_resume()
    elif (out / "checkpoint").exists() or (out / "metrics.jsonl").exists():
        (out / "metrics.jsonl").unlink(missing_ok=True)
    atomic_write_text(
        out / "config.json",
        json.dumps(
            [c.to_dict() for c in configs] if not single else configs[0].to_dict(), indent=1
        ),
    )
    if stack.step < stack.c0.steps or not stack.metrics:
        stack.run(progress=progress, _interrupt_at=_interrupt_at)
    df = pd.DataFrame(stack.metrics)
    outs = []
    for m, cfg in enumerate(configs):
        status = "ok" if stack.diverged[m] is None else f"nan at step {stack.diverged[m]}"
        outs.append(
            RunOutput(
                name=cfg.name,
                out_dir=out,
                checkpoint=stack.run_dir(out / "checkpoint", m),
                metrics=df[df["run"] == cfg.name].reset_index(drop=True),
                status=status,
                config=cfg.to_dict(),
            )
        )
    return outs


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
    _interrupt_at: int | None = None,
) -> RunOutput:
    """Train one run; resume from ``out_dir/checkpoint`` when it exists (and ``resume``).

    Returns a :class:`RunOutput` whose ``checkpoint`` opens with
    ``GPT2LMHeadModel.from_pretrained`` and ``probekit.load``. See the module docstring.
    """
    return train_stack(
        [config],
        out_dir,
        resume=resume,
        progress=progress,
        single=True,
        _interrupt_at=_interrupt_at,
    )[0]


def anchor_cpu_config(gamma: float, seed: int = 0, **overrides: Any) -> TrainConfig:
    """The CPU-sized anchor configuration of docs/anchor-training.md (a few minutes a run).

    2 layers, d_model 64, 4 heads, batch 256, 1500 steps of AdamW (lr 2.5e-3, 100 warmup
    steps, cosine to 0, weight decay 0.1), 20000 training sequences. ``overrides`` replace
    any TrainConfig field.

    Example:
        >>> anchor_cpu_config(0.8).model.gamma
        0.8
    """
    settings: dict[str, Any] = dict(
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4, gamma=gamma),
        task=AnchorTask(n_train=20000, n_test=2000),
        seed=seed, steps=1500, batch_size=256, lr=2.5e-3, warmup_steps=100, weight_decay=0.1,
        eval_every=250, checkpoint_every=500, name=f"g{gamma:g}_s{seed}")
    settings.update(overrides)
    return TrainConfig(**settings)


def load_run_config(checkpoint: str | os.PathLike) -> TrainConfig:
    """The :class:`TrainConfig` stored in a probekit anchor checkpoint (or run) folder."""
    from probekit.training.runs import load_run

    run = load_run(checkpoint)
    if run is None or run.kind != "anchor":
        raise CheckpointError(
            f"no anchor-run run_config.json in {checkpoint}",
            fix="pass a checkpoint written by probekit train",
        )
    return TrainConfig.from_dict(run.config)


__all__ = [
    "RunOutput",
    "TrainConfig",
    "anchor_cpu_config",
    "batch_indices",
    "load_run_config",
    "train",
    "train_stack",
]
