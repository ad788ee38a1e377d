"""Command-line parsers of ``probekit train`` and ``probekit sweep``.

``probekit/cli.py`` wires them in with :func:`add_train_parser` and :func:`add_sweep_parser`;
each sets ``func`` to a function taking the parsed arguments and returning an exit code.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="probekit")
    >>> sub = parser.add_subparsers(dest="command")
    >>> add_train_parser(sub) is not None and add_sweep_parser(sub) is not None
    True
    >>> args = parser.parse_args(["train", "--out", "runs/a", "--gamma", "0.8"])
    >>> build_train_config(args).model.gamma
    0.8
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from probekit.errors import ConfigError, check_known_keys
from probekit.tasks.anchor import KEY_SPLITS, SPECIAL_FORMS, AnchorTask
from probekit.training.checks import check_mapping, is_int
from probekit.training.models import ACTIVATIONS, INIT_SCHEMES, ModelConfig
from probekit.training.precision import PRECISIONS
from probekit.training.trainer import TrainConfig

_M = ModelConfig()
_T = TrainConfig()
_A = AnchorTask()


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers"
        ) from err


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from err


def _anchors(text: str) -> dict[int, int]:
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


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show ``(default: X)`` unless the help already explains the default or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text.lower()
            or action.required
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._StoreFalseAction | argparse._StoreTrueAction)
        ):
            return text  # a switch's help says what it does; "(default: True)" misreads
        if isinstance(action.default, list | tuple):  # as typed: comma-separated
            shown = ",".join(str(v) for v in action.default).replace("%", "%%")
            return f"{text} (default: {shown})"
        return super()._get_help_string(action)


def _key_split(text: str) -> str | int:
    """A key-split name, or an integer modulus."""
    return int(text) if text.strip().lstrip("-").isdigit() else text.strip()


def _fmt_anchors(d: dict[int, int]) -> str:
    return ",".join(f"{k}:{v}" for k, v in d.items())


def _add_common(p: argparse.ArgumentParser, sweep: bool) -> None:
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        help="output folder (created; an existing run there is resumed)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="JSON file of TrainConfig settings (as in a run's config.json); "
        "flags given on the command line override it",
    )
    _add_model(p, sweep)
    _add_task(p)
    _add_optimization(p, sweep)
    _add_run(p)


def _add_model(p: argparse.ArgumentParser, sweep: bool) -> None:
    m = p.add_argument_group("model (GPT-2-style decoder)")
    if not sweep:
        m.add_argument("--n-layers", type=int, default=_M.n_layers, help="number of blocks")
    m.add_argument("--d-model", type=int, default=_M.d_model, help="residual width")
    m.add_argument("--n-heads", type=int, default=_M.n_heads, help="attention heads")
    m.add_argument("--d-mlp", type=int, default=None, help="MLP width (default 4 * d-model)")
    m.add_argument(
        "--activation", choices=ACTIVATIONS, default=_M.activation, help="MLP activation"
    )
    if not sweep:
        m.add_argument(
            "--gamma",
            type=float,
            default=_M.gamma,
            help="initialization rate: every weight matrix has std d_in^-gamma "
            "(larger = smaller init)",
        )
    for part, what in (
        ("emb", "token/position/output embeddings"),
        ("qk", "attention query and key weights"),
        ("vo", "attention value and output weights"),
        ("mlp", "MLP weights"),
    ):
        m.add_argument(
            f"--gamma-{part}",
            type=float,
            default=None,
            help=f"separate initialization rate of the {what} (default: --gamma)",
        )
    m.add_argument(
        "--init-scheme",
        choices=list(INIT_SCHEMES),
        default=_M.init_scheme,
        help="'fan_in': std d_in^-gamma; 'official': the anchor papers' code (d_model fan-in, "
        "output projections / sqrt(2 * layers))",
    )
    m.add_argument(
        "--layernorm-scaling",
        action="store_true",
        help="LayerNorm Scaling (Sun et al. 2025): each layer's LayerNorm output times "
        "1/sqrt(layer + 1) (default: off)",
    )
    m.add_argument(
        "--tie-embeddings",
        action="store_true",
        help="share the input and output embedding (default: separate)",
    )


def _add_task(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("task (anchor functions)")
    t.add_argument(
        "--anchors",
        type=_anchors,
        default=_A.anchors,
        help=f"anchor ids and their shifts, ID:SHIFT,... (default {_fmt_anchors(_A.anchors)})",
    )
    t.add_argument(
        "--special-targets",
        type=_special,
        default=_A.special_targets,
        help="pairs trained on a non-inferential target, A1,A2:OFFSET;... with OFFSET added "
        "to the composite (see --special-form; default 3,4:4, the papers' +4; 'none' for none)",
    )
    t.add_argument(
        "--special-form",
        choices=list(SPECIAL_FORMS),
        default=_A.special_form,
        help="'offset': a special target is its composite + OFFSET (the official code); "
        "'shift': key + OFFSET (probekit's old form)",
    )
    t.add_argument(
        "--key-split",
        type=_key_split,
        default=_A.key_split,
        help=f"which keys are test keys at each position: {', '.join(KEY_SPLITS)} or a modulus",
    )
    t.add_argument(
        "--heldout",
        type=_pairs,
        default=_A.heldout_pairs,
        help="pairs never trained, A1,A2;... (default 4,3)",
    )
    t.add_argument(
        "--item-range",
        type=_ints,
        default=[_A.item_low, _A.item_high],
        help="keys and noise are drawn from [LOW, HIGH), written LOW,HIGH",
    )
    t.add_argument("--seq-len", type=int, default=_A.seq_len, help="tokens per input")
    t.add_argument(
        "--vocab-size", type=int, default=_A.vocab_size, help="vocabulary size (token 0 is padding)"
    )
    t.add_argument("--n-train", type=int, default=_A.n_train, help="training sequences")
    t.add_argument("--n-test", type=int, default=_A.n_test, help="sequences per test split")
    t.add_argument("--task-seed", type=int, default=_A.seed, help="seed of the data")


def _add_optimization(p: argparse.ArgumentParser, sweep: bool) -> None:
    o = p.add_argument_group("optimization")
    if not sweep:
        o.add_argument(
            "--seed",
            type=int,
            default=_T.seed,
            help="seed of the initialization and the batch order",
        )
        o.add_argument(
            "--weight-decay",
            type=float,
            default=_T.weight_decay,
            help="AdamW decoupled weight decay (weight matrices and embeddings)",
        )
    o.add_argument("--steps", type=int, default=_T.steps, help="optimizer steps")
    o.add_argument("--batch-size", type=int, default=_T.batch_size, help="sequences per step")
    o.add_argument("--lr", type=float, default=_T.lr, help="peak learning rate")
    o.add_argument(
        "--warmup-steps",
        type=int,
        default=_T.warmup_steps,
        help="linear warmup steps before the cosine decay",
    )
    o.add_argument(
        "--min-lr-ratio",
        type=float,
        default=_T.min_lr_ratio,
        help="final learning rate as a fraction of --lr",
    )
    o.add_argument(
        "--grad-clip",
        type=float,
        default=_T.grad_clip,
        help="clip each run's gradient norm to this (0 = off)",
    )


def _add_run(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group("evaluation, checkpoints, device")
    r.add_argument(
        "--eval-every",
        type=int,
        default=_T.eval_every,
        help="evaluate every split every N steps (metrics.jsonl)",
    )
    r.add_argument(
        "--checkpoint-every",
        type=int,
        default=_T.checkpoint_every,
        help="write a Hugging Face checkpoint every N steps (and at the end)",
    )
    r.add_argument(
        "--eval-train-samples",
        type=int,
        default=_T.eval_train_samples,
        help="training sequences used to evaluate the train split",
    )
    r.add_argument(
        "--no-eval-at-start",
        dest="eval_at_start",
        action="store_false",
        help="skip the evaluation before the first step",
    )
    r.add_argument(
        "--device",
        default=_T.device,
        help="auto (CUDA when present, else CPU), cpu or cuda",
    )
    r.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default=_T.precision,
        help="forward precision: auto (bf16 autocast on CUDA, fp32 on CPU), fp32, or bf16 "
        "(autocast on CUDA and CPU); weights and AdamW moments stay float32",
    )
    r.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(True) while training (on CUDA also export "
        "CUBLAS_WORKSPACE_CONFIG=:4096:8); CPU runs are deterministic without it",
    )
    r.add_argument(
        "--no-resume", action="store_true", help="start over even if --out holds a checkpoint"
    )
    r.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _explicit(args: argparse.Namespace, parser_defaults: dict[str, Any]) -> set[str]:
    return {k for k, v in vars(args).items() if k in parser_defaults and v != parser_defaults[k]}


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
)
_TASK_FLAGS = (
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
_RUN_FLAGS = (
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


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is refused."""
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ConfigError(f"the config file gives {repeated} twice", fix="give every setting once")
    return dict(pairs)


PRESETS = {"cpu-reference": "anchor_cpu_config"}
"""``probekit train --preset`` name -> the function in probekit.training.trainer giving it."""


def _preset_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``--preset`` (gamma and seed from their flags), or none."""
    preset = getattr(args, "preset", None)
    if preset is None:
        return {}
    from probekit.training import trainer

    cfg = getattr(trainer, PRESETS[preset])(args.gamma, seed=args.seed).to_dict()
    cfg.pop("name", None)
    return cfg


def _base_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of ``--config`` (a run's config.json or run_config.json), else of
    ``--preset``, or none."""
    if getattr(args, "config", None) is None:
        return _preset_settings(args)
    try:
        base = json.loads(Path(args.config).read_text(), object_pairs_hook=_no_repeats)
    except (OSError, ValueError) as err:
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


class _Picker:
    """Copies a flag into a settings section unless --config set it and the flag was not given."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.given = args, getattr(args, "_given", None)

    def explicit(self, flag: str) -> bool:
        return self.given is None or flag in self.given

    def __call__(self, section: dict[str, Any], key: str, flag: str) -> None:
        if self.explicit(flag) or key not in section:
            section[key] = getattr(self.args, flag)


def _task_settings(args: argparse.Namespace, base: dict, pick: _Picker) -> dict[str, Any]:
    if len(args.item_range) != 2:
        raise ConfigError(
            f"--item-range {args.item_range} needs two numbers", fix="write LOW,HIGH, e.g. 20,100"
        )
    task = dict(base.get("task", {}))
    for key, flag in _TASK_FLAGS:
        pick(task, key, flag)
    if pick.explicit("item_range") or "item_low" not in task:
        task["item_low"], task["item_high"] = args.item_range
    return task


def _model_settings(base: dict, task: dict, pick: _Picker, sweep: bool) -> dict[str, Any]:
    model = dict(base.get("model", {}))
    for flag in _MODEL_FLAGS:
        pick(model, flag, flag)
    if not sweep:
        pick(model, "n_layers", "n_layers")
        pick(model, "gamma", "gamma")
    model.setdefault("vocab_size", task.get("vocab_size", _A.vocab_size))
    if pick.explicit("vocab_size"):
        model["vocab_size"] = task["vocab_size"]
    n_positions, seq_len = model.get("n_positions", 0), task["seq_len"]
    if is_int(n_positions) and is_int(seq_len):  # anything else: ModelConfig names it
        model["n_positions"] = max(n_positions, seq_len)
    return model


def build_train_config(args: argparse.Namespace, sweep: bool = False) -> TrainConfig:
    """The :class:`TrainConfig` described by parsed ``train``/``sweep`` arguments."""
    if getattr(args, "preset", None) and not hasattr(args, "_given") and hasattr(args, "_parser"):
        _mark_given(args._parser, args)
    base = _base_settings(args)
    pick = _Picker(args)
    task = _task_settings(args, base, pick)
    model = _model_settings(base, task, pick, sweep)
    cfg = {k: v for k, v in base.items() if k not in ("model", "task")}
    for key in _RUN_FLAGS + (() if sweep else ("seed", "weight_decay")):
        pick(cfg, key, key)
    cfg["task"] = AnchorTask.from_dict(task)
    cfg["model"] = ModelConfig.from_dict(model)
    return TrainConfig(**cfg)


def _mark_given(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    defaults = {a.dest: a.default for a in parser._actions}
    args._given = _explicit(args, defaults)


def run_train(args: argparse.Namespace) -> int:
    """``probekit train``: train one run; print where its checkpoint and metrics are."""
    from probekit.training.trainer import train

    if getattr(args, "config", None) is not None and getattr(args, "preset", None) is not None:
        raise ConfigError("--config and --preset both give every setting", fix="pass one of them")
    if getattr(args, "config", None) is not None or getattr(args, "preset", None) is not None:
        _mark_given(args._parser, args)
    cfg = build_train_config(args)
    if not args.no_progress:
        print(
            "training bar: loss = training loss of the last batch; data = accuracy on seen "
            "anchor pairs with unseen keys; inf / sym = share of the held-out pairs' outputs "
            "that are inferential / symmetric"
        )
    out = train(cfg, args.out, resume=not args.no_resume, progress=not args.no_progress)
    f = out.final
    print(f"checkpoint: {out.checkpoint}")
    print(f"metrics:    {args.out / 'metrics.jsonl'}")
    print(
        f"step {int(f['step'])}: train acc {f['train_acc']:.3f}, seen pairs on test keys "
        f"{f['test_data_acc']:.3f}, held-out pairs: inferential "
        f"{f['test_task_inferential']:.3f}, symmetric {f['test_task_symmetric']:.3f}"
    )
    return 0


def run_sweep_cmd(args: argparse.Namespace) -> int:
    """``probekit sweep``: train the grid stacked by shape; write the table and diagrams."""
    from probekit.training.sweep import SweepConfig, run_sweep

    if args.ray_address is not None and args.executor != "ray":
        raise ConfigError(
            "--ray-address is given but the executor is local",
            fix="add --executor ray, or leave --ray-address out",
        )
    if getattr(args, "config", None) is not None:
        _mark_given(args._parser, args)
    base = build_train_config(args, sweep=True)
    family = None
    if args.family_budget is not None:
        from probekit.training.families import depth_family

        family = depth_family(
            args.family_budget,
            args.depths,
            style=args.family_style,
            d_model=base.model.d_model,
            n_heads=base.model.n_heads,
            vocab_size=base.model.vocab_size,
            n_positions=base.model.n_positions,
            tie_embeddings=base.model.tie_embeddings,
        )
    sweep = SweepConfig(
        base,
        gammas=args.gammas,
        weight_decays=args.weight_decays,
        depths=args.depths,
        seeds=args.seeds,
        stack=not args.no_stack,
        max_stack=args.max_stack,
        family=family,
    )
    res = run_sweep(
        sweep,
        args.out,
        resume=not args.no_resume,
        progress=not args.no_progress,
        executor=args.executor,
        ray_address=args.ray_address,
    )
    cols = [
        "run",
        "final_test_data_acc",
        "final_test_task_inferential",
        "final_test_task_symmetric",
        "solution",
    ]
    print(res.df[cols].to_string(index=False))
    print(
        f"results: {args.out / 'results.csv'}\nphase diagrams: {args.out / 'phase_diagrams.html'}"
    )
    return 0


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``train`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "train",
        help="train a GPT-2-style model on the anchor-function task",
        description="Train a GPT-2-style decoder on the anchor-function task (loss on the last "
        "token; AdamW, warmup + cosine decay). Writes OUT/metrics.jsonl and a "
        "Hugging Face checkpoint in OUT/checkpoint; run the same command again to "
        "resume after an interruption.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="start from these settings (flags given on the command line override them): "
        "cpu-reference is the README's CPU reference run, anchor_cpu_config (2 layers, d_model "
        "64, 4 heads, 1500 steps of batch 256, lr 2.5e-3, weight decay 0.1); default: the "
        "defaults shown below",
    )
    _add_common(p, sweep=False)
    p.set_defaults(func=run_train, _parser=p)
    return p


def add_sweep_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sweep`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "sweep",
        help="sweep gamma x weight decay x depth x seeds; phase diagrams",
        description="Train every combination of --gammas, --weight-decays, --depths and "
        "--seeds. Runs of one depth train together as one stacked model; each "
        "ends as its own checkpoint. Writes OUT/results.csv, OUT/sweep.json and "
        "OUT/phase_diagrams.html; run again to resume.",
        formatter_class=_HelpFormatter,
    )
    g = p.add_argument_group("grid")
    g.add_argument(
        "--gammas",
        type=_floats,
        default=[0.3, 0.5, 0.8],
        help="initialization rates, comma-separated",
    )
    g.add_argument(
        "--weight-decays",
        type=_floats,
        default=[_T.weight_decay],
        help="weight decays, comma-separated",
    )
    g.add_argument(
        "--depths", type=_ints, default=[_M.n_layers], help="numbers of layers, comma-separated"
    )
    g.add_argument("--seeds", type=_ints, default=[0], help="seeds, comma-separated")
    g.add_argument(
        "--family-budget",
        type=int,
        default=None,
        help="sweep --depths at this fixed parameter count: each depth's widths come "
        "from a depth/width family (within 1%% of the budget)",
    )
    g.add_argument(
        "--family-style",
        choices=["mlp", "width"],
        default="mlp",
        help="family style: 'mlp' holds d_model and shrinks the MLP (Petty et al.), "
        "'width' shrinks d_model (Levine et al.)",
    )
    g.add_argument(
        "--no-stack",
        action="store_true",
        help="train every run alone instead of stacking runs of one shape",
    )
    g.add_argument(
        "--max-stack",
        type=int,
        default=None,
        help="at most this many runs per stacked model (memory)",
    )
    x = p.add_argument_group("executor")
    x.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local: the stacks one after another in this process; ray: each stack one Ray "
        'task (a local Ray, or the cluster at --ray-address; needs pip install -e ".[ray]" '
        "and an absolute --out on a filesystem every node sees)",
    )
    x.add_argument(
        "--ray-address",
        default=None,
        help="address of a running Ray cluster (`ray start --head` prints it, e.g. "
        "10.0.0.1:6379); default: start a local Ray sized to this machine",
    )
    _add_common(p, sweep=True)
    p.set_defaults(func=run_sweep_cmd, _parser=p)
    return p


__all__ = ["add_sweep_parser", "add_train_parser", "build_train_config"]
