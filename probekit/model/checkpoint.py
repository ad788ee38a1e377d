"""A checkpoint folder's files, read and checked before anything is built: what makes a
folder a checkpoint, its config, its safetensors headers, its weights' dtype and size against
the config and the free memory, and a complete load (no weight missing, unexpected or
mismatched).

probekit never unpickles a checkpoint file: weights come from safetensors only. What makes a
folder a checkpoint (:data:`CHECKPOINT_MARKERS`, :func:`is_checkpoint_folder`,
:func:`checkpoints_below`) and which of its files probekit never reads
(:func:`is_pickled_weights`, :func:`is_unread_weights`, :func:`ignored_files`) is decided here
once, for loading, for the Hub (:mod:`probekit.model.hub`) and for the command line's checks
(:mod:`probekit.sources`). Importing this module imports no torch (the command
line checks a folder before torch loads); the functions that need it import it.

Example:
    >>> estimate_parameters({"n_layer": 2, "n_embd": 32, "vocab_size": 50}) // 1000
    26
    >>> is_pickled_weights("pytorch_model.bin"), is_unread_weights("tf_model.h5")
    (True, True)
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probekit.errors import CheckpointError
from probekit.io import read_json

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel

CHECKPOINT_MARKERS = ("config.json", "modules.json")
"""Files that make a folder a checkpoint of its own: a transformers checkpoint's config.json,
a sentence-transformers model's modules.json (its transformer may sit in a subfolder)."""

log = logging.getLogger(__name__)


KEPT_CHECKPOINTS = "checkpoints"
"""The folder of a run folder that holds the checkpoints kept over training, one
``step-000500/`` each (an anchor run's ``keep_checkpoints``; in a stack one folder per run
below it): ``probekit timeline RUN`` and the timelines of a run folder read them."""


def is_checkpoint_folder(path: str | os.PathLike) -> bool:
    """Whether the folder ``path`` holds a checkpoint of its own (a file of
    :data:`CHECKPOINT_MARKERS`), not only checkpoints below it.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> is_checkpoint_folder(folder)
        False
        >>> _ = (folder / "modules.json").write_text("[]")  # a sentence-transformers model
        >>> is_checkpoint_folder(folder)
        True
    """
    return any((Path(path) / name).exists() for name in CHECKPOINT_MARKERS)


def check_not_a_checkpoint(path: Path) -> None:
    """Name a folder that is neither a transformers nor a sentence-transformers checkpoint."""
    raise CheckpointError(
        f"{path} is neither a transformers checkpoint (no config.json) nor a "
        "sentence-transformers one (no modules.json)",
        fix="pass a folder written by save_pretrained() (config.json + *.safetensors) or by "
        "sentence-transformers' save() (modules.json, 1_Pooling/)",
    )


def checkpoints_below(
    path: str | os.PathLike, limit: int = 10, depth: int = 4, max_folders: int = 2000
) -> list[Path]:
    """Checkpoint folders (those holding a config.json) below the folder ``path``.

    Searches ``depth`` levels down, skipping hidden folders (an interrupted save's
    ``.checkpoint.*`` among them) and visiting at most ``max_folders``; returns at most ``limit``
    folders, shallowest first. The default depth of 4 is the deepest place probekit itself
    writes a checkpoint: a sweep keeps each stacked run's at ``OUT/stacks/<group>/checkpoint/
    <run>/``, so a sweep's folder (and a folder of runs, ``runs/<run>/checkpoint/``) lists them.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "runs" / "a" / "checkpoint").mkdir(parents=True)
        >>> _ = (root / "runs" / "a" / "checkpoint" / "config.json").write_text("{}")
        >>> [p.relative_to(root).as_posix() for p in checkpoints_below(root)]
        ['runs/a/checkpoint']
    """
    found: list[Path] = []
    level, visited = [Path(path)], 0
    for _ in range(depth):
        below = []
        for folder in level:
            try:
                children = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
            except OSError:
                continue
            for child in children:
                visited += 1
                if visited > max_folders or len(found) >= limit:
                    return found
                if child.is_dir() and not child.is_symlink():
                    below.append(child)
                    if (child / "config.json").is_file():
                        found.append(child)
        level = below
    return found


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""File suffixes of pickled weights, which probekit never unpickles."""

OTHER_FRAMEWORK_WEIGHTS = ("tf_model.h5", "flax_model")
"""How weight files of other frameworks (TensorFlow, Flax) begin: probekit never reads them."""


def is_pickled_weights(name: str | os.PathLike) -> bool:
    """Whether the file ``name`` holds pickled weights (:data:`PICKLE_SUFFIXES`)."""
    return Path(name).suffix in PICKLE_SUFFIXES


def is_unread_weights(name: str | os.PathLike) -> bool:
    """Whether the file ``name`` holds weights probekit never reads: pickled weights
    (:func:`is_pickled_weights`) or another framework's (:data:`OTHER_FRAMEWORK_WEIGHTS`)."""
    return is_pickled_weights(name) or Path(name).name.startswith(OTHER_FRAMEWORK_WEIGHTS)


def _small_json(path: Path) -> Any:
    """The JSON in ``path`` if it is a regular file under 16 MB that parses, else None."""
    try:
        if not path.resolve().is_file() or path.stat().st_size > 16 * 2**20:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # JSON nested too deep: RecursionError
        return None


def _ignored_file(path: Path) -> str | None:
    """Why probekit ignores the file ``path`` of a checkpoint folder, or None."""
    if is_pickled_weights(path.name):
        return f"{path.name} (pickled weights: probekit loads only safetensors, never unpickles)"
    if path.suffix == ".py":
        return f"{path.name} (custom model code: never imported)"
    if path.name.endswith(".index.json"):
        index = _small_json(path)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        shards = set(shards.values()) if isinstance(shards, dict) else set()
        pickled = sorted(str(s) for s in shards if not str(s).endswith(".safetensors"))
        if pickled or not path.name.endswith(".safetensors.index.json"):
            return f"{path.name} (a sharded index of pickled weights {pickled}: never unpickled)"
    return None


def ignored_files(path: str | os.PathLike) -> list[str]:
    """The files of the checkpoint folder ``path`` that probekit ignores, one line each.

    Pickled weights (``pytorch_model.bin`` and the like, also when a sharded index names them)
    are never unpickled, and custom code (``*.py``, ``auto_map`` in config.json or
    tokenizer_config.json) is never imported or run; ``probekit diagnose`` prints a notice for
    each.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "pytorch_model.bin").write_bytes(b"")
        >>> ignored_files(folder)
        ['pytorch_model.bin (pickled weights: probekit loads only safetensors, never unpickles)']
    """
    folder = Path(path)
    try:
        files = sorted(p for p in folder.iterdir() if not p.is_dir())
    except OSError:
        return []
    lines = [line for line in map(_ignored_file, files) if line]
    for name in ("config.json", "tokenizer_config.json"):
        config = _small_json(folder / name)
        if isinstance(config, dict) and "auto_map" in config:
            lines.append(f"auto_map in {name} (remote code: never run)")
    return lines


CONFIG_BYTES = 16 * 2**20
"""The largest config.json read (a Hugging Face config is a few kilobytes)."""


def check_safetensors(path: Path) -> int:
    """Check that a .safetensors file has a readable header and all the data it declares;
    return the number of values it stores."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError(f"header length {header_len} exceeds file size {size}")
            header = json.loads(handle.read(header_len))
        if not isinstance(header, dict):
            raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
        if 8 + header_len + max(ends, default=0) > size:
            raise ValueError("the file is shorter than its header says (truncated)")
        return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as err:
        raise CheckpointError(
            f"corrupt safetensors file {path} ({err})",
            fix="re-save the checkpoint with save_pretrained(safe_serialization=True)",
        ) from err


def check_checkpoint_dir(path: Path) -> tuple[dict, int]:
    """The checkpoint's config, and the number of values its safetensors files store."""
    if not path.exists():
        raise CheckpointError(
            f"checkpoint path {path} does not exist", fix="pass a Hugging Face model directory"
        )
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint path {path} is a file, not a directory",
            fix="pass the directory holding config.json and *.safetensors",
        )
    config_path = path / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{path} has no config.json",
            fix="pass a directory written by save_pretrained() (config.json + safetensors)",
        )
    check_regular_file(config_path)
    config = read_json(
        config_path, CONFIG_BYTES, "a model config", fix="re-save the model's config"
    )
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{config_path} holds a JSON {type(config).__name__}, not an object",
            fix="re-save the model's config with save_pretrained()",
        )
    archs = config.get("architectures")
    if archs is not None and not (
        isinstance(archs, list) and all(isinstance(a, str) for a in archs)
    ):
        raise CheckpointError(
            f"'architectures' in {config_path} is {archs!r}, not a list of class names",
            fix='write e.g. "architectures": ["GPT2LMHeadModel"]',
        )
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickled = [p.name for p in path.iterdir() if is_pickled_weights(p.name)]
        fix = (
            "convert the weights to safetensors (probekit never unpickles checkpoint files)"
            if pickled
            else "save the weights with save_pretrained(safe_serialization=True)"
        )
        raise CheckpointError(f"{path} has no *.safetensors weights", fix=fix)
    stored = 0
    for weight_file in weights:
        check_regular_file(weight_file)
        stored += check_safetensors(weight_file)
    return config, stored


SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
"""The floating dtypes of a safetensors header, each with the name of its torch dtype."""


def stored_dtype(path: str | os.PathLike, config: dict | None = None) -> torch.dtype:
    """The floating dtype a checkpoint directory stores its weights in: the one holding most
    values in the safetensors headers, else the config's ``dtype`` / ``torch_dtype``, else
    float32.

    Example:
        >>> import tempfile, torch
        >>> from probekit.toy import toy_hf_model
        >>> folder = tempfile.mkdtemp()
        >>> toy_hf_model("llama").to(torch.bfloat16).save_pretrained(folder)
        >>> stored_dtype(folder)
        torch.bfloat16
    """
    import torch

    counts: dict[torch.dtype, int] = {}
    for weight_file in sorted(Path(path).glob("*.safetensors")):
        try:
            with weight_file.open("rb") as handle:
                (header_len,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(header_len))
            for key, info in header.items():
                name = SAFETENSORS_DTYPES.get(info.get("dtype")) if key != "__metadata__" else None
                if name is not None:
                    dtype = getattr(torch, name)
                    counts[dtype] = counts.get(dtype, 0) + math.prod(info["shape"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
            continue  # check_safetensors names a corrupt file
    if counts:
        return max(counts, key=lambda d: counts[d])
    named = (config or {}).get("dtype") or (config or {}).get("torch_dtype")
    dtype = getattr(torch, named, None) if isinstance(named, str) else None
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def _config_int(config: dict, *keys: str, default: int = 0) -> int:
    """The first of ``keys`` that ``config`` holds as an int (not a bool), else ``default``."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def estimate_parameters(config: dict) -> int:
    """An estimate of the parameter count a Hugging Face config describes, from its
    sizes alone (no model is built): per layer the query and output projections (d² each),
    the key and value projections (d² each, or ``d x kv_heads x head_dim`` with grouped-query
    attention), 2-3 d·d_ff MLP weights, the token embedding, a separate output head when the
    config says the embeddings are untied (``tie_word_embeddings: false``), and learned
    position embeddings where the config has them. Norms and biases are left out (a fraction
    of a percent).

    Example:
        >>> estimate_parameters({"n_layer": 12, "n_embd": 768, "vocab_size": 50257,
        ...                      "n_positions": 1024}) // 10**6
        124
        >>> llama_8b = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
        ...             "num_attention_heads": 32, "num_key_value_heads": 8,
        ...             "hidden_act": "silu", "vocab_size": 128256, "tie_word_embeddings": False}
        >>> round(estimate_parameters(llama_8b) / 8_030_261_248, 4)  # its published count
        1.0
    """
    layers = _config_int(config, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    d = _config_int(config, "hidden_size", "n_embd", "d_model")
    d_ff = _config_int(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * d) or 4 * d
    gated = 3 if config.get("hidden_act") in ("silu", "swiglu", "gelu_pytorch_tanh") else 2
    vocab = _config_int(config, "vocab_size")
    positions = _config_int(config, "n_positions")
    if config.get("position_embedding_type") == "absolute":
        positions = _config_int(config, "max_position_embeddings")
    heads = _config_int(config, "num_attention_heads", "n_head", "n_heads")
    kv_heads = _config_int(config, "num_key_value_heads", default=heads)
    head_dim = _config_int(config, "head_dim", default=d // heads if heads else 0)
    key_value = 2 * d * kv_heads * head_dim if heads and kv_heads and head_dim else 2 * d * d
    attention = 2 * d * d + key_value
    head = vocab * d if config.get("tie_word_embeddings") is False else 0
    return layers * (attention + gated * d * d_ff) + (vocab + positions) * d + head


def available_memory(device: str) -> int | None:
    """The free memory of ``device`` in bytes (:func:`probekit.numerics.available_memory`,
    imported when asked: importing this module imports no torch), or None when unknown."""
    from probekit.numerics import available_memory as free_memory

    return free_memory(device)


def largest_weight(config: dict) -> int:
    """The number of values of the largest weight matrix a config describes: the
    ``vocab x d_model`` embedding or unembedding, or an MLP's ``d_model x d_ff`` where that is
    larger. A model whose weights are kept in their stored dtype apart from the computation's
    (:func:`probekit.model.storage.compute_in`) holds this one in the computation's dtype
    beside them, at the most.

    Example:
        >>> largest_weight({"hidden_size": 4096, "intermediate_size": 14336,
        ...                 "vocab_size": 128256})
        525336576
    """
    d = _config_int(config, "hidden_size", "n_embd", "d_model")
    d_ff = _config_int(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * d) or 4 * d
    return d * max(_config_int(config, "vocab_size"), d_ff)


def weights_bytes(config: dict, dtype: torch.dtype, stored: torch.dtype | None = None) -> int:
    """About the bytes of memory the weights of the model ``config`` describes take computed in
    ``dtype``: every parameter in ``dtype``, or with ``stored`` (weights kept in their stored
    dtype apart, :func:`probekit.model.storage.compute_in`) every parameter in ``stored`` plus
    the largest weight matrix (:func:`largest_weight`) in ``dtype``.

    Example:
        >>> import torch
        >>> config = {"n_layer": 2, "n_embd": 32, "vocab_size": 50}
        >>> weights_bytes(config, torch.float32)
        104704
        >>> weights_bytes(config, torch.float32, stored=torch.bfloat16)
        68736
    """
    import torch

    size = torch.empty((), dtype=dtype).element_size()
    if stored is None:
        return estimate_parameters(config) * size
    stored_size = torch.empty((), dtype=stored).element_size()
    return estimate_parameters(config) * stored_size + largest_weight(config) * size


def _narrower(dtype: torch.dtype, stored_in: torch.dtype | None) -> torch.dtype | None:
    """``stored_in`` where it has fewer bits than ``dtype`` (weights worth keeping apart)."""
    return stored_in if stored_in is not None and _bits(stored_in) < _bits(dtype) else None


def kept_dtype(
    config: dict,
    dtype: torch.dtype,
    stored_in: torch.dtype | None,
    storage: str,
    available: int | None,
) -> torch.dtype:
    """The dtype :func:`probekit.load` keeps the weights of ``config`` in when they compute in
    ``dtype`` and are stored in ``stored_in``, with ``storage``
    (:data:`probekit.model.storage.STORAGE_CHOICES`) and ``available`` free bytes (None:
    unknown): ``stored_in`` where it is narrower than ``dtype`` and ``storage`` is
    ``"stored"``, or ``"auto"`` and only the stored copy fits; else ``dtype``. Whether the
    chosen copy fits is :func:`check_fits`' question; the estimate before a diagnosis asks
    this one too (one rule for both).

    Example:
        >>> import torch
        >>> config = {"n_layer": 2, "n_embd": 32, "vocab_size": 50}
        >>> kept_dtype(config, torch.float32, torch.bfloat16, "auto", 90_000)
        torch.bfloat16
        >>> kept_dtype(config, torch.float32, torch.bfloat16, "auto", None)
        torch.float32
    """
    narrower = _narrower(dtype, stored_in)
    if narrower is None or storage == "dtype":
        return dtype
    if storage == "stored":
        return narrower
    if available is None or weights_bytes(config, dtype) <= available:
        return dtype
    return narrower if weights_bytes(config, dtype, narrower) <= available else dtype


def check_fits(
    path: Path,
    config: dict,
    stored: int,
    dtype: torch.dtype,
    *,
    stored_in: torch.dtype | None = None,
    storage: str = "dtype",
) -> torch.dtype:
    """Refuse, before anything is built, a config far bigger than its weights or than memory;
    return the dtype to keep the weights in (``dtype``, or ``stored_in`` when they are kept in
    their stored dtype apart from the computation's).

    ``storage`` (:data:`probekit.model.storage.STORAGE_CHOICES`): ``"dtype"`` refuses weights
    whose ``dtype`` copy does not fit in the free memory; ``"stored"`` keeps them in
    ``stored_in`` where that has fewer bits than ``dtype`` and refuses them when that does not
    fit; ``"auto"`` keeps them in ``dtype`` when that fits, else in ``stored_in`` when that fits
    (one logged line says so), else refuses, saying what to do.
    """
    estimate = estimate_parameters(config)
    if estimate > 8 * max(stored, 1) and estimate > 10**6:
        raise CheckpointError(
            f"config.json in {path} describes about {estimate:.3g} parameters but the weights "
            f"hold {stored:.3g} values",
            fix="fix config.json (layers, sizes, vocabulary, positions) to match the weights",
        )
    available = available_memory("cpu")  # weights are read into host memory first
    keep = kept_dtype(config, dtype, stored_in, storage, available)
    need = weights_bytes(config, dtype, None if keep == dtype else keep)
    if available is None or need <= available:
        if keep != dtype and storage == "auto" and available is not None:
            log.warning(
                "the %s copy of the weights in %s (%.3g GiB) does not fit in the %.3g GiB of "
                "free memory: keeping them in their stored %s (%.3g GiB) and computing every "
                "block in %s on the fly (the same numbers)",
                _name(dtype), path, weights_bytes(config, dtype) / 2**30, available / 2**30,
                _name(keep), need / 2**30, _name(dtype),
            )  # fmt: skip
        return keep
    narrower = _narrower(dtype, stored_in)
    if narrower is not None and storage == "auto":  # neither copy fits: say the smaller one
        keep = narrower
        need = weights_bytes(config, dtype, keep)
    raise CheckpointError(
        f"the model in {path} needs about {need / 2**30:.3g} GiB of memory for its "
        f"{estimate:.3g} parameters in {_name(dtype)}"
        + ("" if keep == dtype else f" (weights kept in {_name(keep)})")
        + f"; {available / 2**30:.3g} GiB are available",
        fix="free memory, diagnose fewer sequences, compute in half precision (--dtype "
        "bfloat16, dtype=torch.bfloat16), offload layers to disk (--device-map auto), or use a "
        "machine with more memory",
    )


def _bits(dtype: torch.dtype) -> int:
    """The bits of a floating dtype."""
    import torch

    return torch.finfo(dtype).bits


def _name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def check_regular_file(path: Path) -> None:
    """Refuse anything but a regular file (after symlinks): a FIFO or device would hang."""
    if not path.resolve().is_file():
        raise CheckpointError(
            f"{path} is not a regular file (a pipe, device or dangling link)",
            fix="point the checkpoint at real files written by save_pretrained()",
        )


def from_pretrained_complete(klass: Any, path: str | os.PathLike, **kwargs: Any) -> PreTrainedModel:
    """``klass.from_pretrained(path)`` from safetensors, refusing incomplete weights.

    Raises :class:`CheckpointError` when loading fails or when the checkpoint's tensors do not
    match the model its config describes (see :func:`_check_complete`).
    """
    path = Path(path)
    try:
        hf_model, loading_info = klass.from_pretrained(
            str(path), use_safetensors=True, output_loading_info=True, **kwargs
        )
    except Exception as err:  # HF raises many types; name the folder and the cause
        raise CheckpointError(
            f"could not load the checkpoint in {path}: {type(err).__name__}: {err}",
            fix="check that config.json matches the safetensors weights",
        ) from err
    _check_complete(path, loading_info)
    return hf_model


def _check_complete(path: Path, loading_info: dict) -> None:
    """Refuse a checkpoint whose tensors do not match the model its config describes.

    Hugging Face fills missing weights with a random initialisation and drops unexpected ones,
    so numbers computed after such a load would not be the checkpoint's. Weights that the model
    ties to others (GPT-2's unembedding) are not reported missing by transformers and load.
    """
    problems = []
    for what in ("missing", "unexpected", "mismatched"):
        names = sorted(str(n) for n in loading_info.get(f"{what}_keys") or ())
        if names:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            problems.append(f"{len(names)} {what} tensor(s): {shown}")
    if problems:
        raise CheckpointError(
            f"the weights in {path} do not match its config.json ({'; '.join(problems)})",
            fix="re-save the complete model with save_pretrained(safe_serialization=True), or "
            "fix config.json (number of layers, sizes, architectures) to match the weights",
        )


def named_weights(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of ``module`` with its name; weights a ``device_map`` offloaded to disk
    (meta tensors in the module) are read from the offload folder instead."""
    for name, param in module.named_parameters():
        if not param.is_meta:
            yield name, param
    seen: set[int] = set()
    for sub in module.modules():
        hooks = getattr(sub, "_hf_hook", None)
        for hook in getattr(hooks, "hooks", None) or ([hooks] if hooks is not None else []):
            stored = getattr(getattr(hook, "weights_map", None), "dataset", None)
            if not getattr(hook, "offload", False) or stored is None or id(stored) in seen:
                continue
            seen.add(id(stored))
            for name in stored:
                yield name, stored[name]


__all__ = [
    "CHECKPOINT_MARKERS",
    "KEPT_CHECKPOINTS",
    "OTHER_FRAMEWORK_WEIGHTS",
    "PICKLE_SUFFIXES",
    "SAFETENSORS_DTYPES",
    "check_checkpoint_dir",
    "check_fits",
    "check_not_a_checkpoint",
    "check_regular_file",
    "check_safetensors",
    "checkpoints_below",
    "estimate_parameters",
    "from_pretrained_complete",
    "ignored_files",
    "is_checkpoint_folder",
    "is_pickled_weights",
    "is_unread_weights",
    "largest_weight",
    "named_weights",
    "stored_dtype",
    "weights_bytes",
]
