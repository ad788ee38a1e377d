"""Text for a model's tokenizer, read lazily: the standard library (the default), a text file,
or a data set as researchers name it.

Each source yields texts one after another and :func:`token_windows` stops reading as soon as
it has the windows it needs, so a 300 MB ``--text`` file costs a few chunks, not the file.

- :func:`stdlib_texts`: the Python standard library's ``*.py`` sources (code, comments and
  docstrings) -- real text that ships with every interpreter, split into train/validation by
  a hash of each file's path (:func:`split_of`; the LM task's byte corpus,
  :class:`~probekit.lm.corpus.ByteCorpus`, splits its files by the same rule);
- :func:`file_texts`: a text file, in chunks of about a megabyte cut at line ends;
- :func:`dataset_texts`: one column of a data set -- a Hugging Face ``datasets`` name (with
  config and split; offline it must be in the local datasets cache), a ``save_to_disk``
  folder, or a local ``.jsonl``/``.json``/``.parquet``/``.csv``/``.txt`` file.

Example:
    >>> first = next(stdlib_texts("validation"))
    >>> isinstance(first, str) and len(first) > 0
    True
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import os
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from probekit.errors import InputError

CHUNK_CHARS = 1 << 20
"""Characters of a text file read at a time (cut at the last line end), and the most
characters of a data set's row tokenized at once (a longer row is cut in pieces)."""

VALIDATION_FRACTION = 0.05
"""Share of the standard library's files in the validation split (here and in the LM task's
byte corpus)."""

DATASET_FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""Local data set files by suffix -> the ``datasets`` builder that reads them."""

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}  # installed packages are not stdlib


def stdlib_root() -> Path:
    """The folder of this interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path, pattern: str = "*.py") -> list[Path]:
    """The files under ``root`` matching ``pattern`` in sorted order, installed packages and
    caches left out."""
    return sorted(
        p
        for p in root.rglob(pattern)
        if p.is_file() and not _SKIP_DIRS.intersection(p.relative_to(root).parts)
    )


def split_of(path: Path, root: Path, validation_fraction: float) -> str:
    """ "train" or "validation" for the file ``path``, by a hash of its path below ``root``
    (stable across machines and Python patch releases)."""
    digest = hashlib.sha256(str(path.relative_to(root)).encode()).digest()
    bucket = int.from_bytes(digest[:4], "little") / 2**32
    return "validation" if bucket < validation_fraction else "train"


def _stdlib_split(split: str) -> list[Path]:
    root = stdlib_root()
    return [p for p in corpus_files(root) if split_of(p, root, VALIDATION_FRACTION) == split]


def stdlib_texts(split: str = "validation") -> Iterator[str]:
    """The text of each standard-library source file of ``split`` ("train" or
    "validation"), in sorted path order."""
    if split not in ("train", "validation"):
        raise InputError(f"unknown split {split!r}", fix="use 'train' or 'validation'")
    for path in _stdlib_split(split):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if text.strip():
            yield text


def file_texts(path: str | os.PathLike, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """The text file at ``path`` in chunks of about ``chunk_chars`` characters, each cut after
    a line end (undecodable bytes become U+FFFD); a file under one chunk is one text. It is
    read one chunk at a time, as far as the caller iterates (:func:`token_windows` stops when
    it has its windows); a chunk holding a NUL byte (a binary file) is an
    :class:`InputError`."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        rest = ""
        while chunk := handle.read(chunk_chars):
            if "\0" in chunk:
                raise InputError(
                    f"{path} is a binary file (it holds NUL bytes), not text",
                    fix="pass a UTF-8 text file (convert UTF-16 text with iconv -t UTF-8)",
                )
            chunk = rest + chunk
            cut = chunk.rfind("\n") + 1 or len(chunk)
            rest = chunk[cut:]
            if chunk[:cut]:
                yield chunk[:cut]
        if rest:
            yield rest


def dataset_texts(
    name: str | os.PathLike,
    *,
    config: str | None = None,
    split: str | None = None,
    column: str = "text",
) -> Iterator[str]:
    """The non-empty strings of ``column`` of the data set ``name`` (see the module docstring;
    ``split`` defaults to "validation" for a named data set and "train" for a local file), a
    row longer than :data:`CHUNK_CHARS` in pieces of at most that many characters (a row of
    60 MB is never tokenized whole). A local .jsonl/.json/.csv file must be UTF-8."""
    check_dataset_names(config=config, split=split, column=column)
    path = Path(name)
    if path.is_file() and path.suffix == ".txt":
        yield from file_texts(path)
        return
    rows = _dataset(name, config, split)
    column = _text_column(rows, name, column)
    try:
        for block in rows.iter(batch_size=1000):  # lazily: a diagnosis needs few rows
            for value in block[column]:
                if isinstance(value, str) and value.strip():
                    yield from text_chunks(value, CHUNK_CHARS)
    except UnicodeDecodeError as err:  # text stored without checking its encoding
        raise not_utf8(name, err.start) from err


def check_dataset_names(
    *, config: str | None = None, split: str | None = None, column: str = "text"
) -> None:
    """Refuse an empty (or blank) config, split or column name: ``--split ''`` would otherwise
    be taken silently as the default split."""
    for what, value in (("config", config), ("split", split), ("column", column)):
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise InputError(
                f"the data set's {what} {value!r} is empty",
                fix=f"name a {what}, or leave it out for the default",
            )


def text_chunks(text: str, chunk_chars: int) -> Iterator[str]:
    """``text`` in pieces of at most ``chunk_chars`` characters, each cut after its last line
    end, else before its last space (a word keeps its leading space), else at the limit.

    Example:
        >>> list(text_chunks("one two\\nthree four five", 12))
        ['one two\\n', 'three four', ' five']
    """
    start = 0
    while len(text) - start > chunk_chars:
        window = text[start : start + chunk_chars]
        cut = window.rfind("\n") + 1 or max(window.rfind(" "), 0) or chunk_chars
        yield window[:cut]
        start += cut
    yield text[start:]


def not_utf8(name: str | os.PathLike, offset: int | None = None) -> InputError:
    """The error for a data-set file that is not UTF-8 (its first bad byte at ``offset``)."""
    where = f" (first bad byte at offset {offset})" if offset is not None else ""
    return InputError(
        f"the data set file {os.fspath(name)} is not valid UTF-8{where}",
        fix="convert it to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 FILE > NEW) and pass the new "
        "file; a .txt file is read with U+FFFD replacement characters instead",
    )


def check_utf8(path: Path, block: int = CHUNK_CHARS) -> None:
    """Refuse a file that is not valid UTF-8 (read ``block`` bytes at a time, to its end)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    done = 0
    with open(path, "rb") as handle:
        while True:
            data = handle.read(block)
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as err:
                raise not_utf8(path, done + err.start) from err
            if not data:
                return
            done += len(data)


def dataset_column(
    name: str | os.PathLike,
    *,
    config: str | None = None,
    split: str | None = None,
    column: str = "text",
) -> str:
    """The column :func:`dataset_texts` reads for ``column``: itself, or for the default
    ``"text"`` that a data set lacks, its only string column."""
    path = Path(name)
    if path.is_file() and path.suffix == ".txt":
        return column
    return _text_column(_dataset(name, config, split), name, column)


def _text_column(rows: Any, name: str | os.PathLike, column: str) -> str:
    """``column`` if ``rows`` has it; for the default ``"text"``, the only string column;
    else an :class:`InputError` naming the string columns."""
    names = list(rows.column_names)
    if column in names:
        return column
    strings = [
        c
        for c in names
        if getattr(rows.features.get(c), "dtype", None) in ("string", "large_string")
    ]
    if column == "text" and len(strings) == 1:
        return strings[0]
    listed = ", ".join(strings) if strings else "none"
    raise InputError(
        f"the data set {name} has no column {column!r} (columns: {', '.join(names)}; text "
        f"columns: {listed})",
        fix="pass --column with one of its text columns",
    )


def _dataset(name: str | os.PathLike, config: str | None, split: str | None) -> Any:
    import datasets

    path = Path(name)
    try:
        if path.is_dir() and any((path / f).exists() for f in ("dataset_dict.json", "state.json")):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                return loaded[_split_of(loaded, split or "validation", name)]
            return loaded
        if path.is_file():
            builder = DATASET_FILES.get(path.suffix)
            if builder is None:
                raise InputError(
                    f"cannot read a data set from a {path.suffix or 'suffix-less'} file",
                    fix=f"use one of {', '.join([*DATASET_FILES, '.txt'])}, or --text",
                )
            if builder != "parquet":  # text files: datasets would raise mid-read
                check_utf8(path)
            return datasets.load_dataset(builder, data_files=str(path), split=split or "train")
        return _named_dataset(os.fspath(name), config, split or "validation")
    except InputError:
        raise
    except (ValueError, KeyError) as err:
        raise InputError(f"cannot read the data set {name} ({err})", fix=_fix(name)) from err
    except Exception as err:  # datasets' errors (not found, offline, corrupt) have no common base
        raise InputError(
            f"cannot load the data set {name} ({type(err).__name__}: {str(err)[:200]})",
            fix=_fix(name),
        ) from err


def _named_dataset(name: str, config: str | None, split: str) -> Any:
    """A data set by its Hub name: through ``datasets`` (its own cache when offline), else
    from the repository's files in the local Hugging Face cache (``datasets--org--name``, where
    ``datasets`` and ``hf download --repo-type dataset`` keep them), read as a local folder.

    Offline (``HF_HUB_OFFLINE=1``), or when one request to the Hub (no retries) cannot reach
    it, only the local caches are read, so a data set that is not cached fails in a moment
    (``datasets`` itself retries an unreachable Hub for half a minute)."""
    import datasets

    if datasets.config.HF_HUB_OFFLINE:
        return _cached_dataset(name, config, split, "HF_HUB_OFFLINE=1 forbids a download")
    unreachable = _hub_unreachable(name)
    if unreachable is not None:
        return _cached_dataset(name, config, split, unreachable)
    return _dataset_or_cached_files(name, config, split, lambda first: first)


def _hub_unreachable(name: str) -> str | None:
    """Why the Hugging Face Hub cannot be reached for the data set ``name`` (one request, no
    retries), or None when it answered (whatever it answered: ``datasets`` says the rest)."""
    import datasets
    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import httpx  # the HTTP client huggingface_hub uses

    try:
        HfApi(endpoint=datasets.config.HF_ENDPOINT).dataset_info(
            name, timeout=constants.HF_HUB_ETAG_TIMEOUT
        )
    except (httpx.TransportError, ConnectionError, TimeoutError) as err:  # not connected
        return f"the Hugging Face Hub is unreachable ({type(err).__name__}: {str(err)[:200]})"
    except Exception:  # an answer (not found, gated, a bad name): datasets says the rest
        return None
    return None


def _cached_dataset(name: str, config: str | None, split: str, why: str) -> Any:
    """The data set ``name`` from the local caches only (``why``: why not from the Hub):
    ``datasets``' own cache, else the repository's files in the Hugging Face cache."""
    import datasets

    offline = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True  # read by datasets at each call: no request, no retry
    try:
        miss = functools.partial(_cache_miss, name, why)
        return _dataset_or_cached_files(name, config, split, miss)
    finally:
        datasets.config.HF_HUB_OFFLINE = offline


def _dataset_or_cached_files(
    name: str, config: str | None, split: str, failed: Callable[[Exception], Exception]
) -> Any:
    """``datasets.load_dataset`` of ``name``, else its repository's files in the local Hugging
    Face cache (:func:`_from_hub_cache`); when both fail, the error ``failed`` makes of the
    first failure (``datasets``' own, which says more than "not in the cache either")."""
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as first:
        try:
            return _from_hub_cache(name, config, split)
        except Exception:
            raise failed(first) from None


def _cache_miss(name: str, why: str, first: Exception) -> Exception:
    """What a data set read only from the caches failed with: ``datasets``' own error when it
    is cached but has no such config or split, else that it is in neither cache."""
    if isinstance(first, ValueError | KeyError):
        return first
    return _not_cached(name, why)


def _from_hub_cache(name: str, config: str | None, split: str) -> Any:
    """The data set ``name`` from its repository's files in the local Hugging Face cache."""
    import datasets
    from huggingface_hub import snapshot_download

    folder = snapshot_download(name, repo_type="dataset", local_files_only=True)
    return datasets.load_dataset(folder, config, split=split)


def _not_cached(name: str, why: str) -> InputError:
    import datasets
    from huggingface_hub import constants

    return InputError(
        f"the data set {name} is neither in the local datasets cache "
        f"({datasets.config.HF_DATASETS_CACHE}) nor in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and {why}",
        fix=f"fetch it once where the Hub is reachable (hf download {name} --repo-type "
        f"dataset, or datasets.load_dataset({name!r}, ...)), or pass a save_to_disk folder "
        "or a local .jsonl/.parquet file",
    )


def _split_of(splits: Any, split: str, name: Any) -> str:
    if split not in splits:
        raise InputError(
            f"the data set {name} has no split {split!r} (splits: {', '.join(splits)})",
            fix="pass --split with one of them",
        )
    return split


def _fix(name: Any) -> str:
    return (
        "check the name, config and split; offline, a named data set must be in the local "
        f"datasets cache: load it once online (datasets.load_dataset({os.fspath(name)!r}, ...)) "
        "or pass a save_to_disk folder or a local .jsonl/.parquet file"
    )


def token_windows(
    tokenizer: Any, texts: Iterable[str], length: int, n: int, skip: int = 0
) -> list[list[int]]:
    """The first ``n`` full windows of ``length`` token ids (after the first ``skip``) of the
    ``texts`` joined, reading texts only until they are there. Each window carries the special
    tokens the tokenizer adds to one sequence (BERT's ``[CLS]`` ... ``[SEP]``, Llama's BOS), so
    every sequence looks like one the checkpoint saw in training."""
    n_special = getattr(tokenizer, "num_special_tokens_to_add", lambda: 0)()
    body = length - n_special
    if body < 1:
        raise InputError(
            f"--seq-len {length} leaves no room for the text between the tokenizer's "
            f"{n_special} special tokens",
            fix=f"pass --seq-len {n_special + 1} or more",
        )
    prefix, suffix = _special_wrapping(tokenizer, n_special) if n_special else ([], [])
    wanted = (skip + n) * body
    ids: list[int] = []
    for text in texts:
        plain = tokenizer(text, add_special_tokens=False) if n_special else tokenizer(text)
        ids += plain["input_ids"]
        if len(ids) >= wanted:
            break
    windows = [prefix + ids[i : i + body] + suffix for i in range(0, len(ids) - body + 1, body)]
    return windows[skip : skip + n]


def _special_wrapping(tokenizer: Any, n_special: int) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after one sequence, read off
    how it tokenizes a one-word sample with and without them."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            prefix, suffix = full[:start], full[start + len(plain) :]
            if len(prefix) + len(suffix) == n_special:
                return prefix, suffix
    raise InputError(
        "could not tell where the tokenizer puts its special tokens around a text",
        fix="pass token ids instead of --text",
    )


__all__ = [
    "VALIDATION_FRACTION",
    "check_dataset_names",
    "check_utf8",
    "corpus_files",
    "dataset_texts",
    "file_texts",
    "split_of",
    "stdlib_root",
    "stdlib_texts",
    "text_chunks",
    "token_windows",
]
