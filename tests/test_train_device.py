"""The trainers' device logic, on CPU: no host syncs between sync points, precision, determinism.

A host sync (the host waiting for the device) is caught on CPU by :class:`NoHostSync`, a
``TorchFunctionMode`` that raises on every call that would make the host wait for a CUDA
device: reading a value (``item``, ``tolist``, ``bool``, ``float``, ``numpy``, printing),
copying to the host or from host data (``cpu``, ``to("cpu")``, ``torch.tensor``), and ops
whose output size depends on the data (``nonzero``, boolean-mask indexing, ``unique``...).
The steps between two sync points of both trainers run under it; today's steps (kept below
as the reference of today's numbers) fail under it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

from probekit.anchor import TrainConfig, train
from probekit.anchor import training as trainer_mod
from probekit.errors import ConfigError
from probekit.lm import LMConfig, LMTrainer, train_lm
from probekit.lm.corpus import VOCAB_SIZE
from probekit.training import optim as optim_mod
from probekit.training.models import stacked_forward
from probekit.training.precision import autocast, check_deterministic
from probekit.training.schedule import warmup_cosine
from tests.conftest import TINY_LM, tiny_anchor

torch.set_num_threads(1)


def tiny(**kw) -> TrainConfig:
    return tiny_anchor(**{"steps": 6, "eval_every": 3, "checkpoint_every": 3, **kw})


# ----------------------------------------------------------------------------- the guard
class HostSync(AssertionError):
    """A call that would make the host wait for the device."""


_READS = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "__complex__",
    "__repr__",
    "__str__",
    "__format__",
    "__array__",
}
_DATA_SHAPED = {
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "bincount",
    "repeat_interleave",
    "tensor",
    "as_tensor",
}


def _host_copy(args: tuple, kwargs: dict) -> bool:
    """``tensor.to(...)`` copies to the host ("cpu" named as such) or to another device
    without ``non_blocking``; ``.to(t.device)`` on the tensor's own device is no copy (so a
    host-to-device ``.to(device)`` is invisible on a CPU-only machine: the trainers send
    their host data through ``precision.to_device`` when they prepare an interval)."""
    targets = [a for a in args[1:] if isinstance(a, str | torch.device)]
    targets += [kwargs["device"]] if kwargs.get("device") is not None else []
    for target in targets:
        if isinstance(target, str) and target == "cpu":
            return True
        if torch.device(target) != args[0].device and not kwargs.get("non_blocking", False):
            return True
    return False


class NoHostSync(TorchFunctionMode):
    """Raise :class:`HostSync` on any call that waits for a CUDA device (see the module
    docstring). ``allow``: tensors the call may read (host tensors on CUDA too: the torch
    optimizer's step counters)."""

    def __init__(self, allow: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.allow = {id(t) for t in allow}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        allowed = bool(args) and id(args[0]) in self.allow
        if name in _READS and not allowed:
            raise HostSync(f"{name} reads a device value")
        if name in _DATA_SHAPED:
            raise HostSync(f"{name}: host data or a data-dependent shape")
        if name == "to" and _host_copy(args, kwargs):
            raise HostSync("to: a copy to the host, or a blocking copy between devices")
        if name in ("__getitem__", "__setitem__") and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(torch.is_tensor(i) and i.dtype == torch.bool for i in index):
                raise HostSync(f"{name} with a boolean mask")
        return func(*args, **kwargs)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: x.sum().item(),
        lambda x: x.tolist(),
        lambda x: bool(x[0] > 0),
        lambda x: float(x[0]),
        lambda x: x.cpu(),
        lambda x: x.to("cpu"),
        lambda x: x.numpy(),
        lambda x: x[x > 0],
        lambda x: x.nonzero(),
        lambda x: torch.tensor([1.0]),
        lambda x: f"{x[0]}",
        lambda x: int(x[0]),
    ],
)
def test_the_guard_catches_host_syncs(call) -> None:
    x = torch.ones(3)
    with pytest.raises(HostSync), NoHostSync():
        call(x)


def test_the_guard_lets_device_work_through() -> None:
    x = torch.ones(3)
    with NoHostSync():
        y = torch.where(x > 0, x * 2, 0.0).to(torch.float64).sum()
        x.to(x.device)
    assert y.item() == 6.0


# ----------------------------------------------------------------------------- anchor trainer
def _today_step(stack) -> None:
    """The anchor step as it was before the sync-free one (host copies of the loss and a
    per-run branch on divergence, the optimizer's per-run undo): today's numbers."""
    M, s = stack.M, stack.step
    idx = torch.stack([stack.run_batch(m, s) for m in range(M)]).to(stack.device)
    with autocast(stack.device):
        logits = stacked_forward(stack.params, stack.train_tokens[idx], stack.mcfg)
    V = logits.shape[-1]
    loss = (
        F.cross_entropy(
            logits.float().reshape(-1, V), stack.train_targets[idx].reshape(-1), reduction="none"
        )
        .view(M, -1)
        .mean(1)
    )
    grads = torch.autograd.grad(loss.sum(), list(stack.params.values()))
    opt = stack.optimizer
    with torch.no_grad():
        finite = torch.isfinite(loss)
        for g in grads:
            finite &= torch.isfinite(g.reshape(M, -1)).all(1)
        active = finite.clone()
        for m in range(M):
            if stack.diverged[m] is not None:
                active[m] = False
        updated = opt.update(list(grads), s, stack.settings.schedule(s))
        ok = torch.ones(M, dtype=torch.bool)
        for tensors in updated.values():
            for t in tensors:
                ok &= torch.isfinite(t.reshape(M, -1)).all(1)
        applied = ok & active
        for m in [m for m in range(M) if bool(applied[m])]:  # a branch per run
            for k, (p, ea, eas) in updated.items():
                opt.params[k][m], opt.exp_avg[k][m], opt.exp_avg_sq[k][m] = p[m], ea[m], eas[m]
        finite &= applied | ~active
    stack.step += 1
    lcpu = loss.detach().float().cpu()
    for m in range(M):
        if stack.diverged[m] is None and not bool(finite[m]):
            stack.diverged[m] = stack.step
        elif stack.diverged[m] is None:
            stack.loss_sum[m] += float(lcpu[m])
    stack.loss_count += 1


def _stack(tmp_path: Path, name: str):
    cfgs = [tiny(name=f"r{s}", seed=s, lr=lr) for s, lr in ((0, 3e-3), (1, 0.5))]
    return trainer_mod.AnchorStack(cfgs, tmp_path / name, single=False)


def _poison_run_1(monkeypatch) -> None:
    """The update of 0-based step 2 turns run 1's weights into inf (it diverges at step 3)."""
    real = optim_mod.StackedAdamW.update

    def update(self, grads, step, multiplier):
        updated = real(self, grads, step, multiplier)
        if step == 2:  # the new weights of run 1
            updated["transformer.h.0.mlp.c_fc.weight"][0][1] *= float("inf")
        return updated

    monkeypatch.setattr(optim_mod.StackedAdamW, "update", update)


def test_anchor_steps_do_not_sync_and_give_todays_numbers(tmp_path, monkeypatch) -> None:
    _poison_run_1(monkeypatch)
    new, old = _stack(tmp_path, "new"), _stack(tmp_path, "old")
    new.prepare(5)
    with NoHostSync():
        new.run_steps(5)
    new.sync()
    with pytest.raises(HostSync), NoHostSync():  # today's step waits for the device
        _today_step(_stack(tmp_path, "probe"))
    for _ in range(5):
        _today_step(old)
    assert old.step == new.step == 5 and new.diverged == old.diverged == [None, 3]
    assert new.loss_sum == old.loss_sum and new.loss_count == old.loss_count
    assert all(torch.equal(new.params[k], old.params[k]) for k in new.params)
    moments = new.optimizer.state_dict(), old.optimizer.state_dict()
    assert all(
        torch.equal(moments[0][w][k], moments[1][w][k]) for w in moments[0] for k in moments[0][w]
    )


def test_anchor_data_and_state_live_on_the_device(tmp_path) -> None:
    stack = _stack(tmp_path, "s")
    stack.prepare(3)
    tensors = [
        stack.train_tokens,
        stack.train_targets,
        stack.batches,
        stack.loss_sum_t,
        stack.diverged_t,
        stack.diverged_loss_t,
        stack.optimizer.lr,
        *stack.params.values(),
        *stack.optimizer.exp_avg.values(),
        *stack.optimizer.exp_avg_sq.values(),
    ]
    tensors += [t for split in stack.evaluator.sets.values() for t in split.values()]
    assert {t.device for t in tensors} == {stack.device} == {torch.device("cpu")}
    assert stack.batches.shape == (3, 2, 32)


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(run.checkpoint / "model.safetensors"))


def test_fp32_is_todays_cpu_run_and_bf16_autocasts_with_fp32_weights(tmp_path) -> None:
    auto = train(tiny(steps=3), tmp_path / "auto", progress=False)
    fp32 = train(tiny(steps=3, precision="fp32"), tmp_path / "fp32", progress=False)
    bf16 = train(tiny(steps=3, precision="bf16"), tmp_path / "bf16", progress=False)
    a, f, b = _weights(auto), _weights(fp32), _weights(bf16)
    assert all(torch.equal(a[k], f[k]) for k in a)
    assert {t.dtype for t in b.values()} == {torch.float32}
    moments = load_file(str(bf16.checkpoint / "optimizer.safetensors"))
    assert {t.dtype for k, t in moments.items() if k.startswith("exp_avg")} == {torch.float32}
    assert any(not torch.equal(a[k], b[k]) for k in a)  # bf16 products round differently
    x, y = fp32.final["train_loss"], bf16.final["train_loss"]
    assert abs(x - y) < 0.05 * x
    saved = json.loads((bf16.checkpoint / "run_config.json").read_text())
    assert saved["precision"] == "bf16" and bf16.config["precision"] == "bf16"
    with pytest.raises(ConfigError, match="precision"):
        train(tiny(steps=3, precision="fp32"), tmp_path / "bf16", progress=False)


def test_a_run_saved_without_precision_resumes(tmp_path) -> None:
    cfg = tiny(steps=6, checkpoint_every=3)
    with pytest.MonkeyPatch.context() as patch:

        def kill(stack):
            if stack.step == 4:
                raise KeyboardInterrupt

        patch.setattr(trainer_mod.AnchorStack, "after_step", kill)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, tmp_path / "old", progress=False)
    rc = tmp_path / "old" / "checkpoint" / "run_config.json"
    saved = json.loads(rc.read_text())
    rc.write_text(
        json.dumps({k: v for k, v in saved.items() if k not in ("precision", "deterministic")})
    )
    assert (
        TrainConfig.from_dict(
            {k: v for k, v in cfg.to_dict().items() if k != "precision"}
        ).precision
        == "auto"
    )
    resumed = train(cfg, tmp_path / "old", progress=False)
    ref = train(cfg, tmp_path / "ref", progress=False)
    a, b = _weights(resumed), _weights(ref)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_deterministic_mode_is_on_while_training_and_restored(tmp_path, monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(
        trainer_mod.AnchorStack,
        "after_step",
        lambda stack: seen.append(torch.are_deterministic_algorithms_enabled()),
    )
    before = torch.are_deterministic_algorithms_enabled()
    train(tiny(steps=2, deterministic=True), tmp_path / "d", progress=False)
    assert seen == [True, True] and torch.are_deterministic_algorithms_enabled() == before
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG"):
        check_deterministic(True, torch.device("cuda"))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    check_deterministic(True, torch.device("cuda"))
    for bad in ({"precision": "fp16"}, {"deterministic": 1}):
        with pytest.raises(ConfigError):
            tiny(**bad)
        with pytest.raises(ConfigError):
            LMConfig(**TINY_LM, **bad).validate()


# ----------------------------------------------------------------------------- LM trainer
def _today_update(t: LMTrainer) -> None:
    """The LM step as it was before the sync-free one: today's numbers."""
    cfg, step = t.cfg, t.step
    for group in t.optimizer.param_groups:
        group["lr"] = cfg.lr * warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
    batch = t.corpus.batch("train", cfg.seq_len, cfg.batch_size, cfg.seed, step).to(t.device)
    logits = t.model(batch, use_cache=False).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1))
    assert torch.isfinite(loss)
    t.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(t.model.parameters(), cfg.grad_clip)
    t.optimizer.step()
    assert bool(torch.stack([p.isfinite().all() for p in t.model.parameters()]).all())
    t.step += 1


def test_lm_steps_do_not_sync_and_give_todays_numbers(tmp_path) -> None:
    cfg = LMConfig(**{**TINY_LM, "steps": 6})
    new, old = LMTrainer(cfg, tmp_path / "n", "cpu"), LMTrainer(cfg, tmp_path / "o", "cpu")
    new.prepare(1)
    new.run_steps(1)  # the first step creates the optimizer's state
    steps = tuple(s["step"] for s in new.optimizer.state.values())  # host counters on CUDA too
    new.prepare(5)
    with NoHostSync(allow=steps):
        new.run_steps(5)
    new.check()
    for _ in range(5):
        _today_update(old)
    with pytest.raises(HostSync), NoHostSync(allow=steps):  # today's step waits for the device
        _today_update(old)
    assert new.step == old.step == 5
    a, b = new.model.state_dict(), old.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    tensors = [
        new.batches,
        new.last_loss,
        new.bad_loss_step,
        new.bad_weight_step,
        *new.model.parameters(),
    ]
    assert {t.device for t in tensors} == {new.device} and new.batches.shape == (4, 2, 16)


def test_lm_fp32_is_todays_run_and_bf16_keeps_fp32_weights(tmp_path) -> None:
    runs = {
        p: train_lm(LMConfig(**TINY_LM, precision=p), tmp_path / p, progress=False, device="cpu")
        for p in ("auto", "fp32", "bf16")
    }
    w = {p: load_file(str(r.final / "model.safetensors")) for p, r in runs.items()}
    assert all(torch.equal(w["auto"][k], w["fp32"][k]) for k in w["auto"])
    assert {t.dtype for t in w["bf16"].values()} == {torch.float32}
    assert any(not torch.equal(w["fp32"][k], w["bf16"][k]) for k in w["fp32"])
    x, y = runs["fp32"].metrics.val_loss.iloc[-1], runs["bf16"].metrics.val_loss.iloc[-1]
    assert abs(x - y) < 0.05 * x
    rc = json.loads((runs["bf16"].final / "run_config.json").read_text())
    assert rc["lm"]["precision"] == "bf16"


def test_cli_precision_and_deterministic_flags() -> None:
    import argparse

    from probekit.cli.sweep import add_sweep_parser
    from probekit.cli.train import add_train_parser
    from probekit.cli.train_flags import build_train_config

    parser = argparse.ArgumentParser(prog="probekit")
    sub = parser.add_subparsers(dest="command")
    add_train_parser(sub), add_sweep_parser(sub)
    for command in ("train", "sweep"):
        args = parser.parse_args([command, "--out", "o", "--precision", "bf16", "--deterministic"])
        cfg = build_train_config(args, sweep=command == "sweep")
        assert (cfg.precision, cfg.deterministic) == ("bf16", True)
    cfg = build_train_config(parser.parse_args(["train", "--out", "o"]))
    assert (cfg.precision, cfg.deterministic) == ("auto", False)
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--out", "o", "--precision", "fp16"])
