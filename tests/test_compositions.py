"""The composition task (probekit.tasks.compositions) and fine-tuning a byte-level LM on it
(probekit.lm.finetune): splits, byte format, loss mask, determinism, accuracy against
hand-checked stubs, a tiny fine-tune that learns and resumes after a kill, bad settings."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from probekit.data import TaskData
from probekit.errors import CheckpointError, ConfigError
from probekit.lm import LMConfig
from probekit.lm.finetune import (
    FinetuneConfig,
    answer_scores,
    composition_accuracy,
    finetune_lm,
)
from probekit.tasks.compositions import PAD, CompositionTask

LINE = re.compile(r"^ *(\S+) (\S+) : (\S+) = (\S+)\n$")


# ---- an independent implementation of every primitive ----------------------------------------
def _upper(s: str) -> str:
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


def _lower(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def _swap(s: str) -> str:
    return "".join(_upper(c) if "a" <= c <= "z" else _lower(c) for c in s)


FIRST = {
    "add1": lambda x: str(int(x) + 1),
    "add5": lambda x: str(int(x) + 5),
    "sub3": lambda x: str(int(x) - 3),
    "mul2": lambda x: str(int(x) * 2),
    "mul3": lambda x: str(int(x) * 3),
    "half": lambda x: str(int(x) // 2),
    "upper": _upper,
    "lower": _lower,
    "swap": _swap,
    "cap": lambda s: _upper(s[0]) + _lower(s[1:]),
}
SECOND = {
    "rev": lambda s: "".join(reversed(s)),
    "rot": lambda s: s[1:] + s[0],
    "id": lambda s: s,
    "first2": lambda s: s[0:2],
    "first3": lambda s: s[0:3],
    "last2": lambda s: s[len(s) - 2 :],
    "last3": lambda s: s[len(s) - 3 :],
}


def answer(first: str, second: str, x: str) -> str:
    return SECOND[second](FIRST[first](x))


def oracle(tokens: torch.Tensor) -> torch.Tensor:
    """Logits whose argmax at the last position is the right next byte, worked out from the
    prompt's bytes alone."""
    logits = torch.zeros(*tokens.shape, 259)
    for i, row in enumerate(tokens.tolist()):
        text = bytes(row).decode()
        prompt, written = text.split(" = ", 1)
        first, second, _, x = prompt.split()
        full = answer(first, second, x) + "\n"
        logits[i, -1, ord(full[len(written)]) if len(written) < len(full) else 10] = 1.0
    return logits


SMALL = CompositionTask(n_train=400, n_test=60, seed=3)


# ---- the generator ----------------------------------------------------------------------------
def test_no_heldout_combination_in_training_and_every_primitive_trained():
    task = CompositionTask(seed=5)
    train = task.examples("train")
    held = set(task.heldout_pairs())
    trained = {(fam, f, g) for fam, f, g, _, _ in train}
    assert held and not trained & held
    assert trained == set(task.seen_pairs())  # 4000 examples reach every seen combination
    for family in task.families:
        firsts, seconds = task.operations(family)
        assert {f for fam, f, _ in trained if fam == family} == set(firsts)
        assert {g for fam, _, g in trained if fam == family} == set(seconds)
    # 25% of 6 x 3 and of 4 x 5 combinations, rounded half up
    assert sum(c[0] == "arithmetic" for c in held) == 5
    assert sum(c[0] == "case" for c in held) == 5
    assert {(fam, f, g) for fam, f, g, _, _ in task.examples("heldout")} <= held


def test_test_inputs_are_unseen_in_training():
    task = CompositionTask(seed=2)
    train_inputs = {x for *_, x, _ in task.examples("train")}
    for split in ("seen", "heldout"):
        rows = task.examples(split)
        assert not {x for *_, x, _ in rows} & train_inputs
        assert all(task.is_test_input(x) for *_, x, _ in rows)
    assert not any(task.is_test_input(x) for x in train_inputs)


def test_answers_match_an_independent_implementation():
    for split in ("train", "seen", "heldout"):
        for fam, f, g, x, y in SMALL.examples(split):
            assert y == answer(f, g, x), (fam, f, g, x)
            if fam == "arithmetic":
                assert SMALL.min_number <= int(x) <= SMALL.max_number
            else:
                assert x.isalpha() and SMALL.min_letters <= len(x) <= SMALL.max_letters


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data():
    a, b = CompositionTask(seed=7, n_train=300), CompositionTask(seed=7, n_train=300)
    for split in ("train", "seen", "heldout"):
        assert torch.equal(a.dataset(split).sequences, b.dataset(split).sequences)
    c = CompositionTask(seed=8, n_train=300)
    assert not torch.equal(a.dataset("train").sequences, c.dataset("train").sequences)


def test_byte_format_prompt_width_and_padding():
    data = SMALL.dataset("seen")
    width = SMALL.prompt_width
    assert data.answer_start == width and data.sequences.shape[1] == SMALL.seq_len
    for i, line in enumerate(data.lines()):
        match = LINE.match(line)
        assert match, line
        f, g, x, y = match.groups()
        assert (f, g, x, y) == (data.firsts[i], data.seconds[i], data.inputs[i], data.outputs[i])
        assert line.index(" = ") + 3 == width  # every answer starts at the prompt width
        row = data.sequences[i]
        assert bool((row[len(line) :] == PAD).all()) and bool((row[: len(line)] < 256).all())
    assert torch.equal(data.tokens, data.sequences[:, :width])
    assert bytes(data.tokens[0].tolist()).decode().endswith(" = ")
    assert [chr(t) for t in data.targets.tolist()] == [y[0] for y in data.outputs]


def test_loss_mask_covers_exactly_the_answer_bytes():
    data = SMALL.dataset("train")
    mask, labels = data.loss_mask(), data.labels()
    for i, y in enumerate(data.outputs):
        assert bytes(data.sequences[i][mask[i]].tolist()).decode() == y + "\n"
        targets = labels[i][labels[i] != -100]
        assert bytes(targets.tolist()).decode() == y + "\n"
        # the label at t is the byte at t + 1: the last prompt byte predicts the first answer byte
        assert int(labels[i, data.answer_start - 1]) == ord(y[0])
    assert int(mask.sum()) == int(data.answer_lengths.sum())


def test_named_heldout_combinations_and_a_primitive_subset():
    task = CompositionTask(
        families=("case",),
        primitives=("upper", "lower", "first2", "id"),
        heldout=("upper first2",),
        n_train=200,
    )
    assert task.heldout_pairs() == [("case", "upper", "first2")]
    assert {(f, g) for _, f, g, _, _ in task.examples("train")} == {
        ("upper", "id"),
        ("lower", "first2"),
        ("lower", "id"),
    }


def test_task_data_protocol():
    seen, held = SMALL.dataset("seen"), SMALL.dataset("heldout")
    both = seen.concat([held])
    assert isinstance(both, TaskData) and len(both) == len(seen) + len(held)
    assert both.heldout().tolist() == [False] * len(seen) + [True] * len(held)
    assert both.groups()[0] == f"{seen.firsts[0]} {seen.seconds[0]}"
    assert list(both.categories()) == ["composed", "first_step", "other"]
    shares = both.classify(both.targets)
    assert bool((shares["composed"] == 1).all()) and bool((shares["other"] == 0).all())
    for mask in both.roles().values():
        assert bool((mask.sum(-1) == 1).all())
    assert both.description() == (
        "the composition task's seen combinations on test inputs and held-out combinations"
    )
    assert all(len(v) == len(both) for v in both.variables().values())


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"families": ("arithmetic", "dates")}, "unknown family"),
        ({"families": ["case"]}, "families"),
        ({"primitives": ("upper", "nope")}, "unknown primitive 'nope'"),
        ({"primitives": ("upper", "first2", "id"), "families": ("case",)}, "primitives keep 1"),
        ({"heldout": 0.0}, "heldout 0.0"),
        ({"heldout": 0.9}, "heldout 0.9"),
        ({"heldout": ("add1 nope",)}, "heldout names 'add1 nope'"),
        ({"heldout": ("add1 rev", "add1 rot", "add1 id")}, r"\['add1'\] out of training"),
        ({"n_train": 0}, "n_train 0"),
        ({"n_test": 2.5}, "n_test 2.5"),
        ({"seed": -1}, "seed -1"),
        ({"test_inputs": 1.0}, "test_inputs 1.0"),
        ({"min_number": 1}, "min_number 1"),
        ({"max_number": 20}, "max_number 20"),
        ({"max_number": 10**6}, "max_number 1000000"),
        ({"min_letters": 2}, "min_letters 2"),
        ({"max_letters": 99}, "max_letters 99"),
    ],
)
def test_bad_task_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(ConfigError, match=field):
        CompositionTask(**settings).validate()


def test_generation_is_fast():
    import time

    task = CompositionTask(seed=11)
    task.dataset("seen")  # the number split, once
    start = time.perf_counter()
    task.dataset("train")
    assert time.perf_counter() - start < 0.5  # 4000 examples: ~15 ms here


# ---- accuracy against hand-checked stubs ------------------------------------------------------
def test_accuracy_of_an_oracle_is_one_and_of_a_wrong_model_zero():
    right = composition_accuracy(oracle, SMALL)
    assert right.summary["seen_accuracy"] == 1.0 and right.summary["heldout_accuracy"] == 1.0
    assert (right.df.accuracy == 1.0).all() and set(right.df.split) == {"seen", "heldout"}
    assert right.df.n.sum() == 2 * SMALL.n_test

    def newline_only(tokens):
        return torch.nn.functional.one_hot(torch.full(tokens.shape, 10), 259).float()

    wrong = composition_accuracy(newline_only, SMALL)
    assert wrong.summary["seen_accuracy"] == 0.0 and (wrong.df.correct == 0).all()


def test_accuracy_per_family_of_a_half_right_model():
    """Right on numbers, wrong on strings: per-family accuracy 1 and 0, overall their mix."""

    def numbers_only(tokens):
        logits = oracle(tokens)
        for i, row in enumerate(tokens.tolist()):
            if bytes(row).decode().split(" : ")[1][0].isalpha():
                logits[i, -1] = torch.nn.functional.one_hot(torch.tensor(ord("?")), 259)
        return logits

    acc = composition_accuracy(numbers_only, SMALL)
    assert acc.summary["accuracy_arithmetic"] == 1.0 and acc.summary["accuracy_case"] == 0.0
    by_family = acc.by_family().set_index(["family", "split"])
    assert (by_family.xs("arithmetic").accuracy == 1.0).all()
    share = (acc.examples.family == "arithmetic").mean()
    assert math.isclose(float(acc.examples.correct.mean()), share)
    wrong = acc.examples[acc.examples.family == "case"].written
    assert (wrong == "?" * (SMALL.seq_len - SMALL.prompt_width)).all()


# ---- fine-tuning ------------------------------------------------------------------------------
EASY = CompositionTask(
    families=("case",),
    primitives=("upper", "lower", "first2", "id"),
    n_train=512,
    n_test=64,
    max_letters=4,
)
TINY_LM = LMConfig(n_layers=2, d_model=32, n_heads=2, seq_len=32)


def test_a_tiny_fine_tune_lowers_the_answer_loss_and_scores_as_greedy_decoding(tmp_path):
    cfg = FinetuneConfig(task=EASY, steps=50, batch_size=16, lr=3e-3, warmup_steps=5, eval_every=25)
    torch.manual_seed(cfg.seed)
    import transformers

    fresh = transformers.GPT2LMHeadModel(TINY_LM.hf_config(2))
    before, _ = answer_scores(fresh, EASY.dataset("seen"), torch.device("cpu"), "fp32")
    run = finetune_lm(TINY_LM, tmp_path / "ft", cfg, progress=False, device="cpu")
    after = float(run.metrics.val_loss.iloc[-1])
    assert after < before - 1.0 and after < math.log(259) - 1.0
    assert list(run.metrics.step) == [25, 50]
    # the metrics' teacher-forced exact match equals greedy decoding's, per split
    last = run.metrics.iloc[-1]
    assert last.seen_accuracy == run.accuracy.summary["seen_accuracy"]
    assert last.heldout_accuracy == run.accuracy.summary["heldout_accuracy"]
    assert (tmp_path / "ft" / "accuracy.csv").is_file()
    assert run.flops == 6.0 * fresh.num_parameters() * 50 * 16 * EASY.seq_len


def test_fine_tuning_a_pretrained_run_resumes_bit_identical_after_a_kill(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from probekit.lm import finetune as lm_finetune
    from probekit.lm import train_lm

    pre = LMConfig(
        **{**TINY_LM.__dict__, "steps": 4, "batch_size": 2, "eval_every": 4, "corpus_max_files": 30}
    )
    train_lm(pre, tmp_path / "pre", progress=False, device="cpu")
    cfg = FinetuneConfig(task=EASY, steps=12, batch_size=8, eval_every=4, save_every=4)
    ref = finetune_lm(tmp_path / "pre", tmp_path / "ref", cfg, progress=False, device="cpu")

    class Killed(Exception):
        pass

    def after_step(trainer):
        if trainer.step == 6:
            raise Killed

    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(lm_finetune.FinetuneTrainer, "after_step", after_step)
        finetune_lm(tmp_path / "pre", tmp_path / "cut", cfg, progress=False, device="cpu")
    assert not (tmp_path / "cut" / "final").exists() and (tmp_path / "cut" / "step4").is_dir()
    resumed = finetune_lm(tmp_path / "pre", tmp_path / "cut", cfg, progress=False, device="cpu")
    for name in ("model.safetensors", "optimizer.safetensors"):
        x, y = load_file(str(ref.final / name)), load_file(str(resumed.final / name))
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert ref.metrics.equals(resumed.metrics.assign(seconds=ref.metrics.seconds))
    assert resumed.accuracy.df.equals(ref.accuracy.df)
    # another task in the same folder is refused, naming the difference
    other = FinetuneConfig(task=dataclasses.replace(EASY, seed=1), **_run(cfg))
    with pytest.raises(ConfigError, match="seed"):
        finetune_lm(tmp_path / "pre", tmp_path / "cut", other, progress=False, device="cpu")
    # a fine-tuning cut short is not resumed from other starting weights of the same shape
    other_pre = dataclasses.replace(pre, seed=pre.seed + 1)
    train_lm(other_pre, tmp_path / "pre2", progress=False, device="cpu")
    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(lm_finetune.FinetuneTrainer, "after_step", after_step)
        finetune_lm(tmp_path / "pre", tmp_path / "cut2", cfg, progress=False, device="cpu")
    with pytest.raises(CheckpointError, match="other starting weights"):
        finetune_lm(tmp_path / "pre2", tmp_path / "cut2", cfg, progress=False, device="cpu")


def _run(cfg: FinetuneConfig) -> dict:
    return {k: getattr(cfg, k) for k in ("steps", "batch_size", "eval_every", "save_every")}


@pytest.mark.parametrize(
    "start, cfg, words",
    [
        (TINY_LM, FinetuneConfig(steps=0), "steps = 0"),
        (TINY_LM, FinetuneConfig(task=EASY, lr=-1.0), "lr"),
        (TINY_LM, FinetuneConfig(task="case"), "not a CompositionTask"),
        (TINY_LM, FinetuneConfig(task=CompositionTask(heldout=0.99)), "heldout 0.99"),
        (TINY_LM, FinetuneConfig(), "do not fit the model's context of 32"),
        (LMConfig(d_model=10, n_heads=4), FinetuneConfig(task=EASY), "not divisible"),
    ],
)
def test_bad_fine_tuning_settings_are_refused_before_work(tmp_path, start, cfg, words):
    with pytest.raises(ConfigError, match=words):
        finetune_lm(start, tmp_path / "out", cfg, progress=False, device="cpu")
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_an_lm_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a byte-level LM run"):
        finetune_lm(tmp_path, tmp_path / "out", FinetuneConfig(task=EASY), progress=False)
    assert not (tmp_path / "out").exists()


def test_a_model_in_memory_fine_tunes_as_its_config_from_scratch(tmp_path):
    import transformers
    from safetensors.torch import load_file

    cfg = FinetuneConfig(task=EASY, steps=4, batch_size=4, eval_every=4)
    torch.manual_seed(cfg.seed)
    model = transformers.GPT2LMHeadModel(TINY_LM.hf_config(2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    a = finetune_lm(model, tmp_path / "a", cfg, progress=False, device="cpu")
    b = finetune_lm(TINY_LM, tmp_path / "b", cfg, progress=False, device="cpu")
    x, y = (
        load_file(str(a.final / "model.safetensors")),
        load_file(str(b.final / "model.safetensors")),
    )
    assert all(torch.equal(x[k], y[k]) for k in x)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # not changed
    with pytest.raises(ConfigError, match="byte-level GPT-2"):
        finetune_lm(torch.nn.Linear(2, 2), tmp_path / "c", cfg, progress=False)


def test_task_aware_analyzers_read_the_composition_data():
    import transformers

    import probekit

    torch.manual_seed(0)
    model = probekit.load(transformers.GPT2LMHeadModel(TINY_LM.hf_config(2)))
    small = dataclasses.replace(EASY, n_test=12)
    data = small.dataset("seen").concat([small.dataset("heldout")])
    found = probekit.solution_types(model, data)
    composed, other = found.summary["heldout_composed"], found.summary["heldout_other"]
    assert 0 <= composed <= 1 and 0 <= other <= 1 and composed + other <= 1 + 1e-9
    assert found.summary["solution"] == data.solution_wording().memorizing  # an untrained model
    masked = probekit.token_masking(model, data, by="role", mode="resample")
    assert masked.summary["most_important"] in ("first", "second", "input", "other")
