"""LayerNorm Scaling (Sun et al. 2025) in both trainers: the forward, the folded checkpoint and
a resume that goes on bit for bit from the unscaled gains."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from probekit.anchor import AnchorTask, TrainConfig, train
from probekit.anchor import training as trainer_mod
from probekit.errors import CheckpointError, ConfigError
from probekit.lm import UNSCALED_LN_FILE, LMConfig, LMTrainer, train_lm
from probekit.lm import training as lm_training
from probekit.lm.checkpoints import load_checkpoint
from probekit.lm.layernorm_scaling import hf_copy, unscaled_of
from probekit.training import ModelConfig
from probekit.training.models import (
    from_hf_model,
    init_stacked_params,
    layernorm_scales,
    stacked_forward,
    to_hf_model,
)

LM = dict(
    n_layers=3,
    d_model=16,
    n_heads=2,
    seq_len=16,
    batch_size=2,
    steps=6,
    eval_every=3,
    eval_sequences=2,
    corpus_max_files=30,
    warmup_steps=2,
    layernorm_scaling=True,
)
TASK = AnchorTask(n_train=64, n_test=16)


class Killed(Exception):
    """Stands for a kill of the training process."""


def _paper_forward(model, tokens: torch.Tensor, scaled: bool) -> torch.Tensor:
    """A plain GPT-2 whose layer-l LayerNorm outputs are multiplied by 1/sqrt(l) (l = 1..L), by
    forward hooks: the paper's formulation, written independently of probekit's."""
    handles = []
    if scaled:
        for i, block in enumerate(model.transformer.h):
            for ln in (block.ln_1, block.ln_2):
                handles.append(
                    ln.register_forward_hook(lambda mod, args, out, s=1 / math.sqrt(i + 1): out * s)
                )
    try:
        return model(tokens, use_cache=False).logits
    finally:
        for h in handles:
            h.remove()


def test_the_scales_follow_the_paper() -> None:
    scales = layernorm_scales(3)
    assert len(scales) == 3 * 2 * 2  # ln_1 and ln_2, gain and bias, per layer; not ln_f
    assert [scales[f"transformer.h.{i}.ln_2.weight"] for i in range(3)] == [
        1.0,
        1 / math.sqrt(2),
        1 / math.sqrt(3),
    ]


def test_lm_checkpoint_is_the_training_forward_and_the_papers_model(tmp_path: Path) -> None:
    cfg = LMConfig(**LM)
    trainer = LMTrainer(cfg, tmp_path / "run", "cpu")
    for _ in range(3):
        trainer.train_step()
    trainer.model.eval()
    final = trainer.save(tmp_path / "ck")
    tokens = trainer.corpus.sequences("validation", 16, n=3)
    hf = transformers.GPT2LMHeadModel.from_pretrained(final).eval()
    with torch.no_grad():
        ours = trainer.model(tokens, use_cache=False).logits
        assert torch.equal(hf(tokens, use_cache=False).logits, ours)  # folded: bit for bit
        plain = transformers.GPT2LMHeadModel(hf.config).eval()
        unscaled = load_file(str(final / UNSCALED_LN_FILE))
        plain.load_state_dict({**hf.state_dict(), **unscaled})
        paper = _paper_forward(plain, tokens, scaled=True)
        torch.testing.assert_close(paper, ours, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(_paper_forward(plain, tokens, scaled=False), ours, atol=1e-3)
    assert not torch.equal(
        unscaled["transformer.h.2.ln_1.weight"], hf.state_dict()["transformer.h.2.ln_1.weight"]
    )


def test_lm_gradients_are_those_of_the_scaled_layernorm_output(tmp_path: Path) -> None:
    trainer = LMTrainer(LMConfig(**LM), tmp_path / "run", "cpu")
    tokens = trainer.corpus.sequences("validation", 16, n=2)
    model = trainer.model
    gain = model.transformer.h[2].ln_1.parametrizations.weight.original
    (g_ours,) = torch.autograd.grad(model(tokens).logits.square().mean(), [gain])
    plain = transformers.GPT2LMHeadModel(model.config)
    plain.load_state_dict(hf_copy(model).state_dict())
    with torch.no_grad():
        for name, raw in unscaled_of(model).items():
            plain.get_parameter(name).copy_(raw)
    ref = plain.transformer.h[2].ln_1.weight
    (g_ref,) = torch.autograd.grad(_paper_forward(plain, tokens, True).square().mean(), [ref])
    torch.testing.assert_close(g_ours, g_ref, atol=1e-6, rtol=1e-4)


def test_a_killed_lm_run_with_layernorm_scaling_resumes_bit_identical(tmp_path, monkeypatch):
    cfg = LMConfig(**LM, save_every=2)
    ref = train_lm(cfg, tmp_path / "ref", progress=False, device="cpu")

    def after_step(trainer):
        if trainer.step == 3:
            raise Killed

    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(lm_training.LMTrainer, "after_step", after_step)
        train_lm(cfg, tmp_path / "cut", progress=False, device="cpu")
    resumed = train_lm(cfg, tmp_path / "cut", progress=False, device="cpu")
    for name in ("model.safetensors", "optimizer.safetensors", UNSCALED_LN_FILE):
        x, y = load_file(str(ref.final / name)), load_file(str(resumed.final / name))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name
    assert resumed.metrics.val_loss.equals(ref.metrics.val_loss)
    with pytest.raises(ConfigError, match="layernorm_scaling"):  # a different model: refused
        train_lm(LMConfig(**{**LM, "layernorm_scaling": False}, save_every=2), tmp_path / "cut")


def test_a_damaged_unscaled_file_is_refused_on_resume(tmp_path: Path) -> None:
    cfg = LMConfig(**LM)
    run = train_lm(cfg, tmp_path / "run", progress=False, device="cpu")
    unscaled = load_file(str(run.final / UNSCALED_LN_FILE))
    unscaled["transformer.h.1.ln_2.bias"] += 1.0
    save_file(unscaled, str(run.final / UNSCALED_LN_FILE))
    with pytest.raises(CheckpointError, match="does not fold"):
        load_checkpoint(run.final, cfg, cfg.steps, torch.device("cpu"))
    (run.final / UNSCALED_LN_FILE).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(run.final, cfg, cfg.steps, torch.device("cpu"))


def test_layernorm_scaling_with_growth_is_refused() -> None:
    with pytest.raises(ConfigError, match="layernorm_scaling with growth 'midas'"):
        LMConfig(**{**LM, "n_layers": 4}, growth="midas", initial_layers=2).validate()
    with pytest.raises(ConfigError, match="true or false"):
        LMConfig(**{**LM, "layernorm_scaling": 1}).validate()


def test_stacked_forward_with_layernorm_scaling_is_the_folded_hf_model() -> None:
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, gamma=0.3, layernorm_scaling=True)
    params = init_stacked_params(cfg, seeds=[0, 1])
    gen = torch.Generator().manual_seed(0)
    for k in layernorm_scales(3):  # gains and biases other than 1 and 0
        params[k] += 0.3 * torch.randn(params[k].shape, generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (2, 5, cfg.n_positions), generator=gen)
    ours = stacked_forward(params, tokens, cfg, last_only=False)
    plain_cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, gamma=0.3)
    unscaled = stacked_forward(params, tokens, plain_cfg, last_only=False)
    assert not torch.allclose(ours, unscaled, atol=1e-3)
    for m in range(2):
        hf = to_hf_model(cfg, params, m)
        with torch.no_grad():
            torch.testing.assert_close(hf(tokens[m]).logits, ours[m], atol=1e-4, rtol=1e-4)
            plain = to_hf_model(plain_cfg, params, m)  # unscaled gains + the paper's hooks
            paper = _paper_forward(plain, tokens[m], scaled=True)
            torch.testing.assert_close(paper, ours[m], atol=1e-4, rtol=1e-4)
        back_cfg, back = from_hf_model(hf)  # read back as the plain model it is
        assert not back_cfg.layernorm_scaling
        torch.testing.assert_close(
            stacked_forward(back, tokens[m : m + 1], back_cfg, last_only=False)[0],
            ours[m],
            atol=1e-5,
            rtol=1e-5,
        )
    assert cfg.shape_key() != plain_cfg.shape_key()  # never stacked together


def test_a_killed_anchor_run_with_layernorm_scaling_resumes_bit_identical(tmp_path, monkeypatch):
    model = ModelConfig(n_layers=2, d_model=16, n_heads=2, layernorm_scaling=True)
    cfg = TrainConfig(
        model=model,
        task=TASK,
        steps=8,
        batch_size=8,
        eval_every=4,
        checkpoint_every=2,
        warmup_steps=2,
        device="cpu",
    )
    ref = train(cfg, tmp_path / "ref", progress=False)

    def after_step(stack):
        if stack.step == 5:
            raise Killed

    with monkeypatch.context() as patch, pytest.raises(Killed):
        patch.setattr(trainer_mod.AnchorStack, "after_step", after_step)
        train(cfg, tmp_path / "cut", progress=False)
    resumed = train(cfg, tmp_path / "cut", progress=False)
    for name in ("model.safetensors", "optimizer.safetensors"):
        x = load_file(str(ref.checkpoint / name))
        y = load_file(str(resumed.checkpoint / name))
        keys = [k for k in x if not k.startswith("rng.")]
        assert any(k.startswith("unscaled.") for k in x) == (name == "optimizer.safetensors")
        assert all(torch.equal(x[k], y[k]) for k in keys), name
    hf = transformers.GPT2LMHeadModel.from_pretrained(ref.checkpoint).eval()
    tokens = TASK.dataset("test_data").tokens[:8]
    raw = load_file(str(ref.checkpoint / "optimizer.safetensors"))
    params = {k: v[None] for k, v in load_file(str(ref.checkpoint / "model.safetensors")).items()}
    params.update(
        {k[len("unscaled.") :]: v[None] for k, v in raw.items() if k.startswith("unscaled.")}
    )
    with torch.no_grad():
        ours = stacked_forward(params, tokens[None], model)[0]
        torch.testing.assert_close(hf(tokens).logits[:, -1], ours, atol=1e-5, rtol=1e-5)
