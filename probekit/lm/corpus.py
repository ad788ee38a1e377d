"""The LM task's corpus: the Python standard library's own source (or a folder of text files),
read as bytes.

Every Python interpreter ships its standard library as ``.py`` files, so this corpus needs no
download. Tokens are bytes (0..255) plus three specials: ``PAD`` = 256, ``BOS`` = 257 and
``EOS`` = 258 (vocabulary 259). Files are assigned to train or validation by a hash of their
path relative to the corpus root (:func:`probekit.tasks.text.split_of`, stable across machines
and Python patch releases; the generic text sources split the standard library by the same
rule), and each file is followed by ``EOS`` in the token stream.

Example:
    >>> corpus = ByteCorpus(max_files=20)
    >>> corpus.sequences("validation", 16, n=2).shape
    torch.Size([2, 16])
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from probekit.errors import ConfigError
from probekit.tasks.text import VALIDATION_FRACTION, corpus_files, split_of, stdlib_root

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259


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
        files = corpus_files(self.root, pattern)
        if max_files is not None:
            files = files[:max_files]
        self.splits: dict[str, list[Path]] = {"train": [], "validation": []}
        for path in files:
            self.splits[split_of(path, self.root, validation_fraction)].append(path)
        self._streams: dict[str, torch.Tensor] = {}
        for split in ("train", "validation"):
            if len(self.stream(split)) < 2:
                raise ConfigError(
                    f"the corpus in {self.root} has no readable text for the {split} split "
                    f"({len(files)} files matching {pattern!r})",
                    fix="point the corpus at a folder with more text files",
                )

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


__all__ = ["BOS", "EOS", "PAD", "VOCAB_SIZE", "ByteCorpus"]
