"""What a study's members are pretrained on: the byte corpus of a folder of ``.py`` files (the
Python standard library by default), a text file or a data set's text column, read with the
readers ``probekit diagnose`` uses (:func:`probekit.sources.check_text_file`,
:func:`probekit.sources.check_dataset`, :func:`probekit.sources.texts_of`) and made a byte
corpus by :class:`probekit.lm.corpus.ByteCorpus`.

Before any training the study reads its text (:meth:`StudyData.read`) and refuses what cannot
train its members: a missing or binary file, a data set that cannot be opened (offline: one
not in the local caches), text too short for a validation sequence or for the planned tokens
(its train split must hold at least 1/:data:`MAX_PASSES` of what the largest member trains
on). A text file or a data set is read up to :data:`READ_TOKENS` tokens or one pass of the
largest member, whichever is more, and written once into the study folder (``OUT/corpus/``,
:meth:`~probekit.lm.corpus.ByteCorpus.save`), which every member reads; a folder of files is
read by each member itself, as before. The corpus's fingerprint
(:meth:`~probekit.lm.corpus.ByteCorpus.fingerprint`) goes into ``OUT/study.json``: a study
resumed on other data is refused.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "t.txt"
    >>> _ = path.write_text("def f(x):\\n    return x\\n" * 200)
    >>> data = StudyData(text=str(path))
    >>> data.check()
    >>> corpus = data.read(tokens=1_000, seq_len=16)
    >>> len(corpus.stream("train")) + len(corpus.stream("validation"))
    4601
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probekit.errors import ConfigError
from probekit.io import atomic_write_text
from probekit.lm.corpus import SAVED_FILE, ByteCorpus
from probekit.sources import DatasetChoice, check_dataset, check_text_file, texts_of

MAX_PASSES = 10
"""The most passes over its train split a member's pretraining may make: text shorter than
the largest member's planned tokens / MAX_PASSES is refused (a model would learn that text by
heart, not the language)."""

READ_TOKENS = 1 << 24
"""Tokens of a text file or data set read at least (16M tokens, 32 MB in memory), more when
one pass of the largest member needs more; the rest of the text is not read."""

CORPUS_FOLDER = "corpus"
"""Where a study keeps the corpus of its text file or data set (``OUT/corpus``)."""


@dataclass(frozen=True)
class StudyData:
    """One of: ``folder`` (a folder of ``.py`` files, the first ``max_files`` in path order),
    ``text`` (a UTF-8 text file) or ``dataset`` (a :class:`~probekit.sources.DatasetChoice`);
    none: the Python standard library."""

    folder: str | None = None
    text: str | None = None
    dataset: DatasetChoice | None = None
    max_files: int | None = None

    @classmethod
    def of(
        cls,
        corpus: str | os.PathLike | None,
        text: str | os.PathLike | None,
        dataset: str | DatasetChoice | None,
        max_files: int | None = None,
    ) -> StudyData:
        """The study's data from its arguments (at most one given), checked for type."""
        given = [n for n, v in (("corpus", corpus), ("text", text), ("dataset", dataset)) if v]
        if len(given) > 1:
            raise ConfigError(
                f"{' and '.join(given)} are both given: a study pretrains on one of them",
                fix="pass one of corpus, text and dataset",
            )
        if isinstance(dataset, str):
            dataset = DatasetChoice(dataset)
        if dataset is not None and not isinstance(dataset, DatasetChoice):
            raise ConfigError(
                f"dataset {dataset!r:.60} is not a name or a DatasetChoice",
                fix="pass e.g. 'data.jsonl' or DatasetChoice('wikitext', 'wikitext-2-raw-v1')",
            )
        return cls(
            os.fspath(corpus) if corpus else None,
            os.path.abspath(text) if text else None,
            dataset,
            max_files,
        )

    @property
    def prepared(self) -> bool:
        """Whether the members read a corpus the study writes (a text file or a data set)."""
        return self.text is not None or self.dataset is not None

    def config(self) -> dict[str, Any]:
        """What ``study.json``'s config records of the data (a text file or data set only:
        a folder is the config's ``corpus``, as before)."""
        if self.text is not None:
            return {"text": self.text}
        if self.dataset is not None:
            return {"dataset": vars(self.dataset).copy()}
        return {}

    def describe(self) -> str:
        """The data in words."""
        if self.text is not None:
            return f"text file {self.text}"
        if self.dataset is not None:
            return self.dataset.describe()
        if self.folder is not None:
            return f"the .py files under {self.folder}"
        return "the Python standard library's sources"

    def check(self) -> None:
        """The cheap checks, in seconds (a dry run's): the file is text, the data set opens
        and has text in its column, the folder exists."""
        if self.text is not None:
            check_text_file(self.text)  # missing, a folder, binary: an InputError
        elif self.dataset is not None:
            check_dataset(self.dataset)
        elif self.folder is not None and not Path(self.folder).is_dir():
            raise ConfigError(
                f"corpus folder {self.folder} does not exist", fix="pass a folder of .py files"
            )

    def corpus_root(self, out: Path) -> str | None:
        """What each member's LM run reads (its ``corpus_root``)."""
        if self.prepared:
            return str(out.resolve() / CORPUS_FOLDER)
        return self.folder

    def read(self, tokens: int, seq_len: int) -> ByteCorpus:
        """The byte corpus, checked for ``tokens`` (the largest member's pretraining tokens)
        and sequences of ``seq_len``: one :class:`ConfigError` naming the fix, else the
        corpus."""
        self.check()
        if self.prepared:
            texts, what, _ = texts_of(self.text, self.dataset, fit=False)
            corpus = ByteCorpus.from_texts(texts, what, max_tokens=max(tokens, READ_TOKENS))
        else:
            corpus = ByteCorpus(self.folder, max_files=self.max_files)
        train, validation = (len(corpus.stream(s)) for s in ("train", "validation"))
        fix = "pass a longer text or a larger --dataset, or plan fewer tokens (--steps)"
        if validation < seq_len:
            raise ConfigError(
                f"the validation split of {self.describe()} holds {validation} tokens, fewer "
                f"than one sequence of {seq_len}",
                fix=fix,
            )
        if train * MAX_PASSES < tokens:
            raise ConfigError(
                f"{self.describe()}: {train:,} train tokens, but a member pretrains on "
                f"{tokens:,}, more than {MAX_PASSES} passes over it",
                fix=fix,
            )
        return corpus

    def record(self, corpus: ByteCorpus) -> dict[str, Any]:
        """What ``study.json`` keeps of the corpus: its source, fingerprint and size."""
        return {
            "source": self.describe(),
            "fingerprint": corpus.fingerprint(),
            "train_tokens": len(corpus.stream("train")),
            "validation_tokens": len(corpus.stream("validation")),
        }

    def write(self, corpus: ByteCorpus, out: Path) -> None:
        """Write a text file's or data set's corpus to ``OUT/corpus`` once (whole or not at
        all: written beside it, then moved); a folder of files is read by the members."""
        if not self.prepared:
            return
        folder = out / CORPUS_FOLDER
        if (folder / SAVED_FILE).is_file() and ByteCorpus(folder).fingerprint() == (
            corpus.fingerprint()
        ):
            return
        part = out / f"{CORPUS_FOLDER}.part"
        shutil.rmtree(part, ignore_errors=True)
        corpus.save(part)
        shutil.rmtree(folder, ignore_errors=True)
        part.rename(folder)
        atomic_write_text(folder / "SOURCE.txt", self.describe() + "\n")


__all__ = ["CORPUS_FOLDER", "MAX_PASSES", "READ_TOKENS", "StudyData"]
