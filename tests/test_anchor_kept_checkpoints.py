"""Anchor runs keep checkpoints over training (``keep_checkpoints``): written whole, kept
across a resume that stays bit-identical, read by ``probekit timeline`` and the timelines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import probekit.anchor.training as trainer_mod
from probekit.anchor import TrainConfig, train, train_stack
from probekit.errors import ConfigError
from tests.conftest import tiny_anchor
from tests.test_trainer import Killed, kill_at


def _kept(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_keep_every_n_steps_writes_hugging_face_checkpoints(tmp_path: Path) -> None:
    out = train(tiny_anchor(steps=5, keep_checkpoints=2), tmp_path / "r", progress=False)
    root = out.out_dir / "checkpoints"
    assert _kept(root) == ["step-000000", "step-000002", "step-000004", "step-000005"]
    for name in _kept(root):
        assert sorted(os.listdir(root / name)) == [
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "run_config.json",
            "trainer_state.json",
        ]
    final = _weights(root / "step-000005")
    assert all(torch.equal(v, _weights(out.checkpoint)[k]) for k, v in final.items())


def test_keep_a_list_of_steps_stops_there(tmp_path: Path) -> None:
    out = train(tiny_anchor(steps=8, keep_checkpoints=[1, 3]), tmp_path / "r", progress=False)
    assert _kept(out.out_dir / "checkpoints") == ["step-000001", "step-000003"]
    again = train(tiny_anchor(steps=3), tmp_path / "s", progress=False)
    kept = _weights(out.out_dir / "checkpoints" / "step-000003")
    assert all(torch.equal(v, _weights(again.checkpoint)[k]) for k, v in kept.items())


@pytest.mark.parametrize(
    ("keep", "needle"),
    [(0, "keep_checkpoints"), ([9], "outside"), ([2, 2], "repeated"), ("2", "neither")],
)
def test_bad_keep_checkpoints(keep, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        tiny_anchor(keep_checkpoints=keep)


def test_keeps_round_trip_and_resume_with_other_keeps() -> None:
    cfg = tiny_anchor(keep_checkpoints=(3, 1))
    assert cfg.keep_checkpoints == [1, 3] and TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.comparable() == tiny_anchor().comparable()


@pytest.mark.parametrize("interrupt_at", [3, 5])
def test_kept_checkpoints_survive_a_resume_bit_identical(
    tmp_path: Path, interrupt_at: int, monkeypatch
) -> None:
    cfg = tiny_anchor(steps=8, checkpoint_every=4, eval_every=2, keep_checkpoints=[1, 2, 3, 8])
    ref = train(cfg, tmp_path / "ref", progress=False)
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_at(patch, trainer_mod.AnchorStack, interrupt_at)
        train(cfg, tmp_path / "cut", progress=False)
    root = tmp_path / "cut" / "checkpoints"
    before = {p: (root / p / "model.safetensors").stat().st_mtime_ns for p in _kept(root)}
    resumed = train(cfg, tmp_path / "cut", progress=False)
    assert _kept(root) == _kept(ref.out_dir / "checkpoints")
    for name, mtime in before.items():  # never rewritten
        assert (root / name / "model.safetensors").stat().st_mtime_ns == mtime
    for name in _kept(root):
        x, y = _weights(ref.out_dir / "checkpoints" / name), _weights(root / name)
        assert all(torch.equal(x[k], y[k]) for k in x), name
    x, y = _weights(ref.checkpoint), _weights(resumed.checkpoint)
    assert all(torch.equal(x[k], y[k]) for k in x)


def test_no_resume_removes_kept_checkpoints(tmp_path: Path) -> None:
    train(tiny_anchor(steps=2, keep_checkpoints=1), tmp_path / "r", progress=False)
    train(tiny_anchor(steps=2), tmp_path / "r", resume=False, progress=False)
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_stack_keeps_one_folder_per_run(tmp_path: Path) -> None:
    cfgs = [tiny_anchor(steps=2, keep_checkpoints=1, name=f"s{s}", seed=s) for s in (0, 1)]
    outs = train_stack(cfgs, tmp_path / "st", progress=False)
    root = tmp_path / "st" / "checkpoints"
    assert _kept(root) == ["s0", "s1"]
    for out in outs:
        assert _kept(root / out.name) == ["step-000000", "step-000001", "step-000002"]
        kept = _weights(root / out.name / "step-000002")
        assert all(torch.equal(v, _weights(out.checkpoint)[k]) for k, v in kept.items())


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory) -> Path:
    """A tiny anchor run that kept its checkpoints of steps 0, 2 and 3."""
    out = tmp_path_factory.mktemp("kept") / "g0.5"
    train(tiny_anchor(steps=3, keep_checkpoints=2), out, progress=False)
    return out


def test_timelines_read_an_anchor_run_folder(kept_run: Path) -> None:
    from probekit.analyses.across_checkpoints import depth_timeline, run_checkpoints
    from probekit.analyses.weights.condensation import condensation_timeline
    from probekit.sources import default_data

    kept = run_checkpoints(kept_run)
    assert [(r, s) for r, s, _ in kept] == [("g0.5", 0), ("g0.5", 2), ("g0.5", 3)]
    cond = condensation_timeline(kept_run, matrices=["W_in"])
    assert sorted(set(cond.df.step)) == [0, 2, 3] and cond.summary["n_checkpoints"] == 3
    data, positions = default_data(kept_run)  # the task's test data, read at the last token
    depth = depth_timeline(kept_run, data, positions=positions)
    assert sorted(set(depth.df.step)) == [0, 2, 3] and set(depth.df.run) == {"g0.5"}


def test_timelines_refuse_a_run_without_kept_checkpoints(tmp_path: Path) -> None:
    from probekit.analyses.across_checkpoints import run_checkpoints
    from probekit.errors import InputError

    train(tiny_anchor(steps=2), tmp_path / "r", progress=False)
    with pytest.raises(InputError, match="keep_checkpoints"):
        run_checkpoints(tmp_path / "r")


def test_probekit_timeline_of_an_anchor_run_folder(kept_run: Path, tmp_path: Path) -> None:
    from probekit.cli import main
    from probekit.sources import checkpoints_to_compare

    found = checkpoints_to_compare([str(kept_run)], run=True)
    assert list(found) == ["step-000000", "step-000002", "step-000003"]
    out = tmp_path / "tl"
    code = main(["timeline", str(kept_run), "--out", str(out), "--quiet", "--bootstrap", "0"])
    assert code == 0
    page = (out / "index.html").read_text()
    assert page.index("step-000000") < page.index("step-000002") < page.index("step-000003")
