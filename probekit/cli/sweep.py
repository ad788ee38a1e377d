"""``probekit sweep``: its grid and executor flags (the settings ones shared with train are in
:mod:`probekit.cli.train_flags`) and the table it prints; the sweep is
:func:`probekit.anchor.sweep.run_sweep`.

Example:
    >>> from probekit.cli import build_parser
    >>> args = build_parser().parse_args(["sweep", "--out", "s", "--gammas", "0.3,0.8"])
    >>> args.func is sweep_command, args.gammas, args.depths
    (True, [0.3, 0.8], [2])
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from probekit.cli.common import (
    TRAINER_HELP,
    add_command,
    add_executor,
    add_out,
    check_executor_flags,
)
from probekit.cli.train_flags import (
    DEFAULT_MODEL,
    DEFAULT_RUN,
    add_settings_flags,
    build_train_config,
    parse_floats,
    parse_ints,
)

TABLE_COLUMNS = [
    "run",
    "final_test_data_acc",
    "final_test_task_inferential",
    "final_test_task_symmetric",
    "solution",
]
"""The columns of the results table ``probekit sweep`` prints."""


def sweep_command(args: argparse.Namespace) -> int:
    """``probekit sweep``: train the grid stacked by shape; write the table and diagrams."""
    from probekit.anchor.sweep import SweepConfig, run_sweep

    check_executor_flags(args)
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
        progress=not args.quiet,
        executor=args.executor,
        ray_address=args.ray_address,
    )
    print(res.df[TABLE_COLUMNS].to_string(index=False))
    print(
        f"results: {args.out / 'results.csv'}\nphase diagrams: {args.out / 'phase_diagrams.html'}"
    )
    return 0


def add_sweep_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sweep`` to an argparse subparsers object."""
    p = add_command(
        subparsers,
        "sweep",
        help=TRAINER_HELP["sweep"],
        description="Train every combination of --gammas, --weight-decays, --depths and "
        "--seeds. Runs of one depth train together as one stacked model; each "
        "ends as its own checkpoint. Writes OUT/results.csv, OUT/sweep.json and "
        "OUT/phase_diagrams.html; run again to resume.",
    )
    _add_grid_flags(p)
    add_executor(p, what="stacks")
    add_out(p, type=Path, help="output folder (created; an existing run there is resumed)")
    add_settings_flags(p, sweep=True)
    p.set_defaults(func=sweep_command)
    return p


def _add_grid_flags(p: argparse.ArgumentParser) -> None:
    """The grid: what varies from run to run."""
    g = p.add_argument_group("grid")
    g.add_argument(
        "--gammas",
        type=parse_floats,
        default=[0.3, 0.5, 0.8],
        help="initialization rates, comma-separated",
    )
    g.add_argument(
        "--weight-decays",
        type=parse_floats,
        default=[DEFAULT_RUN.weight_decay],
        help="weight decays, comma-separated",
    )
    g.add_argument(
        "--depths",
        type=parse_ints,
        default=[DEFAULT_MODEL.n_layers],
        help="numbers of layers, comma-separated",
    )
    g.add_argument("--seeds", type=parse_ints, default=[0], help="seeds, comma-separated")
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


__all__ = ["TABLE_COLUMNS", "add_sweep_parser", "sweep_command"]
