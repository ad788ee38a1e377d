"""Reading a lens saved by the ``tuned-lens`` package (Belrose et al. 2023; versions 0.1 and
0.2 write the same folder), safely and only for the model it was made for.

The package's ``TunedLens.save(path)`` writes two files to a folder:

- ``config.json``: its ``TunedLensConfig`` as JSON: ``base_model_name_or_path`` (the model's
  ``config.name_or_path``), ``d_model``, ``num_hidden_layers``, ``bias`` (true),
  ``base_model_revision``, ``unembed_hash`` (a SHA-256 of the unembedding matrix printed to one
  decimal, :func:`unembedding_hash`) and ``lens_type`` (``"linear_tuned_lens"``);
- ``params.pt``: ``torch.save`` of its ``layer_translators`` (an ``nn.ModuleList``) state
  dict: ``"{i}.weight"`` ``[d_model, d_model]`` and ``"{i}.bias"`` ``[d_model]`` for
  ``i = 0 .. num_hidden_layers - 1``, in the dtype of the model's unembedding.

Its lens for layer ``i`` reads ``hidden_states[i]`` (the input of block ``i``), as
``unembed(h + translator_i(h))`` with the model's final norm and unembedding; the final hidden
state has no translator. That is probekit's depth ``i`` and ``translators[i]`` exactly.

``params.pt`` is a pickle, so it is read with ``torch.load(weights_only=True)``, which builds
tensors and plain containers only and refuses anything else without running it; a
``params.safetensors`` copy in the same folder is read instead when there is one. The older
0.0.x format (``num_layers``, an input translator, a copy of the unembedding) is refused.

Example:
    >>> from probekit.toy import toy_model
    >>> len(model_unembedding_hash(toy_model(n_layers=2)))  # what config.json's unembed_hash is
    64
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probekit.analyses.depth.lens_checks import check_translators_finite
from probekit.errors import CheckpointError, InputError, UnsupportedModelError
from probekit.io import read_json
from probekit.model import Model
from probekit.numerics import available_memory

CONFIG_FILE, PARAMS_FILE, SAFETENSORS_FILE = "config.json", "params.pt", "params.safetensors"
LENS_TYPE = "linear_tuned_lens"
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes a translator may be stored in (the package stores the unembedding's)."""

_FIX = "pass the folder the tuned-lens package's TunedLens.save(path) wrote"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_package_config(path: Path) -> dict[str, Any]:
    """The checked ``config.json`` of the tuned-lens folder ``path``: ``d_model`` and
    ``num_hidden_layers`` whole numbers, ``base_model_name_or_path`` a string, ``bias`` a
    bool, ``unembed_hash`` a string or null, ``lens_type`` the linear lens; keys the package
    does not know are ignored, as the package does. :class:`CheckpointError` otherwise."""
    if not path.is_dir():
        raise CheckpointError(f"cannot read a tuned lens from {path} (not a folder)", fix=_FIX)
    config = read_json(path / CONFIG_FILE, 1 << 20, "a tuned-lens config", fix=_FIX)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path / CONFIG_FILE} is not a JSON object", fix=_FIX)
    if "num_hidden_layers" not in config and "num_layers" in config:
        raise CheckpointError(
            f"{path} holds a lens in the tuned-lens 0.0.x format (num_layers, an input "
            "translator and a copy of the unembedding), which is not read",
            fix="use a lens saved by tuned-lens 0.1 or later, or fit one with TunedLens.fit",
        )
    problem = _config_problem(config)
    if problem is not None:
        raise CheckpointError(f"cannot read a tuned lens from {path} ({problem})", fix=_FIX)
    return {
        "base_model_name_or_path": config["base_model_name_or_path"],
        "d_model": config["d_model"],
        "num_hidden_layers": config["num_hidden_layers"],
        "bias": config.get("bias", True),
        "base_model_revision": config.get("base_model_revision"),
        "unembed_hash": config.get("unembed_hash"),
        "lens_type": config.get("lens_type", LENS_TYPE),
    }


def _config_problem(config: dict[str, Any]) -> str | None:
    """What is wrong with a tuned-lens config, in words (None: nothing)."""
    for key in ("d_model", "num_hidden_layers"):
        if not _is_count(config.get(key)):
            return f"its {key} {config.get(key)!r:.40} is not a whole number >= 1"
    if not isinstance(config.get("base_model_name_or_path"), str):
        return "its base_model_name_or_path is not a string"
    if not isinstance(config.get("bias", True), bool):
        return f"its bias {config['bias']!r:.40} is not true or false"
    for key in ("unembed_hash", "base_model_revision"):
        if not isinstance(config.get(key), str | None):
            return f"its {key} is not a string or null"
    if config.get("lens_type", LENS_TYPE) != LENS_TYPE:
        return f"its lens_type {config['lens_type']!r:.40} is not {LENS_TYPE!r}"
    return None


EDGE_ITEMS, THRESHOLD = 3, 1000
"""numpy's default print options: a matrix of more than ``THRESHOLD`` values prints only its
``EDGE_ITEMS`` first and last rows and columns."""


def unembedding_hash(weight: torch.Tensor) -> str:
    """The tuned-lens package's ``unembed_hash`` of an unembedding matrix (``tensor_hash`` in
    its ``utils``): the SHA-256 of ``numpy.array_str(weight, precision=1)`` in float32 with
    numpy's default print options. A large matrix prints only its corners, and their format
    depends on them alone, so only the corners are copied (the same text from a 7 x 7 stand-in
    printed with a threshold below its size), not the whole matrix.

    Example:
        >>> len(unembedding_hash(torch.zeros(50, 32)))
        64
    """
    rows, cols = weight.shape
    threshold = THRESHOLD
    if weight.numel() > THRESHOLD and min(rows, cols) > 2 * EDGE_ITEMS:
        edges = [*range(EDGE_ITEMS + 1), *range(-EDGE_ITEMS, 0)]  # one stand-in for the "..."
        index = torch.tensor(edges, device=weight.device)
        weight = weight.index_select(0, index % rows).index_select(1, index % cols)
        threshold = weight.numel() - 1
    values = weight.detach().cpu().float().numpy()
    with np.printoptions(
        threshold=threshold,
        edgeitems=EDGE_ITEMS,
        linewidth=75,
        suppress=False,
        sign="-",
        floatmode="maxprec",
    ):
        text = np.array_str(values, precision=1)
    return hashlib.sha256(text.encode()).hexdigest()


def model_unembedding_hash(model: Model) -> str:
    """:func:`unembedding_hash` of ``model``'s output embedding."""
    head = model.hf_model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.device.type == "meta":
        raise UnsupportedModelError(
            f"the {model.architecture} model's unembedding is not a weight matrix held here, "
            "so a tuned-lens lens cannot be checked against it",
            fix="load the model with its language-model head on one device",
        )
    return unembedding_hash(weight)


def _names_match(lens_name: str, model_name: str) -> bool:
    """The same model name, or the same last path part (``gpt2`` and ``/models/gpt2``)."""
    tail = lambda name: name.rstrip("/").rsplit("/", 1)[-1]  # noqa: E731
    return lens_name == model_name or tail(lens_name) == tail(model_name) != ""


def check_package_identity(
    config: dict[str, Any], model: Model, path: Path, check_name: bool = True
) -> None:
    """Refuse (:class:`InputError`, naming the difference) the lens of the checked ``config``
    for ``model`` unless it was made for it: the same ``num_hidden_layers`` and ``d_model``,
    the same unembedding (the package's ``unembed_hash``, when recorded), and, with
    ``check_name``, the same model name (``base_model_name_or_path`` against the model's
    ``name_or_path``, or its last path part). A lens that records neither name nor hash
    identifies no model and is read only with ``check_name=False``."""
    made_for = config["base_model_name_or_path"] or "an unnamed model"
    source = str(getattr(model.hf_model.config, "_name_or_path", "") or "")
    here = f"this {model.architecture} model" + (f" ({source})" if source else "")
    fix = f"load the model the lens was made for ({made_for}) or fit a lens on this one"
    lens_shape = (config["num_hidden_layers"], config["d_model"])
    if lens_shape != (model.n_layers, model.d_model):
        raise InputError(
            f"the tuned lens in {path} was made for {made_for} with num_hidden_layers="
            f"{lens_shape[0]}, d_model={lens_shape[1]}; {here} has n_layers={model.n_layers}, "
            f"d_model={model.d_model}",
            fix=f"{fix} (TunedLens.fit)",
        )
    recorded = config["unembed_hash"]
    if recorded is not None and recorded != model_unembedding_hash(model):
        raise InputError(
            f"the tuned lens in {path} was made for {made_for}, whose unembedding differs from "
            f"{here}'s (the unembed_hash the tuned-lens package recorded does not match)",
            fix=f"{fix} (TunedLens.fit)",
        )
    name = config["base_model_name_or_path"]
    if check_name and name and not _names_match(name, source):
        raise InputError(
            f"the tuned lens in {path} was made for {name!r}, not for {here}"
            + (", a model that records no name" if not source else ""),
            fix=f"{fix}; if this model is a copy of {name!r} saved under another name, pass "
            "check_name=False (the shapes and the unembedding are still compared)",
        )
    if check_name and not name and recorded is None:
        raise InputError(
            f"the tuned lens in {path} records neither its model's name nor its unembedding "
            "hash, so nothing tells that it belongs to this model",
            fix="if you know it was made for this model, pass check_name=False",
        )


def _params_file(path: Path) -> Path:
    """The folder's translator file: ``params.safetensors`` if there, else ``params.pt``."""
    for name in (SAFETENSORS_FILE, PARAMS_FILE):
        if os.path.lexists(path / name):
            return path / name
    raise CheckpointError(
        f"{path} holds no {PARAMS_FILE} (nor a {SAFETENSORS_FILE} copy), so it has no "
        "translators to read",
        fix=_FIX,
    )


def _check_params_size(file: Path, n_layers: int, d_model: int) -> None:
    """Refuse a translator file that is not a regular file, or is larger than float64
    translators of the declared shape (plus 1 MiB of container) or than free memory."""
    try:
        info = os.stat(file)
    except OSError as err:
        raise CheckpointError(f"cannot read {file} ({err.strerror or err})", fix=_FIX) from err
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"{file} is not a regular file (a pipe, device or folder)", fix=_FIX)
    most = 8 * n_layers * d_model * (d_model + 1) + (1 << 20)
    if info.st_size > most:
        raise CheckpointError(
            f"{file} holds {info.st_size} bytes, more than {n_layers} translators of d_model "
            f"{d_model} can take even in float64 ({most})",
            fix=_FIX,
        )
    free = available_memory("cpu")
    if free is not None and 2 * info.st_size > free:
        raise CheckpointError(
            f"{file} needs about {2 * info.st_size / 2**30:.1f} GiB to load, more than the "
            f"{free / 2**30:.1f} GiB of memory available",
            fix="load it on a machine with more memory",
        )


def _load_tensors(file: Path) -> Any:
    """The object in ``file``: safetensors, or a pickle read with ``weights_only=True`` (which
    refuses, without running it, anything but tensors and plain containers)."""
    try:
        if file.name == SAFETENSORS_FILE:
            from safetensors.torch import load_file

            return load_file(str(file))
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError, RuntimeError, SafetensorError...
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(
            f"cannot read the translators in {file}: it holds something other than tensors or "
            f"is damaged, and was not run ({type(err).__name__}: {first})",
            fix=f"{_FIX}; probekit reads tensors only (torch.load with weights_only=True)",
        ) from err


def read_package_translators(path: Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The translators of the tuned-lens folder ``path`` as float32 tensors named by probekit
    (``translators.{i}.weight`` / ``.bias``; a zero bias where ``bias`` is false), after
    checking the file holds exactly the package's keys (``{i}.weight``, ``{i}.bias``), each of
    its shape, a floating dtype and finite: :class:`CheckpointError` /
    :class:`~probekit.errors.NumericalError` naming what is wrong."""
    n, d = config["num_hidden_layers"], config["d_model"]
    file = _params_file(path)
    _check_params_size(file, n, d)
    state = _load_tensors(file)
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise CheckpointError(
            f"{file} does not hold a mapping of names to tensors (a {type(state).__name__})",
            fix=_FIX,
        )
    parts = ("weight", "bias") if config["bias"] else ("weight",)
    expected = {f"{i}.{part}" for i in range(n) for part in parts}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise CheckpointError(
            f"{file} does not hold the {n} translators its config declares (missing "
            f"{missing[:4]}, unexpected {extra[:4]})",
            fix=_FIX,
        )
    out: dict[str, torch.Tensor] = {}
    for i in range(n):
        for part in ("weight", "bias"):
            key = f"{i}.{part}"
            shape = (d, d) if part == "weight" else (d,)
            tensor = state.get(key, torch.zeros(d))
            _check_tensor(file, key, tensor, shape)
            out[f"translators.{i}.{part}"] = tensor.to(torch.float32).contiguous()
    check_translators_finite(out, f"in {path}")
    return out


def _check_tensor(file: Path, key: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tensor.layout != torch.strided or tensor.dtype not in FLOAT_DTYPES:
        raise CheckpointError(
            f"{key} in {file} is a {tensor.layout} {tensor.dtype} tensor, not a dense "
            "floating-point one",
            fix=_FIX,
        )
    if tuple(tensor.shape) != shape:
        raise CheckpointError(
            f"{key} in {file} has shape {tuple(tensor.shape)}, not {shape} (d_model "
            f"{shape[0]} in its config)",
            fix=_FIX,
        )
