"""A task other than the anchor task, with answer categories of its own, runs through the
solution types, their figure and the report with no change to probekit/analyses or report.py:
everything they say about the task comes from the TaskData protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from probekit.analyses.mechanisms import solutions as sol
from probekit.data import SolutionWording, TaskData, category_shares, describe
from probekit.report import Diagnosis, write_report
from probekit.report_text import conclusion, own_words
from probekit.result import Result
from probekit.toy import toy_model

torch.set_num_threads(1)

SHIFTS = {10: 1, 11: 2, 12: 3}
"""Operator token -> the shift it adds to the key; operator 12 is never trained."""
HELD_OUT = 12
VOCAB = 32

WORDING = SolutionWording(
    groups="operators",
    reference="rule",
    seen_scope="every key",
    heldout_scope="every key",
    target="shifted key",
    memorizing="unlearned",
    title="Answer type on the held-out operator",
    explain="Per operator, how many outputs follow the rule or copy the key.",
    conclusion="Answer type: {solution}; {heldout_rule:.0%} of the held-out outputs follow "
    "the rule, {heldout_copy:.0%} copy the key.",
)


@dataclass
class ShiftData:
    """``[key, operator]`` sequences answered by ``key + shift(operator)``: the toy task."""

    keys: torch.Tensor
    operators: torch.Tensor
    vocab_size: int | None = VOCAB
    group_label = "operator"

    @property
    def tokens(self) -> torch.Tensor:
        return torch.stack([self.keys, self.operators], dim=1)

    @property
    def targets(self) -> torch.Tensor:
        return self.keys + torch.tensor([SHIFTS[int(o)] for o in self.operators])

    @property
    def resample_range(self) -> tuple[int, int]:
        return (1, 10)

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def groups(self) -> list[str]:
        return [f"op{int(o)}" for o in self.operators]

    def heldout(self) -> torch.Tensor:
        return self.operators == HELD_OUT

    def answers(self) -> dict[str, torch.Tensor]:
        return {"rule": self.targets, "copy": self.keys}

    def categories(self) -> dict[str, str]:
        return {"rule": "rule (key + shift)", "copy": "copy (the key)", "other": "other"}

    def classify(self, predictions: torch.Tensor) -> dict[str, torch.Tensor]:
        rule, copy = predictions == self.targets, predictions == self.keys
        return {"rule": rule.float(), "copy": copy.float(), "other": (~(rule | copy)).float()}

    def subsets(self) -> dict[str, torch.Tensor]:
        return {"even": self.keys % 2 == 0}

    def solution_wording(self) -> SolutionWording:
        return WORDING

    def description(self) -> str:
        return "the shift task's sequences"

    def roles(self) -> dict[str, torch.Tensor]:
        at = torch.arange(2)[None].expand(len(self), 2)
        return {"key": at == 0, "operator": at == 1}

    def variables(self) -> dict[str, np.ndarray]:
        return {"key": self.keys.numpy(), "operator": self.operators.numpy()}

    def mirror_groups(self) -> list[tuple[str, str]]:
        return []

    def concat(self, others: Sequence[ShiftData]) -> ShiftData:
        parts = [self, *others]
        return ShiftData(
            torch.cat([d.keys for d in parts]), torch.cat([d.operators for d in parts])
        )


def _shift_data() -> ShiftData:
    keys = torch.arange(1, 9).repeat(3)
    operators = torch.tensor([10, 11, 12]).repeat_interleave(8)
    return ShiftData(keys, operators)


@pytest.fixture(scope="module")
def model():
    return toy_model("gpt2", n_layers=1, vocab_size=VOCAB)


def _solutions(model, monkeypatch, predictions: torch.Tensor) -> sol.SolutionResult:
    monkeypatch.setattr(sol, "predict", lambda handle, task, batch_size: predictions)
    return sol.solution_types(model, _shift_data())


def test_the_toy_task_is_task_data():
    data = _shift_data()
    assert isinstance(data, TaskData)
    assert describe(data) == "the shift task's sequences"
    shares = category_shares(data.classify(data.keys), data.heldout())
    assert shares == {"rule": 0.0, "copy": 1.0, "other": 0.0}


def test_solution_types_speak_in_the_tasks_categories(model, monkeypatch):
    data = _shift_data()
    copying = torch.where(data.heldout(), data.keys, data.targets)  # seen: right; held out: copy
    res = _solutions(model, monkeypatch, copying)
    s = res.summary
    assert s["solution"] == "copy" and not s["memorizing"]
    assert s["seen_test_accuracy"] == 1.0
    assert (s["heldout_rule"], s["heldout_copy"], s["heldout_other"]) == (0.0, 1.0, 0.0)
    assert s["heldout_copy_even"] == 1.0 and s["heldout_diff_mode"] == -3.0
    assert list(res.fractions().columns[3:]) == ["accuracy", "copy", "other", "rule"]
    assert res.meta["answer_offsets"] == {"copy": {"op12": -3}}
    unlearned = _solutions(model, monkeypatch, torch.zeros(len(data), dtype=torch.long))
    assert unlearned.summary["solution"] == "unlearned" and unlearned.summary["memorizing"]


def test_figure_and_report_take_the_tasks_words(model, monkeypatch, tmp_path: Path):
    data = _shift_data()
    res = _solutions(model, monkeypatch, torch.where(data.heldout(), data.keys, data.targets))
    for result in (res, Result.load(res.save(tmp_path / "solutions.json"))):
        fig = result.figure()
        assert {"rule", "copy", "other"} <= {t.name for t in fig.data}
        assert fig.layout.xaxis.title.text == "operator (seen, then held-out)"
        assert fig.layout.xaxis2.title.text == "prediction − rule (tokens)"
        assert {" copy", "rule "} <= {a.text for a in fig.layout.annotations}
        words = " ".join(
            [fig.layout.title.text, *(a.text for a in fig.layout.annotations)]
            + [t.name for t in fig.data]
        )
        assert not any(w in words for w in ("anchor", "pair", "inferential", "symmetric"))
        said = conclusion("solutions", result)
        assert (
            said
            == "Answer type: copy; 0% of the held-out outputs follow the rule, 100% copy the key."
        )
    assert own_words(res)["title"] == "Answer type on the held-out operator"
    page = write_report(Diagnosis("toy", {"solutions": res}), tmp_path / "report").read_text()
    assert "<h2>Answer type on the held-out operator</h2>" in page
    assert "Per operator, how many outputs follow the rule or copy the key." in page
    assert "Answer type: copy; 0% of the held-out outputs" in page


def test_pair_cosines_compare_at_the_tasks_own_answers(model):
    """The task names the answer the groups are compared at: its reference answer (the first
    category) by default, any other of its answers by name; the title speaks its words."""
    from probekit.analyses.mechanisms.maps import pair_cosines
    from probekit.errors import InputError

    data = _shift_data()
    by_rule = pair_cosines(model, data)
    assert by_rule.meta["answer"] == "rule"
    shared = by_rule.df.set_index(["pair_i", "pair_j"]).n_targets
    assert shared[("op10", "op12")] == 6  # key + 1 and key + 3 meet on 4..9
    title = by_rule.figure().layout.title.text.replace("<br>", " ")
    assert "between operators at equal rule answers" in title
    by_copy = pair_cosines(model, data, answer="copy")  # the key: shared by every operator
    assert by_copy.meta["answer"] == "copy"
    assert by_copy.df.set_index(["pair_i", "pair_j"]).n_targets[("op10", "op12")] == 8
    with pytest.raises(InputError, match="no answer named 'inferential'") as err:
        pair_cosines(model, data, answer="inferential")
    assert "['copy', 'rule']" in err.value.fix
