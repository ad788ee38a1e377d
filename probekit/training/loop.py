"""The training loop both trainers run, and the settings every training run has.

:class:`RunSettings` declares the settings every trainer's config shares (the task packages'
configs above: :class:`~probekit.lm.config.LMConfig`,
:class:`~probekit.anchor.config.TrainConfig`): seed, steps, batch size, the AdamW schedule, the
evaluation interval, precision and determinism, with their checks and the learning-rate
schedule. The configs inherit them, so their constructor keywords and saved fields are the
fields of one class.

A :class:`Trainer` is one run (or one stack of runs) as the loop sees it; each trainer supplies
its own work (prepare an interval's batches, one step, the divergence check, evaluate, save,
and its run folder's recovery, resumption and config) and the loop does the rest:

* :func:`run_loop`: from ``trainer.step`` to the end, in intervals between sync points (an
  evaluation, a checkpoint, a trainer's own stops such as growth stages, the end). An interval's
  batches go to the device in one copy and its steps queue there without the host waiting; the
  loss sums and the divergence flags stay on the device (:func:`first_failure`) and are read at
  the sync point, where a run that diverged stops before anything is saved. At a sync point the
  loop evaluates when an evaluation is due, calls the per-step seam, then saves when a save is
  due, so a checkpoint never lacks its metrics row.
* :func:`train_in_folder`: lock the run folder -> recover what a kill left -> resume (or start
  over) -> write the run's config -> the loop -> finish.

Example:
    >>> s = RunSettings(steps=10, warmup_steps=2, lr=1e-3)
    >>> s.lr_at(0), s.lr_at(1)
    (0.0005, 0.001)
    >>> RunSettings(steps=0).validate_run()
    Traceback (most recent call last):
    ...
    probekit.errors.ConfigError: steps = 0 must be a positive integer. Fix: ...
"""

from __future__ import annotations

import errno
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import torch

from probekit.errors import CheckpointError, ConfigError
from probekit.training.checks import (
    MAX_STEPS,
    STEPS_WHY,
    check_bounded,
    check_flag,
    check_int,
    check_real,
    check_seed,
)
from probekit.training.lock import LOCK_NAME, run_folder_lock
from probekit.training.memory import check_fits
from probekit.training.precision import (
    check_deterministic,
    check_precision,
    deterministic_mode,
    to_device,
)
from probekit.training.schedule import resolve_device, warmup_cosine

#: most batch elements (indices or tokens) held on the device at once (int64: 64 MiB)
MAX_PREPARED = 2**23


@dataclass
class RunSettings:
    """The settings every training run has (the defaults suit a small task run; a config may
    set its own).

    ``seed`` draws the initialization and the batch order. ``steps`` AdamW updates of
    ``batch_size`` sequences; the learning rate warms up linearly from 0 to ``lr`` over
    ``warmup_steps`` and decays on a cosine to ``min_lr_ratio`` times ``lr``
    (:func:`~probekit.training.schedule.warmup_cosine`). ``weight_decay`` is decoupled;
    ``grad_clip`` <= 0 turns gradient clipping off. The run is evaluated every ``eval_every``
    steps and at the end. ``precision`` ("auto": bf16 autocast on CUDA, fp32 on CPU; "fp32";
    "bf16") and ``deterministic`` (``torch.use_deterministic_algorithms(True)`` while
    training): see :mod:`probekit.training.precision`.

    Example:
        >>> RunSettings(lr=3e-3).lr_at(0) < RunSettings(lr=3e-3).lr_at(100)
        True
    """

    seed: int = 0
    steps: int = 2000
    batch_size: int = 256
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 100
    precision: str = "auto"
    deterministic: bool = False

    #: the examples the fix of a bad setting suggests (a config with other defaults sets its own)
    EXAMPLES: ClassVar[dict[str, str]] = {
        "weight_decay": "0 or e.g. 0.01",
        "min_lr_ratio": "e.g. 0.0 or 0.1",
    }

    def validate_run(self) -> None:
        """Raise :class:`~probekit.errors.ConfigError` naming the first bad shared setting."""
        for name in ("steps", "batch_size", "eval_every"):
            check_int(name, getattr(self, name))
        check_bounded("steps", self.steps, MAX_STEPS, STEPS_WHY)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_seed("seed", self.seed)
        check_real("lr", self.lr, positive=True, example="e.g. 1e-3")
        check_real("weight_decay", self.weight_decay, 0, example=self.EXAMPLES["weight_decay"])
        check_real("grad_clip", self.grad_clip, example="e.g. 1.0 (<= 0 turns clipping off)")
        check_real("min_lr_ratio", self.min_lr_ratio, 0, 1, example=self.EXAMPLES["min_lr_ratio"])
        self._check_decay()
        check_precision(self.precision)
        check_flag("deterministic", self.deterministic)

    def _check_decay(self) -> None:
        """Refuse ``lr * weight_decay >= 1``: the decoupled decay multiplies every weight by
        ``1 - lr * weight_decay`` at the peak of the schedule, which then zeroes the weights or
        flips their sign at each step (and overflows to NaN for ``--lr 1e300``)."""
        product = self.lr * self.weight_decay
        if product >= 1:
            raise ConfigError(
                f"lr {self.lr!r} x weight_decay {self.weight_decay!r} = {product:.3g} is not "
                "below 1: the decoupled weight decay multiplies every weight by 1 - lr x "
                "weight_decay at each step, which zeroes or flips them",
                fix="lower lr or weight_decay so that their product is well below 1 "
                "(e.g. lr 1e-3, weight_decay 0.01)",
            )

    def last_evaluation(self, step: int) -> int:
        """The step of the last evaluation at or before ``step`` (every ``eval_every`` and the
        end): the metrics row a checkpoint at ``step`` must find."""
        return step if step == self.steps else step - step % self.eval_every

    def lr_at(self, step: int) -> float:
        """Learning rate of update ``step`` (0-based): linear warmup then cosine decay."""
        return self.lr * self.schedule(step)

    def schedule(self, step: int) -> float:
        """The schedule's multiplier of ``lr`` at update ``step`` (:func:`warmup_cosine`)."""
        return warmup_cosine(step, self.steps, self.warmup_steps, self.min_lr_ratio)


#: the names of the shared run settings
RUN_SETTINGS = tuple(f.name for f in fields(RunSettings))


def checked_device(settings: RunSettings, device: str | None, needs: int, what: str):
    """The device a run trains on, once its determinism setting and memory are checked there
    (``needs`` bytes for ``what``); raises :class:`~probekit.errors.ConfigError` otherwise."""
    dev = resolve_device(device)
    check_deterministic(settings.deterministic, dev)
    check_fits(needs, dev, what)
    return dev


def first_failure(at: torch.Tensor, finite: torch.Tensor, step: int):
    """Record on the device the first step at which ``finite`` is false.

    ``at`` holds that step (-1: none yet); returns the updated ``at`` and the mask of the
    entries that failed for the first time now, without the host waiting for the device.

    Example:
        >>> finite = torch.tensor([True, False, False])
        >>> at, new = first_failure(torch.tensor([-1, 2, -1]), finite, 5)
        >>> at.tolist(), new.tolist()
        ([-1, 2, 5], [False, False, True])
    """
    new = (at < 0) & ~finite
    return torch.where(new, step, at), new


def read_on_host(*tensors: torch.Tensor) -> list:
    """The values of device tensors of one shape, as float64 lists, in one copy (a host sync)."""
    return torch.stack([t.double() for t in tensors]).tolist()


def kept_checkpoint(step: int | None, folder: Path | None) -> str:
    """What a stopped run leaves: the checkpoint of ``step`` in ``folder``, or none."""
    if step is None:
        return "no checkpoint was written before it"
    return f"the checkpoint of step {step} in {folder} is kept"


class Trainer(ABC):
    """One run (or one stack of runs) as :func:`run_loop` and :func:`train_in_folder` drive it.

    A subclass holds ``settings`` (a :class:`RunSettings`), ``device``, the run folder ``out``
    and the step reached, and supplies the abstract methods; the others are hooks that do
    nothing unless a trainer needs them.
    """

    settings: RunSettings
    device: torch.device
    out: Path
    step: int = 0
    #: the prepared batches of steps ``batch_start ..`` on the device (see :meth:`hold_batches`)
    batches: torch.Tensor | None = None
    batch_start: int = 0

    # ---------------------------------------------------------------- the trainer's own work
    @abstractmethod
    def prepare(self, stop: int) -> None:
        """Build the batches of steps ``self.step .. stop - 1`` and :meth:`hold_batches` them."""

    @abstractmethod
    def train_step(self) -> torch.Tensor:
        """One update at ``self.step`` (then ``self.step += 1``); nothing here waits for the
        device. Returns the training loss (on the device)."""

    @abstractmethod
    def check(self) -> None:
        """At a sync point: read the run state kept on the device and raise
        :class:`~probekit.errors.NumericalError` if the run diverged."""

    @abstractmethod
    def evaluate(self) -> Any:
        """Evaluate at ``self.step``, append the metrics rows and write ``metrics.jsonl``."""

    @abstractmethod
    def progress_numbers(self) -> dict[str, Any]:
        """The progress bar's numbers after an evaluation."""

    @abstractmethod
    def save_if_due(self) -> None:
        """At a sync point, after the evaluation: write the checkpoint due at ``self.step``."""

    # ---------------------------------------------------------------- the run folder
    @abstractmethod
    def recover(self) -> None:
        """Undo what a kill left in ``out``: half-swapped checkpoints, ``.*.tmp`` files."""

    @abstractmethod
    def resume(self) -> None:
        """Go on from the last complete checkpoint in ``out`` (none: from step 0)."""

    @abstractmethod
    def start_over(self) -> None:
        """``resume=False``: remove the checkpoints and metrics of an earlier run in ``out``."""

    @abstractmethod
    def write_config(self) -> None:
        """Write the run's settings into ``out``."""

    @abstractmethod
    def finished(self) -> bool:
        """Whether the folder already holds the whole run (then nothing is trained)."""

    def finish(self, trained: bool) -> None:
        """After training (``trained``: whether the loop ran), still holding the folder lock."""
        return None  # nothing to do unless a trainer needs it

    def kept(self) -> str:
        """What a stopped run leaves in ``out``: which checkpoint, or that there is none."""
        return "the checkpoints already in the folder are kept"

    # ---------------------------------------------------------------- hooks
    def description(self) -> str:
        """The progress bar's label."""
        return "train"

    def begin(self) -> None:
        """Before the first interval (e.g. the evaluation at step 0)."""
        return None  # nothing to do unless a trainer needs it

    def begin_interval(self) -> None:
        """Before each interval is planned (e.g. growing the model at a stage boundary)."""
        return None  # nothing to do unless a trainer needs it

    def after_step(self) -> None:
        """After every update, before a save: the per-step hook (tests replace it on
        :class:`~probekit.anchor.training.AnchorStack` or
        :class:`~probekit.lm.training.LMTrainer` to simulate a kill after a given step)."""
        return None  # nothing to do unless a trainer needs it

    def trained_for(self, seconds: float) -> None:
        """The seconds an interval's steps took, up to its sync point's device read."""
        return None  # nothing to do unless a trainer needs it

    def end(self) -> None:
        """After the loop, also when it stopped on an error."""
        return None  # nothing to do unless a trainer needs it

    def sync_intervals(self) -> list[int]:
        """Every how many steps the loop stops to sync: evaluations, checkpoints."""
        return [self.settings.eval_every]

    def other_sync_points(self) -> list[int]:
        """Steps the loop stops at besides the intervals' (e.g. growth stages)."""
        return []

    def elements_per_step(self) -> int:
        """How many int64 elements a step's prepared batch holds."""
        return self.settings.batch_size

    # ---------------------------------------------------------------- shared
    def hold_batches(self, batches: torch.Tensor) -> None:
        """Send the batches of steps ``self.step ..`` to the device in one copy."""
        self.batches, self.batch_start = to_device(batches, self.device), self.step

    def batch_at(self, step: int) -> torch.Tensor:
        """The prepared batch of ``step`` (prepared now when :meth:`prepare` did not)."""
        if self.batches is None or not 0 <= step - self.batch_start < self.batches.shape[0]:
            self.prepare(step + 1)
        assert self.batches is not None, "prepare() holds the batches"
        return self.batches[step - self.batch_start]

    def run_steps(self, stop: int, each=None) -> None:
        """Train up to ``stop`` (from the batches of :meth:`prepare`) without waiting for the
        device; ``each()`` after every step but the last."""
        while self.step < stop:
            self.train_step()
            if each is not None and self.step < stop:
                each()

    def next_stop(self) -> tuple[int, bool]:
        """The step the loop next stops at, and whether it is a sync point (an evaluation, a
        checkpoint, another sync point, the end) rather than the end of the prepared batches."""
        s = self.step
        stops = [self.settings.steps] + [s - s % k + k for k in self.sync_intervals()]
        sync = min(stops + [b for b in self.other_sync_points() if b > s])
        room = max(1, MAX_PREPARED // self.elements_per_step())
        return min(sync, s + room), s + room >= sync

    def checkpoint_due(self) -> bool:
        """Whether :meth:`save_if_due` writes a checkpoint at ``self.step`` (a trainer that
        saves on its own schedule says when)."""
        return False

    def evaluation_due(self) -> bool:
        """Whether ``self.step`` is an evaluation step (every ``eval_every`` and the end)."""
        step, settings = self.step, self.settings
        return step % settings.eval_every == 0 or step == settings.steps


@contextmanager
def _saying(bar: Any, what: str) -> Iterator[None]:
    """Name ``what`` the loop does on its live line while it does it (an evaluation, a
    checkpoint: seconds in which no step is counted)."""
    if not what or bar.disable:
        yield
        return
    desc = bar.desc
    bar.set_description_str(f"{desc}: {what}", refresh=True)
    try:
        yield
    finally:
        bar.set_description_str(desc, refresh=False)


def run_loop(trainer: Trainer, progress: bool = True) -> None:
    """Train from ``trainer.step`` to the end: evaluate and save at their intervals.

    The steps between two sync points queue on the device without waiting for it; the run
    state kept there comes back at a sync point (:meth:`Trainer.check`), where a run that
    diverged stops. Order at a sync point: check, evaluate (when due), the per-step seam,
    save (when due)."""
    from probekit.progress import bar as progress_bar

    total = trainer.settings.steps
    trainer.begin()
    bar = progress_bar(
        total=total,
        initial=trainer.step,
        disable=not progress,
        desc=trainer.description(),
        dynamic_ncols=True,
        leave=False,
    )

    def each() -> None:
        trainer.after_step()
        bar.update(1)

    try:
        while trainer.step < total:
            trainer.begin_interval()
            stop, sync = trainer.next_stop()
            start = time.perf_counter()
            trainer.prepare(stop)
            trainer.run_steps(stop, each)
            if sync:
                trainer.check()
            trainer.trained_for(time.perf_counter() - start)
            if sync and trainer.evaluation_due():
                with _saying(bar, "evaluating"):
                    trainer.evaluate()
                bar.set_postfix(**trainer.progress_numbers(), refresh=False)
            each()
            if sync:
                with _saying(bar, "saving a checkpoint" if trainer.checkpoint_due() else ""):
                    trainer.save_if_due()
    finally:
        bar.close()
        trainer.end()


def train_in_folder(trainer: Trainer, resume: bool = True, progress: bool = True) -> None:
    """The whole run in ``trainer.out``: lock the folder against a second writer, recover what
    a kill left, resume (or start over), write the run's config, train, finish.

    A folder that already holds the whole run is not trained again. A full disk (or quota) at
    any write is one :class:`~probekit.errors.CheckpointError` naming the checkpoint that is
    kept (:meth:`Trainer.kept`); the half-written one is removed by its writer."""
    with run_folder_lock(trainer.out):
        try:
            _train_locked(trainer, resume, progress)
        except Exception as err:
            if not disk_full(err):
                raise
            raise CheckpointError(
                f"no space left on the disk of {trainer.out} to write step {trainer.step}; "
                f"{trainer.kept()}",
                fix="free disk space (or train into a folder on another disk) and run the same "
                "command again: it resumes from that checkpoint",
            ) from err


def _train_locked(trainer: Trainer, resume: bool, progress: bool) -> None:
    """:func:`train_in_folder`'s work once the folder is locked."""
    trainer.recover()
    if resume:
        trainer.resume()
    else:
        trainer.start_over()
    fresh = _holds_nothing(trainer.out)
    trainer.write_config()
    try:
        trained = not trainer.finished()
        if trained:
            with deterministic_mode(trainer.settings.deterministic, trainer.device):
                run_loop(trainer, progress)
        trainer.finish(trained)
    except Exception:
        if fresh:  # a run that fails before its first checkpoint leaves nothing behind
            _remove_records(trainer.out)
        raise


RUN_RECORDS = ("config.json", "run_config.json", "metrics.jsonl")
"""The files a run writes before its first checkpoint: its settings and metrics."""


def _holds_nothing(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but the run-folder lock."""
    return all(entry.name == LOCK_NAME for entry in folder.iterdir())


def _remove_records(folder: Path) -> None:
    """Remove the :data:`RUN_RECORDS` of a run that wrote nothing else into ``folder`` (no
    checkpoint): a failed first start leaves the folder as it found it."""
    written = {entry.name for entry in folder.iterdir()} - {LOCK_NAME}
    if written <= set(RUN_RECORDS):
        for name in written:
            (folder / name).unlink(missing_ok=True)


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` reports a full disk or an exhausted quota (an ``OSError`` with ENOSPC
    or EDQUOT, or the safetensors writer's own error saying so).

    Example:
        >>> import errno
        >>> disk_full(OSError(errno.ENOSPC, "No space left on device")), disk_full(OSError())
        (True, False)
    """
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    words = str(err).lower()
    return type(err).__name__ == "SafetensorError" and (
        "no space left" in words or "quota exceeded" in words
    )


__all__ = [
    "MAX_PREPARED",
    "RUN_RECORDS",
    "RUN_SETTINGS",
    "RunSettings",
    "Trainer",
    "checked_device",
    "disk_full",
    "first_failure",
    "kept_checkpoint",
    "read_on_host",
    "run_loop",
    "train_in_folder",
]
