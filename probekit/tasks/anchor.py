"""The anchor-function compositional task (Zhang et al., NeurIPS 2024 / TPAMI 2025).

An input is ``seq_len`` tokens of noise drawn from the item range, with a key ``x`` at position
``p`` and an anchor pair ``(a1, a2)`` at ``p + 1, p + 2``. The target (the next token) is the
composite ``g(g(x; a1); a2)`` where each anchor shifts the key (default 1:+5, 2:+1, 3:-2, 4:-8).
Some pairs are trained on a *non-inferential* target (default ``(3, 4) -> x - 6`` instead of the
composite ``x - 10``) and some pairs are never trained (default ``(4, 3)``). On a held-out pair a
model can answer with the composite (the *inferential* solution), with the trained target of the
mirrored pair (the *symmetric* solution), or with something else.

Keys are also split: a training sequence has ``x mod (seq_len - 2) != p``, a test sequence
``x mod (seq_len - 2) == p``.

Splits:
    ``train``      seen pairs, training keys (the trained target).
    ``test_data``  seen pairs, test keys ("generalization on data").
    ``test_task``  held-out pairs, all keys ("generalization on task").

Example:
    >>> task = AnchorTask(n_train=100, n_test=50)
    >>> data = task.dataset("train")
    >>> data.tokens.shape
    torch.Size([100, 9])
    >>> int(data.targets[0]) == task.trained_target(int(data.keys[0]), data.pair(0))
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from probekit.errors import ConfigError, InputError, check_known_keys

Pair = tuple[int, int]

SPLITS: tuple[str, ...] = ("train", "test_data", "test_task")
_SPLIT_INDEX = {name: i for i, name in enumerate(SPLITS)}


ROLE_OFFSETS = {"key": 0, "anchor1": 1, "anchor2": 2}
"""Position of each role relative to the key."""


@dataclass
class AnchorData:
    """One split of the task: token ids and the bookkeeping needed to score predictions.

    ``tokens`` is ``[n, seq_len]`` (long), ``targets`` the label the split is scored against (the
    trained target for seen pairs, the composite for held-out pairs), ``composite`` the composite
    ``g(g(x; a1); a2)``, ``symmetric`` the trained target of the mirrored pair (``-1`` where the
    mirrored pair is not trained), ``pairs`` ``[n, 2]``, ``keys`` and ``positions`` ``[n]``,
    ``intermediate`` the first step ``g(x; a1)`` and ``is_heldout`` ``[n]`` bool. ``item_range``
    is the task's ``(item_low, item_high)``, ``vocab_size`` the task's vocabulary (the model
    that reads the data must have it).

    It implements :class:`probekit.data.TaskData`, the protocol task-aware analyzers ask.
    """

    split: str
    tokens: torch.Tensor
    targets: torch.Tensor
    composite: torch.Tensor
    symmetric: torch.Tensor
    pairs: torch.Tensor
    keys: torch.Tensor
    positions: torch.Tensor
    intermediate: torch.Tensor
    is_heldout: torch.Tensor
    item_range: tuple[int, int] = (20, 100)
    vocab_size: int | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def pair(self, i: int) -> Pair:
        """The anchor pair of sample ``i`` as a tuple."""
        a1, a2 = self.pairs[i].tolist()
        return (int(a1), int(a2))

    # ---- the TaskData protocol ------------------------------------------------------------
    @property
    def resample_range(self) -> tuple[int, int]:
        """Token ids a resampled position draws from: the item range."""
        return self.item_range

    def groups(self) -> list[str]:
        """The anchor pair of every sequence, as ``"(a1,a2)"``."""
        return [f"({a},{b})" for a, b in self.pairs.tolist()]

    def heldout(self) -> torch.Tensor:
        return self.is_heldout

    def answers(self) -> dict[str, torch.Tensor]:
        """``inferential`` (the composite) and ``symmetric`` (mirrored pair's trained target)."""
        return {"inferential": self.composite, "symmetric": self.symmetric}

    def roles(self) -> dict[str, torch.Tensor]:
        """Bool ``[n, seq_len]`` masks of the key, the two anchors and the noise positions."""
        n, t = self.tokens.shape
        at = torch.arange(t)[None]
        out = {role: at == (self.positions[:, None] + off) for role, off in ROLE_OFFSETS.items()}
        out["noise"] = ~(out["key"] | out["anchor1"] | out["anchor2"])
        return out

    def variables(self) -> dict[str, np.ndarray]:
        """key, a1, a2, g1 = g(key; a1) and the target of every sequence."""
        as_np = lambda t: t.numpy().astype(np.int64)  # noqa: E731
        return {
            "key": as_np(self.keys),
            "a1": as_np(self.pairs[:, 0]),
            "a2": as_np(self.pairs[:, 1]),
            "g1": as_np(self.intermediate),
            "target": as_np(self.targets),
        }

    def mirror_groups(self) -> list[tuple[str, str]]:
        """Each held-out pair with its mirror, where both are present."""
        present = set(self.groups())
        out = []
        for a, b in sorted({tuple(p) for p in self.pairs[self.is_heldout].tolist()}):
            held, mirror = f"({a},{b})", f"({b},{a})"
            if mirror in present and mirror != held:
                out.append((held, mirror))
        return out

    def concat(self, others: Sequence[AnchorData]) -> AnchorData:
        """One data set of this split followed by ``others`` (e.g. seen and held-out pairs)."""
        parts = [self, *others]
        fields = (
            "tokens",
            "targets",
            "composite",
            "symmetric",
            "pairs",
            "keys",
            "positions",
            "intermediate",
            "is_heldout",
        )
        return AnchorData(
            "+".join(d.split for d in parts),
            *(torch.cat([getattr(d, f) for d in parts]) for f in fields),
            item_range=self.item_range,
            vocab_size=self.vocab_size,
        )


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

    Example:
        >>> task = AnchorTask(anchors={1: 5, 2: 1, 3: -2, 4: -8}, heldout_pairs=[(4, 3)])
        >>> task.composite(50, (4, 3)), task.trained_target(50, (3, 4))
        (40, 44)
    """

    anchors: dict[int, int] = field(default_factory=lambda: {1: 5, 2: 1, 3: -2, 4: -8})
    item_low: int = 20
    item_high: int = 100
    seq_len: int = 9
    vocab_size: int = 201
    special_targets: dict[Pair, int] = field(default_factory=lambda: {(3, 4): -6})
    heldout_pairs: list[Pair] = field(default_factory=lambda: [(4, 3)])
    n_train: int = 20000
    n_test: int = 2000
    seed: int = 0

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
        if self.seq_len < 4:
            raise ConfigError(
                f"seq_len {self.seq_len} is too short: a key, two anchors and at least two key "
                "positions are needed",
                fix="use seq_len >= 4 (default 9)",
            )
        self._validate_pairs()
        if self.n_train < 1 or self.n_test < 1:
            raise ConfigError("n_train and n_test must be positive", fix="use e.g. 20000 / 2000")

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
        for p in self.special_targets:
            if p in self.heldout_pairs:
                raise ConfigError(
                    f"pair {p} is both held out and given a trained target",
                    fix="remove it from one of heldout_pairs / special_targets",
                )
        for p in self.pairs:
            for name, shift in (
                ("composite", self.composite_shift(p)),
                ("target", self.target_shift(p)),
            ):
                lo, hi = self.item_low + shift, self.item_high - 1 + shift
                if lo < 1 or hi >= self.vocab_size:
                    raise ConfigError(
                        f"the {name} of pair {p} ranges over [{lo}, {hi}], outside the vocabulary "
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
    def modulus(self) -> int:
        """The key-split modulus ``seq_len - 2``."""
        return self.seq_len - 2

    def composite_shift(self, pair: Pair) -> int:
        """``g(g(x; a1); a2) - x``."""
        return self.anchors[pair[0]] + self.anchors[pair[1]]

    def target_shift(self, pair: Pair) -> int:
        """The trained target minus the key (the composite unless the pair is special)."""
        return self.special_targets.get(tuple(pair), self.composite_shift(pair))

    def composite(self, x: int, pair: Pair) -> int:
        """The inferential answer ``g(g(x; a1); a2)``."""
        return x + self.composite_shift(pair)

    def trained_target(self, x: int, pair: Pair) -> int:
        """The training label of ``(x, pair)``."""
        return x + self.target_shift(pair)

    def symmetric_shift(self, pair: Pair) -> int | None:
        """The trained shift of the mirrored pair, or None when the mirror is not trained."""
        mirror = (pair[1], pair[0])
        return None if mirror in self.heldout_pairs else self.target_shift(mirror)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` inverts it."""
        d = asdict(self)
        d["anchors"] = {str(k): v for k, v in self.anchors.items()}
        d["special_targets"] = [[a, b, s] for (a, b), s in self.special_targets.items()]
        d["heldout_pairs"] = [list(p) for p in self.heldout_pairs]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AnchorTask:
        """Rebuild a task from :meth:`to_dict` output.

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
        pair_pool = self.heldout_pairs if split == "test_task" else self.seen_pairs
        pair_arr = np.array(pair_pool, dtype=np.int64)[rng.integers(0, len(pair_pool), n)]
        keys = rng.integers(self.item_low, self.item_high, n)
        m = self.modulus
        if split == "train":
            positions = (keys % m + 1 + rng.integers(0, m - 1, n)) % m
        elif split == "test_data":
            positions = keys % m
        else:
            positions = rng.integers(0, m, n)
        tokens = rng.integers(self.item_low, self.item_high, (n, self.seq_len))
        rows = np.arange(n)
        tokens[rows, positions] = keys
        tokens[rows, positions + 1] = pair_arr[:, 0]
        tokens[rows, positions + 2] = pair_arr[:, 1]
        comp_shift = {p: self.composite_shift(p) for p in self.pairs}
        tgt_shift = {p: self.target_shift(p) for p in self.pairs}
        sym_shift = {p: self.symmetric_shift(p) for p in self.pairs}
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
        held = {tuple(p) for p in self.heldout_pairs}
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
        )

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
        ``other`` is neither. Returns one dict per pair present in ``data``.

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
        rows = []
        for pair in sorted({tuple(p) for p in data.pairs.tolist()}):
            sel = (data.pairs[:, 0] == pair[0]) & (data.pairs[:, 1] == pair[1])
            pred = predictions[sel]
            inferential = pred == data.composite[sel]
            has_sym = self.symmetric_shift(pair) is not None
            symmetric = pred == data.symmetric[sel]
            other = ~(inferential | symmetric) if has_sym else ~inferential
            rows.append(
                {
                    "pair": f"({pair[0]},{pair[1]})",
                    "a1": pair[0],
                    "a2": pair[1],
                    "heldout": pair in self.heldout_pairs,
                    "n": int(sel.sum()),
                    "accuracy": float((pred == data.targets[sel]).float().mean()),
                    "inferential": float(inferential.float().mean()),
                    "symmetric": float(symmetric.float().mean()) if has_sym else float("nan"),
                    "other": float(other.float().mean()),
                }
            )
        return rows


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
