"""Depth growth of probekit checkpoints: MIDAS, LIDAS and append-at-the-top, and their schedules.

A growth operation reads a checkpoint folder written by the trainer (Hugging Face GPT-2
``config.json`` + ``model.safetensors``, and when present ``optimizer.safetensors`` with the
AdamW moments ``exp_avg.<name>`` / ``exp_avg_sq.<name>`` and ``run_config.json``) and writes a
deeper one in which ``block_size`` layers are copies of existing layers — weights *and*
optimizer moments — so training continues where it left off.

- ``"midas"`` (Saunshi et al. 2024): copy the middle block of ``b`` layers and insert the copy
  right after it.
- ``"lidas"``: insert, at the middle of the stack, a block made of the last ``b/2`` layers
  before the middle and the first ``b/2`` layers after it.
- ``"append"``: the baseline; copy the top ``b`` layers and append them at the top.

:func:`prop_alpha_stages` gives stage lengths proportional to ``i^alpha`` (Prop-alpha), and
:func:`growth_plan` checks a whole schedule before any training starts.

Example:
    >>> layer_map(4, "midas", 2)          # new layer -> source layer
    [0, 1, 2, 1, 2, 3]
    >>> prop_alpha_stages(1000, 3, 1.0)
    [167, 333, 500]
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from probekit.errors import CheckpointError, ConfigError
from probekit.io import atomic_write_text, swapped_directory
from probekit.training.checkpoint import RUN_CONFIG, read_json_object, read_run_config
from probekit.training.checks import check_int, is_int, is_real

if TYPE_CHECKING:
    import torch

METHODS = ("midas", "lidas", "append")
_LAYER = re.compile(
    r"^(?P<prefix>(?:exp_avg\.|exp_avg_sq\.)?transformer\.h\.)(?P<i>\d+)\.(?P<rest>.+)$"
)


def layer_map(n_layers: int, method: str, block_size: int) -> list[int]:
    """For each layer of the grown model, the index of the layer it is copied from."""
    if method not in METHODS:
        raise ConfigError(f"unknown growth method {method!r}", fix=f"use one of {list(METHODS)}")
    check_int("n_layers", n_layers)
    check_int("block_size", block_size)
    if block_size > n_layers:
        raise ConfigError(
            f"block size {block_size} is larger than the model's {n_layers} layers",
            fix=f"use a block of at most {n_layers} layers, or start from a deeper model",
        )
    layers = list(range(n_layers))
    if method == "append":
        return layers + layers[n_layers - block_size :]
    if method == "midas":
        start = (n_layers - block_size) // 2
        stop = start + block_size
        return layers[:stop] + layers[start:stop] + layers[stop:]
    if block_size % 2:
        raise ConfigError(
            f"LIDAS needs an even block size, got {block_size}",
            fix="use an even block size (half from below the middle, half from above)",
        )
    middle, half = n_layers // 2, block_size // 2
    if middle - half < 0 or middle + half > n_layers:
        raise ConfigError(
            f"LIDAS block of {block_size} does not fit around the middle of {n_layers} layers",
            fix="use a smaller block",
        )
    new_block = layers[middle - half : middle] + layers[middle : middle + half]
    return layers[:middle] + new_block + layers[middle:]


def inserted_layers(n_layers: int, method: str, block_size: int) -> list[int]:
    """Indices, in the grown model, of the newly inserted copies."""
    layer_map(n_layers, method, block_size)  # validates
    if method == "append":
        start = n_layers
    elif method == "midas":
        start = (n_layers - block_size) // 2 + block_size
    else:
        start = n_layers // 2
    return list(range(start, start + block_size))


def _renumber(tensors: dict[str, torch.Tensor], mapping: list[int]) -> dict[str, torch.Tensor]:
    """Tensors of the grown model: layer ``i`` of the output is a copy of ``mapping[i]``."""
    by_layer: dict[int, dict[str, torch.Tensor]] = {}
    out = {}
    for key, value in tensors.items():
        match = _LAYER.match(key)
        if match is None:
            out[key] = value
        else:
            by_layer.setdefault(int(match["i"]), {})[f"{match['prefix']}{{}}.{match['rest']}"] = (
                value
            )
    lost = sorted(set(mapping) - set(by_layer))
    if lost:
        raise CheckpointError(
            f"the checkpoint holds no tensors of layer(s) {lost}",
            fix="pass an intact checkpoint (its config.json and weights must agree)",
        )
    for new, old in enumerate(mapping):
        for template, value in by_layer[old].items():
            out[template.format(new)] = value.clone()
    return out


def _gpt2_config_of(src: Path) -> dict:
    """The Hugging Face config.json of a GPT-2 checkpoint; anything else is refused."""
    config = read_json_object(
        src / "config.json",
        unreadable=f"no readable config.json in {src}",
        fix="pass a checkpoint folder written by probekit train",
        holding="a model config",
    )
    if config.get("model_type") != "gpt2":
        raise ConfigError(
            f"cannot grow a {config.get('model_type')!r} checkpoint",
            fix="growth works on probekit's GPT-2-style checkpoints (probekit train)",
        )
    return config


def _check_distinct(src: Path, dst: Path) -> None:
    """Refuse a destination that is the source, inside it, or holds it (the swap would
    replace or delete the source)."""
    a, b = src.resolve(), dst.resolve()
    if a == b or a in b.parents or b in a.parents:
        raise ConfigError(
            f"the grown checkpoint {dst} would overwrite its source {src}",
            fix="write it to a folder outside the source checkpoint, e.g. a sibling folder",
        )


def grow_checkpoint(
    src: str | os.PathLike, dst: str | os.PathLike, method: str = "midas", block_size: int = 2
) -> Path:
    """Write a grown copy of the checkpoint in ``src`` to ``dst`` (atomically); returns ``dst``."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    _check_distinct(src, dst)
    config = _gpt2_config_of(src)
    given = config.get("n_layer")
    if not is_int(given) or given < 1:
        raise CheckpointError(
            f"{src / 'config.json'} gives n_layer {given!r}",
            fix="pass a checkpoint folder written by probekit train",
        )
    n_layers = int(given)
    mapping = layer_map(n_layers, method, block_size)
    try:
        weights = load_file(str(src / "model.safetensors"))
        optimizer = (
            load_file(str(src / "optimizer.safetensors"))
            if (src / "optimizer.safetensors").exists()
            else None
        )
    except Exception as err:  # safetensors raises its own error type on a damaged file
        raise CheckpointError(
            f"unreadable weights in {src} ({err})", fix="pass an intact checkpoint"
        ) from err
    config["n_layer"] = len(mapping)
    with swapped_directory(dst) as tmp:
        save_file(
            _renumber(weights, mapping), str(tmp / "model.safetensors"), metadata={"format": "pt"}
        )
        if optimizer is not None:
            save_file(_renumber(optimizer, mapping), str(tmp / "optimizer.safetensors"))
        atomic_write_text(tmp / "config.json", json.dumps(config, indent=2))
        for name in ("trainer_state.json", "generation_config.json"):
            if (src / name).exists():
                atomic_write_text(tmp / name, (src / name).read_text())
        run = read_run_config(src)
        if run is not None:
            if isinstance(run.get("model"), dict):
                run["model"]["n_layers"] = len(mapping)
            atomic_write_text(tmp / RUN_CONFIG, json.dumps(run, indent=1))
        atomic_write_text(
            tmp / "growth.json",
            json.dumps(
                {
                    "method": method,
                    "block_size": block_size,
                    "from_layers": n_layers,
                    "layer_map": mapping,
                    "inserted": inserted_layers(n_layers, method, block_size),
                }
            ),
        )
    return dst


def prop_alpha_stages(total_steps: int, n_stages: int, alpha: float) -> list[int]:
    """Stage lengths proportional to ``i^alpha`` (i = 1..n_stages), summing to ``total_steps``."""
    if not is_int(n_stages) or n_stages < 1:
        raise ConfigError(f"{n_stages!r} stages", fix="use at least one stage")
    check_int("total_steps", total_steps)
    if not (is_real(alpha) and alpha > 0):
        raise ConfigError(f"alpha = {alpha!r} must be > 0", fix="use e.g. alpha = 1 (Prop-1)")
    if total_steps < n_stages:
        raise ConfigError(
            f"{total_steps} training steps cannot hold {n_stages} stages",
            fix="train longer or use fewer stages",
        )
    try:
        weights = [float((i + 1) ** alpha) for i in range(n_stages)]
        if not math.isfinite(sum(weights)):
            raise OverflowError
    except OverflowError as err:
        raise ConfigError(
            f"alpha = {alpha} is too large: {n_stages} ** alpha overflows and every stage but "
            "the last would be empty",
            fix="use a moderate alpha, e.g. 0.5 .. 3",
        ) from err
    ends, running = [], 0.0
    for w in weights:
        running += w
        ends.append(round(total_steps * running / sum(weights)))
    lengths = [b - a for a, b in zip([0] + ends[:-1], ends, strict=True)]
    if min(lengths) < 1:
        raise ConfigError(
            f"stage lengths {lengths} leave an empty stage", fix="train longer or lower alpha"
        )
    return lengths


@dataclass
class GrowthPlan:
    """A checked growth schedule: when to grow and how deep the model is in each stage."""

    method: str
    block_size: int
    stage_lengths: list[int]
    depths: list[int]

    @property
    def boundaries(self) -> list[int]:
        """Training steps at which the model grows (the start of stages 2..n)."""
        out, step = [], 0
        for length in self.stage_lengths[:-1]:
            step += length
            out.append(step)
        return out


def growth_plan(
    initial_layers: int,
    final_layers: int,
    total_steps: int,
    *,
    method: str = "midas",
    block_size: int = 2,
    alpha: float = 1.0,
) -> GrowthPlan:
    """Plan growth from ``initial_layers`` to ``final_layers`` in blocks of ``block_size``."""
    check_int("initial_layers", initial_layers)
    check_int("final_layers", final_layers)
    check_int("block_size", block_size)
    grown = final_layers - initial_layers
    if grown < 0 or grown % block_size:
        raise ConfigError(
            f"cannot grow from {initial_layers} to {final_layers} layers in blocks of {block_size}",
            fix="make final - initial a non-negative multiple of the block size",
        )
    n_stages = grown // block_size + 1
    depths = [initial_layers + block_size * i for i in range(n_stages)]
    for depth in depths[:-1]:
        layer_map(depth, method, block_size)  # raises if a stage cannot be grown
    return GrowthPlan(method, block_size, prop_alpha_stages(total_steps, n_stages, alpha), depths)


def training_flops(
    n_params_per_stage: list[int], tokens_per_step: int, stage_lengths: list[int]
) -> float:
    """Training FLOPs by the 6·N·D rule, summed over stages of different sizes."""
    if len(n_params_per_stage) != len(stage_lengths) or not stage_lengths:
        raise ConfigError(
            f"{len(n_params_per_stage)} parameter counts for {len(stage_lengths)} stages",
            fix="give one parameter count per stage (at least one stage)",
        )
    return float(
        sum(
            6 * n * tokens_per_step * s
            for n, s in zip(n_params_per_stage, stage_lengths, strict=True)
        )
    )


__all__ = [
    "GrowthPlan",
    "METHODS",
    "grow_checkpoint",
    "growth_plan",
    "inserted_layers",
    "layer_map",
    "prop_alpha_stages",
    "training_flops",
]
