"""Loading a model: :func:`load` from a checkpoint folder (every file checked before it is
read), an in-memory Hugging Face model or a bridge, with the device placement (one device or an
accelerate ``device_map``), the tokenizer saved beside the weights, and base models and
sentence-transformers folders wrapped for the bridge.

A call of :func:`load` runs: placement -> folder checks (:mod:`probekit.model.checkpoint`) ->
the head class of a base model (:mod:`probekit.model.headless`) -> ``from_pretrained`` -> the
bridge (:mod:`probekit.model.bridge`) -> its :class:`~probekit.model.runtime.Runtime` ->
:class:`probekit.model.Model` -> its weight and structure checks.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from probekit.errors import CheckpointError, InputError, UnsupportedModelError
from probekit.model.bridge import attach_bridge, supported_architectures, unsupported
from probekit.model.checkpoint import (
    check_checkpoint_dir,
    check_fits,
    check_not_a_checkpoint,
    from_pretrained_complete,
    stored_dtype,
)
from probekit.model.handle import Model
from probekit.model.headless import (
    Headless,
    Pooling,
    has_final_norm,
    head_class_for,
    read_sentence_transformers,
    wrap_headless,
)
from probekit.model.hub import hub_name, resolve
from probekit.model.runtime import Runtime
from probekit.model.storage import STORAGE_CHOICES, compute_in

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def _default_device() -> str:
    """Where a checkpoint folder loads without a ``device``: CUDA when present, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load(
    source: Any,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    storage: str = "auto",
    copy_model: bool = True,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    revision: str | None = None,
) -> Model:
    """Attach probekit to a model and return its :class:`Model` handle.

    ``source`` is a Hugging Face model directory on disk (config.json + safetensors), a
    Hugging Face Hub name (``"gpt2"``, ``"EleutherAI/pythia-70m"``, with ``@revision`` or
    ``revision=``: a branch, tag or commit) resolved from the local Hugging Face cache or
    downloaded when allowed (:mod:`probekit.model.hub`: safetensors, configs and tokenizer
    files only), an in-memory Hugging Face ``PreTrainedModel``, a ``TransformerBridge``, or an
    existing :class:`Model` (returned as is). An in-memory model is copied first, so the
    caller's object keeps its modules, parameter names, device and dtype (``save_pretrained``
    still works);
    ``copy_model=False`` skips the copy for a model too large to hold twice, and then the
    bridge replaces its submodules in place: use the returned handle, not the original.
    Directories load onto CUDA when present, else the CPU, in the dtype their weights are
    stored in (bf16 / fp16 / fp32, see :func:`stored_dtype`) unless ``dtype`` is set; every
    measure is accumulated in float64 whatever the model's dtype.

    ``storage`` says which dtype the weights are kept in, apart from the one they compute in
    (``dtype``): ``"dtype"`` casts them to ``dtype`` (a float32 computation of a bf16
    checkpoint holds a float32 copy: 4 bytes per parameter); ``"stored"`` keeps them as the
    checkpoint stores them (bf16 / fp16: 2 bytes per parameter) and computes every block, norm,
    embedding and head in ``dtype`` (float32 when ``dtype`` is None) on the fly, each weight
    copied to float32 when read and dropped after (:mod:`probekit.model.storage`): the numbers
    of a float32 load (bf16 and fp16 convert to float32 exactly) in the memory of the stored
    weights plus the largest weight matrix in float32 (the ``vocab x d_model`` unembedding,
    :func:`~probekit.model.checkpoint.weights_bytes`); ``"auto"`` (the default) is
    ``"dtype"``, except that a checkpoint folder whose ``dtype`` copy would not fit in the free
    memory while its stored weights would loads as ``"stored"``, with one logged line saying
    so. A model too big either way is refused before loading, saying what to do.

    Base models without an LM head (``GPT2Model``, ``LlamaModel``, ``BertModel``, ... of every
    family whose head class the bridge supports, found from transformers' auto mappings) and
    sentence-transformers folders (``modules.json``, ``1_Pooling/config.json``: mean, CLS or
    last-token pooling, optional ``Normalize``) load too: their output is the final hidden
    state per token or the pooled embedding per sequence (:attr:`Model.output_kind`). The
    bridge attaches to the base model wrapped in its head class whose head is never run or
    read (weights tied to the embeddings or zeros, never random).

    ``device_map`` (``"auto"``, or a dict as accelerate takes it), with ``max_memory`` and
    ``offload_folder``, spreads a checkpoint folder's layers over GPUs, the CPU and the disk
    (accelerate); a trace's cached residuals stay on the device of the block that wrote them.

    Example:
        >>> import tempfile
        >>> from probekit.toy import toy_hf_model
        >>> folder = tempfile.mkdtemp()
        >>> toy_hf_model("llama", n_layers=2).save_pretrained(folder)
        >>> load(folder, device="cpu").architecture
        'LlamaForCausalLM'
    """
    if isinstance(source, Model):
        return source
    placement = _placement(source, device, device_map, max_memory, offload_folder)
    _check_storage(storage, placement)
    if isinstance(source, str | os.PathLike):  # checked before transformers is imported
        model = _load_folder(local_folder(source, revision), device, dtype, placement, storage)
    else:
        model = _load_object(source, device, dtype, copy_model, storage)
    model.check_finite()
    model.check_structure()
    return model


def local_folder(source: str | os.PathLike, revision: str | None = None) -> Path:
    """The folder on disk that ``source`` names: itself when it exists (``revision`` must then
    be None), else the Hub model of that name (:func:`probekit.model.hub.resolve`)."""
    path = Path(source).expanduser()
    if os.path.lexists(path) or hub_name(source) is None:
        if revision is not None:
            raise CheckpointError(
                f"revision={revision!r} was given for the folder {source}",
                fix="pass revision only with a Hugging Face Hub name",
            )
        return path
    return resolve(os.fspath(source), revision)


def _placement(
    source: Any, device: Any, device_map: Any, max_memory: Any, offload_folder: Any
) -> dict:
    """The accelerate placement arguments of :func:`load`, checked before any work."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise InputError(
                "max_memory and offload_folder only apply with a device_map",
                fix='pass device_map="auto" as well',
            )
        return {}
    if not isinstance(source, str | os.PathLike):
        raise InputError(
            "device_map applies to a checkpoint folder, not to a model already in memory",
            fix="pass the folder's path, or place the in-memory model yourself",
        )
    if device is not None:
        raise InputError("device and device_map were both given", fix="pass only one of them")
    if not (device_map in ("auto", "balanced", "sequential") or isinstance(device_map, dict)):
        raise InputError(
            f"device_map={device_map!r} is neither 'auto', 'balanced', 'sequential' nor a dict",
            fix='pass device_map="auto" (with max_memory={0: "20GiB", "cpu": "60GiB"})',
        )
    if max_memory is not None and not isinstance(max_memory, dict):
        raise InputError(
            f"max_memory={max_memory!r} is not a dict", fix='pass e.g. {0: "20GiB", "cpu": "60GiB"}'
        )
    out: dict[str, Any] = {"device_map": device_map}
    if max_memory is not None:
        out["max_memory"] = max_memory
    if offload_folder is not None:
        out["offload_folder"] = str(offload_folder)
    return out


def _check_storage(storage: Any, placement: dict) -> None:
    """Refuse a ``storage`` of :func:`load` that is not one of
    :data:`~probekit.model.storage.STORAGE_CHOICES`, or ``"stored"`` with a ``device_map``."""
    if storage not in STORAGE_CHOICES:
        raise InputError(
            f"storage={storage!r} is none of {', '.join(map(repr, STORAGE_CHOICES))}",
            fix='pass storage="stored" to keep the weights as stored and compute in float32',
        )
    if storage == "stored" and placement:
        raise InputError(
            'storage="stored" and a device_map were both given',
            fix="pass only one of them (weights kept as stored stay on one device)",
        )


def _load_object(
    source: Any, device: Any, dtype: torch.dtype | None, copy_model: bool, storage: str = "auto"
) -> Model:
    """A handle on an in-memory Hugging Face model (copied unless told not to) or a bridge."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedModel

    if isinstance(source, TransformerBridge):
        return Model(Runtime(source))
    if not isinstance(source, PreTrainedModel):
        raise InputError(
            f"cannot load a model from a {type(source).__name__}",
            fix="pass a model directory path, a Hugging Face model or a TransformerBridge",
        )
    arch = type(source).__name__
    head = head_class_for(arch)  # base classes, even those the bridge lists
    if arch not in supported_architectures() and head is None:
        raise unsupported(arch)
    hf_model = copy.deepcopy(source) if copy_model else source
    apart = _apart(next(hf_model.parameters()).dtype, dtype, storage)
    if apart is not None:
        dtype = None  # kept as stored, computed in `apart`
    if device is not None or dtype is not None:
        # transformers wraps its `to` in functools.wraps(nn.Module.to), which mypy reads as an
        # unbound function missing its self
        hf_model.to(device=device, dtype=dtype)  # type: ignore[call-arg]
    if head is not None:
        return _headless_model(hf_model, head, None, None, None, apart)
    return Model(_runtime(attach_bridge(hf_model, arch), apart))


def _apart(stored: torch.dtype, dtype: torch.dtype | None, storage: str) -> torch.dtype | None:
    """The dtype weights kept in ``stored`` compute in under ``storage="stored"`` (``dtype``,
    default float32), or None where they are cast to it (not narrower than it)."""
    compute = dtype or torch.float32
    if storage != "stored" or torch.finfo(stored).bits >= torch.finfo(compute).bits:
        return None
    return compute


def _runtime(bridge: Any, apart: torch.dtype | None, headless: Headless | None = None) -> Runtime:
    """The :class:`Runtime` of ``bridge``, its weights computed in ``apart`` when not None
    (:func:`~probekit.model.storage.compute_in`)."""
    if apart is not None:
        compute_in(bridge, bridge.original_model, apart)
    return Runtime(bridge, headless)


def _load_folder(
    path: Path,
    device: Any,
    dtype: torch.dtype | None,
    placement: dict | None = None,
    storage: str = "auto",
) -> Model:
    """A handle on the checkpoint folder ``path``, every file checked before it is read."""
    folder, pooling, arch, head, dtype, apart = _checked_folder(
        path, dtype, fits=not placement, storage=storage
    )
    hf_model = _from_folder(folder, arch, dtype, placement or {})
    if not placement:
        # transformers wraps its `to` in functools.wraps(nn.Module.to), which mypy reads as an
        # unbound function (self = the device)
        hf_model.to(device or _default_device())  # type: ignore[arg-type]
    if head is not None:
        return _headless_model(hf_model, head, _tokenizer(folder), str(path), pooling, apart)
    bridge = attach_bridge(hf_model, arch, _tokenizer(path))
    return Model(_runtime(bridge, apart), source=str(path))


def check_loadable(
    source: str | os.PathLike, dtype: torch.dtype | None = None, storage: str = "auto"
) -> None:
    """Every check :func:`load` makes of the checkpoint folder (or cached Hub snapshot)
    ``source`` before it reads a weight: it is a folder with a config.json that parses to an
    object of a supported architecture (or a sentence-transformers folder), safetensors weights
    whose headers parse and whose files hold all the data they declare (none truncated), and a
    model that fits in memory (its weights kept as ``storage`` says, see :func:`load`). Raises
    the :class:`~probekit.errors.CheckpointError` or
    :class:`~probekit.errors.UnsupportedModelError` that :func:`load` would; reads headers only.

    Example:
        >>> import tempfile
        >>> check_loadable(tempfile.mkdtemp())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        probekit.errors.CheckpointError: ... is neither a transformers checkpoint ...
    """
    _check_storage(storage, {})
    _checked_folder(local_folder(source), dtype, fits=True, storage=storage)


def _checked_folder(
    path: Path, dtype: torch.dtype | None, *, fits: bool, storage: str = "auto"
) -> tuple[Path, Pooling | None, str, str | None, torch.dtype, torch.dtype | None]:
    """The checks of the checkpoint folder ``path`` before any weight is read (with ``fits``,
    also that the model fits in memory): the folder of the weights, the sentence-transformers
    pooling (or None), the architecture, its head class for a base model (or None), the
    dtype to load the weights in and the dtype they compute in when that differs (weights kept
    as stored, ``storage`` of :func:`load`; None: the same)."""
    pooling = None
    if (path / "modules.json").exists() and path.is_dir():
        folder, pooling = read_sentence_transformers(path)
    else:
        folder = path
    if not (folder / "config.json").exists() and path.is_dir() and folder == path:
        check_not_a_checkpoint(path)
    config, stored = check_checkpoint_dir(folder)
    stored_in = stored_dtype(folder, config)
    compute = dtype or (torch.float32 if storage == "stored" else stored_in)
    load_in = compute
    if fits:
        load_in = check_fits(folder, config, stored, compute, stored_in=stored_in, storage=storage)
    archs = config.get("architectures") or []
    arch = archs[0] if archs else config.get("model_type", "<unknown>")
    head = head_class_for(arch)  # base classes, even those the bridge lists
    if arch not in supported_architectures() and head is None:
        raise unsupported(arch)
    if pooling is not None and head is None:
        raise UnsupportedModelError(
            f"the transformer of the sentence-transformers model in {path} is a {arch}, a "
            "model with an LM head, not a base model",
            fix="save the sentence-transformers model with its base (AutoModel) transformer",
        )
    return folder, pooling, arch, head, load_in, None if load_in == compute else compute


def _from_folder(folder: Path, arch: str, dtype: torch.dtype, placement: dict) -> PreTrainedModel:
    """The Hugging Face model ``arch`` from ``folder`` (eager attention, no progress bars)."""
    import transformers
    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one line per problem on the CLI, no HF bars
    try:
        return from_pretrained_complete(
            getattr(transformers, arch),
            folder,
            dtype=dtype,
            attn_implementation="eager",
            **placement,
        )
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()


def _tokenizer(path: Path) -> Any:
    """The tokenizer saved beside the weights, if any (probekit itself needs none)."""
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:  # a broken tokenizer must not block the analyses
        reason = " ".join(str(err).split())[:300]  # one line on the CLI
        log.warning("ignoring the tokenizer in %s: %s: %s", path, type(err).__name__, reason)
        return None


def _headless_model(
    base: PreTrainedModel,
    head_name: str,
    tokenizer: Any,
    source: str | None,
    pooling: Pooling | None,
    apart: torch.dtype | None = None,
) -> Model:
    """A :class:`Model` over the base model ``base`` (no LM head), wrapped for the bridge
    (computed in ``apart`` when not None: see :func:`_runtime`)."""
    arch = type(base).__name__
    wrapper = wrap_headless(base, head_name)
    bridge = attach_bridge(wrapper, head_name, tokenizer)
    headless = Headless(arch, has_final_norm(bridge, wrapper.base_model), pooling)
    return Model(_runtime(bridge, apart, headless), source=source)


__all__ = ["check_loadable", "load"]
