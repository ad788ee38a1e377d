"""Checks that a tuned lens belongs to the model it reads and that a lens folder is what it
claims, before anything is built: the model identity a lens records (architecture, shapes,
dtype, source and a weight fingerprint), finite translators, int64 ``fit_sequences``, and a
folder whose config, weights file and size fit together and in memory.

Example:
    >>> from probekit.toy import toy_model
    >>> saved = model_identity(toy_model(n_layers=2, seed=0))
    >>> identity_mismatch(saved, model_identity(toy_model(n_layers=2, seed=0))) is None
    True
    >>> identity_mismatch(saved, model_identity(toy_model(n_layers=2, seed=1)))
    'the weights differ in the embedding'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeGuard

import torch

from probekit.errors import CheckpointError, InputError, NumericalError, UnsupportedModelError
from probekit.io import read_json
from probekit.model import Model
from probekit.model.storage import plain_name, stored_tensor
from probekit.numerics import all_finite, available_memory, tolerance, within_tolerance

FORMAT = "probekit.tuned_lens"
WEIGHTS_FILE, CONFIG_FILE = "lens.safetensors", "config.json"

VERSION = 3
"""Version 3 fingerprints every parameter tensor of the model a lens was fit on
(:func:`model_identity`); version 2 fingerprinted only the embedding, the unembedding and the
first and last block, so a model differing in a middle block or a norm passed (issue 31);
version 1 lenses record no model. Lenses of versions 1 and 2 are read but refused for a model
until re-identified (see :meth:`TunedLens.check_model`); a version above this one is refused
on load."""

FINGERPRINT_OF = "every parameter tensor"
"""What a version-3 identity's fingerprint covers (``model_identity(...)["fingerprint_of"]``)."""

CONFIG_BYTES = 1 << 30
"""The largest lens config.json read (its loss history holds one number per step)."""

FINGERPRINT_SAMPLES = 16
"""Values sampled from each fingerprinted weight tensor at seeded random positions, besides as
many at evenly strided positions (the first and last included); a tensor of at most twice as
many values is recorded whole (:func:`model_identity`)."""


def _positions(numel: int) -> torch.Tensor:
    """The flat positions sampled from a tensor of ``numel`` values: the same for every model
    of that size."""
    if numel <= 2 * FINGERPRINT_SAMPLES:
        return torch.arange(numel)
    strided = torch.linspace(0, numel - 1, FINGERPRINT_SAMPLES).round().long()
    g = torch.Generator().manual_seed(numel)
    return torch.cat([strided, torch.randint(numel, (FINGERPRINT_SAMPLES,), generator=g)])


def _parameters(model: Model) -> dict[str, torch.Tensor]:
    """Every parameter tensor of ``model`` by name (the bridge's wrapper level left out of the
    names), the input embedding named ``embedding`` and an untied output embedding
    ``unembedding``."""
    hf = model.hf_model
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    special = {} if head is None else {id(stored_tensor(head)): "unembedding"}
    embedding = stored_tensor(hf.get_input_embeddings())  # as stored (load(storage=...))
    if not isinstance(embedding, torch.Tensor):
        raise UnsupportedModelError(
            f"the input embedding of {type(hf).__name__} has no weight tensor",
            fix="use a model whose input embedding is a torch embedding (nn.Embedding)",
        )
    special[id(embedding)] = "embedding"  # wins when tied
    out = {"embedding": embedding}
    for name, weight in hf.named_parameters():
        out[special.get(id(weight), plain_name(name).replace("._original_component", ""))] = weight
    return out


def _fingerprint(weights: dict[str, torch.Tensor]) -> dict[str, dict[str, Any] | None]:
    """Per tensor its shape and the values at :func:`_positions` (one transfer per device);
    None for a tensor with no values here (offloaded to the meta device)."""
    picked: dict[str, torch.Tensor] = {}
    for name, weight in weights.items():
        if weight.device.type != "meta" and weight.numel() > 0:
            flat = _positions(weight.numel())
            index = tuple(i.to(weight.device) for i in torch.unravel_index(flat, weight.shape))
            picked[name] = weight.detach()[index].float()
    values: dict[str, list[float]] = {}
    by_device: dict[torch.device, list[str]] = {}
    for name, tensor in picked.items():
        by_device.setdefault(tensor.device, []).append(name)
    for names in by_device.values():
        joined = torch.cat([picked[n] for n in names]).cpu().tolist()
        for name in names:
            values[name], joined = joined[: picked[name].numel()], joined[picked[name].numel() :]
    return {
        name: {"shape": list(weight.shape), "values": values[name]} if name in values else None
        for name, weight in weights.items()
    }


def model_identity(model: Model) -> dict[str, Any]:
    """What a lens records of the model it is fit on: architecture, shapes, dtype, where it
    was loaded from, and a weight fingerprint of every parameter tensor (its shape and
    values at :func:`_positions`: all of a small tensor such as a norm's gain, else
    2 x :data:`FINGERPRINT_SAMPLES` of them), so a model differing in any one tensor -- a
    middle block, a LayerNorm weight -- is told apart.

    Example:
        >>> from probekit.toy import toy_model
        >>> identity = model_identity(toy_model(n_layers=2))
        >>> identity["n_layers"], identity["fingerprint_of"], len(identity["fingerprint"])
        (2, 'every parameter tensor', 40)
    """
    hf = model.hf_model
    return {
        "architecture": model.architecture,
        "n_layers": model.n_layers,
        "d_model": model.d_model,
        "d_vocab": model.d_vocab,
        "dtype": str(model.dtype).removeprefix("torch."),
        "source": str(getattr(hf.config, "_name_or_path", "") or ""),
        "fingerprint_of": FINGERPRINT_OF,
        "fingerprint": _fingerprint(_parameters(model)),
    }


def describe_identity(identity: dict[str, Any]) -> str:
    """A model identity in words (architecture, shapes and where it was loaded from)."""
    source = identity.get("source")
    return (
        f"{identity.get('architecture')} (n_layers={identity.get('n_layers')}, "
        f"d_model={identity.get('d_model')}, d_vocab={identity.get('d_vocab')}"
        + (f", from {source}" if source else "")
        + ")"
    )


def _dtype_tolerance(name: Any) -> float:
    dtype = getattr(torch, str(name), None)
    return tolerance(dtype) if isinstance(dtype, torch.dtype) else tolerance(torch.float16)


def identity_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """How the model identity ``current`` differs from the ``saved`` one, or None when they
    are the same model: the same architecture and shapes, and every fingerprinted weight equal
    to the tolerance of the coarser of the two dtypes (:func:`~probekit.numerics.tolerance`:
    the same checkpoint loaded in bfloat16 matches its float32 self; another model does not)."""
    for key in ("architecture", "n_layers", "d_model", "d_vocab"):
        if saved.get(key) != current.get(key):
            return f"its {key} is {saved.get(key)!r}, this model's {current.get(key)!r}"
    tol = max(_dtype_tolerance(saved.get("dtype")), _dtype_tolerance(current.get("dtype")))
    theirs = saved.get("fingerprint")
    mine = current.get("fingerprint") or {}
    if not isinstance(theirs, dict):
        return "its weight fingerprint is unreadable"
    if set(theirs) != set(mine):
        missing, extra = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
        return (
            f"its tensors differ (only the lens's model has {missing[:3]}, only this {extra[:3]})"
        )
    for name, entry in theirs.items():
        reason = _tensor_mismatch(name, entry, mine[name], tol)
        if reason is not None:
            return reason
    return None


def _tensor_mismatch(name: str, saved: Any, current: Any, tol: float) -> str | None:
    """How one tensor's fingerprint ``current`` differs from the ``saved`` one (None: equal to
    ``tol``, or either has no values here)."""
    if saved is None or current is None:
        return None
    try:
        want = torch.tensor(saved["values"], dtype=torch.float64)
        shape = [int(n) for n in saved["shape"]]
    except (TypeError, ValueError, RuntimeError, KeyError):
        return f"its {name} fingerprint is unreadable"
    got = torch.tensor(current["values"], dtype=torch.float64)
    if shape != current["shape"]:
        return f"the shape of {name} is {shape}, this model's {current['shape']}"
    if want.shape != got.shape or not within_tolerance(got, want, tol):
        return f"the weights differ in {'the ' if name in _NAMED else ''}{name}"
    return None


_NAMED = ("embedding", "unembedding")


def check_translators_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    """Raise :class:`NumericalError` naming the first translator tensor (of the lens
    ``where``) holding NaN or infinite values."""
    for name, tensor in tensors.items():
        if not all_finite(tensor):
            raise NumericalError(
                f"the tuned lens {where} holds NaN or infinite values in {name}",
                fix="refit the lens (a lower lr, or grad_clip, keeps the fit finite)",
            )


def check_fit_sequences(hashes: Any, where: str) -> None:
    """Refuse ``fit_sequences`` that are not one int64 hash per sequence (a float copy
    cannot hold the hashes, so the overlap would silently be 0)."""
    ok = isinstance(hashes, torch.Tensor) and hashes.dtype == torch.int64 and hashes.ndim == 1
    if not ok:
        kind = (
            f"a {hashes.dtype} tensor of shape {tuple(hashes.shape)}"
            if isinstance(hashes, torch.Tensor)
            else type(hashes).__name__
        )
        raise CheckpointError(
            f"the fit_sequences of the tuned lens {where} are {kind}, not one int64 hash per "
            "sequence, so the overlap of fit and evaluation data cannot be counted",
            fix="refit the lens, or keep fit_sequences as TunedLens.fit writes them (int64)",
        )


def check_lens_shape(mine: tuple[int, int, int | None], model: Model) -> None:
    """Raise :class:`InputError` unless ``model`` has the lens shape ``mine`` (n_layers,
    d_model, d_vocab; a d_vocab of None is not compared)."""
    theirs = (model.n_layers, model.d_model, model.d_vocab)
    if mine[:2] != theirs[:2] or (mine[2] is not None and mine[2] != theirs[2]):
        raise InputError(
            f"the tuned lens was fit on a model with n_layers={mine[0]}, d_model={mine[1]}, "
            f"d_vocab={mine[2]}; this model has n_layers={theirs[0]}, d_model={theirs[1]}, "
            f"d_vocab={theirs[2]}",
            fix="fit a lens on this model (TunedLens.fit) or load the lens made for it",
        )


def check_identity(saved: Any, current: dict[str, Any], where: str) -> None:
    """Raise :class:`InputError` naming both models unless the lens ``where``, which records
    the model identity ``saved``, was fit on the model of identity ``current``. A lens that
    records none (saved before lenses did), or a fingerprint of only some tensors (before
    version 3), is refused too, with the way to record it."""
    refit = (
        "fit a lens on this model (probekit diagnose --tuned-lens, or TunedLens.fit(model, "
        "data)) or pass the model the lens was fit on"
    )
    if not isinstance(saved, dict):
        raise InputError(
            f"the tuned lens {where} records no identity of the model it was fit on (it was "
            f"saved before lenses did), so it cannot be checked against this model, "
            f"{describe_identity(current)}",
            fix=f"{refit}; if it was fit on this very model, record that: lens = "
            "TunedLens.load(path); lens.identify(model); lens.save(path)",
        )
    if saved.get("fingerprint_of") != FINGERPRINT_OF:
        raise InputError(
            f"the tuned lens {where} records a fingerprint of only some of its model's weights "
            "(the embedding, the unembedding, the first and last block: a lens saved before "
            f"lens format {VERSION}), so a model differing in a middle block or a norm would "
            f"pass as the same; this model is {describe_identity(current)}",
            fix=f"{refit}; if it was fit on this very model, record it again: lens = "
            "TunedLens.load(path); lens.identify(model); lens.save(path)",
        )
    reason = identity_mismatch(saved, current)
    if reason is not None:
        raise InputError(
            f"the tuned lens {where} was fit on {describe_identity(saved)}, not on this model, "
            f"{describe_identity(current)}: {reason}",
            fix=refit,
        )


_READ_FIX = "pass a folder written by TunedLens.save()"


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def read_lens_config(path: Path) -> dict[str, Any]:
    """The checked config.json of the lens folder ``path``: a regular file of the format, of a
    ``version`` this probekit reads (1 to :data:`VERSION`; a newer or unknown one is refused,
    not guessed at), with whole-number ``n_layers`` and ``d_model`` (and ``d_vocab`` or null)
    and an object ``fit_info``; anything else is one :class:`CheckpointError`."""
    if not path.is_dir():
        raise CheckpointError(f"cannot read a tuned lens from {path} (not a folder)", fix=_READ_FIX)
    config = read_json(path / CONFIG_FILE, CONFIG_BYTES, "a tuned lens's config", fix=_READ_FIX)
    problem = None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        problem = f"{CONFIG_FILE} is not a {FORMAT} config"
    elif not _is_count(version := config.get("version")) or version > VERSION:
        raise CheckpointError(
            f"cannot read a tuned lens from {path} (its format version is {version!r:.40}; "
            f"this probekit reads versions 1 to {VERSION})",
            fix="read it with the probekit version that saved it, or fit the lens again "
            "with this one (probekit diagnose --tuned-lens, or TunedLens.fit)",
        )
    elif not all(_is_count(config.get(k)) for k in ("n_layers", "d_model")):
        problem = f"n_layers {config.get('n_layers')!r} or d_model {config.get('d_model')!r}"
        problem += " is not a whole number >= 1"
    elif config.get("d_vocab") is not None and not _is_count(config["d_vocab"]):
        problem = f"d_vocab {config['d_vocab']!r} is not a whole number >= 1"
    elif not isinstance(config.get("fit_info", {}), dict):
        problem = f"fit_info is a JSON {type(config['fit_info']).__name__}, not an object"
    if problem is not None:
        raise CheckpointError(f"cannot read a tuned lens from {path} ({problem})", fix=_READ_FIX)
    return {**config, "d_vocab": config.get("d_vocab"), "fit_info": config.get("fit_info", {})}


def _check_lens_size(path: Path, config: dict[str, Any]) -> None:
    """Refuse a weights file that is not a regular file, and a config whose translators
    (float32) need more bytes than the weights file holds or than the free memory, before
    anything is built."""
    import stat

    weights = path / WEIGHTS_FILE
    try:
        info = os.stat(weights)
    except OSError as err:
        raise CheckpointError(
            f"cannot read a tuned lens from {path} ({err.strerror or err})", fix=_READ_FIX
        ) from err
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(
            f"{weights} is not a regular file (a pipe, device or folder), so it cannot be a "
            "tuned lens's weights",
            fix=_READ_FIX,
        )
    n, d = config["n_layers"], config["d_model"]
    need = 4 * n * d * (d + 1)
    if need > info.st_size:
        raise CheckpointError(
            f"cannot read a tuned lens from {path} (its config declares {n} translators of "
            f"d_model {d}, {need} bytes, more than its {WEIGHTS_FILE} holds: {info.st_size})",
            fix="re-save the lens with TunedLens.save()",
        )
    free = available_memory("cpu")
    if free is not None and 2 * need > free:
        raise CheckpointError(
            f"the tuned lens in {path} needs about {2 * need / 2**30:.1f} GiB to load, more "
            f"than the {free / 2**30:.1f} GiB of memory available",
            fix="load it on a machine with more memory",
        )


def read_lens_tensors(path: Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of a saved lens (checked in size first), with finite translators and int64
    ``fit_sequences``, or :class:`CheckpointError` / :class:`NumericalError`."""
    from safetensors.torch import load_file

    _check_lens_size(path, config)
    try:
        tensors = load_file(str(path / WEIGHTS_FILE))
    except Exception as err:  # noqa: BLE001 - safetensors' SafetensorError is not an OSError
        raise CheckpointError(
            f"cannot read a tuned lens from {path} ({type(err).__name__}: {err})", fix=_READ_FIX
        ) from err
    if "fit_sequences" in tensors:
        check_fit_sequences(tensors["fit_sequences"], f"in {path}")
    check_translators_finite(
        {k: v for k, v in tensors.items() if k != "fit_sequences"}, f"in {path}"
    )
    return tensors
