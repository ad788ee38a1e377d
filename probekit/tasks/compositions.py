"""Compositions of primitive operations on short numbers and strings, as text for probekit's
byte-level LMs: a built-in task of held-out combinations of seen primitives, in the style of
the compositional-generalization studies of depth (Petty et al. 2024).

Families (each a first operation ``f`` then a second ``g``, every pair ``(f, g)`` a
combination):

* ``"arithmetic"`` -- on integers from ``min_number`` to ``max_number``; ``f``: ``add1``
  (x + 1), ``add5``, ``sub3`` (x - 3), ``mul2`` (2x), ``mul3``, ``half`` (x // 2); ``g`` on the
  decimal digits of ``f(x)``: ``rev`` (reversed, leading zeros kept: 120 -> ``021``), ``rot``
  (rotated left by one digit: 123 -> ``231``), ``id`` (unchanged);
* ``"case"`` -- on strings of ``min_letters`` to ``max_letters`` ASCII letters of mixed case;
  ``f``: ``upper``, ``lower``, ``swap`` (swap case), ``cap`` (first letter upper, the rest
  lower); ``g``: ``first2``, ``first3`` (the first n letters), ``last2``, ``last3`` (the
  last n), ``id``.

**Byte format.** One example is one line, ``f"{f} {g} : {x} = {y}\\n"``, e.g.
``add5 rev : 128 = 331`` (128 + 5 = 133, reversed), left-padded with spaces to the task's
prompt width :attr:`CompositionTask.prompt_width` so that every answer starts at the same
position. The *prompt* is everything up to and including ``"= "``; the *answer* is the bytes
after it: ``y`` and the closing ``"\\n"`` (which tells a decoder where the answer ends).
Tokens are bytes (0..255); sequences are right-padded with ``PAD`` = 256 to
:attr:`CompositionTask.seq_len` (the byte corpus's vocabulary of 259, :mod:`probekit.lm.corpus`).

**Splits.** Per family, ``heldout`` (a fraction of the family's combinations, or a list of
``"f g"`` names) of the combinations never appear in training; the rest are the *seen*
combinations. The seeded choice keeps every primitive in training: a random covering set of
combinations (each ``f`` and each ``g`` in at least one) is always seen, and the held-out ones
are drawn at random from the others. Inputs are split too: an input is a *test input* when a
CRC-32 hash of the seed and the input falls below ``test_inputs``; training examples use only
the other inputs, so the ``"seen"`` test split measures seen combinations on unseen inputs and
the ``"heldout"`` split held-out combinations (on test inputs as well).

* ``"train"``: ``n_train`` examples, seen combinations on training inputs;
* ``"seen"``: ``n_test`` examples, seen combinations on test inputs;
* ``"heldout"``: ``n_test`` examples, held-out combinations on test inputs.

Examples are drawn uniformly over the split's combinations, then the inputs uniformly, all
from ``numpy.random.default_rng((seed, split))``: a split is a function of the settings.

Example:
    >>> task = CompositionTask(n_train=8, n_test=4, seed=1)
    >>> data = task.dataset("heldout")
    >>> line = data.lines()[0]
    >>> line.strip().split(" = ")[0].count(" : "), line.endswith("\\n")
    (1, True)
    >>> all(pair in task.heldout_pairs() for pair in zip(data.families, data.firsts, data.seconds))
    True
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch

from probekit.data import SolutionWording
from probekit.errors import ConfigError

PAD = 256
"""The padding token after an answer (the byte corpus's ``PAD``)."""

VOCAB_SIZE = 259
"""Bytes and the byte corpus's three specials (:mod:`probekit.lm.corpus`)."""

IGNORE = -100
"""The label of a position without a target (no loss there)."""


NUMBER_FIRST: dict[str, Callable[[int], int]] = {
    "add1": lambda x: x + 1,
    "add5": lambda x: x + 5,
    "sub3": lambda x: x - 3,
    "mul2": lambda x: 2 * x,
    "mul3": lambda x: 3 * x,
    "half": lambda x: x // 2,
}
"""The arithmetic family's first operations (integer to integer)."""

NUMBER_SECOND: dict[str, Callable[[str], str]] = {
    "rev": lambda s: s[::-1],
    "rot": lambda s: s[1:] + s[:1],
    "id": lambda s: s,
}
"""The arithmetic family's second operations, on the decimal digits of the first's result."""

STRING_FIRST: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "lower": str.lower,
    "swap": str.swapcase,
    "cap": str.capitalize,
}
"""The case family's first operations (case changes)."""

STRING_SECOND: dict[str, Callable[[str], str]] = {
    "first2": lambda s: s[:2],
    "first3": lambda s: s[:3],
    "last2": lambda s: s[-2:],
    "last3": lambda s: s[-3:],
    "id": lambda s: s,
}
"""The case family's second operations (truncations and the no-op)."""

FAMILIES: dict[str, tuple[dict[str, Callable[..., Any]], dict[str, Callable[[str], str]]]] = {
    "arithmetic": (NUMBER_FIRST, NUMBER_SECOND),
    "case": (STRING_FIRST, STRING_SECOND),
}
"""Each family's first and second operations, by name."""

SPLITS = ("train", "seen", "heldout")
"""The task's splits (see the module docstring)."""

Combination = tuple[str, str, str]
"""A combination: (family, first operation, second operation)."""

_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
_MAX_NUMBER = 99_999  # numbers are enumerated for the input split: a bound keeps that fast


def apply(family: str, first: str, second: str, x: str) -> str:
    """The answer of the combination ``first`` then ``second`` of ``family`` on input ``x``.

    Example:
        >>> apply("arithmetic", "add5", "rev", "128"), apply("case", "swap", "last3", "aBcDe")
        ('331', 'CdE')
    """
    f, g = FAMILIES[family][0][first], FAMILIES[family][1][second]
    return g(str(f(int(x)))) if family == "arithmetic" else g(f(x))


def first_step(family: str, first: str, x: str) -> str:
    """The result of the first operation alone (what a model that ignores ``g`` answers)."""
    f = FAMILIES[family][0][first]
    return str(f(int(x))) if family == "arithmetic" else f(x)


@dataclass(frozen=True)
class CompositionTask:
    """The settings of the composition task (see the module docstring), checked by
    :meth:`validate` before anything is drawn.

    ``families``: which families; ``primitives``: the operations used (names of the chosen
    families' first and second operations; None: all of them; each family keeps at least two
    of each); ``heldout``: the share of each family's combinations held out (in (0, 1)), or the
    held-out combinations as ``"f g"`` names; ``n_train`` / ``n_test``: examples in the
    training split and in each test split; ``test_inputs``: the share of inputs kept for the
    test splits; ``seed``; the inputs' ranges: integers ``min_number .. max_number``, strings of
    ``min_letters .. max_letters`` letters.

    Example:
        >>> CompositionTask(heldout=0.9).validate()
        Traceback (most recent call last):
        ...
        probekit.errors.ConfigError: heldout 0.9 holds out 16 of the arithmetic family's 18 \
combinations, but at most 12 can be held out with every primitive still trained. Fix: ...
    """

    families: tuple[str, ...] = ("arithmetic", "case")
    primitives: tuple[str, ...] | None = None
    heldout: float | tuple[str, ...] = 0.25
    n_train: int = 4000
    n_test: int = 400
    test_inputs: float = 0.2
    seed: int = 0
    min_number: int = 10
    max_number: int = 999
    min_letters: int = 3
    max_letters: int = 8
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    EXAMPLES: ClassVar[dict[str, str]] = {"heldout": "e.g. 0.25 or ('add1 rev', 'cap last2')"}

    # ---- checks -------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad setting and its fix."""
        self._check_families()
        for name in ("n_train", "n_test"):
            _check_int(name, getattr(self, name), 1)
        _check_int("seed", self.seed, 0)
        _check_fraction("test_inputs", self.test_inputs, "e.g. 0.2")
        _check_int("min_number", self.min_number, 3, "sub3 must stay non-negative")
        _check_int("max_number", self.max_number, self.min_number + 20, "at least 20 numbers")
        if self.max_number > _MAX_NUMBER:
            raise ConfigError(
                f"max_number {self.max_number} is above {_MAX_NUMBER}",
                fix=f"use max_number <= {_MAX_NUMBER} (numbers of up to 5 digits)",
            )
        _check_int("min_letters", self.min_letters, 3, "the truncations keep up to 3 letters")
        _check_int("max_letters", self.max_letters, self.min_letters)
        if self.max_letters > 32:
            raise ConfigError(f"max_letters {self.max_letters} is above 32", fix="use e.g. 8")
        self._check_heldout()
        if "arithmetic" in self.families and not all(self._numbers()):
            raise ConfigError(
                f"test_inputs {self.test_inputs} leaves no number between {self.min_number} and "
                f"{self.max_number} in one of the splits",
                fix="widen the number range or use test_inputs near 0.2",
            )

    def _check_families(self) -> None:
        if not isinstance(self.families, tuple) or not self.families:
            raise ConfigError(
                f"families {self.families!r} is not a non-empty tuple",
                fix=f"pass a tuple of {list(FAMILIES)}",
            )
        for family in self.families:
            if family not in FAMILIES:
                raise ConfigError(f"unknown family {family!r}", fix=f"use {list(FAMILIES)}")
        if len(set(self.families)) != len(self.families):
            raise ConfigError(f"families {self.families} repeats one", fix="name each once")
        if self.primitives is None:
            return
        if not isinstance(self.primitives, tuple):
            raise ConfigError(
                f"primitives {self.primitives!r} is not a tuple", fix="pass a tuple of names"
            )
        known = {n for fam in self.families for ops in FAMILIES[fam] for n in ops}
        for name in self.primitives:
            if name not in known:
                raise ConfigError(
                    f"unknown primitive {name!r} for families {self.families}",
                    fix=f"use names from {sorted(known)}",
                )
        for family in self.families:
            for which, ops in zip(("first", "second"), self.operations(family), strict=True):
                if len(ops) < 2:
                    raise ConfigError(
                        f"primitives keep {len(ops)} {which} operation(s) of the {family} "
                        "family; a held-out combination needs at least two of each",
                        fix=f"add {which} operations of {family} to primitives",
                    )

    def _check_heldout(self) -> None:
        if isinstance(self.heldout, tuple):
            self._named_heldout()  # raises on an unknown or uncovered name
            return
        _check_fraction("heldout", self.heldout, self.EXAMPLES["heldout"])
        for family in self.families:
            firsts, seconds = self.operations(family)
            total = len(firsts) * len(seconds)
            most = total - max(len(firsts), len(seconds))
            wanted = self._heldout_count(family)
            if wanted > most:
                raise ConfigError(
                    f"heldout {self.heldout} holds out {wanted} of the {family} family's {total} "
                    f"combinations, but at most {most} can be held out with every primitive "
                    "still trained",
                    fix=f"use heldout <= {most / total:.2f}",
                )

    # ---- the combinations -------------------------------------------------------------------
    def operations(self, family: str) -> tuple[list[str], list[str]]:
        """The first and the second operations of ``family`` this task uses, in order."""
        firsts, seconds = FAMILIES[family]
        kept = set(firsts) | set(seconds) if self.primitives is None else set(self.primitives)
        return [n for n in firsts if n in kept], [n for n in seconds if n in kept]

    def combinations(self) -> list[Combination]:
        """Every (family, first, second) of the task."""
        return [
            (fam, f, g)
            for fam in self.families
            for f in self.operations(fam)[0]
            for g in self.operations(fam)[1]
        ]

    def _heldout_count(self, family: str) -> int:
        firsts, seconds = self.operations(family)
        share = self.heldout if isinstance(self.heldout, float | int) else 0.0
        return max(1, math.floor(share * len(firsts) * len(seconds) + 0.5))

    def heldout_pairs(self) -> list[Combination]:
        """The held-out combinations (never in training), in the order of :meth:`combinations`."""
        if "heldout" not in self._cache:
            if isinstance(self.heldout, tuple):
                chosen = set(self._named_heldout())
            else:
                chosen = {c for fam in self.families for c in self._drawn_heldout(fam)}
            self._cache["heldout"] = [c for c in self.combinations() if c in chosen]
        return list(self._cache["heldout"])

    def seen_pairs(self) -> list[Combination]:
        """The combinations in training."""
        held = set(self.heldout_pairs())
        return [c for c in self.combinations() if c not in held]

    def _drawn_heldout(self, family: str) -> list[Combination]:
        """A seeded draw: a random covering set stays seen, the held-out ones come from the
        rest."""
        rng = np.random.default_rng((self.seed, 7, self.families.index(family)))
        firsts, seconds = self.operations(family)
        rows, cols = rng.permutation(len(firsts)), rng.permutation(len(seconds))
        n = max(len(firsts), len(seconds))
        cover = {(firsts[rows[i % len(firsts)]], seconds[cols[i % len(seconds)]]) for i in range(n)}
        rest = [(f, g) for f in firsts for g in seconds if (f, g) not in cover]
        picked = rng.choice(len(rest), size=self._heldout_count(family), replace=False)
        return [(family, *rest[i]) for i in sorted(picked)]

    def _named_heldout(self) -> list[Combination]:
        found: list[Combination] = []
        for name in self.heldout if isinstance(self.heldout, tuple) else ():
            parts = name.split() if isinstance(name, str) else []
            match = [
                c for c in self.combinations() if len(parts) == 2 and (c[1], c[2]) == tuple(parts)
            ]
            if not match:
                raise ConfigError(
                    f"heldout names {name!r}, which is not a combination of this task",
                    fix="name combinations as 'first second', e.g. 'add1 rev'",
                )
            found += match
        for family in self.families:
            seen = [c for c in self.combinations() if c[0] == family and c not in found]
            firsts, seconds = self.operations(family)
            lost = [p for p in firsts if all(c[1] != p for c in seen)]
            lost += [p for p in seconds if all(c[2] != p for c in seen)]
            if lost:
                raise ConfigError(
                    f"heldout leaves the {family} primitive(s) {lost} out of training",
                    fix="hold out fewer combinations, so each primitive stays in one seen one",
                )
        return found

    # ---- inputs --------------------------------------------------------------------------------
    def is_test_input(self, x: str) -> bool:
        """Whether ``x`` is kept for the test splits (a CRC-32 of the seed and ``x``)."""
        return zlib.crc32(f"{self.seed}|{x}".encode()) < self.test_inputs * 2**32

    def _numbers(self) -> tuple[list[str], list[str]]:
        """The training and the test numbers, as strings."""
        if "numbers" not in self._cache:
            train: list[str] = []
            test: list[str] = []
            for x in range(self.min_number, self.max_number + 1):
                s = str(x)
                (test if self.is_test_input(s) else train).append(s)
            self._cache["numbers"] = (train, test)
        return self._cache["numbers"]

    def _strings(self, rng: np.random.Generator, n: int, test: bool) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            lengths = rng.integers(self.min_letters, self.max_letters + 1, size=2 * (n - len(out)))
            letters = rng.integers(0, len(_LETTERS), size=(len(lengths), self.max_letters))
            for k, row in zip(lengths, letters, strict=True):
                s = "".join(_LETTERS[row[:k]])
                if self.is_test_input(s) == test and len(out) < n:
                    out.append(s)
        return out

    # ---- the examples ----------------------------------------------------------------------------
    @cached_property
    def prompt_width(self) -> int:
        """Bytes of the longest prompt (``"f g : x = "``); every prompt is left-padded to it."""
        widths = []
        for family in self.families:
            firsts, seconds = self.operations(family)
            x = self.max_number if family == "arithmetic" else self.max_letters
            x_len = len(str(x)) if family == "arithmetic" else x
            widths.append(max(map(len, firsts)) + max(map(len, seconds)) + x_len + 7)
        return max(widths)

    @cached_property
    def answer_width(self) -> int:
        """Bytes of the longest answer, its ``"\\n"`` included."""
        widths = []
        for family in self.families:
            if family == "arithmetic":
                firsts = self.operations(family)[0]
                top = max(
                    abs(NUMBER_FIRST[f](x))
                    for f in firsts
                    for x in (self.min_number, self.max_number)
                )
                widths.append(len(str(top)))
            else:
                widths.append(self.max_letters)
        return max(widths) + 1

    @property
    def seq_len(self) -> int:
        """Tokens of every sequence: the prompt width and the answer width."""
        return self.prompt_width + self.answer_width

    def examples(self, split: str, n: int | None = None) -> list[tuple[str, str, str, str, str]]:
        """The examples of ``split`` as (family, first, second, input, answer) tuples."""
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}", fix=f"use one of {list(SPLITS)}")
        self.validate()
        pairs = self.heldout_pairs() if split == "heldout" else self.seen_pairs()
        n = (self.n_train if split == "train" else self.n_test) if n is None else n
        rng = np.random.default_rng((self.seed, SPLITS.index(split)))
        which = rng.integers(0, len(pairs), size=n)
        test = split != "train"
        numbers = self._numbers()[1 if test else 0]
        counts = np.bincount([("arithmetic" == pairs[i][0]) for i in which], minlength=2)
        drawn_numbers = iter(
            np.asarray(numbers)[rng.integers(0, len(numbers), size=counts[1])] if counts[1] else []
        )
        drawn_strings = iter(self._strings(rng, int(counts[0]), test))
        out = []
        for i in which:
            family, f, g = pairs[i]
            x = str(next(drawn_numbers) if family == "arithmetic" else next(drawn_strings))
            out.append((family, f, g, x, apply(family, f, g, x)))
        return out

    def dataset(self, split: str, n: int | None = None) -> CompositionData:
        """The examples of ``split`` as token sequences (:class:`CompositionData`)."""
        rows = self.examples(split, n)
        return encode(rows, split, self.prompt_width, self.seq_len, set(self.heldout_pairs()))

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON types (tuples as lists)."""
        out = asdict(self)
        out.pop("_cache", None)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompositionTask:
        """The task of :meth:`to_dict`'s output."""
        tuples = {k: tuple(v) for k, v in d.items() if isinstance(v, list)}
        return cls(**{**d, **tuples})


def encode(
    rows: Sequence[tuple[str, str, str, str, str]],
    split: str,
    width: int,
    length: int,
    heldout: set[Combination] | None = None,
) -> CompositionData:
    """Examples (family, first, second, input, answer) as :class:`CompositionData`: each line
    left-padded with spaces to ``width`` prompt bytes, right-padded with ``PAD`` to ``length``."""
    n = len(rows)
    lines = [f"{f} {g} : {x} = ".rjust(width) + f"{y}\n" for _, f, g, x, y in rows]
    joined = "".join(line.ljust(length, "\0") for line in lines).encode()
    sequences = torch.frombuffer(bytearray(joined), dtype=torch.uint8).long().view(n, length)
    lengths = torch.tensor([len(y) + 1 for *_, y in rows], dtype=torch.long)
    at = torch.arange(length)[None]
    sequences = sequences.masked_fill(at >= width + lengths[:, None], PAD)
    held = heldout or set()
    families, firsts, seconds, inputs, outputs = (
        (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [], [])
    )
    return CompositionData(
        split=split,
        sequences=sequences,
        answer_start=width,
        answer_lengths=lengths,
        families=families,
        firsts=firsts,
        seconds=seconds,
        inputs=inputs,
        outputs=outputs,
        is_heldout=torch.tensor([(r[0], r[1], r[2]) in held for r in rows], dtype=torch.bool),
    )


CATEGORIES = {
    "composed": "the first answer byte of the composition, g(f(x))",
    "first_step": "the first byte of f(x) alone: the second operation ignored",
    "other": "neither",
}
"""The answer categories of a prediction of the first answer byte."""

WORDING = SolutionWording(
    groups="combinations",
    reference="composed answer",
    seen_scope="test inputs",
    heldout_scope="test inputs",
    target="composed answer",
    memorizing="not learnt (the seen combinations' first answer bytes are mostly wrong)",
    title="First answer byte on the held-out combinations",
    explain=(
        "The figure shows, for each combination, the share of first answer bytes that are the "
        "composition's, that of the first operation alone, or neither."
    ),
    conclusion="Solution: {solution}; on the held-out combinations {heldout_composed:.1%} of "
    "first answer bytes are the composition's and {heldout_first_step:.1%} the first "
    "operation's alone.",
)
"""How figures and reports speak of the composition task."""


@dataclass
class CompositionData:
    """One split of the composition task as token sequences, and as
    :class:`~probekit.data.TaskData`.

    ``sequences`` ``[n, L]``: the whole lines (prompt left-padded with spaces to
    ``answer_start`` bytes, answer, ``"\\n"``, then ``PAD``); ``answer_start``: the position of
    every sequence's first answer byte; ``answer_lengths`` ``[n]``: answer bytes with the
    ``"\\n"``; the examples' ``families``, ``firsts``, ``seconds``, ``inputs`` and
    ``outputs`` (the answers without ``"\\n"``); ``is_heldout`` ``[n]``.

    As task data (what analyzers read), ``tokens`` are the prompts ``[n, answer_start]``,
    scored at their last position against ``targets``, the first answer byte; groups are the
    combinations (``"add1 rev"``).

    Example:
        >>> data = CompositionTask(n_train=4, n_test=2).dataset("train")
        >>> data.tokens.shape[1] == data.answer_start
        True
        >>> bool((data.loss_mask().sum(1) == data.answer_lengths).all())
        True
    """

    split: str
    sequences: torch.Tensor
    answer_start: int
    answer_lengths: torch.Tensor
    families: list[str]
    firsts: list[str]
    seconds: list[str]
    inputs: list[str]
    outputs: list[str]
    is_heldout: torch.Tensor
    vocab_size: int | None = VOCAB_SIZE
    group_label: ClassVar[str] = "combination"

    def __len__(self) -> int:
        return int(self.sequences.shape[0])

    # ---- sequences for training and evaluation ---------------------------------------------------
    def lines(self) -> list[str]:
        """The examples as text lines (the prompt's left padding included)."""
        return [bytes(row[row != PAD].tolist()).decode() for row in self.sequences]

    def loss_mask(self) -> torch.Tensor:
        """Bool ``[n, L]``: the answer bytes (the ``"\\n"`` included), nothing else."""
        at = torch.arange(self.sequences.shape[1])[None]
        start = self.answer_start
        return (at >= start) & (at < start + self.answer_lengths[:, None])

    def labels(self) -> torch.Tensor:
        """``[n, L]`` next-token labels for a causal LM: ``labels[:, t]`` is the token to
        predict at ``t`` where ``t + 1`` is an answer byte, ``-100`` (no loss) elsewhere."""
        labels = torch.full_like(self.sequences, IGNORE)
        mask = self.loss_mask()
        labels[:, :-1] = torch.where(mask[:, 1:], self.sequences[:, 1:], IGNORE)
        return labels

    # ---- the TaskData protocol -----------------------------------------------------------------
    @property
    def tokens(self) -> torch.Tensor:
        """The prompts ``[n, answer_start]`` (up to and including ``"= "``)."""
        return self.sequences[:, : self.answer_start]

    @property
    def targets(self) -> torch.Tensor:
        """The first answer byte of every sequence."""
        return self.sequences[:, self.answer_start]

    @property
    def resample_range(self) -> tuple[int, int]:
        """Printable ASCII, the bytes a resampled position draws from."""
        return (32, 127)

    def groups(self) -> list[str]:
        """The combination of every sequence, ``"first second"``."""
        return [f"{f} {g}" for f, g in zip(self.firsts, self.seconds, strict=True)]

    def heldout(self) -> torch.Tensor:
        return self.is_heldout

    def answers(self) -> dict[str, torch.Tensor]:
        """``composed``: the first answer byte; ``first_step``: the first byte of ``f(x)``
        alone (``-1`` where it is the composed one's)."""
        steps = [
            first_step(fam, f, x)[0]
            for fam, f, x in zip(self.families, self.firsts, self.inputs, strict=True)
        ]
        alone = torch.tensor([ord(c) for c in steps], dtype=torch.long)
        composed = self.targets
        return {"composed": composed, "first_step": torch.where(alone == composed, -1, alone)}

    def categories(self) -> dict[str, str]:
        """composed, first_step, other (:data:`CATEGORIES`)."""
        return dict(CATEGORIES)

    def classify(self, predictions: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per category, whether each predicted first answer byte is in it (NaN: no
        ``first_step`` answer distinct from the composed one)."""
        answers = self.answers()
        composed = predictions == answers["composed"]
        has_alone = answers["first_step"] != -1
        alone = (predictions == answers["first_step"]) & has_alone
        return {
            "composed": composed.float(),
            "first_step": torch.where(has_alone, alone.float(), float("nan")),
            "other": (~(composed | alone)).float(),
        }

    def subsets(self) -> dict[str, torch.Tensor]:
        """Per family, its sequences (``"arithmetic"``, ``"case"``)."""
        return {
            fam: torch.tensor([f == fam for f in self.families])
            for fam in sorted(set(self.families))
        }

    def solution_wording(self) -> SolutionWording:
        return WORDING

    def description(self) -> str:
        words = {
            "train": "training split",
            "seen": "seen combinations on test inputs",
            "heldout": "held-out combinations",
        }
        parts = [words.get(s, s) for s in self.split.split("+")]
        return f"the composition task's {' and '.join(parts)}"

    def roles(self) -> dict[str, torch.Tensor]:
        """One position per sequence: the last byte of the first operation's name
        (``"first"``), of the second's (``"second"``) and of the input (``"input"``)."""
        n, width = self.tokens.shape
        first, second, inputs = (torch.zeros(n, width, dtype=torch.bool) for _ in range(3))
        for i, (f, g, x) in enumerate(zip(self.firsts, self.seconds, self.inputs, strict=True)):
            start = width - len(f"{f} {g} : {x} = ")
            first[i, start + len(f) - 1] = True
            second[i, start + len(f) + len(g)] = True
            inputs[i, width - 4] = True
        return {"first": first, "second": second, "input": inputs}

    def variables(self) -> dict[str, np.ndarray]:
        """Integer codes of the family and the two operations, and the target byte."""
        code = lambda names: np.unique(names, return_inverse=True)[1].astype(np.int64)  # noqa: E731
        return {
            "family": code(self.families),
            "first": code(self.firsts),
            "second": code(self.seconds),
            "target": self.targets.numpy().astype(np.int64),
        }

    def mirror_groups(self) -> list[tuple[str, str]]:
        """None: combinations have no mirror."""
        return []

    def concat(self, others: Sequence[CompositionData]) -> CompositionData:
        """One data set of this split followed by ``others`` (of the same task)."""
        parts = [self, *others]
        if (
            len({d.answer_start for d in parts}) > 1
            or len({d.sequences.shape[1] for d in parts}) > 1
        ):
            raise ConfigError(
                "composition data of different prompt widths cannot be joined",
                fix="generate them from one CompositionTask",
            )
        joined = lambda name: [x for d in parts for x in getattr(d, name)]  # noqa: E731
        return CompositionData(
            "+".join(d.split for d in parts),
            torch.cat([d.sequences for d in parts]),
            self.answer_start,
            torch.cat([d.answer_lengths for d in parts]),
            families=joined("families"),
            firsts=joined("firsts"),
            seconds=joined("seconds"),
            inputs=joined("inputs"),
            outputs=joined("outputs"),
            is_heldout=torch.cat([d.is_heldout for d in parts]),
        )


def _check_int(name: str, value: Any, low: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        reason = f" ({why})" if why else ""
        raise ConfigError(
            f"{name} {value!r} is not an integer of at least {low}{reason}",
            fix=f"pass {name}={low} or more",
        )


def _check_fraction(name: str, value: Any, example: str) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 < value < 1:
        raise ConfigError(f"{name} {value!r} is not a share between 0 and 1", fix=f"use {example}")


__all__ = [
    "CATEGORIES",
    "FAMILIES",
    "IGNORE",
    "NUMBER_FIRST",
    "NUMBER_SECOND",
    "PAD",
    "SPLITS",
    "STRING_FIRST",
    "STRING_SECOND",
    "VOCAB_SIZE",
    "WORDING",
    "CompositionData",
    "CompositionTask",
    "apply",
    "encode",
    "first_step",
]
