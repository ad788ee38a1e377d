"""A live line during every phase of a diagnosis and of the demo, naming what runs and counting
its block passes; --quiet shows none."""

from __future__ import annotations

import probekit
from probekit import progress
from probekit.report import ANALYSES, diagnose
from probekit.toy import toy_hf_model, toy_tokens


def _recorded(monkeypatch, lines: list | None = None) -> list[tuple[str, int]]:
    closed: list[tuple[str, int]] = []
    close = progress.Line.close

    def record(self) -> None:
        closed.append((self.bar.desc if self.bar is not None else "", self.done))
        if lines is not None:
            lines.append(self)
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


def test_each_line_knows_its_total_and_counts_every_variant_done(monkeypatch, capsys):
    lines: list = []
    _recorded(monkeypatch, lines)
    model = probekit.load(toy_hf_model("gpt2", n_layers=3))
    diagnose(model, toy_tokens(), n_bootstrap=2, progress=True)
    totals = {line.bar.desc: (line.steps, line.total) for line in lines}
    n = model.n_layers
    assert totals["contributions"] == (3 * n, 3 * n)  # layer, attention, MLP of each layer
    assert totals["skip_effects"] == (n, n)
    assert totals["layer_swaps"] == (n - 1, n - 1)  # the adjacent swaps
    for name in ("residual", "logit_lens", "gradients"):
        assert totals[name] == (1, 1), name  # one batch
    err = capsys.readouterr().err
    assert "variants" in err and "batches" in err


def test_a_quiet_diagnosis_inside_a_shown_phase_counts_analyses_on_it(monkeypatch):
    """The demo's "depth diagnosis" line: the analyses done / total, their block passes beside
    them; the quiet analyses inside do not reset its total."""
    lines: list = []
    _recorded(monkeypatch, lines)
    model = probekit.load(toy_hf_model("gpt2", n_layers=2))
    with progress.phase("depth diagnosis") as outer:
        diagnose(model, toy_tokens(), n_bootstrap=2, progress=False)
    assert (outer.steps, outer.total) == (len(ANALYSES), len(ANALYSES))
    assert outer.done >= 3 * model.n_layers  # the passes of every analysis inside
    assert outer.bar is not None


def test_counted_steps_after_each_item_and_only_on_an_owned_line():
    with progress.phase("outer", enabled=False) as line:
        seen = []
        for item in progress.counted([1, 2, 3], "items"):
            seen.append((item, line.steps))
    assert seen == [(1, 0), (2, 1), (3, 2)] and (line.steps, line.total) == (3, 3)
    progress.expect(5)  # no phase open: nothing happens
    progress.step()
