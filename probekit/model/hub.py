"""Hugging Face Hub names: ``org/name`` or ``org/name@revision`` resolved to a local folder.

A name that is not a folder on disk is looked up with ``huggingface_hub``: the local Hugging
Face cache first (``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``), a download only
when the cache lacks it and downloads are allowed (``HF_HUB_OFFLINE`` unset). Only the files a
checkpoint needs are ever fetched -- :data:`HUB_FILES`: safetensors weights, JSON configs and
tokenizer files; never pickled weights (``*.bin``, ``*.pt``) and never code (``*.py``), so no
remote code can run. A repository whose weights are pickled only
(:func:`probekit.model.checkpoint.is_unread_weights`) is refused with one clear error. This
module imports nothing heavy: the command line resolves a name before torch loads.

Example:
    >>> hub_name("EleutherAI/pythia-70m@step1000")
    ('EleutherAI/pythia-70m', 'step1000')
    >>> hub_name("gpt2"), hub_name("./runs/model"), hub_name("a b")
    (('gpt2', None), None, None)
    >>> hub_name("org/ti--ny")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    probekit.errors.CheckpointError: 'org/ti--ny' is not a folder here, and not a valid ... Fix: ...
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from probekit.errors import CheckpointError
from probekit.model.checkpoint import is_unread_weights

HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken")
"""What is fetched from a repository: configs (also ``1_Pooling/config.json`` of a
sentence-transformers model), safetensors weights and their index, tokenizer files
(``vocab.txt``, ``merges.txt``, sentencepiece ``*.model``, ``*.tiktoken``)."""

_NAME = re.compile(
    r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}(?:/[\w.-]{1,96})?)(?:@(?P<rev>.*))?", re.DOTALL
)
"""How a Hub name is written (matched whole): ``name`` or ``org/name``, then ``@revision``.
Whether the name is one the Hub allows is then decided by ``huggingface_hub``'s own rules."""

_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|//|@\{")
"""What git's ref-name rules forbid anywhere in a revision (``git check-ref-format``)."""


def hub_name(text: str | os.PathLike) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``text`` is written as a Hub name (``name``, ``org/name``,
    either with ``@revision``), else ``None`` (a path such as ``./x`` or ``/x/y/z``).

    Call it for a text that is not a path on disk. A text written as a Hub name that the Hub's
    rules refuse (``org/a--b``, a trailing ``.`` or ``-``, a non-ASCII name, a bad revision,
    white space around the name) raises :class:`~probekit.errors.CheckpointError` instead of
    being taken for another name."""
    text = os.fspath(text)
    match = _NAME.fullmatch(text)
    if match is None:
        if text != text.strip() and _NAME.fullmatch(text.strip()):
            raise CheckpointError(
                f"{text!r} is not a folder here, and a Hub name with white space around it",
                fix="pass the name without the spaces or line breaks around it",
            )
        return None
    _check_repo_id(text, match["repo"])
    if match["rev"] is not None:
        check_revision(match["rev"], text)
    return match["repo"], match["rev"]


def _check_repo_id(text: str, repo_id: str) -> None:
    """Refuse a name the Hub's own rules refuse (``huggingface_hub.utils.validate_repo_id``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
        repo_id.encode("ascii")
    except (HFValidationError, UnicodeEncodeError) as err:
        reason = "letters beyond ASCII" if isinstance(err, UnicodeEncodeError) else err
        raise CheckpointError(
            f"{text!r} is not a folder here, and not a valid Hugging Face Hub name ({reason})",
            fix="pass an existing model folder, or a Hub name as the Hub spells it (letters, "
            "digits, '-', '_', '.'; no '--' or '..'; not starting or ending with '-' or '.')",
        ) from None


def check_revision(revision: object, name: str | None = None) -> str:
    """``revision`` when it is a Hub revision (a branch, tag, commit or ``refs/pr/N``) that
    git's ref-name rules allow, else :class:`~probekit.errors.CheckpointError`: not a string,
    empty, white space or control characters, ``..``, a leading or trailing ``/``, ``//``,
    ``~^:?*[\\``, ``@{``, a part starting with ``.`` or ending with ``.lock``, a trailing ``.``.

    Example:
        >>> check_revision("refs/pr/1")
        'refs/pr/1'
        >>> check_revision("../../x")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        probekit.errors.CheckpointError: revision '../../x' is not a Hub revision ... Fix: ...
    """
    of = f" of {name}" if name else ""
    fix = "pass a branch, tag or commit such as main, v1.0, refs/pr/1 or a 40-digit commit hash"
    if not isinstance(revision, str):
        raise CheckpointError(
            f"revision{of} must be a string, not {type(revision).__name__} ({revision!r})", fix=fix
        )
    parts = revision.split("/")
    if (
        not revision
        or revision == "@"
        or _REF_FORBIDDEN.search(revision)
        or revision.startswith("/")
        or revision.endswith(("/", "."))
        or any(p.startswith(".") or p.endswith(".lock") for p in parts)
    ):
        raise CheckpointError(
            f"revision {revision!r}{of} is not a Hub revision (a git ref name has no '..', "
            "no leading or trailing '/', no white space)",
            fix=fix,
        )
    return revision


def fetch_command(repo_id: str, revision: str | None) -> str:
    """The shell command that puts the files probekit needs into the local cache."""
    rev = f" --revision {revision}" if revision else ""
    include = " ".join(f"'{pattern}'" for pattern in HUB_FILES)
    return f"hf download {repo_id}{rev} --include {include}"


def resolve(name: str, revision: str | None = None) -> Path:
    """The local snapshot folder of the Hub model ``name`` (``org/name[@revision]``; a
    ``revision`` argument is the same as ``@revision``): from the cache, else downloaded when
    allowed. Raises :class:`~probekit.errors.CheckpointError` when it is not cached and cannot
    be downloaded, or holds no safetensors weights."""
    repo_id, revision = _repo_and_revision(name, revision)
    label = f"{repo_id}@{revision}" if revision else repo_id
    folder = _cached(repo_id, revision)
    if folder is None:
        folder = _download(repo_id, revision, label)
    if not any(folder.glob("*.safetensors")):
        raise _no_safetensors(folder, label)
    return folder


def _repo_and_revision(name: str, revision: str | None) -> tuple[str, str | None]:
    parsed = hub_name(name)
    if parsed is None:
        raise CheckpointError(
            f"{name!r} is neither a folder nor a Hugging Face Hub name",
            fix="pass a model folder, or a Hub name such as gpt2 or EleutherAI/pythia-70m@main",
        )
    repo_id, named = parsed
    if revision is not None:
        check_revision(revision, name)
    if revision is not None and named is not None and revision != named:
        raise CheckpointError(
            f"{name!r} names revision {named!r} but revision={revision!r} was given",
            fix="give the revision once",
        )
    return repo_id, revision or named


def _cached(repo_id: str, revision: str | None) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id, revision=revision, allow_patterns=list(HUB_FILES), local_files_only=True
        )
    except LocalEntryNotFoundError:
        return None
    return Path(folder)


def _download(repo_id: str, revision: str | None, label: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    fix = f"fetch it once where the Hub is reachable: {fetch_command(repo_id, revision)}"
    if constants.HF_HUB_OFFLINE:
        raise CheckpointError(
            f"{label} is not a folder here and not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE=1 forbids a download",
            fix=fix,
        )
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=list(HUB_FILES))
    except RevisionNotFoundError as err:
        raise CheckpointError(f"the Hub model {repo_id} has no revision {revision!r}") from err
    except RepositoryNotFoundError as err:
        raise CheckpointError(
            f"there is no model {repo_id} on the Hugging Face Hub (or it is private)",
            fix="check the name; for a private or gated model run `hf auth login` first",
        ) from err
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise CheckpointError(f"could not download {label} ({err})", fix=fix) from err
    return Path(folder)


def _no_safetensors(folder: Path, label: str) -> CheckpointError:
    pickled = _remote_pickles(label) if not _offline() else []
    if pickled:
        return CheckpointError(
            f"{label} has pickled weights only ({', '.join(pickled)}); probekit never unpickles",
            fix="use a revision with *.safetensors weights (the Hub's conversion bot opens one "
            "as a pull request, e.g. @refs/pr/1), or save the model with "
            "save_pretrained(safe_serialization=True) where you trust its code",
        )
    return CheckpointError(
        f"{label} (cached at {folder}) holds no *.safetensors weights",
        fix="fetch the weights too, or use a revision with safetensors weights",
    )


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _remote_pickles(label: str) -> list[str]:
    from huggingface_hub import list_repo_files

    repo_id, _, revision = label.partition("@")
    try:
        files = list_repo_files(repo_id, revision=revision or None)
    except Exception:  # the listing only improves the message; it never decides
        return []
    return [f for f in files if is_unread_weights(f)]
