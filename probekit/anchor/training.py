"""The built-in trainer for the anchor-function tasks.

One run trains a GPT-2-style decoder (:mod:`probekit.training.models`) on the last token of the
task's training split with AdamW (linear warmup, cosine decay, decoupled weight decay, gradient
clipping), evaluates every split at a fixed interval into ``metrics.jsonl`` (also shown on a
progress bar), and checkpoints to a Hugging Face directory that ``GPT2LMHeadModel.from_pretrained``
opens. CUDA when present, CPU otherwise (``device``); the forward runs in ``precision``
("auto": bf16 autocast on CUDA, fp32 on CPU; "fp32"; "bf16"), the weights and AdamW moments
are float32 in every mode (:mod:`probekit.training.precision`).

The device is never waited for between sync points (evaluations, checkpoints, the end): each
interval's batch indices are built on the host and sent in one copy, the loss sums and the
divergence flags stay on the device, and the host reads them at the sync point. So a single
run whose loss becomes NaN stops at the next sync point (naming the step it diverged at, before
anything is saved), and the progress bar's loss is the mean training loss since the evaluation
before, updated at each evaluation. The loop is the one both trainers run
(:mod:`probekit.training.loop`); :class:`AnchorStack` supplies the anchor run's steps.

A run's output folder::

    out/config.json          the run's settings (TrainConfig.to_dict())
    out/metrics.jsonl        one JSON row per evaluation
    out/checkpoint/          config.json + model.safetensors (Hugging Face), optimizer.safetensors
                             (AdamW moments), trainer_state.json (step, schedule),
                             run_config.json (kind "anchor")
    out/checkpoints/step-000500/
                             with keep_checkpoints: a kept checkpoint of a step (the same
                             without optimizer.safetensors), never rewritten; in a stack
                             out/checkpoints/<run name>/step-000500/

Nothing is pickled. Each step's batch is a function of (seed, step) alone, so a run killed at any
point and started again with the same command resumes from its last checkpoint and ends with
weights bit-identical (on CPU) to an uninterrupted run. ``deterministic=True`` adds
``torch.use_deterministic_algorithms(True)`` for CUDA (see
:mod:`probekit.training.precision` for what is bit-identical where). A NaN loss stops the run with a
:class:`~probekit.errors.NumericalError` and keeps the last good checkpoint.

Several runs of one shape train together as one stacked model (``train_stack``); that is what
:mod:`probekit.anchor.sweep` uses. A single run is a stack of one.

Example:
    >>> import tempfile
    >>> from probekit.anchor import AnchorTask, TrainConfig
    >>> from probekit.training.models import ModelConfig
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
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from probekit.anchor.config import PER_RUN, TrainConfig
from probekit.anchor.evaluation import Evaluator
from probekit.anchor.stack_io import (
    KEPT,
    keep_stack,
    remove_kept_leftovers,
    resume_stack,
    save_stack,
)
from probekit.errors import ConfigError, NumericalError
from probekit.io import atomic_write_text
from probekit.training.checkpoint import previous_of, recover_checkpoint, remove_leftovers
from probekit.training.loop import (
    Trainer,
    checked_device,
    first_failure,
    kept_checkpoint,
    read_on_host,
    train_in_folder,
)
from probekit.training.memory import LAYER_OVERHEAD_BYTES, TRAIN_BYTES_PER_PARAM
from probekit.training.metrics import write_metrics
from probekit.training.models import decays, init_stacked_params, stacked_forward
from probekit.training.optim import StackedAdamW
from probekit.training.precision import autocast, resolve_precision
from probekit.training.schedule import resolve_device


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
    return _permutation(int(seed), epoch, int(n))[within * batch_size : (within + 1) * batch_size]


class AnchorStack(Trainer):
    """``M`` anchor runs of one shape trained as one stacked model: the anchor trainer.

    Holds the stacked parameters, the :class:`StackedAdamW`, the :class:`Evaluator` and the
    run state (step, loss sums, divergence, metrics); :mod:`probekit.anchor.stack_io` saves and
    resumes it, :func:`~probekit.training.loop.run_loop` drives it. ``settings`` is the first
    run's config (the stack shares all but the per-run settings :data:`PER_RUN`).
    """

    settings: TrainConfig

    def __init__(self, configs: list[TrainConfig], out_dir: Path, single: bool) -> None:
        check_stack(configs)
        self.cfgs = configs
        self.settings = first = configs[0]
        self.M = len(configs)
        self.out = Path(out_dir)
        self.single = single
        self.device = dev = resolve_device(first.device)
        self.precision = resolve_precision(first.precision, dev)
        self.mcfg = first.model
        self.task = first.task
        train = self.task.dataset("train")
        self.train_tokens = train.tokens.to(dev)
        self.train_targets = train.targets.to(dev)
        self.evaluator = Evaluator(
            self.task, first.eval_train_samples, dev, train=train, precision=self.precision
        )
        init = init_stacked_params([c.model for c in configs], [c.seed for c in configs])
        self.params = {k: v.to(dev).requires_grad_(True) for k, v in init.items()}
        self.optimizer = StackedAdamW(
            self.params,
            lr=[c.lr for c in configs],
            weight_decay=[c.weight_decay for c in configs],
            grad_clip=[c.grad_clip for c in configs],
            betas=(first.beta1, first.beta2),
            eps=first.eps,
            decays=decays,
        )
        self.step = 0
        # host copies of the run state, valid at sync points (evaluation, checkpoint, end);
        # between them the device tensors of upload() are the truth
        self.loss_sum = [0.0] * self.M
        self.loss_count = 0
        self.diverged: list[int | None] = [None] * self.M
        self.diverged_loss = [float("nan")] * self.M
        self.metrics: list[dict[str, Any]] = []
        self.elapsed = 0.0
        self.hf = None  # the GPT2LMHeadModel checkpoints are written through, built once
        self.batches: torch.Tensor | None = None  # [steps, M, batch] indices from batch_start
        self.batch_start = 0
        self.upload()

    def run_batch(self, m: int, step: int) -> torch.Tensor:
        """Batch of run ``m`` at ``step`` (see :func:`batch_indices`)."""
        n = self.train_tokens.shape[0]
        return batch_indices(self.cfgs[m].seed, step, n, self.settings.batch_size)

    def run_dir(self, root: Path, m: int) -> Path:
        """Where run ``m`` sits under the checkpoint folder ``root``."""
        return root if self.single else root / self.cfgs[m].name

    def upload(self) -> None:
        """Put the host run state (loss sums, divergence) on the device (after a resume)."""
        dev = self.device
        self.loss_sum_t = torch.tensor(self.loss_sum, dtype=torch.float64, device=dev)
        at = [-1 if d is None else d for d in self.diverged]
        self.diverged_t = torch.tensor(at, dtype=torch.int64, device=dev)
        self.diverged_loss_t = torch.tensor(self.diverged_loss, dtype=torch.float32, device=dev)

    def sync(self) -> None:
        """Copy the device run state to the host lists: the one host sync between
        evaluations (it waits for the queued steps)."""
        rows = read_on_host(self.loss_sum_t, self.diverged_t, self.diverged_loss_t)
        self.loss_sum = rows[0]
        self.diverged = [None if d < 0 else int(d) for d in rows[1]]
        self.diverged_loss = rows[2]

    def check(self) -> None:
        """The sync point: :meth:`sync`; a single run that diverged raises."""
        self.sync()
        if self.single and self.diverged[0] is not None:
            raise _diverged_error(self)

    def prepare(self, stop: int) -> None:
        """The batch indices of steps ``self.step .. stop - 1`` of every run, built on the
        host (the same as :func:`batch_indices`) and sent to the device in one copy."""
        steps = range(self.step, stop)
        idx = torch.stack(
            [torch.stack([self.run_batch(m, s) for m in range(self.M)]) for s in steps]
        )
        self.hold_batches(idx)

    def train_step(self) -> torch.Tensor:
        """One AdamW update of every live run; returns the per-run training loss (on the
        device: nothing here waits for it)."""
        M, s = self.M, self.step
        idx = self.batch_at(s)
        with autocast(self.device, self.precision):
            logits = stacked_forward(self.params, self.train_tokens[idx], self.mcfg)
        V = logits.shape[-1]
        loss = (
            F.cross_entropy(
                logits.float().reshape(-1, V),
                self.train_targets[idx].reshape(-1),
                reduction="none",
            )
            .view(M, -1)
            .mean(1)
        )
        grads = torch.autograd.grad(loss.sum(), list(self.params.values()))
        with torch.no_grad():
            finite = torch.isfinite(loss)
            for g in grads:
                finite &= torch.isfinite(g.reshape(M, -1)).all(1)
            active = finite & (self.diverged_t < 0)
            applied = self.optimizer.step(list(grads), s, self.settings.schedule(s), active)
            finite &= applied | ~active  # an update that made weights non-finite was undone
            self.step += 1
            self._account(loss.detach().float(), finite)
        return loss

    def _account(self, loss: torch.Tensor, finite: torch.Tensor) -> None:
        """Record the step's losses, and the step at which a run first diverged (on the
        device: a run that diverged adds no more losses)."""
        self.diverged_t, new = first_failure(self.diverged_t, finite, self.step)
        self.diverged_loss_t = torch.where(new, loss, self.diverged_loss_t)
        live = self.diverged_t < 0
        self.loss_sum_t += torch.where(live, loss.double(), 0.0)
        self.loss_count += 1

    def evaluate(self) -> list[dict[str, Any]]:
        """One metrics row per run (appended to ``metrics`` and written to
        ``metrics.jsonl``); resets the loss sums."""
        scores = self.evaluator(self.params, self.mcfg, per_pair=True)
        rows = []
        for m, c in enumerate(self.cfgs):
            batch = self.loss_sum[m] / self.loss_count if self.loss_count else float("nan")
            row = {
                "step": self.step,
                "run": c.name,
                "lr": c.lr_at(max(0, self.step - 1)),
                "batch_loss": batch,
            }
            row.update(scores[m])
            row.update(diverged_at=self.diverged[m], elapsed_s=round(self.elapsed, 3))
            rows.append(row)
        self.loss_sum = [0.0] * self.M
        self.loss_sum_t.zero_()
        self.loss_count = 0
        self.metrics.extend(rows)
        write_metrics(self.out / "metrics.jsonl", self.metrics)
        return rows

    def progress_numbers(self) -> dict[str, str]:
        """The progress bar's numbers: the run's, or the mean over a stack; ``loss`` is the
        mean training loss since the evaluation before."""
        return _postfix(self.metrics[-self.M :])

    def checkpoint_due(self) -> bool:
        """Every ``checkpoint_every`` steps and at the end."""
        s = self.step
        return s % self.settings.checkpoint_every == 0 or s == self.settings.steps

    def save_if_due(self) -> None:
        """Checkpoint every ``checkpoint_every`` steps and at the end; first the kept
        checkpoint of the step, if any (so a kill between the two loses neither: the resumed
        run passes the step again)."""
        self.keep_if_due()
        if self.checkpoint_due():
            save_stack(self)

    # --- checkpoints over training ---
    def keep_if_due(self) -> None:
        """Write the kept checkpoints of this step (``keep_checkpoints``), if it is one."""
        if self.settings.keeps(self.step):
            keep_stack(self, self.single)

    def recover(self) -> None:
        recover_checkpoint(self.out / "checkpoint")
        remove_leftovers(self.out, LEFTOVERS)
        remove_kept_leftovers(self.out)

    def resume(self) -> None:
        if resume_stack(self):
            self.upload()

    def start_over(self) -> None:
        start_over(self.out)

    def write_config(self) -> None:
        """``out/config.json``: the run's settings, or a list of the stack's."""
        settings = self.settings.to_dict() if self.single else [c.to_dict() for c in self.cfgs]
        atomic_write_text(self.out / "config.json", json.dumps(settings, indent=1))

    def finished(self) -> bool:
        return self.step >= self.settings.steps and bool(self.metrics)

    def finish(self, trained: bool) -> None:
        """The finished run keeps one checkpoint: the previous one is removed."""
        shutil.rmtree(previous_of(self.out / "checkpoint"), ignore_errors=True)

    def description(self) -> str:
        return self.settings.name if self.M == 1 else f"{self.M} stacked runs"

    def kept(self) -> str:
        return _kept_checkpoint(self.out / "checkpoint")

    def begin(self) -> None:
        """The evaluation of the initialization (``eval_at_start``), once."""
        if self.step == 0 and not self.metrics and self.settings.eval_at_start:
            self.evaluate()
        if self.step == 0:
            self.keep_if_due()  # the initialization, when step 0 is kept

    def trained_for(self, seconds: float) -> None:
        self.elapsed += seconds

    def sync_intervals(self) -> list[int]:
        keep = self.settings.keep_checkpoints
        every = [keep] if isinstance(keep, int) else []
        return [self.settings.eval_every, self.settings.checkpoint_every, *every]

    def other_sync_points(self) -> list[int]:
        """The kept steps of a list ``keep_checkpoints``."""
        keep = self.settings.keep_checkpoints
        return list(keep) if isinstance(keep, list) else []

    def elements_per_step(self) -> int:
        return self.M * self.settings.batch_size


def check_stack(configs: list[TrainConfig]) -> None:
    """Refuse an empty stack or runs that cannot train together in one stack."""
    if not configs:
        raise ConfigError("no runs to train", fix="pass at least one TrainConfig")
    if len({c.stack_key() for c in configs}) != 1:
        raise ConfigError(
            "runs in one stack differ in more than " + ", ".join(PER_RUN) + " and gammas",
            fix="group runs by TrainConfig.stack_key()",
        )
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"run names repeat: {names}", fix="give every run its own name")


def _postfix(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The progress bar's numbers (set at each evaluation): the run's, or the mean over a
    stack; ``loss`` is the mean training loss since the evaluation before."""
    keys = ("batch_loss", "test_data_acc", "test_task_inferential", "test_task_symmetric")
    r = (
        rows[0]
        if len(rows) == 1
        else {k: float(np.nanmean([row[k] for row in rows])) for k in keys}
    )
    return dict(
        loss=f"{r['batch_loss']:.3f}",
        data=f"{r['test_data_acc']:.2f}",
        inf=f"{r['test_task_inferential']:.2f}",
        sym=f"{r['test_task_symmetric']:.2f}",
    )


def _kept_checkpoint(root: Path) -> str:
    """What checkpoint a stopped run leaves: which step, or that there is none."""
    try:
        step = json.loads((root / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return kept_checkpoint(None, None)
    return kept_checkpoint(step, root)


def _diverged_error(stack: AnchorStack) -> NumericalError:
    loss = stack.diverged_loss[0]
    what = "loss" if not math.isfinite(loss) else "updated weights"
    return NumericalError(
        f"run {stack.cfgs[0].name!r}: the {what} became NaN/inf at step {stack.diverged[0]}"
        f" (loss {loss}); {_kept_checkpoint(stack.out / 'checkpoint')}",
        fix="lower lr, raise gamma (smaller init) or keep grad_clip on",
    )


def _outputs(stack: AnchorStack, out: Path) -> list[RunOutput]:
    df = pd.DataFrame(stack.metrics)
    outs = []
    for m, cfg in enumerate(stack.cfgs):
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


def train_stack(
    configs: list[TrainConfig],
    out_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
    single: bool = False,
) -> list[RunOutput]:
    """Train runs of one shape together as one stacked model; each gets its own checkpoint.

    Checkpoints go to ``out_dir/checkpoint/<run name>/`` (or ``out_dir/checkpoint/`` when
    ``single``), metrics of all runs to ``out_dir/metrics.jsonl`` (column ``run``). The
    settings, the device and the memory the run needs are checked before anything is built; the
    folder is locked against a second writer while the run trains
    (:func:`~probekit.training.loop.train_in_folder`).

    Example:
        >>> import tempfile
        >>> from probekit.anchor import AnchorTask, TrainConfig
        >>> from probekit.training.models import ModelConfig
        >>> task = AnchorTask(n_train=64, n_test=16)
        >>> cfgs = [TrainConfig(model=ModelConfig(d_model=16, n_heads=2, gamma=g), task=task,
        ...         name=f"g{g}", steps=2, batch_size=8, eval_every=2) for g in (0.3, 0.8)]
        >>> [o.name for o in train_stack(cfgs, tempfile.mkdtemp(), progress=False)]
        ['g0.3', 'g0.8']
    """
    configs = list(configs)
    check_stack_fits(configs)
    out = Path(out_dir)
    stack = AnchorStack(configs, out, single=single)
    train_in_folder(stack, resume=resume, progress=progress)
    return _outputs(stack, out)


#: files written atomically into a run folder, whose ``.<name>.*.tmp`` a kill may leave
LEFTOVERS = ("metrics.jsonl", "config.json", "run_config.json")


def stack_bytes(configs: list[TrainConfig]) -> int:
    """Estimated bytes of training ``configs`` (TrainConfigs of one shape) as one stack."""
    c0 = configs[0]
    m, task = c0.model, c0.task
    M = len(configs)
    params = M * m.n_params() * TRAIN_BYTES_PER_PARAM
    # tokens, targets and six bookkeeping tensors per sequence, int64, plus numpy's copy
    data = 2 * (task.n_train + 2 * task.n_test) * (task.seq_len + 8) * 8
    per_token = 16 * m.d_model + 2 * m.mlp_width() + m.n_heads * task.seq_len
    acts = M * c0.batch_size * task.seq_len * m.n_layers * per_token * 4
    logits = M * c0.batch_size * m.vocab_size * 4 * 3
    return params + data + acts + logits + m.n_layers * LAYER_OVERHEAD_BYTES


def check_stack_fits(configs: list[TrainConfig]) -> torch.device:
    """The stack's device, once its settings and memory are checked (nothing is built)."""
    check_stack(configs)
    first = configs[0]
    what = f"training {len(configs)} stacked run(s) of {first.model.n_params()} parameters"
    return checked_device(first, first.device, stack_bytes(configs), what)


def start_over(out: Path) -> None:
    """``resume=False``: remove the folder's checkpoints and metrics before training."""
    for name in ("checkpoint", "checkpoint.previous", KEPT):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike,
    resume: bool = True,
    progress: bool = True,
) -> RunOutput:
    """Train one run; resume from ``out_dir/checkpoint`` when it exists (and ``resume``).

    Returns a :class:`RunOutput` whose ``checkpoint`` opens with
    ``GPT2LMHeadModel.from_pretrained`` and ``probekit.load``. See the module docstring.
    """
    return train_stack([config], out_dir, resume=resume, progress=progress, single=True)[0]


__all__ = [
    "AnchorStack",
    "RunOutput",
    "batch_indices",
    "check_stack",
    "check_stack_fits",
    "stack_bytes",
    "start_over",
    "train",
    "train_stack",
]
