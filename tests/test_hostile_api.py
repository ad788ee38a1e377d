"""Hostile arguments to the analyzers and the command line end as one ProbekitError naming the
problem and the fix, before any work: no raw error, no clamped range, no NaN in a summary."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import probekit
from probekit.cli import main
from probekit.errors import InputError
from probekit.toy import toy_hf_model, toy_tokens


@pytest.fixture(scope="module")
def model():
    return probekit.load(toy_hf_model("gpt2", n_layers=3))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, t: probekit.logit_lens(m, t, kl_threshold=math.nan), "kl_threshold=nan"),
        (lambda m, t: probekit.logit_lens(m, t, kl_threshold=-1.0), "positive finite KL"),
        (lambda m, t: probekit.contributions(m, t, components=[]), "asks for no component"),
        (lambda m, t: probekit.layer_swaps(m, t, blocks=[(0, 5)]), "block (0, 5) is not"),
        (lambda m, t: probekit.layer_swaps(m, t, blocks=[(2, 2)]), "block (2, 2) is not"),
        (lambda m, t: probekit.layer_swaps(m, t, tolerance=math.nan), "tolerance=nan"),
        (lambda m, t: probekit.layer_swaps(m, t, tolerance=-1), "tolerance=-1"),
        (lambda m, t: probekit.contributions(m, t, batch_size=0), "batch_size=0"),
        (lambda m, t: probekit.contributions(m, t, batch_size=2.5), "batch_size=2.5"),
        (lambda m, t: probekit.residual_stats(m, t, batch_size=True), "batch_size=True"),
    ],
)
def test_bad_arguments_are_named_with_their_fix(model, call, message):
    with pytest.raises(InputError, match="Fix:") as info:
        call(model, toy_tokens())
    assert message in str(info.value)


@settings(max_examples=25, deadline=None)
@given(start=st.integers(-2, 5), stop=st.integers(-2, 5))
def test_a_given_block_is_a_range_inside_the_model_or_refused(model, start, stop):
    if 0 <= start < stop <= model.n_layers:
        res = probekit.layer_swaps(model, toy_tokens(), blocks=[(start, stop)], n_bootstrap=0)
        assert res.df is not None
    else:
        with pytest.raises(InputError, match="half-open layer range"):
            probekit.layer_swaps(model, toy_tokens(), blocks=[(start, stop)], n_bootstrap=0)


@pytest.mark.parametrize("threads", ["0", "1000000000000", "-3"])
def test_absurd_thread_counts_are_one_line(capsys, tmp_path, threads):
    argv = ["diagnose", str(tmp_path), "--out", str(tmp_path / "r"), "--threads", threads]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--threads" in err and "Traceback" not in err


def _saved(tmp_path, n: int = 30_000) -> tuple:
    """A real result saved with its .npz sidecar (a large table) and its JSON payload."""
    import json

    import pandas as pd

    from probekit.result import Result

    table = pd.DataFrame({"layer": range(n), "value": [0.5] * n, "name": ["x"] * n})
    path = Result(table, {"total": 1.0}).save(tmp_path / "r.json")
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: p.update(summary=[1, 2]), "'summary' is a list"),
        (lambda p: p.pop("summary"), "no 'summary' entry"),
        (lambda p: p.update(meta="text"), "'meta' is a str"),
        (lambda p: p["df"]["dtypes"].update(name=5), "column 'name' has no dtype string"),
        (lambda p: p["df"]["data"].update(name=["x"]), "lengths"),
        (lambda p: p["df"].update(npz="../elsewhere.npz"), "not a file name beside it"),
    ],
)
def test_a_hand_edited_result_file_is_refused_by_name(tmp_path, damage, message):
    import json

    from probekit.errors import CheckpointError
    from probekit.result import Result

    path, payload = _saved(tmp_path)
    damage(payload)
    path.write_text(json.dumps(payload))
    with pytest.raises(CheckpointError, match="cannot read a probekit result") as info:
        Result.load(path)
    assert message in str(info.value)


def test_deep_truncated_fifo_and_device_result_files_are_refused(tmp_path):
    import os

    from probekit.errors import CheckpointError
    from probekit.result import Result

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    path, _ = _saved(tmp_path)
    npz = path.with_suffix(".npz")
    npz.write_bytes(npz.read_bytes()[:100])  # a truncated sidecar
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for bad, message in (
        (deep, "cannot read a probekit result"),
        (path, "cannot read a probekit result"),
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
    ):
        with pytest.raises(CheckpointError, match=message):
            Result.load(bad)


# ----------------------------------------------------------------------------- issue 31 item 15
def test_logits_of_a_model_without_its_lm_head_are_refused():
    import torch
    import transformers

    from probekit.errors import UnsupportedModelError

    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    base = probekit.load(transformers.GPT2Model(config).eval())
    with pytest.raises(UnsupportedModelError, match="Model.logits needs .* without an LM head"):
        base.logits(toy_tokens())
    [batch] = base.prepare(toy_tokens())
    assert base.forward(batch).shape[-1] == 32  # its output: the final hidden state
    assert isinstance(base.forward(batch), torch.Tensor)


def test_uint8_and_1d_token_ids_are_read_as_the_same_ids(model):
    import torch

    tokens = toy_tokens(batch=3, length=6)
    want = model.logits(tokens)
    assert torch.equal(model.logits(tokens.to(torch.uint8)), want)
    assert torch.equal(model.logits(tokens[0]), want[:1])  # a 1-D tensor: one sequence
    a = probekit.contributions(model, tokens.to(torch.uint8)).df
    assert a.equals(probekit.contributions(model, tokens).df)


@pytest.mark.parametrize("data", [[[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5, 6]], [1, 2, 3]])
def test_plain_lists_of_token_ids_are_refused_with_the_way_to_pass_them(model, data):
    with pytest.raises(InputError, match="plain list of token ids") as info:
        probekit.contributions(model, data)
    assert "torch.tensor(ids)" in str(info.value) and "attention_mask" in str(info.value)


def test_batches_of_different_lengths(model):
    import torch

    short, long = toy_tokens(batch=20, length=4), toy_tokens(batch=20, length=6)
    assert probekit.contributions(model, [short, long]).df is not None  # each batch runs as is
    both = model.logits([long[:2], long[2:4]])  # one length: one tensor
    assert torch.equal(both, model.logits(long[:4]))
    with pytest.raises(InputError, match="Model.logits .* one length.*lengths \\[4, 6\\]"):
        model.logits([short, long])
    with pytest.raises(InputError, match="linear_probes .* one length") as info:
        probekit.linear_probes(model, [short, long], labels={"p": torch.arange(40) % 2})
    assert "attention_mask" in str(info.value)


@pytest.mark.parametrize("labels", [[0] * 40, [3.5] * 40])
def test_linear_probes_refuse_a_single_class_or_value(model, labels):
    import numpy as np

    tokens = toy_tokens(batch=40, length=4)
    with pytest.raises(InputError, match="'c' have a single .* nothing for a probe") as info:
        probekit.linear_probes(model, tokens, labels={"c": np.array(labels)})
    assert "at least two different" in str(info.value)
