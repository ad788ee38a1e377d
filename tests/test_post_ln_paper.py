"""The anchor paper's model as a trainer choice (``ModelConfig(architecture="post_ln_paper")``:
post-LN, no linear biases, ReLU, one head, saved as a post-LN OPT) and the init at a reference
width (``init_ref_width``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import probekit
from probekit.anchor import TrainConfig, train
from probekit.anchor import training as trainer_mod
from probekit.anchor.training import train_stack
from probekit.errors import ConfigError
from probekit.training import ModelConfig, init_params
from probekit.training.models import (
    from_hf_model,
    init_stacked_params,
    stacked_forward,
    to_hf_model,
)
from tests.conftest import tiny_anchor
from tests.test_trainer import Killed, kill_at

torch.set_num_threads(1)

PAPER = "post_ln_paper"


def paper(**kw) -> ModelConfig:
    return ModelConfig(architecture=PAPER, **{"n_layers": 2, "d_model": 16, **kw})


# ----------------------------------------------------------------------------- the model
def test_the_paper_model_defaults_to_one_relu_head_and_gpt2_is_unchanged() -> None:
    cfg = paper()
    assert (cfg.n_heads, cfg.activation, cfg.post_ln) == (1, "relu", True)
    gpt2 = ModelConfig()
    assert (gpt2.n_heads, gpt2.activation, gpt2.architecture) == (4, "gelu_new", "gpt2")
    assert gpt2.shape_key() == (2, 64, 4, 256, "gelu_new", 201, 9, False, 1e-5, False)
    assert paper(n_heads=2, activation="gelu_new").n_heads == 2
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert paper().shape_key() != ModelConfig(n_layers=2, d_model=16, n_heads=1).shape_key()


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(architecture="bert"), "unknown architecture"),
        (dict(architecture=PAPER, layernorm_scaling=True), "layernorm_scaling"),
        (dict(architecture=PAPER, layer_norm_eps=1e-6), "eps 1e-5"),
        (dict(init_ref_width=0), "init_ref_width"),
        (dict(init_ref_width=1.5), "init_ref_width"),
    ],
)
def test_bad_architecture_settings_are_config_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("tie", [False, True])
def test_stacked_forward_is_the_post_ln_opt_forward(tie: bool) -> None:
    cfg = paper(n_layers=3, gamma=0.3, vocab_size=30, n_positions=7, tie_embeddings=tie)
    params = init_stacked_params(cfg, seeds=[0, 1])
    tokens = torch.randint(0, 30, (2, 5, 7))
    last = stacked_forward(params, tokens, cfg)
    full = stacked_forward(params, tokens, cfg, last_only=False)
    for m in range(2):
        hf = to_hf_model(cfg, params, m)
        assert type(hf).__name__ == "OPTForCausalLM" and hf.model.decoder.final_layer_norm is None
        assert not [n for n, _ in hf.named_parameters() if n.endswith(("fc1.bias", "_proj.bias"))]
        assert sum(p.numel() for p in hf.parameters()) == cfg.n_params()
        ref = hf(tokens[m]).logits
        torch.testing.assert_close(full[m], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(last[m], ref[:, -1], atol=1e-4, rtol=1e-4)
        back_cfg, back = from_hf_model(hf)
        assert back_cfg.shape_key() == cfg.shape_key()  # the init rate is not in the model
        assert all(torch.equal(back[k][0], params[k][m]) for k in params)


def test_probekit_loads_the_saved_model_and_reads_its_post_ln_blocks(tmp_path: Path) -> None:
    cfg = paper(vocab_size=30, n_positions=8)
    hf = to_hf_model(cfg, init_stacked_params(cfg, [0]), 0)
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = probekit.load(str(tmp_path), device="cpu")
    assert model.architecture == "OPTForCausalLM"
    assert (model.structure.kind, model.post_norm) == ("post_ln", True)
    tokens = torch.randint(1, 30, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(model.logits(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)
    # zero ablation in a post-LN block: the sublayer, its LayerNorm included, is the identity
    got = {}
    hooks = model.update_hooks(0, lambda *t: got.setdefault("clean", t))
    [batch] = model.prepare(tokens)
    with torch.no_grad():
        model.forward(batch, hooks)
        h_in, a, m, h_out = got["clean"]
        torch.testing.assert_close(h_in + a + m, h_out)
        seen = {}
        skip = model.replace_update_hooks(0, "attn", None) + model.replace_update_hooks(
            0, "mlp", None
        )
        model.forward(batch, skip + model.update_hooks(0, lambda *t: seen.setdefault("skip", t)))
    torch.testing.assert_close(seen["skip"][3], seen["skip"][0])  # skipping = identity


# ----------------------------------------------------------------------------- the init
@pytest.mark.parametrize("scheme", ["fan_in", "official"])
def test_the_paper_init_draws_every_matrix_with_its_gamma(scheme: str) -> None:
    d, f, g, L = 128, 384, 0.6, 2
    p = init_params(paper(d_model=d, d_mlp=f, gamma=g, init_scheme=scheme), seed=0)
    out = (2 * L) ** -0.5 if scheme == "official" else 1.0
    fc2_in = d if scheme == "official" else f
    top = "model.decoder."
    expect = {
        top + "embed_tokens.weight": d**-g,
        top + "embed_positions.weight": d**-g,
        "lm_head.weight": d**-g,
        top + "layers.1.self_attn.q_proj.weight": d**-g,
        top + "layers.1.self_attn.k_proj.weight": d**-g,
        top + "layers.1.self_attn.v_proj.weight": d**-g,
        top + "layers.1.self_attn.out_proj.weight": d**-g * out,
        top + "layers.0.fc1.weight": d**-g,
        top + "layers.0.fc2.weight": fc2_in**-g * out,
    }
    for name, std in expect.items():
        assert float(p[name].std()) == pytest.approx(std, rel=0.05), name
    assert float(p[top + "layers.0.self_attn_layer_norm.weight"].min()) == 1.0
    assert float(p[top + "layers.0.final_layer_norm.bias"].abs().max()) == 0.0


@pytest.mark.parametrize("arch", ["gpt2", PAPER])
@pytest.mark.parametrize("scheme", ["fan_in", "official"])
def test_init_ref_width_gives_every_matrix_the_reference_widths_std(arch: str, scheme) -> None:
    """std = (d_in * d_ref / d_model)^-gamma: the std the same matrix has in the model of width
    d_ref (d_ref^-gamma for every matrix that reads the residual stream)."""
    d, ref, g = 64, 400, 0.5
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_heads=4, gamma=g, init_scheme=scheme, init_ref_width=ref
    )
    p = init_params(cfg, seed=0)
    own = init_params(ModelConfig(**{**cfg.to_dict(), "init_ref_width": None}), seed=0)
    out = (2 * cfg.n_layers) ** -0.5 if scheme == "official" else 1.0
    # fc2 reads d_mlp (4 d_model for gpt2, 3 d_model for post_ln_paper); official: d_model
    mlp_ratio = 1 if scheme == "official" else cfg.mlp_width() // d
    n = 0
    for name, w in p.items():
        if w.dim() < 2:
            continue
        n += 1
        is_out = name.endswith(("attn.c_proj.weight", "out_proj.weight"))
        is_fc2 = name.endswith(("mlp.c_proj.weight", "fc2.weight"))
        want = (mlp_ratio * ref if is_fc2 else ref) ** -g * (out if is_out or is_fc2 else 1.0)
        # the same draws, rescaled: the ratio is exact, the std within sampling error
        ratio = (p[name] / own[name]).nan_to_num(nan=0.0)
        nonzero = ratio[own[name] != 0]
        scale = (mlp_ratio * ref if is_fc2 else ref) / (mlp_ratio * d if is_fc2 else d)
        torch.testing.assert_close(nonzero, torch.full_like(nonzero, scale**-g))
        assert float(w.std()) == pytest.approx(want, rel=0.08), name
    assert n >= 8
    assert float(p[next(iter(p))].std()) < float(own[next(iter(p))].std())  # 400 > 64: smaller


# ----------------------------------------------------------------------------- training
def paper_run(**overrides) -> TrainConfig:
    return tiny_anchor(**{"model": paper(gamma=0.5), **overrides})


def test_a_paper_run_trains_saves_and_loads(tmp_path: Path) -> None:
    out = train(paper_run(), tmp_path / "run", progress=False)
    config = json.loads((out.checkpoint / "config.json").read_text())
    assert config["architectures"] == ["OPTForCausalLM"] and not config["do_layer_norm_before"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = probekit.load(str(out.checkpoint), device="cpu")
    assert model.structure.kind == "post_ln"


@pytest.mark.parametrize("interrupt_at", [3, 7])
def test_a_paper_run_resumes_bit_identically(tmp_path: Path, interrupt_at, monkeypatch) -> None:
    cfg = paper_run(steps=8, checkpoint_every=2, eval_every=3)
    ref = train(cfg, tmp_path / "ref", progress=False)
    with monkeypatch.context() as patch, pytest.raises(Killed):
        kill_at(patch, trainer_mod.AnchorStack, interrupt_at)
        train(cfg, tmp_path / "cut", progress=False)
    resumed = train(cfg, tmp_path / "cut", progress=False)
    for name in ("model.safetensors", "optimizer.safetensors"):
        x = load_file(str(ref.checkpoint / name))
        y = load_file(str(resumed.checkpoint / name))
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in x if not k.startswith("rng.")), name
    cols = [c for c in ref.metrics.columns if c != "elapsed_s"]
    assert ref.metrics[cols].equals(resumed.metrics[cols])


def test_paper_runs_stacked_equal_runs_trained_alone(tmp_path: Path) -> None:
    cfgs = [
        paper_run(name="a", seed=0, task_seed=0),
        paper_run(name="b", seed=1, task_seed=0, model=paper(gamma=0.8, init_ref_width=64)),
    ]
    stacked = train_stack(cfgs, tmp_path / "stack", progress=False)
    for cfg, run in zip(cfgs, stacked, strict=True):
        alone = train(cfg, tmp_path / cfg.name, progress=False)
        w1 = load_file(str(run.checkpoint / "model.safetensors"))
        w2 = load_file(str(alone.checkpoint / "model.safetensors"))
        assert w1.keys() == w2.keys()
        for k in w1:
            torch.testing.assert_close(w1[k], w2[k], atol=2e-5, rtol=1e-4, msg=k)
    a, b = (load_file(str(r.checkpoint / "model.safetensors")) for r in stacked)
    assert not torch.equal(a["lm_head.weight"], b["lm_head.weight"])


# ----------------------------------------------------------------------------- cli and sweep
def test_cli_architecture_flags_take_the_architectures_defaults() -> None:
    import argparse

    from probekit.cli.train_flags import add_settings_flags, build_train_config

    parser = argparse.ArgumentParser()
    add_settings_flags(parser, False)

    def model(*flags: str) -> ModelConfig:
        return build_train_config(parser.parse_args(list(flags))).model

    m = model("--architecture", PAPER, "--init-ref-width", "400", "--d-model", "32")
    assert (m.architecture, m.n_heads, m.activation, m.d_mlp, m.init_ref_width) == (
        PAPER,
        1,
        "relu",
        96,
        400,
    )
    assert model("--architecture", PAPER, "--n-heads", "2", "--d-mlp", "40").n_heads == 2
    assert model() == ModelConfig()  # the default stays GPT-2


def test_the_sweep_table_has_the_init_std_for_a_phase_diagram_against_it() -> None:
    import pandas as pd

    from probekit.anchor.sweep import SweepConfig, SweepResult, settings_row

    base = paper_run(model=paper(init_ref_width=400))
    runs = SweepConfig(base, gammas=[0.3, 0.8], seeds=[0]).runs()
    rows = [settings_row(r, 8, "done", "") for r in runs]
    assert [row["init_std"] for row in rows] == pytest.approx([400**-0.3, 400**-0.8])
    assert all(r.model.architecture == PAPER and r.model.init_ref_width == 400 for r in runs)
    df = pd.DataFrame(rows).assign(final_test_task_symmetric=[1.0, 0.0])
    fig = SweepResult(df, {}).phase_diagram("test_task_symmetric", "init_std", "depth")
    assert "std" in fig.layout.xaxis.title.text
