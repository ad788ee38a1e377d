"""The anchor runs' settings: :class:`TrainConfig`, and the presets of ``probekit train``.

:class:`TrainConfig` extends the settings every run shares
(:class:`~probekit.training.loop.RunSettings`) with the model, the task and the anchor run's
own; :func:`anchor_cpu_config` is the CPU-sized configuration of docs/anchor-training.md, and
:data:`PRESETS` names it for ``probekit train --preset``.

Example:
    >>> cfg = anchor_cpu_config(0.8, seed=1)
    >>> cfg.name, cfg.model.gamma, TrainConfig.from_dict(cfg.to_dict()).to_dict() == cfg.to_dict()
    ('g0.8_s1', 0.8, True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from probekit.anchor.task import AnchorTask
from probekit.errors import ConfigError, check_known_keys
from probekit.training.checks import (
    check_device_name,
    check_flag,
    check_int,
    check_mapping,
    check_seed,
    is_int,
    is_real,
)
from probekit.training.loop import RunSettings
from probekit.training.models import ModelConfig

#: settings that may differ between runs trained together in one stack
PER_RUN = ("name", "seed", "lr", "weight_decay", "grad_clip")


@dataclass
class TrainConfig(RunSettings):
    """Everything that defines a training run: the shared run settings
    (:class:`~probekit.training.loop.RunSettings`: seed, steps, batch size, the AdamW schedule,
    ``eval_every``, precision, determinism) and the anchor run's own.

    ``beta1``, ``beta2`` and ``eps`` are AdamW's. The runs checkpoint every
    ``checkpoint_every`` steps and at the end (one resumable checkpoint, overwritten);
    ``keep_checkpoints`` keeps a Hugging Face checkpoint of given steps besides (an interval
    ``N``: steps 0, N, 2N, ... and the last; or a list of steps), in
    ``OUT/checkpoints/step-000500/`` (:meth:`keeps`). ``eval_train_samples`` caps the training-split
    evaluation; ``eval_at_start`` evaluates the initialization as well.

    Seeds: ``seed`` draws the initialization and the batch order. The data are drawn with
    ``task_seed``, which by default (None) *follows* ``seed``: every seed of a sweep is a new
    sample of the training and test data as well as of the weights, as in the official code
    (``main.py`` seeds everything with ``--seed`` before generating the data). Set
    ``task_seed`` to keep one data sample across seeds. A task given with a seed other than 0
    (``AnchorTask(seed=5)``, ``--task-seed 5``) counts as a set ``task_seed``. ``self.task`` is
    always the task the run trains on (its ``seed`` is the data seed), and :meth:`to_dict`
    saves the data seed as ``task_seed``. A run config saved before ``task_seed`` existed is
    read with ``task_seed`` = its task's seed, the data it was trained on.

    ``precision``: "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16" (autocast on
    CUDA and on CPU); weights and moments stay float32. A config saved before the setting
    existed reads as "auto" (what it trained with) and resumes. ``deterministic``:
    ``torch.use_deterministic_algorithms(True)`` while training; it changes neither the model
    nor the data, so a run may resume with it on or off.

    Example:
        >>> TrainConfig(lr=3e-3).lr_at(0) < TrainConfig(lr=3e-3).lr_at(100)
        True
        >>> TrainConfig(seed=3).task.seed, TrainConfig(seed=3, task_seed=0).task.seed
        (3, 0)
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    task: AnchorTask = field(default_factory=AnchorTask)
    name: str = "run"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    checkpoint_every: int = 500
    eval_train_samples: int = 2000
    eval_at_start: bool = True
    device: str = "auto"
    task_seed: int | None = None
    # --- checkpoints over training ---
    keep_checkpoints: int | list[int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)
        if isinstance(self.task, dict):
            self.task = AnchorTask.from_dict(self.task)
        if isinstance(self.task, AnchorTask):
            self._resolve_task_seed()
        self.validate()

    def _resolve_task_seed(self) -> None:
        """Make ``self.task`` the task of the data seed (``task_seed``, else ``seed``)."""
        check_seed("seed", self.seed)
        if self.task_seed is not None:
            check_seed("task_seed", self.task_seed)
        follows = getattr(self.task, "_seed_from_run", False)
        if self.task_seed is None and not follows and self.task.seed != 0:
            self.task_seed = self.task.seed  # an explicitly seeded task keeps its data
        data_seed = self.seed if self.task_seed is None else self.task_seed
        follow = self.task_seed is None
        if self.task.seed != data_seed or follows != follow:
            self.task = AnchorTask.from_dict({**self.task.to_dict(), "seed": data_seed})
            self.task._seed_from_run = follow

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the bad setting and a fix."""
        if not isinstance(self.model, ModelConfig) or not isinstance(self.task, AnchorTask):
            raise ConfigError(
                f"model {type(self.model).__name__} / task {type(self.task).__name__} are not "
                "a ModelConfig and an AnchorTask",
                fix="pass ModelConfig / AnchorTask objects or their dicts",
            )
        self.validate_run()
        for name in ("checkpoint_every", "eval_train_samples"):
            check_int(name, getattr(self, name))
        self._validate_adam()
        check_flag("eval_at_start", self.eval_at_start)
        check_device_name(self.device)
        self._validate_keep()
        self._validate_fit()

    # --- checkpoints over training ---
    def _validate_keep(self) -> None:
        """``keep_checkpoints`` is None, a positive interval, or a list of distinct steps in
        ``[0, steps]`` (stored sorted)."""
        keep = self.keep_checkpoints
        if keep is None:
            return
        if is_int(keep):
            check_int("keep_checkpoints", keep)
            self.keep_checkpoints = int(keep)
            return
        fix = "pass an interval N (every N steps) or a list of steps such as [0, 100, 500]"
        if isinstance(keep, str | bytes) or not isinstance(keep, list | tuple):
            raise ConfigError(
                f"keep_checkpoints {keep!r} is neither a step interval nor a list of steps", fix=fix
            )
        bad = [s for s in keep if not is_int(s) or not 0 <= s <= self.steps]
        if bad or not keep or len(set(keep)) != len(keep):
            what = f"steps {bad} outside [0, {self.steps}]" if bad else "no step or a repeated one"
            raise ConfigError(f"keep_checkpoints {list(keep)!r} holds {what}", fix=fix)
        self.keep_checkpoints = sorted(int(s) for s in keep)

    def keeps(self, step: int) -> bool:
        """Whether a checkpoint of ``step`` is kept (``keep_checkpoints``): with an interval
        ``N`` the steps 0, N, 2N, ... and the last; with a list its steps.

        Example:
            >>> cfg = TrainConfig(steps=250, keep_checkpoints=100)
            >>> [s for s in range(251) if cfg.keeps(s)]
            [0, 100, 200, 250]
        """
        keep = self.keep_checkpoints
        if keep is None:
            return False
        if isinstance(keep, int):
            return step % keep == 0 or step == self.steps
        return step in keep

    def _validate_adam(self) -> None:
        betas_ok = all(is_real(b) and 0 <= b < 1 for b in (self.beta1, self.beta2))
        if not (betas_ok and is_real(self.eps) and self.eps > 0):
            raise ConfigError(
                f"AdamW betas ({self.beta1!r}, {self.beta2!r}) must lie in [0, 1) and eps "
                f"{self.eps!r} be a finite positive number",
                fix="use beta1=0.9, beta2=0.999, eps=1e-8",
            )

    def _validate_fit(self) -> None:
        """The run fits its task and model, and its name is a folder name."""
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
        name = self.name
        if (
            not isinstance(name, str)
            or not name
            or "/" in name
            or "\x00" in name
            or name.startswith(".")
        ):
            raise ConfigError(
                f"run name {name!r} is not a plain folder name",
                fix="use letters, digits, '-', '_' and '.'",
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (nested model and task)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["model"] = self.model.to_dict()
        d["task"] = self.task.to_dict()
        d["task_seed"] = self.task.seed
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict` (and the reader of saved run configs).

        A run config saved before ``task_seed`` existed (no ``task_seed``, and a complete task
        dict without ``key_split``) keeps the data it was trained on: ``task_seed`` = its task's
        seed, and the task's old rules (:meth:`AnchorTask.from_dict` with ``saved``)."""
        d = check_mapping("training", d)
        check_known_keys(d, {f.name for f in fields(cls)}, "training")
        task = d.get("task")
        if "task_seed" not in d and isinstance(task, dict) and "key_split" not in task:
            d = {**d, "task": AnchorTask.from_dict(task, saved=True)}
            d["task_seed"] = d["task"].seed
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
        """The settings a resumed run must share with its checkpoint (all but the device,
        ``deterministic`` and ``keep_checkpoints``, which change neither the model nor the
        data)."""
        d = self.to_dict()
        d.pop("device")
        d.pop("deterministic")
        d.pop("keep_checkpoints")  # which checkpoints are kept changes no weight
        return d


def anchor_cpu_config(gamma: float, seed: int = 0, **overrides: Any) -> TrainConfig:
    """The CPU-sized anchor configuration of docs/anchor-training.md (a few minutes a run).

    2 layers, d_model 64, 4 heads, batch 256, 1500 steps of AdamW (lr 2.5e-3, 100 warmup
    steps, cosine to 0, weight decay 0.1), 20000 training sequences. ``overrides`` replace
    any TrainConfig field.

    The task keeps the key split these settings were tuned and the docs' demo measured
    with, ``key_split="probekit_v1"`` (test keys x mod 7 == p): with the official split
    (``"complexity_control"``, x mod 9 == p) the large-initialization model of this size
    answers inferentially too (73.6% inferential at gamma 0.5, seed 0), so the demo would show
    two inferential models. Pass ``task=AnchorTask(...)`` for the official rules.

    Example:
        >>> anchor_cpu_config(0.8).model.gamma
        0.8
    """
    settings: dict[str, Any] = dict(
        model=ModelConfig(n_layers=2, d_model=64, n_heads=4, gamma=gamma),
        task=AnchorTask(n_train=20000, n_test=2000, key_split="probekit_v1"),
        seed=seed,
        steps=1500,
        batch_size=256,
        lr=2.5e-3,
        warmup_steps=100,
        weight_decay=0.1,
        eval_every=250,
        checkpoint_every=500,
        name=f"g{gamma:g}_s{seed}",
    )
    settings.update(overrides)
    return TrainConfig(**settings)


PRESETS = {"cpu-reference": anchor_cpu_config}
"""``probekit train --preset`` name -> the function giving its TrainConfig (from gamma and
seed)."""

__all__ = ["PER_RUN", "PRESETS", "TrainConfig", "anchor_cpu_config"]
