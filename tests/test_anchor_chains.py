"""Longer compositions: the anchor task over chains of k anchors (``chain_length``). At k = 2 it
is the pair task, its data bit-identical to what probekit generated before chains existed."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest
import torch

from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.errors import ConfigError
from probekit.training.models import ModelConfig

FIELDS = ("tokens", "targets", "composite", "symmetric", "pairs", "keys", "positions",
          "intermediate", "is_heldout")  # fmt: skip

PAIR_DATA_SHA256 = "ac6159fe53640e69a2c6c0cca15e2a9112878702801467f4aaad82ec1533bb6f"
"""The data of the pair task below as generated before chains existed (probekit at the commit
that added chain_length, and the one before it, print the same hash)."""


def chain_task(k: int = 3, **kw) -> AnchorTask:
    """A task of chains of ``k`` anchors with an item range whose targets fit the vocabulary."""
    return AnchorTask(chain_length=k, item_low=40, item_high=120, **{"n_train": 3000,
                      "n_test": 600, **kw})  # fmt: skip


def test_pair_task_data_are_unchanged() -> None:
    digest = hashlib.sha256()
    for split_rule in ("complexity_control", "probekit_v1"):
        task = AnchorTask(n_train=300, n_test=100, key_split=split_rule, seed=7)
        for split in ("train", "test_data", "test_task"):
            data = task.dataset(split)
            for name in FIELDS:
                digest.update(getattr(data, name).numpy().tobytes())
    assert digest.hexdigest() == PAIR_DATA_SHA256
    assert "chain_length" not in AnchorTask().to_dict()  # saved pair tasks read as before
    assert AnchorTask(chain_length=2) == AnchorTask()


@pytest.mark.parametrize("k", [3, 4])
def test_chain_targets_and_layout(k: int) -> None:
    task = chain_task(k)
    shift = task.anchors
    for split in ("train", "test_data", "test_task"):
        data = task.dataset(split)
        assert data.pairs.shape == (len(data), k)
        assert bool((data.positions < task.seq_len - k).all())
        rows = torch.arange(len(data))
        assert bool((data.tokens[rows, data.positions] == data.keys).all())
        for j in range(k):
            assert bool((data.tokens[rows, data.positions + 1 + j] == data.pairs[:, j]).all())
        for i in range(len(data)):
            chain, key = data.pair(i), int(data.keys[i])
            composite = key + sum(shift[a] for a in chain)
            assert int(data.composite[i]) == composite
            special = task.special_targets.get(chain[:2], 0)  # the first pair's +4 offset
            trained = composite + special
            assert int(data.targets[i]) == (composite if split == "test_task" else trained)
            assert int(data.intermediate[i]) == key + shift[chain[0]]
        assert set(data.roles()) == {"key", "noise", *(f"anchor{j}" for j in range(1, k + 1))}


def test_heldout_chains_are_never_trained_though_each_pair_is() -> None:
    """A chain is held out when its first two anchors are a held-out pair: no training
    sequence begins with (4, 3), but (4, 3) is trained later in chains, as every pair is."""
    task = chain_task(3)
    assert task.heldout_chains == [(4, 3, a) for a in (1, 2, 3, 4)]
    # chains that would answer the key itself are left out of the test (and of training):
    # (4,3,1,1) by its composite -8-2+5+5, (4,3,1,2) and (4,3,2,1) by their symmetric answer
    four = chain_task(4)
    left_out = {(4, 3, 1, 1), (4, 3, 1, 2), (4, 3, 2, 1)}
    assert len(four.heldout_chains) == 13 and not left_out & set(four.heldout_chains)
    assert not left_out & set(four.seen_chains)
    assert len(task.seen_chains) == 60 and not set(task.seen_chains) & set(task.heldout_chains)
    train_chains = set()
    for split in ("train", "test_data"):
        chains = {tuple(c) for c in task.dataset(split).pairs.tolist()}
        assert not chains & set(task.heldout_chains)
        train_chains |= chains
    trained_pairs = {c[j : j + 2] for c in train_chains for j in range(2)}
    assert trained_pairs == set(itertools.product(range(1, 5), repeat=2))
    held = task.dataset("test_task")
    assert bool(held.is_heldout.all()) and set(held.groups()) == {f"(4,3,{a})" for a in range(1, 5)}
    # the symmetric answer: the trained target of the chain with its first pair swapped
    i = 0
    mirror = (3, 4, held.pair(i)[2])
    assert int(held.symmetric[i]) == task.trained_target(int(held.keys[i]), mirror)


def test_chain_scores_per_chain_and_key_split() -> None:
    task = chain_task(3)
    data = task.dataset("test_data")
    rows = task.score(data, data.targets)
    assert {r["pair"] for r in rows} == set(data.groups())
    assert all(r["accuracy"] == 1.0 and "a3" in r for r in rows)
    m = task.modulus
    assert bool((data.keys % m == data.positions % m).all())
    train_data = task.dataset("train")
    assert bool((train_data.keys % m != train_data.positions % m).all())


def test_bad_chains_are_refused() -> None:
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        AnchorTask(chain_length=3)  # the default item range: x - 24 drops below 1
    with pytest.raises(ConfigError, match="too short"):
        chain_task(4, seq_len=5)
    with pytest.raises(ConfigError, match="chain_length"):
        chain_task(1)
    with pytest.raises(ConfigError, match="chain_length"):
        chain_task(12)
    assert AnchorTask.from_dict(chain_task(4).to_dict()) == chain_task(4)


def test_chain_run_writes_per_chain_metrics(tmp_path: Path) -> None:
    task = chain_task(3, n_train=256, n_test=64)
    cfg = TrainConfig(model=ModelConfig(d_model=16, n_heads=2), task=task, steps=2,
                      batch_size=16, eval_every=2, device="cpu")  # fmt: skip
    out = train(cfg, tmp_path / "r", progress=False)
    accs = out.metrics["pair_acc"].iloc[-1]
    assert set(accs["test_task"]) <= {f"(4,3,{a})" for a in range(1, 5)}
    assert all(len(name.split(",")) == 3 for name in accs["train"])


@pytest.mark.slow
def test_a_tiny_chain_model_learns_the_seen_chains(tmp_path: Path) -> None:
    """About 30 s on one CPU thread: chance is 1 answer in the ~80 targets."""
    task = chain_task(3, n_train=8000, n_test=500)
    cfg = TrainConfig(
        model=ModelConfig(n_layers=2, d_model=48, n_heads=4, gamma=0.5),
        task=task,
        steps=600,
        batch_size=128,
        lr=5e-3,
        warmup_steps=30,
        eval_every=100,
        device="cpu",
    )
    final = train(cfg, tmp_path / "k3", progress=False).final
    assert final["train_acc"] > 0.3 and final["test_data_acc"] > 0.15
