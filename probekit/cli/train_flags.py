"""The settings flags of ``probekit train`` and ``probekit sweep``, and the
:class:`~probekit.anchor.config.TrainConfig` they describe.

:func:`add_settings_flags` adds them (``--config``, the model, the task, the optimization, the
evaluation and device); :func:`build_train_config` reads the parsed flags into a TrainConfig.
Over ``--config`` (a JSON file of settings) or ``--preset``, a flag counts only when given a
value other than its default (:func:`given_flags`, which compares with the defaults of a parser
built for the purpose); without them every flag counts.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_settings_flags(parser, sweep=False)
    >>> build_train_config(parser.parse_args(["--gamma", "0.8"])).model.gamma
    0.8
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from probekit.anchor import KEY_SPLITS, PRESETS, SPECIAL_FORMS, AnchorTask, TrainConfig
from probekit.cli.common import Flags, add_device, add_quiet
from probekit.errors import CheckpointError, ConfigError, check_known_keys
from probekit.io import read_regular_file
from probekit.training.checks import check_mapping, is_int
from probekit.training.models import (
    ACTIVATIONS,
    ARCH_DEFAULTS,
    ARCHITECTURES,
    INIT_SCHEMES,
    ModelConfig,
)
from probekit.training.precision import PRECISIONS

DEFAULT_MODEL = ModelConfig()
"""The model settings a flag defaults to."""
DEFAULT_RUN = TrainConfig()
"""The optimization, evaluation and device settings a flag defaults to."""
DEFAULT_TASK = AnchorTask()
"""The task settings a flag defaults to."""


def parse_floats(text: str) -> list[float]:
    """``--gammas 0.3,0.8``: comma-separated numbers."""
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers"
        ) from err


def parse_ints(text: str) -> list[int]:
    """``--depths 2,3``: comma-separated integers."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from err


def _anchors(text: str) -> dict[int, int]:
    """``--anchors 1:5,2:1``: anchor id -> shift; an id given twice is refused."""
    try:
        items = [(int(k), int(v)) for k, v in (item.split(":") for item in text.split(","))]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list ID:SHIFT,ID:SHIFT (e.g. 1:5,2:1,3:-2,4:-8)"
        ) from err
    ids = [k for k, _ in items]
    repeated = sorted({k for k in ids if ids.count(k) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r} gives anchor id(s) {repeated} twice")
    return dict(items)


def _pairs(text: str) -> list[tuple[int, int]]:
    """``--heldout 4,3;2,1``: anchor pairs (``none`` or empty: no pair)."""
    if text.strip().lower() in ("", "none"):
        return []
    try:
        out = []
        for item in text.split(";"):
            a, b = item.split(",")
            out.append((int(a), int(b)))
        return out
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list A1,A2;A1,A2 (e.g. 4,3)") from err


def _special(text: str) -> dict[tuple[int, int], int]:
    """``--special-targets 3,4:4``: anchor pair -> offset (``none`` or empty: none)."""
    if text.strip().lower() in ("", "none"):
        return {}
    try:
        out = {}
        for item in text.split(";"):
            pair, shift = item.split(":")
            a, b = pair.split(",")
            out[(int(a), int(b))] = int(shift)
        return out
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list A1,A2:SHIFT;... (e.g. 3,4:-6)"
        ) from err


def _key_split(text: str) -> str | int:
    """A key-split name, or an integer modulus."""
    return int(text) if text.strip().lstrip("-").isdigit() else text.strip()


def _fmt_anchors(d: dict[int, int]) -> str:
    """Anchors written as ``--anchors`` takes them."""
    return ",".join(f"{k}:{v}" for k, v in d.items())


def add_settings_flags(parser: argparse.ArgumentParser, sweep: bool) -> None:
    """Add ``--config`` and the settings flags (for ``sweep``, without the ones its grid sets:
    ``--n-layers``, ``--gamma``, ``--seed``, ``--weight-decay``)."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="JSON file of TrainConfig settings (as in a run's config.json); "
        "flags given on the command line override it",
    )
    _add_model(parser, sweep)
    _add_task(parser)
    _add_optimization(parser, sweep)
    _add_run(parser)


_GRID_FLAGS = ("--n-layers", "--gamma", "--seed", "--weight-decay")
"""The flags ``probekit sweep`` does not take: its grid sets them."""


def _add_typed(
    group: Flags,
    flags: tuple[tuple[str, Any, Any, str], ...],
    sweep: bool = False,
) -> None:
    """Add each ``(flag, type, default, help)`` (for ``sweep``, without the grid's flags)."""
    for flag, kind, default, help in flags:
        if not (sweep and flag in _GRID_FLAGS):
            group.add_argument(flag, type=kind, default=default, help=help)


def _add_switches(group: Flags, flags: tuple[tuple[str, str], ...]) -> None:
    """Add each ``(flag, help)`` as an on/off switch (off unless given)."""
    for flag, help in flags:
        group.add_argument(flag, action="store_true", help=help)


def _add_model(p: argparse.ArgumentParser, sweep: bool) -> None:
    """The model flags (``--n-layers`` and ``--gamma`` only for train: sweep has a grid)."""
    m = p.add_argument_group("model (GPT-2-style decoder)")
    sizes = (
        ("--n-layers", int, DEFAULT_MODEL.n_layers, "number of blocks"),
        ("--d-model", int, DEFAULT_MODEL.d_model, "residual width"),
        ("--n-heads", int, DEFAULT_MODEL.n_heads, "attention heads (post_ln_paper: 1)"),
        ("--d-mlp", int, None, "MLP width (default 4 * d-model; post_ln_paper: 3 * d-model)"),
    )
    _add_typed(m, sizes, sweep)
    m.add_argument(
        "--activation",
        choices=ACTIVATIONS,
        default=DEFAULT_MODEL.activation,
        help="MLP activation (post_ln_paper: relu)",
    )
    # --- paper architecture and reference-width init ---
    m.add_argument(
        "--architecture",
        choices=list(ARCHITECTURES),
        default=DEFAULT_MODEL.architecture,
        help="'gpt2': pre-LN GPT-2 block; 'post_ln_paper': the anchor paper's post-LN, "
        "bias-free block (saved as a post-LN OPT)",
    )
    m.add_argument(
        "--init-ref-width",
        type=int,
        default=None,
        help="draw every matrix with the std it has at this reference width "
        "(std (d_in * ref / d_model)^-gamma; e.g. 400, the paper's d_model)",
    )
    gamma = "initialization rate: every weight matrix has std d_in^-gamma (larger = smaller init)"
    rates = (("--gamma", float, DEFAULT_MODEL.gamma, gamma),) + tuple(
        (
            f"--gamma-{part}",
            float,
            None,
            f"separate initialization rate of the {what} (default: --gamma)",
        )
        for part, what in (
            ("emb", "token/position/output embeddings"),
            ("qk", "attention query and key weights"),
            ("vo", "attention value and output weights"),
            ("mlp", "MLP weights"),
        )
    )
    _add_typed(m, rates, sweep)
    m.add_argument(
        "--init-scheme",
        choices=list(INIT_SCHEMES),
        default=DEFAULT_MODEL.init_scheme,
        help="'fan_in': std d_in^-gamma; 'official': the anchor papers' code (d_model fan-in, "
        "output projections / sqrt(2 * layers))",
    )
    switches = (
        (
            "--layernorm-scaling",
            "LayerNorm Scaling (Sun et al. 2025): each layer's LayerNorm "
            "output times 1/sqrt(layer + 1) (default: off)",
        ),
        ("--tie-embeddings", "share the input and output embedding (default: separate)"),
    )
    _add_switches(m, switches)


def _add_task(p: argparse.ArgumentParser) -> None:
    """The anchor-task flags."""
    t = p.add_argument_group("task (anchor functions)")
    anchors = f"(default {_fmt_anchors(DEFAULT_TASK.anchors)})"
    _add_typed(
        t,
        (
            (
                "--anchors",
                _anchors,
                DEFAULT_TASK.anchors,
                f"anchor ids and their shifts, ID:SHIFT,... {anchors}",
            ),
            (
                "--special-targets",
                _special,
                DEFAULT_TASK.special_targets,
                "pairs trained on a "
                "non-inferential target, A1,A2:OFFSET;... with OFFSET added to the composite (see "
                "--special-form; default 3,4:4, the papers' +4; 'none' for none)",
            ),
        ),
    )
    t.add_argument(
        "--special-form",
        choices=list(SPECIAL_FORMS),
        default=DEFAULT_TASK.special_form,
        help="'offset': a special target is its composite + OFFSET (the official code); "
        "'shift': key + OFFSET (probekit's old form)",
    )
    keys = f"which keys are test keys at each position: {', '.join(KEY_SPLITS)} or a modulus"
    items = [DEFAULT_TASK.item_low, DEFAULT_TASK.item_high]
    _add_typed(
        t,
        (
            ("--key-split", _key_split, DEFAULT_TASK.key_split, keys),
            (
                "--heldout",
                _pairs,
                DEFAULT_TASK.heldout_pairs,
                "pairs never trained, A1,A2;... (default 4,3)",
            ),
            (
                "--item-range",
                parse_ints,
                items,
                "keys and noise are drawn from [LOW, HIGH), written LOW,HIGH",
            ),
            ("--seq-len", int, DEFAULT_TASK.seq_len, "tokens per input"),
            ("--vocab-size", int, DEFAULT_TASK.vocab_size, "vocabulary size (token 0 is padding)"),
            ("--n-train", int, DEFAULT_TASK.n_train, "training sequences"),
            ("--n-test", int, DEFAULT_TASK.n_test, "sequences per test split"),
            ("--task-seed", int, DEFAULT_TASK.seed, "seed of the data"),
        ),
    )
    _add_chain_flag(t)


def _add_optimization(p: argparse.ArgumentParser, sweep: bool) -> None:
    """The optimizer flags (``--seed`` and ``--weight-decay`` only for train)."""
    o = p.add_argument_group("optimization")
    run = DEFAULT_RUN
    flags = (
        ("--seed", int, run.seed, "seed of the initialization and the batch order"),
        (
            "--weight-decay",
            float,
            run.weight_decay,
            "AdamW decoupled weight decay (weight matrices and embeddings)",
        ),
        ("--steps", int, run.steps, "optimizer steps"),
        ("--batch-size", int, run.batch_size, "sequences per step"),
        ("--lr", float, run.lr, "peak learning rate"),
        ("--warmup-steps", int, run.warmup_steps, "linear warmup steps before the cosine decay"),
        ("--min-lr-ratio", float, run.min_lr_ratio, "final learning rate as a fraction of --lr"),
        ("--grad-clip", float, run.grad_clip, "clip each run's gradient norm to this (0 = off)"),
    )
    _add_typed(o, flags, sweep)


def _add_run(p: argparse.ArgumentParser) -> None:
    """Evaluation, checkpoints, device, resuming and the progress bar."""
    r = p.add_argument_group("evaluation, checkpoints, device")
    run = DEFAULT_RUN
    flags = (
        ("--eval-every", int, run.eval_every, "evaluate every split every N steps (metrics.jsonl)"),
        (
            "--checkpoint-every",
            int,
            run.checkpoint_every,
            "write a Hugging Face checkpoint every N steps (and at the end)",
        ),
        (
            "--eval-train-samples",
            int,
            run.eval_train_samples,
            "training sequences used to evaluate the train split",
        ),
    )
    _add_typed(r, flags)
    r.add_argument(
        "--no-eval-at-start",
        dest="eval_at_start",
        action="store_false",
        help="skip the evaluation before the first step",
    )
    add_device(
        r, default=DEFAULT_RUN.device, help="auto (CUDA when present, else CPU), cpu or cuda"
    )
    r.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default=DEFAULT_RUN.precision,
        help="forward precision: auto (bf16 autocast on CUDA, fp32 on CPU), fp32, or bf16 "
        "(autocast on CUDA and CPU); weights and AdamW moments stay float32",
    )
    switches = (
        (
            "--deterministic",
            "torch.use_deterministic_algorithms(True) while training (on CUDA "
            "also export CUBLAS_WORKSPACE_CONFIG=:4096:8); CPU runs are deterministic without it",
        ),
        ("--no-resume", "start over even if --out holds a checkpoint"),
    )
    _add_switches(r, switches)
    _add_keep_flag(r)
    add_quiet(r, help="hide the progress bar", no_progress_alias=True)


_MODEL_FLAGS = (
    "d_model",
    "n_heads",
    "d_mlp",
    "activation",
    "gamma_emb",
    "gamma_qk",
    "gamma_vo",
    "gamma_mlp",
    "init_scheme",
    "layernorm_scaling",
    "tie_embeddings",
    "architecture",
    "init_ref_width",
)
"""The model settings set by the flag of the same name."""
_TASK_FLAGS: tuple[tuple[str, str], ...] = (
    ("anchors", "anchors"),
    ("special_targets", "special_targets"),
    ("special_form", "special_form"),
    ("key_split", "key_split"),
    ("heldout_pairs", "heldout"),
    ("seq_len", "seq_len"),
    ("vocab_size", "vocab_size"),
    ("n_train", "n_train"),
    ("n_test", "n_test"),
    ("seed", "task_seed"),
)
"""The (task setting, flag) pairs."""
_RUN_FLAGS: tuple[str, ...] = (
    "steps",
    "batch_size",
    "lr",
    "warmup_steps",
    "min_lr_ratio",
    "grad_clip",
    "eval_every",
    "checkpoint_every",
    "eval_train_samples",
    "eval_at_start",
    "device",
    "precision",
    "deterministic",
)
"""The run settings set by the flag of the same name (train adds seed and weight_decay)."""


# --- longer compositions and checkpoints over training ---
_TASK_FLAGS += (("chain_length", "chain_length"),)
_RUN_FLAGS += ("keep_checkpoints",)


def _keep(text: str) -> int | list[int] | None:
    """``--keep-checkpoints 500`` (every 500 steps) or ``0,100,500`` (those steps); ``none``."""
    if text.strip().lower() in ("", "none"):
        return None
    if "," not in text:
        try:
            return int(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps") from err
    return parse_ints(text)


def _add_chain_flag(t: Flags) -> None:
    """``--chain-length``: the task's chains of anchors."""
    t.add_argument(
        "--chain-length",
        type=int,
        default=DEFAULT_TASK.chain_length,
        help="anchors composed per input (2: the pairs of the papers; 3 or 4: chains, held out "
        "when their first two anchors are a --heldout pair; widen --item-range so that every "
        "target stays in the vocabulary, e.g. 40,120)",
    )


def _add_keep_flag(r: Flags) -> None:
    """``--keep-checkpoints``: the steps whose checkpoints are kept."""
    r.add_argument(
        "--keep-checkpoints",
        type=_keep,
        default=DEFAULT_RUN.keep_checkpoints,
        metavar="EVERY|S1,S2,...",
        help="besides the resumable checkpoint, keep a Hugging Face checkpoint of these steps in "
        "OUT/checkpoints/step-NNNNNN/ (EVERY: steps 0, EVERY, 2 EVERY, ... and the last; or a "
        "comma list of steps), for probekit timeline OUT; default none",
    )


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is refused."""
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ConfigError(f"the config file gives {repeated} twice", fix="give every setting once")
    return dict(pairs)


def _preset_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``--preset`` (gamma and seed from their flags), or none."""
    preset = getattr(args, "preset", None)
    if preset is None:
        return {}
    cfg = PRESETS[preset](args.gamma, seed=args.seed).to_dict()
    cfg.pop("name", None)
    return cfg


def _base_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``--config`` (a run's config.json or run_config.json), else of
    ``--preset``, or none."""
    if getattr(args, "config", None) is None:
        return _preset_settings(args)
    try:  # a pipe or device would block: only a regular file of at most 16 MiB is read
        raw = read_regular_file(args.config, 16 * 2**20, "a config file")
        base = json.loads(raw, object_pairs_hook=_no_repeats)
    except CheckpointError as err:
        raise ConfigError(err.problem, fix=err.fix) from err
    except (OSError, ValueError, RecursionError) as err:  # nested too deep: RecursionError
        raise ConfigError(
            f"cannot read the config file {args.config} ({err})",
            fix="pass a JSON file such as a run's config.json",
        ) from err
    if isinstance(base, list) and base and all(isinstance(b, dict) for b in base):
        base = base[0]  # a stack's config.json lists its runs
    if not isinstance(base, dict):
        raise ConfigError(
            f"the config file {args.config} holds {type(base).__name__}, not an object of "
            "TrainConfig settings",
            fix='write {"steps": 100, "model": {...}, "task": {...}} (as in a run\'s config.json)',
        )
    base = {k: v for k, v in base.items() if k != "kind"}
    check_known_keys(base, {f.name for f in fields(TrainConfig)}, "training")
    for key in ("model", "task"):
        if key in base:
            base[key] = check_mapping(key, base[key])
    return base


def flag_defaults(sweep: bool) -> dict[str, Any]:
    """Every settings flag's default, read off a parser that holds only those flags."""
    parser = argparse.ArgumentParser(add_help=False)
    add_settings_flags(parser, sweep)
    return vars(parser.parse_args([]))


def given_flags(args: argparse.Namespace, sweep: bool = False) -> frozenset[str]:
    """The settings flags ``args`` holds at a value other than their default: those that
    override ``--config`` and ``--preset`` (a flag given at its default value counts as not
    given)."""
    defaults = flag_defaults(sweep)
    return frozenset(k for k, v in defaults.items() if getattr(args, k, v) != v)


@dataclass(frozen=True)
class _Flags:
    """Parsed flags and the names of those given (see :func:`given_flags`)."""

    args: argparse.Namespace
    given: frozenset[str]

    def copy(self, section: dict[str, Any], key: str, flag: str) -> None:
        """Copy the flag into ``section[key]`` unless the settings set it and it was not given."""
        if flag in self.given or key not in section:
            section[key] = getattr(self.args, flag)


def _task_settings(base: dict, flags: _Flags) -> dict[str, Any]:
    """The task section: the base's, with the flags copied in."""
    item_range = flags.args.item_range
    if len(item_range) != 2:
        raise ConfigError(
            f"--item-range {item_range} needs two numbers", fix="write LOW,HIGH, e.g. 20,100"
        )
    task = dict(base.get("task", {}))
    for key, flag in _TASK_FLAGS:
        flags.copy(task, key, flag)
    if "item_range" in flags.given or "item_low" not in task:
        task["item_low"], task["item_high"] = item_range
    return task


# --- paper architecture and reference-width init ---
def _follow_architecture(model: dict, flags: _Flags) -> None:
    """The heads and the activation follow the architecture
    (:data:`~probekit.training.models.ARCH_DEFAULTS`) unless their flags are given: a given
    ``--architecture`` other than the base's replaces the base's values (they were its
    architecture's), and settings without them take the architecture's."""
    base_arch = model.get("architecture", DEFAULT_MODEL.architecture)
    arch = flags.args.architecture if "architecture" in flags.given else base_arch
    heads, activation = ARCH_DEFAULTS.get(arch, ARCH_DEFAULTS[DEFAULT_MODEL.architecture])
    if arch != base_arch:
        model["n_heads"], model["activation"] = heads, activation
        model.pop("d_mlp", None)  # the architecture's ratio to d_model unless --d-mlp
    model.setdefault("n_heads", heads)
    model.setdefault("activation", activation)


def _model_settings(base: dict, task: dict, flags: _Flags, sweep: bool) -> dict[str, Any]:
    """The model section: the base's, with the flags copied in; its vocabulary follows the
    task's, its context covers the task's sequences."""
    model = dict(base.get("model", {}))
    _follow_architecture(model, flags)
    for flag in _MODEL_FLAGS + (() if sweep else ("n_layers", "gamma")):
        flags.copy(model, flag, flag)
    model.setdefault("vocab_size", task.get("vocab_size", DEFAULT_TASK.vocab_size))
    if "vocab_size" in flags.given:
        model["vocab_size"] = task["vocab_size"]
    n_positions, seq_len = model.get("n_positions", 0), task["seq_len"]
    if is_int(n_positions) and is_int(seq_len):  # anything else: ModelConfig names it
        model["n_positions"] = max(n_positions, seq_len)
    return model


def build_train_config(args: argparse.Namespace, sweep: bool = False) -> TrainConfig:
    """The :class:`TrainConfig` described by parsed ``train``/``sweep`` flags: the settings of
    ``--config`` or ``--preset`` (if any), overridden by the flags given."""
    base = _base_settings(args)
    flags = _Flags(args, given_flags(args, sweep))
    task = _task_settings(base, flags)
    model = _model_settings(base, task, flags, sweep)
    cfg = {k: v for k, v in base.items() if k not in ("model", "task")}
    for key in _RUN_FLAGS + (() if sweep else ("seed", "weight_decay")):
        flags.copy(cfg, key, key)
    cfg["task"] = AnchorTask.from_dict(task)
    cfg["model"] = ModelConfig.from_dict(model)
    return TrainConfig(**cfg)


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_RUN",
    "DEFAULT_TASK",
    "PRESETS",
    "add_settings_flags",
    "build_train_config",
    "flag_defaults",
    "given_flags",
    "parse_floats",
    "parse_ints",
]
