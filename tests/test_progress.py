"""A live line during every phase of a diagnosis and of the demo, naming what runs and counting
its block passes; --quiet shows none."""

from __future__ import annotations

import probekit
from probekit import progress
from probekit.report import ANALYSES, diagnose
from probekit.toy import toy_hf_model, toy_tokens


def _recorded(monkeypatch) -> list[tuple[str, int]]:
    closed: list[tuple[str, int]] = []
    close = progress.Line.close

    def record(self) -> None:
        closed.append((self.bar.desc if self.bar is not None else "", self.done))
        close(self)

    monkeypatch.setattr(progress.Line, "close", record)
    return closed


def test_each_analysis_of_a_diagnosis_has_a_live_line_counting_its_work(monkeypatch, capsys):
    closed = _recorded(monkeypatch)
    model = probekit.load(toy_hf_model("gpt2", n_layers=3))
    diagnose(model, toy_tokens(), n_bootstrap=2, progress=True)
    names = [desc for desc, _ in closed]
    assert names == list(ANALYSES)
    counted = dict(closed)
    for name in ("contributions", "layer_swaps", "gradients"):  # variants, backward forwards
        assert counted[name] >= model.n_layers, name
    assert counted["skip_effects"] == 0  # the skips contributions already ran, from the cache
    assert "block passes" in capsys.readouterr().err


def test_quiet_shows_no_line_and_nothing_counts_outside_a_phase(monkeypatch, capsys):
    closed = _recorded(monkeypatch)
    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    diagnose(model, toy_tokens(), n_bootstrap=2, progress=False)
    assert [desc for desc, _ in closed] == [""] * len(ANALYSES)
    assert "block passes" not in capsys.readouterr().err
    probekit.contributions(model, toy_tokens())  # no phase open: advance is a no-op
