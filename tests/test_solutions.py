"""Tests of the solution-type classifier (inferential / symmetric / memorizing / other)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import probekit
from probekit.analyses.mechanisms import solutions as sol
from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.errors import ConfigError, InputError
from probekit.result import Result
from probekit.run_folders import load_run
from probekit.training import ModelConfig

torch.set_num_threads(1)

TASK = AnchorTask(n_train=256, n_test=300, seed=11)


def _tiny_gpt2(vocab: int = 201):
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, vocab_size=vocab)
    return transformers.GPT2LMHeadModel(cfg.to_hf_config()).eval()


def _oracle(mode: str, task: AnchorTask):
    """Fake last-token logits that follow a rule: the classifier must recover the rule."""
    anchors = torch.tensor(sorted(task.anchors))
    shifts = task.anchors
    gen = torch.Generator().manual_seed(0)

    def logits(model, tokens: torch.Tensor) -> torch.Tensor:
        is_anchor = torch.isin(tokens, anchors)
        first = is_anchor.float().argmax(1)
        rows = torch.arange(tokens.shape[0])
        key, a1, a2 = tokens[rows, first - 1], tokens[rows, first], tokens[rows, first + 1]
        out = []
        for x, p, q in zip(key.tolist(), a1.tolist(), a2.tolist(), strict=False):
            pair = (p, q)
            if mode == "inferential":
                y = x + shifts[p] + shifts[q]
            elif mode == "symmetric":
                y = x + task.target_shift((q, p) if pair in task.heldout_pairs else pair)
            elif mode == "memorizing":
                y = int(torch.randint(20, 100, (1,), generator=gen))
            else:  # "offby2": held-out pair answers composite + 2 for a quarter of the keys
                y = (
                    x + task.target_shift(pair)
                    if pair not in task.heldout_pairs
                    else (x + shifts[p] + shifts[q] + 2 * (x % 4 == 0))
                )
            out.append(y)
        z = torch.full((tokens.shape[0], task.vocab_size), -5.0)
        z[rows, torch.tensor(out)] = 5.0
        return z

    return logits


@pytest.fixture(scope="module")
def handle():
    return probekit.load(_tiny_gpt2())


@pytest.mark.parametrize(
    "mode, solution",
    [
        ("inferential", "inferential"),
        ("symmetric", "symmetric"),
        ("memorizing", "memorizing"),
        ("offby2", "inferential"),
    ],
)
def test_classifier_recovers_the_rule(handle, monkeypatch, mode: str, solution: str) -> None:
    monkeypatch.setattr(sol, "last_token_logits", _oracle(mode, TASK))
    res = sol.solution_types(handle, TASK.solution_data())
    s = res.summary
    assert s["solution"] == solution
    assert s["memorizing"] == (mode == "memorizing")
    diffs = res.df[res.df["metric"] == "diff"]
    assert diffs["value"].sum() == pytest.approx(1.0)
    frac = res.fractions().set_index("pair")
    if mode == "inferential":
        assert s["heldout_inferential"] == 1.0 and s["heldout_symmetric"] == 0.0
        assert frac.loc["(3,4)", "accuracy"] == 0.0  # composite x-10, trained target x-6
        assert s["seen_test_accuracy"] == pytest.approx(
            1 - frac.loc["(3,4)", "n"] / 300 * 1, abs=0.2
        )
        assert diffs["diff"].tolist() == [0.0]
    if mode == "symmetric":
        assert s["heldout_symmetric"] == 1.0 and s["seen_test_accuracy"] == 1.0
        assert diffs["diff"].tolist() == [4.0]  # x-6 versus the composite x-10
        assert frac.loc["(4,3)", "symmetric"] == 1.0
    if mode == "memorizing":
        assert s["seen_test_accuracy"] < 0.1
    if mode == "offby2":
        assert s["heldout_inferential"] == pytest.approx(0.75, abs=0.1)
        assert s["heldout_other"] == pytest.approx(1 - s["heldout_inferential"])
        assert sorted(diffs["diff"].tolist()) == [0.0, 2.0]


def test_result_round_trip_and_figure(handle, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sol, "last_token_logits", _oracle("symmetric", TASK))
    res = sol.solution_types(handle, TASK.solution_data())
    path = res.save(tmp_path / "sol.json")
    back = Result.load(path)
    assert isinstance(back, sol.SolutionResult)
    assert back.summary == res.summary
    fig = back.figure()
    names = {t.name for t in fig.data}
    assert {"inferential", "symmetric", "other"} <= names
    sym = next(t for t in fig.data if t.name == "symmetric")
    assert max(sym.y) == 1.0


def test_matches_the_trainers_own_metrics_on_a_checkpoint(tmp_path: Path) -> None:
    cfg = TrainConfig(
        model=ModelConfig(n_layers=2, d_model=16, n_heads=2),
        task=TASK,
        steps=30,
        batch_size=64,
        lr=1e-2,
        warmup_steps=3,
        eval_every=30,
        device="cpu",
    )
    out = train(cfg, tmp_path / "run", progress=False)
    task = load_run(out.checkpoint).task  # task read from the checkpoint
    res = sol.solution_types(out.checkpoint, task.solution_data())
    final = out.final
    assert res.summary["heldout_inferential"] == pytest.approx(final["test_task_inferential"])
    assert res.summary["heldout_symmetric"] == pytest.approx(final["test_task_symmetric"])
    assert res.summary["seen_test_accuracy"] == pytest.approx(final["test_data_acc"])


def test_bad_inputs(handle) -> None:
    with pytest.raises(ConfigError, match="no task"):
        sol.solution_types(handle, TASK.solution_data().tokens)
    with pytest.raises(InputError, match="vocabulary"):
        sol.solution_types(
            probekit.load(_tiny_gpt2(vocab=150)), AnchorTask(vocab_size=201).solution_data()
        )
    with pytest.raises(ConfigError, match="memorizing_threshold"):
        sol.solution_types(handle, TASK.solution_data(), memorizing_threshold=2.0)


def test_untrained_mirror_is_nan_never_zero(handle, monkeypatch) -> None:
    # (4, 3) and (3, 4) both held out: neither has a trained mirror, no symmetric answer exists
    task = AnchorTask(
        n_train=256, n_test=200, seed=2, special_targets={}, heldout_pairs=[(4, 3), (3, 4)]
    )
    monkeypatch.setattr(sol, "last_token_logits", _oracle("inferential", task))
    res = sol.solution_types(handle, task.solution_data())
    s = res.summary
    assert s["heldout_inferential"] == 1.0 and s["solution"] == "inferential"
    assert s["heldout_symmetric"] != s["heldout_symmetric"]  # NaN
    assert s["heldout_symmetric_train_keys"] != s["heldout_symmetric_train_keys"]
    frac = res.fractions().set_index("pair")
    assert frac.loc["(4,3)", "symmetric"] != frac.loc["(4,3)", "symmetric"]
    assert all(
        r["symmetric"] != r["symmetric"]
        for r in task.score(task.dataset("test_task"), task.dataset("test_task").composite)
    )


def test_heldout_summary_on_all_keys_and_training_key_cells(handle, monkeypatch) -> None:
    data = TASK.solution_data()
    right = data.composite.clone()
    right[data.heldout() & ~data.on_training_keys()] = 0  # wrong on held-out test-key cells
    monkeypatch.setattr(sol, "predict", lambda model, task, batch_size: right)
    s = sol.solution_types(handle, data).summary
    held = data.heldout()
    share = float(data.on_training_keys()[held].float().mean())
    assert s["heldout_inferential_train_keys"] == 1.0
    assert s["heldout_inferential"] == pytest.approx(share)
    assert s["heldout_other"] == pytest.approx(1 - share)


#: configurations other than the published one: anchors, shifts, held-out pairs, key splits
OTHER_CONFIGS = [
    dict(
        anchors={1: 3, 2: -4, 5: 7},
        special_targets={(2, 5): -2},
        heldout_pairs=[(5, 2)],
        key_split=5,
    ),
    dict(special_targets={(1, 2): 3}, heldout_pairs=[(2, 1)]),
    dict(
        anchors={6: 2, 7: 9, 8: -3, 9: -6},
        special_targets={(7, 8): -5, (6, 9): 2},
        heldout_pairs=[(8, 7), (9, 6)],
        key_split="anchor_function_pub",
        seq_len=10,
    ),
]


@pytest.mark.parametrize("settings", OTHER_CONFIGS, ids=["3anchors", "pair21", "2heldout"])
def test_other_configurations_end_to_end(settings: dict, monkeypatch, tmp_path: Path) -> None:
    task = AnchorTask(n_train=256, n_test=120, seed=4, **settings)
    shifts, special = task.anchors, task.special_targets
    # the generator: answers derived from this configuration (offsets from the composite)
    data = task.solution_data()
    for i in range(0, len(data), 7):
        x, (a, b) = int(data.keys[i]), data.pair(i)
        assert int(data.composite[i]) == x + shifts[a] + shifts[b]
        if (a, b) in task.heldout_pairs:
            mirror = (b, a)
            want = (
                -1 if mirror in task.heldout_pairs else x + shifts[a] + shifts[b] + special[mirror]
            )
            assert int(data.symmetric[i]) == want
            assert int(data.targets[i]) == x + shifts[a] + shifts[b]
        else:
            assert int(data.targets[i]) == x + shifts[a] + shifts[b] + special.get((a, b), 0)
    # a short trainer run, the classifier on its checkpoint, the figure
    model = ModelConfig(n_layers=1, d_model=16, n_heads=2, n_positions=task.seq_len)
    cfg = TrainConfig(
        model=model,
        task=task,
        steps=4,
        batch_size=32,
        warmup_steps=1,
        eval_every=4,
        eval_train_samples=64,
        device="cpu",
    )
    out = train(cfg, tmp_path / "run", progress=False)
    assert load_run(out.checkpoint).task == task
    res = sol.solution_types(out.checkpoint, task.solution_data())
    assert res.summary["heldout_inferential"] == pytest.approx(out.final["test_task_inferential"])
    assert res.summary["heldout_symmetric"] == pytest.approx(out.final["test_task_symmetric"])
    held_labels = {f"({a},{b})" for a, b in task.heldout_pairs}
    assert set(res.df[res.df["heldout"]]["pair"]) == held_labels
    assert {t.name for t in res.figure().data} >= {"inferential", "symmetric", "other"}
    # the classifier recovers answers built from this configuration alone: trained targets on
    # the seen pairs, the composite or the mirror's trained target on the held-out ones
    handle = probekit.load(out.checkpoint)
    for mode in ("inferential", "symmetric"):
        answer = data.answers()[mode]
        if mode == "symmetric":  # a held-out pair without a trained mirror: the composite
            answer = torch.where(answer == -1, data.composite, answer)
        pred = torch.where(data.heldout(), answer, data.targets)
        monkeypatch.setattr(sol, "predict", lambda model, task, batch_size, p=pred: p)
        s = sol.solution_types(handle, data).summary
        assert s["solution"] == mode and s[f"heldout_{mode}"] == 1.0
        assert s["seen_test_accuracy"] == 1.0
