"""The LM task's corpus: the Python standard library's own source (or a folder of text files,
or any texts: a text file, a data set's column), read as bytes.

Every Python interpreter ships its standard library as ``.py`` files, so this corpus needs no
download. Tokens are bytes (0..255) plus three specials: ``PAD`` = 256, ``BOS`` = 257 and
``EOS`` = 258 (vocabulary 259). Files are assigned to train or validation by a hash of their
path relative to the corpus root (:func:`probekit.tasks.text.split_of`, stable across machines
and Python patch releases; the generic text sources split the standard library by the same
rule), and each file is followed by ``EOS`` in the token stream.

Other texts (:meth:`ByteCorpus.from_texts`: e.g. :func:`probekit.tasks.text.file_texts` or
:func:`~probekit.tasks.text.dataset_texts`) are UTF-8 encoded, each followed by ``EOS``, and
their stream's last ``validation_fraction`` forms the validation split (a held-out tail, as a
text has no files to hash). :meth:`ByteCorpus.save` writes such a corpus to a folder that
``ByteCorpus(folder)`` (and so an LM run's ``corpus_root``) reads back as it was;
:meth:`ByteCorpus.fingerprint` names its content.

Example:
    >>> corpus = ByteCorpus(max_files=20)
    >>> corpus.sequences("validation", 16, n=2).shape
    torch.Size([2, 16])
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from probekit.errors import ConfigError
from probekit.tasks.text import VALIDATION_FRACTION, corpus_files, split_of, stdlib_root

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259

SAVED_FILE = "byte_corpus.json"
"""The file that marks a folder written by :meth:`ByteCorpus.save` (its splits beside it, as
``train.npy`` and ``validation.npy``)."""


class ByteCorpus:
    """Byte-level token streams of the ``*.py`` files under ``root`` (default: the stdlib).

    ``validation_fraction`` of the files (by path hash) form the validation split;
    ``max_files`` caps the number of files read (the first ones in sorted path order).
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        validation_fraction: float = VALIDATION_FRACTION,
        max_files: int | None = None,
        pattern: str = "*.py",
    ) -> None:
        if not 0 < validation_fraction < 1:
            raise ConfigError(
                f"validation_fraction {validation_fraction} is outside (0, 1)", fix="use e.g. 0.05"
            )
        self.root = Path(root) if root is not None else stdlib_root()
        if not self.root.is_dir():
            raise ConfigError(
                f"corpus folder {self.root} does not exist", fix="pass a folder of text files"
            )
        self.source = f"the .py files under {self.root}" if root is not None else "the stdlib"
        self._streams: dict[str, torch.Tensor] = {}
        if (self.root / SAVED_FILE).is_file():  # a corpus written by save(): read as it was
            self._read_saved()
            return
        files = corpus_files(self.root, pattern)
        if max_files is not None:
            files = files[:max_files]
        self.splits: dict[str, list[Path]] = {"train": [], "validation": []}
        for path in files:
            self.splits[split_of(path, self.root, validation_fraction)].append(path)
        for split in ("train", "validation"):
            if len(self.stream(split)) < 2:
                raise ConfigError(
                    f"the corpus in {self.root} has no readable text for the {split} split "
                    f"({len(files)} files matching {pattern!r})",
                    fix="point the corpus at a folder with more text files",
                )

    @classmethod
    def from_texts(
        cls,
        texts: Iterable[str],
        source: str = "the texts",
        validation_fraction: float = VALIDATION_FRACTION,
        max_tokens: int | None = None,
    ) -> ByteCorpus:
        """The corpus of ``texts`` (``source``: what they are, in words): each UTF-8 encoded
        and followed by ``EOS``, read until ``max_tokens`` tokens (the rest is not read); the
        last ``validation_fraction`` of the stream is the validation split. Text with fewer
        than 2 tokens in a split is a :class:`ConfigError`.

        Example:
            >>> corpus = ByteCorpus.from_texts(["hello world\\n"] * 20, "a greeting")
            >>> len(corpus.stream("train")), len(corpus.stream("validation"))
            (247, 13)
        """
        if not 0 < validation_fraction < 1:
            raise ConfigError(
                f"validation_fraction {validation_fraction} is outside (0, 1)", fix="use e.g. 0.05"
            )
        chunks: list[np.ndarray] = []
        n, eos = 0, np.array([EOS], dtype=np.int16)
        for text in texts:
            data = text.encode("utf-8", errors="replace")
            chunks += [np.frombuffer(data, dtype=np.uint8).astype(np.int16), eos]
            n += len(data) + 1
            if max_tokens is not None and n >= max_tokens:
                break
        stream = torch.from_numpy(np.concatenate(chunks)) if chunks else torch.zeros(0)
        stream = stream.to(torch.int16)[:max_tokens]
        cut = len(stream) - round(len(stream) * validation_fraction)
        corpus = cls.__new__(cls)
        corpus.root, corpus.source = Path(), source
        corpus.splits = {"train": [], "validation": []}
        corpus._streams = {"train": stream[:cut], "validation": stream[cut:]}
        for split in ("train", "validation"):
            if len(corpus._streams[split]) < 2:
                raise ConfigError(
                    f"{source} holds {len(stream)} bytes: too little text for a {split} split",
                    fix="pass a longer text",
                )
        return corpus

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the corpus's splits to ``folder`` (``ByteCorpus(folder)`` reads them back as
        they are); returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for split in ("train", "validation"):
            np.save(folder / f"{split}.npy", self.stream(split).numpy())
        about = {"source": self.source, "fingerprint": self.fingerprint()}
        (folder / SAVED_FILE).write_text(json.dumps(about, indent=1))  # last: the folder is whole
        return folder

    def _read_saved(self) -> None:
        about = json.loads((self.root / SAVED_FILE).read_text())
        self.source = about["source"]
        self.splits = {"train": [], "validation": []}
        for split in self.splits:
            self._streams[split] = torch.from_numpy(np.load(self.root / f"{split}.npy"))

    def fingerprint(self) -> str:
        """A short hash of the corpus's token streams (the same text split alike gives the
        same fingerprint on any machine)."""
        digest = hashlib.sha256()
        for split in ("train", "validation"):
            digest.update(self.stream(split).numpy().astype("<i2").tobytes())
            digest.update(b"|")
        return digest.hexdigest()[:16]

    def stream(self, split: str) -> torch.Tensor:
        """All tokens of a split as one 1-D int16 tensor (files joined by ``EOS``)."""
        if split not in self.splits:
            raise ConfigError(f"unknown split {split!r}", fix="use 'train' or 'validation'")
        if split not in self._streams:
            chunks = []
            for path in self.splits[split]:
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                if data:
                    chunks.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).short())
                    chunks.append(torch.tensor([EOS], dtype=torch.int16))
            self._streams[split] = (
                torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.int16)
            )
        return self._streams[split]

    def sequences(self, split: str, length: int, n: int | None = None) -> torch.Tensor:
        """Non-overlapping windows ``[n, length]`` from the start of the split's stream."""
        stream = self.stream(split)
        available = len(stream) // length
        n = available if n is None else n
        if length < 2 or n < 1 or n > available:
            raise ConfigError(
                f"cannot cut {n} sequences of {length} tokens from {len(stream)} {split} tokens",
                fix="ask for fewer or shorter sequences",
            )
        return stream[: n * length].view(n, length).long()

    def batch(self, split: str, length: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
        """A batch ``[batch_size, length]`` at random offsets, a function of (seed, step)."""
        stream = self.stream(split)
        if len(stream) <= length:
            raise ConfigError(
                f"the {split} split is shorter than one sequence of {length}",
                fix="use shorter sequences or a larger corpus",
            )
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(stream) - length, (batch_size,), generator=g)
        return torch.stack([stream[s : s + length] for s in starts.tolist()]).long()


__all__ = ["BOS", "EOS", "PAD", "SAVED_FILE", "VOCAB_SIZE", "ByteCorpus"]
