"""Fine-tune a byte-level LM on the composition task, and measure its exact-match accuracy.

:func:`finetune_lm` starts from a pretrained LM run (its folder or one of its checkpoints) --
or, for training on the task from scratch, from a fresh model of an :class:`LMConfig` -- and
trains it on the training split of a :class:`~probekit.tasks.compositions.CompositionTask`
with the LM run's AdamW, schedule and loop (:class:`FinetuneTrainer`, an
:class:`~probekit.lm.training.LMTrainer` on other batches): a fresh optimizer, each step a
batch of ``batch_size`` examples drawn as a function of (seed, step), and the cross-entropy on
the answer bytes only (the answer and its closing newline; the prompt carries no loss). The
run folder is an LM run's (``run_config.json`` of kind ``"lm"`` with the task under
``"finetune"``, ``metrics.jsonl``, ``step{n}/`` every ``save_every`` steps, ``final/``),
written atomically and resumed after a kill as :func:`~probekit.lm.training.train_lm`'s runs
are; it also holds ``accuracy.csv`` and ``accuracy.json`` (:func:`composition_accuracy` of the
final model). Its metrics rows: ``train_loss`` (answer bytes), ``val_loss`` and
``heldout_loss`` (answer loss on the seen and the held-out test split), ``seen_accuracy`` and
``heldout_accuracy`` (exact match, as below), ``flops`` (6 x parameters x tokens).

:func:`composition_accuracy` scores exact match by greedy decoding: from each prompt the model
writes ``answer_width`` bytes, each the argmax after the ones before, and an answer is right
when the bytes up to and including its first newline are the answer and that newline. (This
equals teacher-forced exact match -- every answer byte the argmax after the right prefix --
which the metrics rows use: one forward, the same number.) It reports the seen combinations
on unseen inputs, the held-out combinations, each family and each combination in one tidy
table.

Example:
    >>> import tempfile
    >>> task = CompositionTask(n_train=64, n_test=8)
    >>> model = LMConfig(n_layers=2, d_model=16, n_heads=2, seq_len=48)
    >>> cfg = FinetuneConfig(task=task, steps=2, batch_size=4, eval_every=2)
    >>> run = finetune_lm(model, tempfile.mkdtemp(), cfg, progress=False, device="cpu")
    >>> sorted(run.accuracy.summary)[:3], run.final.name
    (['accuracy_arithmetic', 'accuracy_case', 'heldout_accuracy'], 'final')
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from probekit.errors import CheckpointError, ConfigError
from probekit.io import atomic_write_text
from probekit.lm.checkpoints import adamw, load_checkpoint, save_checkpoint
from probekit.lm.config import LMConfig
from probekit.lm.corpus import VOCAB_SIZE
from probekit.lm.training import LMTrainer, lm_run_bytes
from probekit.tasks.compositions import IGNORE, CompositionData, CompositionTask
from probekit.training.checkpoint import FIX, check_same_settings, read_run_config, write_run_config
from probekit.training.checks import check_optional_int
from probekit.training.loop import RUN_SETTINGS, RunSettings, checked_device, train_in_folder
from probekit.training.metrics import write_metrics
from probekit.training.precision import autocast, resolve_precision


@dataclass
class FinetuneConfig(RunSettings):
    """A fine-tuning run: the shared run settings (seed, steps, batch size, AdamW schedule,
    ``eval_every``, precision; fine-tuning defaults here), the task and ``save_every``."""

    task: CompositionTask = field(default_factory=CompositionTask)
    steps: int = 500
    batch_size: int = 32
    lr: float = 3e-4
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    eval_every: int = 100
    save_every: int | None = None

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad setting, before any work."""
        if not isinstance(self.task, CompositionTask):
            raise ConfigError(
                f"task {self.task!r} is not a CompositionTask", fix="pass task=CompositionTask(...)"
            )
        self.task.validate()
        self.validate_run()
        check_optional_int("save_every", self.save_every)

    def settings(self) -> dict[str, Any]:
        """The settings as JSON types (what a resumed run must share)."""
        out = asdict(self)
        out["task"] = self.task.to_dict()
        return json.loads(json.dumps(out))


@dataclass
class FinetuneRun:
    """What :func:`finetune_lm` returns: the metrics, final checkpoint, FLOPs, the
    checkpoints written and the final model's :class:`CompositionAccuracy`."""

    metrics: pd.DataFrame
    final: Path
    flops: float
    checkpoints: list[Path]
    accuracy: CompositionAccuracy


@dataclass
class CompositionAccuracy:
    """Exact-match accuracy on the composition task's test splits.

    ``df``: one row per combination (``family``, ``first``, ``second``, ``split``: "seen" or
    "heldout", ``n``, ``correct``, ``accuracy``); ``summary``: ``seen_accuracy``,
    ``heldout_accuracy`` and per family ``accuracy_<family>`` / ``seen_accuracy_<family>`` /
    ``heldout_accuracy_<family>``; ``examples``: one row per example (the prompt's
    combination, input, answer, the decoded bytes and whether they match)."""

    df: pd.DataFrame
    summary: dict[str, float]
    examples: pd.DataFrame

    def by_family(self) -> pd.DataFrame:
        """Accuracy per family and split (rows: family, split, n, correct, accuracy)."""
        grouped = self.df.groupby(["family", "split"], as_index=False)[["n", "correct"]].sum()
        grouped["accuracy"] = grouped["correct"] / grouped["n"]
        return grouped


# ---- the trainer ------------------------------------------------------------------------------
class FinetuneTrainer(LMTrainer):
    """The LM trainer on the composition task: batches of examples with their answer labels,
    the loss on the answer bytes, evaluation on the test splits."""

    def __init__(
        self,
        cfg: LMConfig,
        finetune: FinetuneConfig,
        start: Path | torch.nn.Module | None,
        out: Path,
        device: torch.device,
    ) -> None:
        self.cfg = self.settings = cfg
        self.finetune = finetune
        self.start_from = start
        self.out = out
        self.plan = cfg.plan()
        self.device = device
        self.precision = resolve_precision(cfg.precision, device)
        task = finetune.task
        train = task.dataset("train")
        self.train_tokens, self.train_labels = train.sequences, train.labels()
        self.tests = {"seen": task.dataset("seen"), "heldout": task.dataset("heldout")}
        self.model = _start_model(cfg, start, device)
        self.start_weights = weights_fingerprint(self.model)
        self.optimizer = adamw(self.model, cfg)
        self.stages: dict[int, int] = {}
        self.scaler = None
        self.scale_start_step = 0
        self.step, self.flops, self.seconds = 0, 0.0, 0.0
        self.started = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []
        self.batches: torch.Tensor | None = None
        self.batch_start = 0
        none = torch.tensor(-1, device=self.device)
        self.last_loss = torch.tensor(float("nan"), device=self.device)
        self.bad_loss_step, self.bad_loss, self.bad_weight_step = none, self.last_loss, none
        T = task.seq_len
        causal = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        self.causal = causal[None, None].expand(cfg.batch_size, 1, T, T)
        self.accuracy: CompositionAccuracy | None = None

    def state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "flops": self.flops,
            "finetune": self.finetune.settings(),
            "start_weights": self.start_weights,
        }

    def save(self, path: Path) -> Path:
        return save_checkpoint(self.model, self.optimizer, path, self.cfg, self.state())

    def write_config(self) -> None:
        origin = self.start_from
        start = (
            "scratch" if origin is None else str(origin) if isinstance(origin, Path) else "model"
        )
        settings = {
            "lm": asdict(self.cfg),
            "finetune": {**self.finetune.settings(), "start": start},
        }
        write_run_config(self.out, "lm", settings)

    def _resume_from(self, folder: Path, step: int) -> None:
        """Refuse a checkpoint of another fine-tuning (task, settings), then load it."""
        try:
            state = json.loads((folder / "trainer_state.json").read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(
                f"{folder / 'trainer_state.json'} is unreadable", fix=FIX
            ) from err
        saved = state.get("finetune") if isinstance(state, dict) else None
        check_same_settings(folder, saved, self.finetune.settings())
        started = state.get("start_weights") if isinstance(state, dict) else None
        if started is not None and started != self.start_weights:
            raise CheckpointError(
                f"{folder} fine-tunes other starting weights (fingerprint {started}) than the "
                f"ones given now ({self.start_weights}): resuming would mix two fine-tunings",
                fix="start from the weights this run was fine-tuned from, or use a new out_dir",
            )
        super()._resume_from(folder, step)

    def prepare(self, stop: int) -> None:
        """Steps ``self.step .. stop - 1``: each ``[2, batch, L]`` (tokens, labels), the
        examples drawn as a function of (seed, step)."""
        n, size = self.train_tokens.shape[0], self.cfg.batch_size
        batches = []
        for s in range(self.step, stop):
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + s)
            pick = torch.randint(0, n, (size,), generator=g)
            batches.append(torch.stack([self.train_tokens[pick], self.train_labels[pick]]))
        self.hold_batches(torch.stack(batches))

    def batch_loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Cross-entropy on the answer bytes only (labels ``-100`` elsewhere)."""
        tokens, labels = batch[0], batch[1]
        with autocast(self.device, self.precision):
            logits = self.model(tokens, attention_mask=self.causal, use_cache=False).logits
        return F.cross_entropy(
            logits.float().reshape(-1, VOCAB_SIZE), labels.reshape(-1), ignore_index=IGNORE
        )

    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.finetune.task.seq_len

    def elements_per_step(self) -> int:
        return 2 * self.tokens_per_step()

    def evaluate(self) -> float:
        """Answer loss and teacher-forced exact match on both test splits; a metrics row."""
        scores = {
            name: answer_scores(self.model, d, self.device, self.precision)
            for name, d in self.tests.items()
        }
        self.rows.append(
            {
                "step": self.step,
                "depth": self.model.config.n_layer,
                "lr": self.optimizer.param_groups[0]["lr"],
                "train_loss": float(self.last_loss),
                "val_loss": scores["seen"][0],
                "heldout_loss": scores["heldout"][0],
                "seen_accuracy": scores["seen"][1],
                "heldout_accuracy": scores["heldout"][1],
                "flops": self.flops,
                "seconds": self.seconds + time.perf_counter() - self.started,
            }
        )
        write_metrics(self.out / "metrics.jsonl", self.rows)
        return scores["seen"][0]

    def progress_numbers(self) -> dict[str, Any]:
        row = self.rows[-1]
        return dict(
            loss=f"{row['train_loss']:.3f}",
            seen=f"{row['seen_accuracy']:.2f}",
            heldout=f"{row['heldout_accuracy']:.2f}",
        )

    def description(self) -> str:
        return "fine-tune"

    def finish(self, trained: bool) -> None:
        """Write ``final`` (when trained), then the final model's accuracy tables."""
        super().finish(trained)
        data = self.tests["seen"].concat([self.tests["heldout"]])
        self.accuracy = composition_accuracy(self.model, data, batch_size=256)
        atomic_write_text(self.out / "accuracy.csv", self.accuracy.df.to_csv(index=False))
        atomic_write_text(self.out / "accuracy.json", json.dumps(self.accuracy.summary, indent=1))


def weights_fingerprint(model: torch.nn.Module) -> str:
    """The first 16 hex digits of the SHA-256 of a model's weights (names and float32 values,
    in name order): what a fine-tuning records of the weights it started from, so a resume
    from other starting weights is refused.

    Example:
        >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> print(weights_fingerprint(a) == weights_fingerprint(a))
        True
        >>> print(weights_fingerprint(a) == weights_fingerprint(b))
        False
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _start_model(cfg: LMConfig, start: Path | torch.nn.Module | None, device: torch.device):
    """The pretrained checkpoint's model, a copy of a model in memory, or (``start`` None) a
    fresh one seeded by ``cfg.seed``."""
    import copy

    import transformers

    if isinstance(start, torch.nn.Module):
        return copy.deepcopy(start).float().to(device).train()
    if start is not None:
        model, _ = load_checkpoint(start, cfg, 0, device)  # a fresh optimizer: its moments unused
        return model
    torch.manual_seed(cfg.seed)
    model = transformers.GPT2LMHeadModel(cfg.hf_config(cfg.n_layers))
    return model.to(device).train()  # type: ignore[arg-type]


def pretrained_checkpoint(path: str | os.PathLike) -> tuple[Path, LMConfig]:
    """The checkpoint to start from (a run folder's ``final/``, or the checkpoint folder
    itself) and its run's :class:`LMConfig`; :class:`ConfigError` when it is not an LM run's."""
    folder = Path(path)
    if (folder / "final").is_dir():
        folder = folder / "final"
    stored = read_run_config(folder) if folder.is_dir() else None
    if not isinstance(stored, dict) or not isinstance(stored.get("lm"), dict):
        raise ConfigError(
            f"{path} is not a byte-level LM run folder or checkpoint (no LM run_config.json)",
            fix="pass the folder of a train_lm run (or its final/ checkpoint), or an LMConfig "
            "to train from scratch",
        )
    fields = LMConfig.__dataclass_fields__
    settings = {k: v for k, v in stored["lm"].items() if k in fields}
    return folder, LMConfig(**settings)


def model_lm_config(model: Any) -> tuple[torch.nn.Module, LMConfig]:
    """A byte-level GPT-2 in memory (a ``transformers.GPT2LMHeadModel`` or a probekit
    ``Model`` of one) and the :class:`LMConfig` of its shape; :class:`ConfigError` for any
    other model."""
    hf = getattr(model, "hf_model", model)
    config: Any = getattr(hf, "config", None)
    if type(hf).__name__ != "GPT2LMHeadModel" or getattr(config, "vocab_size", None) != VOCAB_SIZE:
        raise ConfigError(
            f"cannot fine-tune a {type(hf).__name__} on the composition task: it needs a "
            f"byte-level GPT-2 (GPT2LMHeadModel of vocabulary {VOCAB_SIZE})",
            fix="pass a train_lm run folder, a checkpoint of one, its model, or an LMConfig",
        )
    shape = dict(
        n_layers=config.n_layer,
        d_model=config.n_embd,
        n_heads=config.n_head,
        d_mlp=config.n_inner,
        seq_len=config.n_positions,
    )
    return hf, LMConfig(**shape)


def finetune_config(model: LMConfig, finetune: FinetuneConfig) -> LMConfig:
    """The LM run settings of a fine-tuning: the model's, with the fine-tuning's run settings
    (a static run: the pretrained depth, no growth)."""
    run = {name: getattr(finetune, name) for name in RUN_SETTINGS}
    return replace(
        model, **run, growth="static", residual_scale_start=None, save_every=finetune.save_every
    )


def finetune_lm(
    start: str | os.PathLike | LMConfig | Any,
    out_dir: str | os.PathLike,
    cfg: FinetuneConfig | None = None,
    *,
    progress: bool = True,
    device: str | None = None,
    resume: bool = True,
) -> FinetuneRun:
    """Fine-tune the LM ``start`` on ``cfg.task`` into the run folder ``out_dir``.

    ``start``: a :func:`~probekit.lm.train_lm` run folder (its ``final/``) or checkpoint
    folder; a byte-level GPT-2 in memory (its ``GPT2LMHeadModel`` or a probekit ``Model`` of
    it: copied, the caller's model is not changed); or an :class:`LMConfig` for a fresh model
    (training on the task from scratch).
    Bad settings, a task longer than the model's context and a folder that is not an LM run
    are refused before anything is written. A killed run started again with the same
    arguments resumes from its last checkpoint (set ``cfg.save_every``); a finished one is not
    trained again.
    """
    cfg = FinetuneConfig() if cfg is None else cfg
    cfg.validate()
    origin: Path | torch.nn.Module | None
    if isinstance(start, LMConfig):
        start.validate()
        origin, model_cfg = None, start
    elif isinstance(start, str | os.PathLike):
        origin, model_cfg = pretrained_checkpoint(start)
    else:
        origin, model_cfg = model_lm_config(start)
    lm_cfg = finetune_config(model_cfg, cfg)
    lm_cfg.validate()
    if cfg.task.seq_len > lm_cfg.seq_len:
        raise ConfigError(
            f"the task's sequences of {cfg.task.seq_len} bytes do not fit the model's context "
            f"of {lm_cfg.seq_len}",
            fix="shorten the task (max_letters, max_number) or use a model of a longer seq_len",
        )
    what = "fine-tuning an LM"
    dev = checked_device(lm_cfg, device, lm_run_bytes(lm_cfg, VOCAB_SIZE), what)
    out = Path(out_dir)
    trainer = FinetuneTrainer(lm_cfg, cfg, origin, out, dev)
    train_in_folder(trainer, resume=resume, progress=progress)
    assert trainer.accuracy is not None, "finish() measures it"
    return FinetuneRun(
        pd.DataFrame(trainer.rows),
        out / "final",
        trainer.flops,
        trainer.checkpoints,
        trainer.accuracy,
    )


# ---- scoring -----------------------------------------------------------------------------------
def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


def _logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[n, t, V]`` of a probekit Model, an HF causal LM or a callable."""
    if hasattr(model, "hf_model") and hasattr(model, "logits"):  # a probekit Model
        return model.logits(tokens)
    out = model(tokens.to(_device_of(model)))
    return out.logits if hasattr(out, "logits") else out


@torch.no_grad()
def answer_scores(
    model: Any, data: CompositionData, device: torch.device, precision: str
) -> tuple[float, float]:
    """Answer loss (per answer byte) and teacher-forced exact match of ``data``."""
    was_training = model.training
    model.eval()
    labels = data.labels()
    total, count, right = 0.0, 0, 0
    for tokens, target in zip(data.sequences.split(64), labels.split(64), strict=True):
        with autocast(device, precision):
            logits = model(tokens.to(device), use_cache=False).logits.float()
        target = target.to(device)
        total += float(
            F.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE, reduction="sum")
        )
        scored = target != IGNORE
        count += int(scored.sum())
        hits = (logits.argmax(-1) == target) | ~scored
        right += int(hits.all(-1).sum())
    model.train(was_training)
    return total / max(count, 1), right / max(len(data), 1)


@torch.no_grad()
def greedy_answers(model: Any, data: CompositionData, batch_size: int = 256) -> list[bytes]:
    """The bytes ``model`` writes after each prompt by greedy decoding (as many as the longest
    answer and its newline), each cut after its first newline. ``model``: a probekit Model, an
    HF causal LM or a callable from tokens ``[n, t]`` to logits ``[n, t, V]``."""
    width = int(data.sequences.shape[1] - data.answer_start)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval") and not hasattr(model, "hf_model"):
        model.eval()
    out: list[bytes] = []
    try:
        for prompts in data.tokens.split(batch_size):
            tokens = prompts.clone()
            for _ in range(width):
                step = _logits(model, tokens)[:, -1].argmax(-1).cpu()
                tokens = torch.cat([tokens, step[:, None]], dim=1)
            for row in tokens[:, data.answer_start :].tolist():
                written = bytes(b for b in row if b < 256)
                out.append(written.split(b"\n")[0] + b"\n" if b"\n" in written else written)
    finally:
        if hasattr(model, "train") and not hasattr(model, "hf_model"):
            model.train(was_training)
    return out


def composition_accuracy(
    model: Any, data: CompositionData | CompositionTask, batch_size: int = 256
) -> CompositionAccuracy:
    """Exact-match accuracy by greedy decoding on the composition task's test data.

    ``model``: a probekit Model, an HF causal LM (a fine-tuned one: :func:`finetune_lm`), a
    checkpoint or run folder, or any callable from tokens ``[n, t]`` to logits ``[n, t, V]``;
    ``data``: test data (:meth:`CompositionTask.dataset`), or a task (its "seen" and "heldout"
    splits). Writes no file.

    Example:
        >>> import torch
        >>> task = CompositionTask(n_test=6)
        >>> newline = lambda t: torch.nn.functional.one_hot(torch.full(t.shape, 10), 259).float()
        >>> composition_accuracy(newline, task).summary["seen_accuracy"]
        0.0
    """
    if isinstance(data, CompositionTask):
        data = data.dataset("seen").concat([data.dataset("heldout")])
    if isinstance(model, str | os.PathLike):
        model = _load_model(model)
    written = greedy_answers(model, data, batch_size)
    examples = pd.DataFrame(
        {
            "family": data.families,
            "first": data.firsts,
            "second": data.seconds,
            "split": ["heldout" if h else "seen" for h in data.is_heldout.tolist()],
            "input": data.inputs,
            "answer": data.outputs,
            "written": [w.decode("utf-8", errors="replace").rstrip("\n") for w in written],
            "correct": [w == f"{y}\n".encode() for w, y in zip(written, data.outputs, strict=True)],
        }
    )
    keys = ["family", "first", "second", "split"]
    df = examples.groupby(keys, as_index=False).agg(
        n=("correct", "size"), correct=("correct", "sum")
    )
    df["accuracy"] = df["correct"] / df["n"]
    return CompositionAccuracy(df, _summary(examples), examples)


def _summary(examples: pd.DataFrame) -> dict[str, float]:
    mean = lambda part: float(part["correct"].mean()) if len(part) else float("nan")  # noqa: E731
    out = {
        f"{split}_accuracy": mean(examples[examples.split == split])
        for split in ("seen", "heldout")
    }
    for family in sorted(set(examples.family)):
        part = examples[examples.family == family]
        out[f"accuracy_{family}"] = mean(part)
        for split in ("seen", "heldout"):
            out[f"{split}_accuracy_{family}"] = mean(part[part.split == split])
    return out


def _load_model(path: str | os.PathLike):
    folder, cfg = pretrained_checkpoint(path)
    model, _ = load_checkpoint(folder, cfg, 0, torch.device("cpu"))
    return model.eval()


__all__ = [
    "CompositionAccuracy",
    "FinetuneConfig",
    "FinetuneRun",
    "FinetuneTrainer",
    "answer_scores",
    "composition_accuracy",
    "finetune_config",
    "finetune_lm",
    "greedy_answers",
    "model_lm_config",
    "pretrained_checkpoint",
]
