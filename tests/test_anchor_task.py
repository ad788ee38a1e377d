"""Tests of the anchor-function task: layout, targets, splits, determinism, validation."""

from __future__ import annotations

import pytest
import torch

from probekit.anchor import SPLITS, AnchorTask
from probekit.errors import ConfigError, InputError, ProbekitError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def task() -> AnchorTask:
    return AnchorTask(n_train=3000, n_test=600, seed=3)


def _check_layout(task: AnchorTask, split: str) -> None:
    d = task.dataset(split)
    n = len(d)
    rows = torch.arange(n)
    assert d.tokens.shape == (n, task.seq_len)
    assert d.tokens.dtype == torch.long
    # key and anchors where the bookkeeping says they are
    assert torch.equal(d.tokens[rows, d.positions], d.keys)
    assert torch.equal(d.tokens[rows, d.positions + 1], d.pairs[:, 0])
    assert torch.equal(d.tokens[rows, d.positions + 2], d.pairs[:, 1])
    assert int(d.positions.min()) >= 0 and int(d.positions.max()) <= task.seq_len - 3
    # everything else is noise from the item range, never padding or an anchor
    mask = torch.ones_like(d.tokens, dtype=torch.bool)
    mask[rows, d.positions + 1] = False
    mask[rows, d.positions + 2] = False
    noise = d.tokens[mask]
    assert int(noise.min()) >= task.item_low and int(noise.max()) < task.item_high


@pytest.mark.parametrize("split", SPLITS)
def test_layout(task: AnchorTask, split: str) -> None:
    _check_layout(task, split)


def test_targets_follow_the_anchor_operations(task: AnchorTask) -> None:
    shifts = {1: 5, 2: 1, 3: -2, 4: -8}
    for split in SPLITS:
        d = task.dataset(split)
        for i in range(0, len(d), 37):
            x, (a1, a2) = int(d.keys[i]), d.pair(i)
            composite = x + shifts[a1] + shifts[a2]
            assert int(d.composite[i]) == composite
            expected = x - 6 if (a1, a2) == (3, 4) else composite
            if split == "test_task":
                expected = composite  # held-out pairs are scored against the composite
            assert int(d.targets[i]) == expected
            mirror = (a2, a1)
            if mirror == (4, 3):
                assert int(d.symmetric[i]) == -1
            else:
                mirror_target = x - 6 if mirror == (3, 4) else x + shifts[a2] + shifts[a1]
                assert int(d.symmetric[i]) == mirror_target


def test_pairs_per_split(task: AnchorTask) -> None:
    train_pairs = {tuple(p) for p in task.dataset("train").pairs.tolist()}
    assert train_pairs == set(task.seen_pairs)
    assert len(train_pairs) == 15 and (4, 3) not in train_pairs
    assert {tuple(p) for p in task.dataset("test_data").pairs.tolist()} <= set(task.seen_pairs)
    assert {tuple(p) for p in task.dataset("test_task").pairs.tolist()} == {(4, 3)}


@pytest.mark.parametrize(
    "split, modulus",
    [("complexity_control", 9), ("anchor_function_pub", 8), ("probekit_v1", 7), (5, 5)],
)
def test_key_split(split: str | int, modulus: int) -> None:
    task = AnchorTask(n_train=3000, n_test=600, seed=3, key_split=split)
    assert task.modulus == modulus
    tr, te = task.dataset("train"), task.dataset("test_data")
    held = task.dataset("test_task")
    assert bool((tr.keys % modulus != tr.positions % modulus).all())
    assert bool((te.keys % modulus == te.positions % modulus).all())
    assert torch.equal(tr.on_training_keys(), torch.ones(len(tr), dtype=torch.bool))
    assert not bool(te.on_training_keys().any())
    # training and test keys use every position; held-out pairs get both kinds of cells
    assert set(tr.positions.tolist()) == set(te.positions.tolist()) == set(range(7))
    assert 0 < int(held.on_training_keys().sum()) < len(held)
    # the official rule: the keys 7 and 8 mod 9 are never test keys (positions are 0..6)
    if split == "complexity_control":
        assert not bool(((te.keys % 9) >= 7).any())


def test_legacy_task_dicts_keep_their_rules() -> None:
    """A task saved before key_split / special_form existed reads with the old rules."""
    old = {
        k: v
        for k, v in AnchorTask(n_train=50, n_test=20).to_dict().items()
        if k not in ("key_split", "special_form")
    }
    old["special_targets"] = [[3, 4, -6]]
    t = AnchorTask.from_dict(old, saved=True)
    assert (t.key_split, t.special_form, t.modulus) == ("probekit_v1", "shift", 7)
    # the same fields given by hand (the CLI's flags) are a new task: offsets, official split
    assert AnchorTask.from_dict({**old, "special_targets": [[3, 4, 4]]}).modulus == 9
    assert t.trained_target(50, (3, 4)) == 44
    # a partial dict is a new configuration: today's defaults
    assert AnchorTask.from_dict({"n_train": 50, "n_test": 20}).key_split == "complexity_control"


def test_offset_and_shift_forms_give_the_same_data() -> None:
    a = AnchorTask(n_train=400, n_test=100, special_targets={(3, 4): 4})
    b = AnchorTask(n_train=400, n_test=100, special_targets={(3, 4): -6}, special_form="shift")
    for split in SPLITS:
        da, db = a.dataset(split), b.dataset(split)
        for f in ("tokens", "targets", "composite", "symmetric"):
            assert torch.equal(getattr(da, f), getattr(db, f))


def test_heldout_scored_on_all_keys_and_training_key_cells(task: AnchorTask) -> None:
    d = task.dataset("test_task")
    pred = d.composite.clone()
    pred[~d.on_training_keys()] = 0  # right only on the training-key cells
    row = task.score(d, pred)[0]
    on_train = d.on_training_keys().float().mean()
    assert row["inferential_train_keys"] == 1.0
    assert row["inferential"] == pytest.approx(float(on_train))
    assert row["n_train_keys"] == int(d.on_training_keys().sum())


def test_deterministic_from_seed() -> None:
    a = AnchorTask(n_train=200, n_test=50, seed=1)
    b = AnchorTask(n_train=200, n_test=50, seed=1)
    c = AnchorTask(n_train=200, n_test=50, seed=2)
    for split in SPLITS:
        assert torch.equal(a.dataset(split).tokens, b.dataset(split).tokens)
        assert not torch.equal(a.dataset(split).tokens, c.dataset(split).tokens)
    # splits are not copies of each other
    assert not torch.equal(a.dataset("train").tokens[:50], a.dataset("test_data").tokens)


def test_round_trip_and_custom_task() -> None:
    t = AnchorTask(
        anchors={1: 3, 2: -1, 5: 2},
        special_targets={(1, 2): 7},
        heldout_pairs=[(2, 1), (5, 5)],
        seq_len=7,
        n_train=100,
        n_test=30,
        special_form="shift",
        key_split="probekit_v1",
    )
    assert AnchorTask.from_dict(t.to_dict()) == t
    assert len(t.pairs) == 9 and len(t.seen_pairs) == 7
    d = t.dataset("train")
    sel = (d.pairs[:, 0] == 1) & (d.pairs[:, 1] == 2)
    assert bool((d.targets[sel] == d.keys[sel] + 7).all())
    assert bool((d.keys % 5 != d.positions).all())
    assert {tuple(p) for p in t.dataset("test_task").pairs.tolist()} == {(2, 1), (5, 5)}


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"anchors": {1: 5, 25: 1}}, "inside the item range"),
        ({"anchors": {0: 5, 2: 1}}, "outside [1, 201)"),
        ({"heldout_pairs": [(4, 9)]}, "not a pair of the anchors"),
        ({"heldout_pairs": [(4, 3, 1)]}, "not 2"),
        ({"heldout_pairs": ["ab"]}, "not a pair"),
        ({"vocab_size": 105}, "outside the vocabulary"),
        ({"item_low": 5}, "outside the vocabulary"),
        ({"seq_len": 3}, "too short"),
        ({"item_low": 100, "item_high": 50}, "item range"),
        ({"special_targets": {(3, 4): 200}}, "outside the vocabulary"),
        ({"heldout_pairs": [(3, 4)]}, "both held out"),
        ({"n_train": 0}, "positive"),
        ({"key_split": "mod7"}, "unknown key_split"),
        ({"key_split": 1}, "modulus 1 < 2"),
        ({"key_split": 200}, "no test key"),
        ({"special_form": "absolute"}, "special_form"),
        # degenerate: the answers could not be told apart
        ({"special_targets": {(3, 4): 0}}, "equals its composite"),
        ({"special_targets": {(3, 4): -10}, "special_form": "shift"}, "equals its composite"),
        ({"special_targets": {}}, "would be the same answer"),
        ({"heldout_pairs": [(2, 1)]}, "(2, 1)"),
        (
            {"anchors": {1: 5, 2: -5}, "special_targets": {(1, 2): 3}, "heldout_pairs": [(2, 1)]},
            "the key itself",
        ),
        ({"special_targets": {(3, 4): 10}}, "the key itself"),
    ],
)
def test_invalid_configurations(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        AnchorTask(**kwargs)
    assert needle in str(info.value)
    assert "Fix:" in str(info.value)


def test_bad_generate_arguments() -> None:
    t = AnchorTask(n_train=10, n_test=10)
    with pytest.raises(InputError):
        t.generate("validation")
    with pytest.raises(InputError):
        t.generate("train", n=0)
    with pytest.raises(ProbekitError):
        AnchorTask.from_dict({"anchors": {1: 2}, "colour": "red"})


def test_score_fractions(task: AnchorTask) -> None:
    d = task.dataset("test_task")
    inf = task.score(d, d.composite)[0]
    assert (inf["pair"], inf["inferential"], inf["symmetric"], inf["other"]) == ("(4,3)", 1, 0, 0)
    sym = task.score(d, d.symmetric)[0]
    assert (sym["inferential"], sym["symmetric"], sym["other"], sym["accuracy"]) == (0, 1, 0, 0)
    half = d.composite.clone()
    half[::2] = 0
    mixed = task.score(d, half)[0]
    assert mixed["inferential"] == pytest.approx(0.5, abs=0.01)
    assert mixed["other"] == pytest.approx(0.5, abs=0.01)
    seen = task.score(task.dataset("test_data"), task.dataset("test_data").targets)
    assert len(seen) == 15 and all(r["accuracy"] == 1.0 for r in seen)
    with pytest.raises(InputError):
        task.score(d, d.composite[:-1])


def test_unknown_settings_are_named():
    import pytest

    from probekit.anchor import AnchorTask, TrainConfig
    from probekit.errors import ConfigError
    from probekit.training.models import ModelConfig

    with pytest.raises(ConfigError, match=r"unknown task settings \['bogus'\]"):
        AnchorTask.from_dict({**AnchorTask().to_dict(), "bogus": 1})
    with pytest.raises(ConfigError, match=r"unknown model settings \['depth'\]"):
        ModelConfig.from_dict({"depth": 3})
    with pytest.raises(ConfigError, match=r"unknown training settings \['epochs'\]"):
        TrainConfig.from_dict({"epochs": 3})
