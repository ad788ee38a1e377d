"""The anchor-function compositional task (Zhang et al., NeurIPS 2024 / TPAMI 2025).

An input is ``seq_len`` tokens of noise drawn from the item range, with a key ``x`` at position
``p`` and an anchor pair ``(a1, a2)`` at ``p + 1, p + 2``. The target (the next token) is the
composite ``g(g(x; a1); a2)`` where each anchor shifts the key (default 1:+5, 2:+1, 3:-2, 4:-8).
Some pairs are trained on a *non-inferential* target (default ``(3, 4)``: the composite ``x - 10``
plus the offset ``+4``, i.e. ``x - 6``) and some pairs are never trained (default ``(4, 3)``). On
a held-out pair a model can answer with the composite (the *inferential* solution), with the
trained target of the mirrored pair (the *symmetric* solution), or with something else
(:mod:`probekit.anchor.solutions`). One split is :class:`~probekit.anchor.data.AnchorData`.

Longer compositions (``chain_length`` k, 2 by default: the pairs above): the key is followed by
a chain of k anchors ``(a1, ..., ak)`` at ``p + 1 .. p + k`` and the target is the composite
``g(...g(g(x; a1); a2)...; ak)``; the chain's first two anchors keep the pair rules (a special
first pair adds its offset; the symmetric answer is the trained target of the chain with its first
two anchors swapped). A chain is held out when its first two anchors are a held-out pair
(:attr:`AnchorTask.heldout_chains`): every anchor and every pair is trained, ``(4, 3)`` as the
second step of ``(1, 4, 3)``, but never as the first step of a chain. At k = 2 the data are
bit-identical to the pair task's as generated before chains existed.

Keys are also split by a modulus ``m`` (``key_split``): a training sequence has
``x mod m != p mod m``, a test sequence ``x mod m == p mod m`` (``p`` in ``[0, seq_len - 2)``).

The official code, point by point (files of GitHub ``sjtuzzw/complexity_control`` under
``code_for_anchor_func/``, and ``xuzhiqin1990/anchor_function_pub``):

* key split: ``data_generator/composition.py`` line 23 calls
  ``generate_mod_list(data_min, data_max, args.seq_len)`` (``data_generator_base.py`` lines
  4-16: test keys are ``i % seq_len == pos``), with ``seq_len`` 9 input tokens
  (``main.py``, ``--seq_len`` default 9): modulus ``seq_len``, the default
  ``key_split="complexity_control"``.
  It draws the position first (line 29, ``np.random.randint(0, seq_len - 2)``), then the key
  among that position's training (or test) keys (lines 31-34); so does probekit.
  ``anchor_function_pub`` (``data_generator/composition.py`` lines 28-29: ``x =
  random.choice(dataset) + pos``) tests ``(x - p) mod 8 == 0``: ``key_split="anchor_function_pub"``
  (modulus 8). probekit before this field used modulus ``seq_len - 2`` with the key drawn first
  and the position among the key's allowed ones: ``key_split="probekit_v1"`` (bit-identical to
  the data it generated). The NeurIPS paper states the split only in words; the rules differ
  in which keys are test keys, not in the idea.
* special target: ``composition.py`` lines 42-43 add ``+4`` to the composite of ``(3, 4)``:
  ``special_targets`` are offsets from the composite (``special_form="offset"``, default
  ``{(3, 4): 4}``); ``special_form="shift"`` reads them as target minus key (probekit's old form,
  ``{(3, 4): -6}``), which gives the same data.
* held-out pair: the official generator gives a pair's sequences on training keys (data mode
  suffix ``xel``, line 31) or test keys (``xm0``, line 33), and the held-out pair is evaluated
  on training-key cells;
  probekit's ``test_task`` uses all keys and :meth:`AnchorData.on_training_keys` marks the
  training-key cells, so both numbers are reported (``score`` and ``solution_types``).

Splits:
    ``train``      seen pairs, training keys (the trained target).
    ``test_data``  seen pairs, test keys ("generalization on data").
    ``test_task``  held-out pairs, all keys ("generalization on task"); its training-key
                   cells (:meth:`AnchorData.on_training_keys`) are the official code's set.

Example:
    >>> task = AnchorTask(n_train=100, n_test=50)
    >>> data = task.dataset("train")
    >>> data.tokens.shape
    torch.Size([100, 9])
    >>> int(data.targets[0]) == task.trained_target(int(data.keys[0]), data.pair(0))
    True
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from probekit.anchor.data import AnchorData, Chain, Pair
from probekit.data import category_shares
from probekit.errors import ConfigError, InputError, check_known_keys

KEY_SPLITS: dict[str, str] = {
    "complexity_control": "modulus seq_len, position drawn first (the official code, default)",
    "anchor_function_pub": "modulus 8, position drawn first ((x - p) mod 8 == 0 are test keys)",
    "probekit_v1": "modulus seq_len - 2, key drawn first (probekit before key_split existed)",
}
"""The named key-split rules (an integer ``key_split`` is a modulus, position drawn first)."""

SPECIAL_FORMS: dict[str, str] = {
    "offset": "special target = composite + value (the official code's '+4', default)",
    "shift": "special target = key + value (probekit's form before special_form existed)",
}

#: the fields of a task saved before key_split / special_form existed: such a dict is read
#: with the rules it was generated with (probekit_v1 split, absolute shifts)
LEGACY_FIELDS = frozenset(
    ("anchors", "item_low", "item_high", "seq_len", "vocab_size", "special_targets",
     "heldout_pairs", "n_train", "n_test", "seed")
)  # fmt: skip

MAX_CHAINS = 100_000
"""The most chains (anchors to the power of the chain length) a task may have."""

SPLITS: tuple[str, ...] = ("train", "test_data", "test_task")
_SPLIT_INDEX = {name: i for i, name in enumerate(SPLITS)}


def _check_int(name: str, value: Any) -> None:
    """``value`` is an integer (not a bool, not a float)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ConfigError(
            f"task setting {name} = {value!r} is not an integer", fix=f"set {name} to an integer"
        )


def _as_int(value: Any, what: str) -> int:
    """``value`` as an int: integers and integer text (JSON object keys) only."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    raise ConfigError(f"{what} {value!r} is not an integer", fix="write a whole number")


def _anchor_mapping(value: Any) -> dict[int, int]:
    """Anchor id -> shift; ids that repeat once read as integers (``1`` and ``"01"``) refused."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"anchors {value!r} are not a mapping of anchor id to shift",
            fix="pass e.g. {1: 5, 2: 1, 3: -2, 4: -8}",
        )
    out: dict[int, int] = {}
    for k, v in value.items():
        key = _as_int(k, "anchor id")
        if key in out:
            raise ConfigError(f"anchor id {key} is given twice", fix="list every anchor id once")
        out[key] = _as_int(v, f"shift of anchor {key}")
    return out


def _as_pair(value: Any, what: str) -> Pair:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise ConfigError(
            f"{what} {value!r} is not a pair of anchor ids", fix="write it as (a1, a2), e.g. (4, 3)"
        )
    items = tuple(_as_int(v, f"{what} {value!r}: anchor id") for v in value)
    if len(items) != 2:
        raise ConfigError(
            f"{what} {value!r} has {len(items)} elements, not 2",
            fix="write it as (a1, a2), e.g. (4, 3)",
        )
    return (items[0], items[1])


@dataclass
class AnchorTask:
    """Configuration and generator of an anchor-function task (see the module docstring).

    ``special_targets`` maps a pair to an offset from its composite (``special_form="offset"``,
    the official code's rule) or, with ``special_form="shift"``, to its target minus the key.
    ``key_split`` names the key-split rule (:data:`KEY_SPLITS`) or gives the modulus as an
    integer. A held-out pair whose symmetric answer would equal its composite, or either of
    them the key itself, is refused: the solution types could not be told apart.
    ``chain_length`` composes chains of that many anchors (see the module docstring).

    Example:
        >>> task = AnchorTask(anchors={1: 5, 2: 1, 3: -2, 4: -8}, heldout_pairs=[(4, 3)])
        >>> task.composite(50, (4, 3)), task.trained_target(50, (3, 4))
        (40, 44)
        >>> old_form = AnchorTask(special_targets={(3, 4): -6}, special_form="shift")
        >>> old_form.trained_target(50, (3, 4))
        44
    """

    anchors: dict[int, int] = field(default_factory=lambda: {1: 5, 2: 1, 3: -2, 4: -8})
    item_low: int = 20
    item_high: int = 100
    seq_len: int = 9
    vocab_size: int = 201
    special_targets: dict[Pair, int] = field(default_factory=lambda: {(3, 4): 4})
    heldout_pairs: list[Pair] = field(default_factory=lambda: [(4, 3)])
    n_train: int = 20000
    n_test: int = 2000
    seed: int = 0
    key_split: str | int = "complexity_control"
    special_form: str = "offset"
    # --- longer compositions ---
    chain_length: int = 2

    def __post_init__(self) -> None:
        self.anchors = _anchor_mapping(self.anchors)
        self.special_targets = {
            _as_pair(k, "special-target pair"): _as_int(v, "special-target shift")
            for k, v in _pairs_mapping(self.special_targets).items()
        }
        if isinstance(self.heldout_pairs, str | bytes | Mapping) or not isinstance(
            self.heldout_pairs, Sequence | set | tuple
        ):
            raise ConfigError(
                f"held-out pairs {self.heldout_pairs!r} are not a list of pairs",
                fix="pass e.g. [(4, 3)] (or [] for none)",
            )
        self.heldout_pairs = [_as_pair(p, "held-out pair") for p in self.heldout_pairs]
        self._cache: dict[str, AnchorData] = {}
        # whether this task's seed follows the run's (set by TrainConfig, not a field)
        self._seed_from_run = False
        self.validate()

    # ------------------------------------------------------------------ configuration
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the problem if the configuration is impossible."""
        for name in ("item_low", "item_high", "seq_len", "vocab_size", "n_train", "n_test", "seed"):
            _check_int(name, getattr(self, name))
        if not 0 <= self.seed < 2**32:
            raise ConfigError(
                f"task seed {self.seed} is outside [0, 2**32)", fix="use a seed such as 0"
            )
        if self.vocab_size < 3 or self.vocab_size >= 2**31:
            raise ConfigError(
                f"vocab_size {self.vocab_size} is outside [3, 2**31)", fix="use e.g. 201"
            )
        if not (1 <= self.item_low < self.item_high <= self.vocab_size):
            raise ConfigError(
                f"item range [{self.item_low}, {self.item_high}) is not inside [1, "
                f"{self.vocab_size})",
                fix="choose 1 <= item_low < item_high <= vocab_size (0 is padding)",
            )
        if self.item_high - self.item_low < 2:
            raise ConfigError(
                f"item range [{self.item_low}, {self.item_high}) holds one value: the key could "
                "not be told from the noise",
                fix="use a range of several values, e.g. [20, 100)",
            )
        if len(self.anchors) < 2:
            raise ConfigError(
                f"anchors {self.anchors} name {len(self.anchors)} anchor(s); composition needs "
                "at least two",
                fix="pass e.g. anchors={1: 5, 2: 1}",
            )
        for a in self.anchors:
            if a <= 0 or a >= self.vocab_size:
                raise ConfigError(
                    f"anchor id {a} is outside [1, {self.vocab_size})",
                    fix="use ids between 1 and vocab_size - 1 (0 is padding)",
                )
            if self.item_low <= a < self.item_high:
                raise ConfigError(
                    f"anchor id {a} lies inside the item range [{self.item_low}, {self.item_high})",
                    fix="pick anchor ids outside the item range, e.g. 1..4 with items in [20, 100)",
                )
        self._validate_chain_length()
        if self.seq_len < 4:
            raise ConfigError(
                f"seq_len {self.seq_len} is too short: a key, two anchors and at least two key "
                "positions are needed",
                fix="use seq_len >= 4 (default 9)",
            )
        if self.seq_len < self.chain_length + 2:
            raise ConfigError(
                f"seq_len {self.seq_len} is too short for chains of {self.chain_length} anchors: "
                "a key, the anchors and at least two key positions are needed",
                fix=f"use seq_len >= {self.chain_length + 2}",
            )
        self._validate_split()
        self._validate_pairs()
        self._validate_distinct()
        if self.n_train < 1 or self.n_test < 1:
            raise ConfigError("n_train and n_test must be positive", fix="use e.g. 20000 / 2000")

    def _validate_split(self) -> None:
        """The key split names a rule or a modulus >= 2, and every position has both a
        training key and a test key."""
        if self.special_form not in SPECIAL_FORMS:
            raise ConfigError(
                f"special_form {self.special_form!r} is not one of {list(SPECIAL_FORMS)}",
                fix="use 'offset' (offset from the composite) or 'shift' (target minus key)",
            )
        split = self.key_split
        if isinstance(split, str):
            if split not in KEY_SPLITS:
                raise ConfigError(
                    f"unknown key_split {split!r}",
                    fix=f"use one of {list(KEY_SPLITS)} or an integer modulus >= 2",
                )
        else:
            _check_int("key_split", split)
            if split < 2:
                raise ConfigError(
                    f"key_split modulus {split} < 2 leaves no training keys",
                    fix="use a modulus >= 2 or a named rule such as 'complexity_control'",
                )
        items = np.arange(self.item_low, self.item_high)
        for p in range(self.n_positions):
            test = items % self.modulus == p % self.modulus
            if test.all() or not test.any():
                raise ConfigError(
                    f"with key_split {split!r} (modulus {self.modulus}) position {p} has "
                    f"{'no training' if test.all() else 'no test'} key in [{self.item_low}, "
                    f"{self.item_high})",
                    fix="widen the item range or choose a smaller modulus",
                )

    def _validate_distinct(self) -> None:
        """No special target equals its composite; on every held-out pair the inferential and
        symmetric answers differ from each other and from the key."""
        for p in self.special_targets:
            if self.target_shift(p) == self.composite_shift(p):
                raise ConfigError(
                    f"the special target of pair {p} equals its composite (offset 0): it is not "
                    "special, and its mirror's symmetric and inferential answers coincide",
                    fix=f"give {p} a non-zero offset, or leave it out of special_targets",
                )
        for chain in self.heldout_chains:
            comp, sym = self.composite_shift(chain), self.symmetric_shift(chain)
            mirror = (chain[1], chain[0])
            if sym is not None and sym == comp:
                raise ConfigError(
                    f"on the held-out {self._unit} {chain} the symmetric answer (the trained "
                    f"target of {mirror}) equals the composite x{comp:+d}: 'inferential' and "
                    "'symmetric' would be the same answer",
                    fix=f"give {mirror} a special target (special_targets={{{mirror}: 4}}), "
                    f"hold out {mirror} too, or hold out another pair",
                )
            for name, shift in (("composite", comp), ("symmetric answer", sym)):
                if shift == 0:
                    raise ConfigError(
                        f"the {name} of the held-out {self._unit} {chain} is the key itself: a "
                        "model that copies the key would be classified by it",
                        fix="choose anchors / special targets whose shifts on it are non-zero",
                    )

    def _validate_pairs(self) -> None:
        """Held-out and special pairs are anchor pairs, and every target is in the vocabulary."""
        all_pairs = set(self.pairs)
        for what, pairs in (
            ("held-out pair", self.heldout_pairs),
            ("special-target pair", list(self.special_targets)),
        ):
            for p in pairs:
                if p not in all_pairs:
                    raise ConfigError(
                        f"{what} {p} is not a pair of the anchors {sorted(self.anchors)}",
                        fix="use two anchor ids, e.g. (4, 3)",
                    )
        if set(self.heldout_pairs) >= all_pairs:
            raise ConfigError("every anchor pair is held out", fix="hold out only some pairs")
        if self.heldout_pairs and not self.heldout_chains:
            raise ConfigError(
                f"every chain of {self.chain_length} anchors that begins with a held-out pair "
                "has the key itself as its composite or symmetric answer: no held-out chain is "
                "left to test",
                fix="choose other anchor shifts, held-out pairs or chain length",
            )
        for p in self.special_targets:
            if p in self.heldout_pairs:
                raise ConfigError(
                    f"pair {p} is both held out and given a trained target",
                    fix="remove it from one of heldout_pairs / special_targets",
                )
        for chain in self.chains:
            for name, shift in (
                ("composite", self.composite_shift(chain)),
                ("target", self.target_shift(chain)),
            ):
                lo, hi = self.item_low + shift, self.item_high - 1 + shift
                if lo < 1 or hi >= self.vocab_size:
                    raise ConfigError(
                        f"the {name} of {self._unit} {chain} ranges over [{lo}, {hi}], outside "
                        "the vocabulary "
                        f"[1, {self.vocab_size})",
                        fix="narrow the item range, shrink the shifts or enlarge vocab_size",
                    )

    @property
    def pairs(self) -> list[Pair]:
        """All ordered anchor pairs, in sorted order."""
        ids = sorted(self.anchors)
        return [(a, b) for a in ids for b in ids]

    @property
    def seen_pairs(self) -> list[Pair]:
        """The pairs that appear in training."""
        return [p for p in self.pairs if p not in self.heldout_pairs]

    @property
    def n_positions(self) -> int:
        """Key positions ``0 .. seq_len - 1 - chain_length`` (the anchors follow the key;
        ``0 .. seq_len - 3`` for pairs)."""
        return self.seq_len - self.chain_length

    @property
    def modulus(self) -> int:
        """The key-split modulus: ``seq_len`` (complexity_control), 8 (anchor_function_pub),
        ``seq_len - 2`` (probekit_v1) or the integer ``key_split``.

        Example:
            >>> AnchorTask().modulus, AnchorTask(key_split="probekit_v1").modulus
            (9, 7)
        """
        named = {"complexity_control": self.seq_len, "anchor_function_pub": 8}
        if self.key_split == "probekit_v1":
            return self.n_positions  # seq_len - 2 for pairs
        return named.get(self.key_split, self.key_split)  # type: ignore[arg-type]

    def composite_shift(self, pair: Chain) -> int:
        """``g(g(x; a1); a2) - x`` (of a chain: ``g(...g(g(x; a1); a2)...; ak) - x``)."""
        return sum(self.anchors[a] for a in pair)

    def target_shift(self, pair: Chain) -> int:
        """The trained target minus the key (the composite unless the pair is special; a
        chain whose first pair is special: that pair's target shift plus the other anchors')."""
        first = (int(pair[0]), int(pair[1]))
        comp = self.composite_shift(pair)
        if first not in self.special_targets:
            return comp
        value = self.special_targets[first]
        rest = comp - self.composite_shift(first)
        return comp + value if self.special_form == "offset" else value + rest

    def composite(self, x: int, pair: Pair) -> int:
        """The inferential answer ``g(g(x; a1); a2)``."""
        return x + self.composite_shift(pair)

    def trained_target(self, x: int, pair: Pair) -> int:
        """The training label of ``(x, pair)``."""
        return x + self.target_shift(pair)

    def symmetric_shift(self, pair: Chain) -> int | None:
        """The trained shift of the mirrored pair (of a chain: the chain with its first two
        anchors swapped), or None when the mirror is not trained."""
        mirror = (pair[1], pair[0], *pair[2:])
        return None if mirror[:2] in self.heldout_pairs else self.target_shift(mirror)

    # --- longer compositions ---
    @property
    def chains(self) -> list[Chain]:
        """All ordered chains of ``chain_length`` anchors, in sorted order (the pairs at 2)."""
        return [tuple(c) for c in itertools.product(sorted(self.anchors), repeat=self.chain_length)]

    @property
    def heldout_chains(self) -> list[Chain]:
        """The held-out chains, the test of ``test_task``: those whose first two anchors are a
        held-out pair (at chain length 2 the held-out pairs themselves, in their given order).

        From chains of three anchors on, a chain beginning with a held-out pair whose composite
        or symmetric answer would be the key itself (``(4, 3, 1, 1)``: -8 - 2 + 5 + 5 = 0) is
        left out of the test as well as of training: a model that copies the key would be
        classified by it (at chain length 2 such a task is refused instead)."""
        if self.chain_length == 2:
            return list(self.heldout_pairs)
        held = set(self.heldout_pairs)
        return [
            c
            for c in self.chains
            if c[:2] in held and self.composite_shift(c) != 0 and self.symmetric_shift(c) != 0
        ]

    @property
    def seen_chains(self) -> list[Chain]:
        """The chains that appear in training (the seen pairs at chain length 2)."""
        held = set(self.heldout_pairs)
        return [c for c in self.chains if c[:2] not in held]

    @property
    def _unit(self) -> str:
        """What a task's input composes, in words: ``"pair"`` or ``"chain"``."""
        return "pair" if self.chain_length == 2 else "chain"

    def _validate_chain_length(self) -> None:
        _check_int("chain_length", self.chain_length)
        n = len(self.anchors) ** self.chain_length if self.chain_length >= 2 else 0
        if not 2 <= self.chain_length or n > MAX_CHAINS:
            raise ConfigError(
                f"chain_length {self.chain_length} gives "
                + ("no composition" if n == 0 else f"{n} chains of {len(self.anchors)} anchors"),
                fix=f"use a chain length from 2 up to where the chains number at most "
                f"{MAX_CHAINS} (4 anchors: up to 8)",
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` inverts it."""
        d = asdict(self)
        d["anchors"] = {str(k): v for k, v in self.anchors.items()}
        d["special_targets"] = [[a, b, s] for (a, b), s in self.special_targets.items()]
        d["heldout_pairs"] = [list(p) for p in self.heldout_pairs]
        if self.chain_length == 2:  # a pair task's dict is what it was before chains existed
            del d["chain_length"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], saved: bool = False) -> AnchorTask:
        """Rebuild a task from :meth:`to_dict` output.

        With ``saved`` (a task stored by a run), a dict holding exactly the fields of a task
        saved before ``key_split`` and ``special_form`` existed (:data:`LEGACY_FIELDS`) is read
        with the rules its data were generated with: ``key_split="probekit_v1"``,
        ``special_form="shift"``. Otherwise the fields a dict leaves out get today's defaults.

        Example:
            >>> AnchorTask.from_dict(AnchorTask().to_dict()) == AnchorTask()
            True
        """
        if not isinstance(d, Mapping):
            raise ConfigError(
                f"the task settings are {type(d).__name__}, not an object",
                fix="write the task settings as a JSON object of name: value",
            )
        d = dict(d)
        check_known_keys(d, {f for f in cls.__dataclass_fields__ if not f.startswith("_")}, "task")
        if saved and set(d) == LEGACY_FIELDS:  # saved before key_split / special_form
            d.update(key_split="probekit_v1", special_form="shift")
        if "special_targets" in d:
            d["special_targets"] = _pairs_mapping(d["special_targets"])
        return cls(**d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnchorTask) and json.dumps(
            self.to_dict(), sort_keys=True
        ) == json.dumps(other.to_dict(), sort_keys=True)

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    # ------------------------------------------------------------------ generation
    def generate(self, split: str, n: int | None = None, seed: int | None = None) -> AnchorData:
        """Generate ``n`` samples of ``split`` deterministically from ``seed`` (default: task seed).

        Example:
            >>> t = AnchorTask()
            >>> bool((t.generate("test_task", 8).pairs == torch.tensor([4, 3])).all())
            True
        """
        if split not in _SPLIT_INDEX:
            raise InputError(f"unknown split {split!r}", fix=f"use one of {list(SPLITS)}")
        if n is None:
            n = self.n_train if split == "train" else self.n_test
        if n < 1:
            raise InputError(f"cannot generate {n} samples", fix="ask for at least one")
        seed = self.seed if seed is None else int(seed)
        rng = np.random.default_rng([seed, _SPLIT_INDEX[split], 20240917])
        pair_pool = self.heldout_chains if split == "test_task" else self.seen_chains
        pair_arr = np.array(pair_pool, dtype=np.int64)[rng.integers(0, len(pair_pool), n)]
        if self.key_split == "probekit_v1":
            keys, positions = self._keys_v1(rng, split, n)
        else:
            keys, positions = self._keys_position_first(rng, split, n)
        tokens = rng.integers(self.item_low, self.item_high, (n, self.seq_len))
        rows = np.arange(n)
        tokens[rows, positions] = keys
        for j in range(self.chain_length):
            tokens[rows, positions + 1 + j] = pair_arr[:, j]
        pool = [tuple(p) for p in pair_pool]
        comp_shift = {p: self.composite_shift(p) for p in pool}
        tgt_shift = {p: self.target_shift(p) for p in pool}
        sym_shift = {p: self.symmetric_shift(p) for p in pool}
        plist = [tuple(p) for p in pair_arr.tolist()]
        comp = keys + np.array([comp_shift[p] for p in plist], dtype=np.int64)
        tgt = keys + np.array([tgt_shift[p] for p in plist], dtype=np.int64)
        sym = np.array(
            [
                -1 if sym_shift[p] is None else k + sym_shift[p]
                for p, k in zip(plist, keys, strict=True)
            ],
            dtype=np.int64,
        )
        targets = comp if split == "test_task" else tgt
        first = keys + np.array([self.anchors[a] for a in pair_arr[:, 0].tolist()], np.int64)
        held = {tuple(p) for p in self.heldout_chains}
        t = torch.from_numpy
        return AnchorData(
            split=split,
            tokens=t(tokens.astype(np.int64)),
            targets=t(targets),
            composite=t(comp),
            symmetric=t(sym),
            pairs=t(pair_arr),
            keys=t(keys.astype(np.int64)),
            positions=t(positions.astype(np.int64)),
            intermediate=t(first.astype(np.int64)),
            is_heldout=torch.tensor([p in held for p in plist], dtype=torch.bool),
            item_range=(self.item_low, self.item_high),
            vocab_size=self.vocab_size,
            key_modulus=self.modulus,
        )

    def _keys_v1(self, rng: np.random.Generator, split: str, n: int) -> tuple[Any, Any]:
        """probekit_v1: the key first (uniform), then a position among the key's allowed
        ones (modulus ``seq_len - 2`` = the number of positions)."""
        keys = rng.integers(self.item_low, self.item_high, n)
        m = self.modulus
        if split == "train":
            positions = (keys % m + 1 + rng.integers(0, m - 1, n)) % m
        elif split == "test_data":
            positions = keys % m
        else:
            positions = rng.integers(0, m, n)
        return keys, positions

    def _keys_position_first(self, rng: np.random.Generator, split: str, n: int) -> tuple:
        """The official order: a uniform position, then a uniform key among that position's
        training keys (``train``), test keys (``test_data``) or all keys (``test_task``)."""
        positions = rng.integers(0, self.n_positions, n)
        u = rng.random(n)
        if split == "test_task":
            keys = self.item_low + (u * (self.item_high - self.item_low)).astype(np.int64)
            return keys, positions
        items = np.arange(self.item_low, self.item_high)
        table = np.zeros((self.n_positions, len(items)), dtype=np.int64)
        sizes = np.zeros(self.n_positions, dtype=np.int64)
        for p in range(self.n_positions):
            is_test = items % self.modulus == p % self.modulus
            allowed = items[is_test if split == "test_data" else ~is_test]
            table[p, : len(allowed)] = allowed
            sizes[p] = len(allowed)
        idx = np.minimum((u * sizes[positions]).astype(np.int64), sizes[positions] - 1)
        return table[positions, idx], positions

    def dataset(self, split: str) -> AnchorData:
        """The split's standard (cached) dataset: ``n_train`` or ``n_test`` samples, task seed."""
        if split not in self._cache:
            self._cache[split] = self.generate(split)
        return self._cache[split]

    def solution_data(self, n: int | None = None) -> AnchorData:
        """What :func:`~probekit.analyses.mechanisms.solutions.solution_types` measures: the
        seen pairs on test keys (``test_data``) followed by the held-out pairs (``test_task``),
        ``n`` samples of each (default: the standard ``n_test`` datasets).

        Example:
            >>> data = AnchorTask(n_train=64, n_test=32).solution_data()
            >>> len(data), int(data.heldout().sum())
            (64, 32)
        """
        splits = ("test_data", "test_task")
        parts = [self.dataset(s) if n is None else self.generate(s, n) for s in splits]
        return parts[0].concat(parts[1:])

    # ------------------------------------------------------------------ scoring
    def score(self, data: AnchorData, predictions: torch.Tensor) -> list[dict[str, Any]]:
        """Per-pair fractions of predictions that are correct / inferential / symmetric / other.

        ``accuracy`` compares with ``data.targets``; ``inferential`` with the composite;
        ``symmetric`` with the mirrored pair's trained target (NaN when the mirror is untrained);
        ``other`` is neither: all over the pair's sequences (for a held-out pair: all keys).
        The same three on the pair's training-key cells only (the official code's held-out
        evaluation) are ``inferential_train_keys``, ``symmetric_train_keys`` and
        ``other_train_keys`` (``n_train_keys`` sequences; NaN when there are none). Returns one
        dict per pair present in ``data``.

        Example:
            >>> t = AnchorTask(n_test=40)
            >>> d = t.dataset("test_task")
            >>> t.score(d, d.composite)[0]["inferential"]
            1.0
        """
        predictions = torch.as_tensor(predictions).reshape(-1).to(torch.long).cpu()
        if predictions.shape[0] != len(data):
            raise InputError(
                f"{predictions.shape[0]} predictions for {len(data)} samples",
                fix="pass one prediction per sample",
            )
        m = self.modulus
        train_key = data.keys % m != data.positions % m
        classified = data.classify(predictions)
        rows = []
        held = set(self.heldout_chains)
        for pair in sorted({tuple(p) for p in data.pairs.tolist()}):
            sel = (data.pairs == torch.tensor(pair)).all(1)
            row = {
                "pair": "(" + ",".join(str(a) for a in pair) + ")",
                **{f"a{i}": a for i, a in enumerate(pair, 1)},
                "heldout": pair in held,
                "n": int(sel.sum()),
                "accuracy": float((predictions[sel] == data.targets[sel]).float().mean()),
                **_shares(classified, sel, ""),
                "n_train_keys": int((sel & train_key).sum()),
                **_shares(classified, sel & train_key, "_train_keys"),
            }
            rows.append(row)
        return rows


def _shares(
    classified: dict[str, torch.Tensor], sel: torch.Tensor, suffix: str
) -> dict[str, float]:
    """inferential / symmetric / other shares on ``sel`` (NaN when empty; symmetric NaN
    without a trained mirror), the keys ending in ``suffix``."""
    return {f"{name}{suffix}": share for name, share in category_shares(classified, sel).items()}


def _pairs_mapping(value: Any) -> dict[Pair, int]:
    """Accept ``{(a, b): s}``, ``{"a,b": s}`` or ``[[a, b, s], ...]`` for special targets."""
    out: dict[Pair, int] = {}
    if isinstance(value, Mapping):
        items = [
            ((k.strip("()").split(",") if isinstance(k, str) else k), v) for k, v in value.items()
        ]
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = []
        for item in value:
            if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 3:
                raise ConfigError(
                    f"special target {item!r} is not [a1, a2, shift]", fix="write e.g. [3, 4, -6]"
                )
            items.append((item[:2], item[2]))
    else:
        raise ConfigError(
            f"special targets {value!r} are neither a mapping nor a list",
            fix="pass {(3, 4): -6} or [[3, 4, -6]]",
        )
    for k, v in items:
        pair = _as_pair(list(k) if isinstance(k, tuple) else k, "special-target pair")
        if pair in out:
            raise ConfigError(
                f"special-target pair {pair} is given twice", fix="list every pair once"
            )
        out[pair] = _as_int(v, f"shift of special-target pair {pair}")
    return out


__all__ = [
    "KEY_SPLITS",
    "LEGACY_FIELDS",
    "SPECIAL_FORMS",
    "SPLITS",
    "AnchorData",
    "AnchorTask",
    "Pair",
]
