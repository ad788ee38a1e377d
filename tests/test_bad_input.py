"""Hostile inputs to the model handle get one clear probekit error, never a traceback or NaN.

Property-based (hypothesis) where the space is large: masks, labels, token dtypes.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import probekit
from probekit.errors import CheckpointError, InputError, NumericalError
from probekit.result import Result
from tests.conftest import VOCAB, make_hf

pytestmark = pytest.mark.filterwarnings("ignore")
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def gpt2():
    return probekit.load(make_hf("gpt2", n_layers=2))


def _tokens(b: int = 3, t: int = 6) -> torch.Tensor:
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(0))


# ---- masks -------------------------------------------------------------------------------
@given(lengths=st.lists(st.integers(2, 6), min_size=1, max_size=4))
@FAST
def test_right_padding_of_any_lengths_is_accepted(gpt2, lengths):
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in lengths])
    batches = gpt2.prepare((_tokens(len(lengths)), mask))
    assert torch.equal(batches[0].attention_mask, mask)


def _one_run(row: list[int]) -> bool:
    """The real tokens of ``row`` form one contiguous run (any padding on either side)."""
    ones = [i for i, v in enumerate(row) if v]
    return ones == list(range(ones[0], ones[-1] + 1))


@given(
    row=st.lists(st.integers(0, 1), min_size=6, max_size=6).filter(
        lambda r: 1 in r and r != sorted(r, reverse=True)
    )
)
@FAST
def test_left_padding_is_moved_right_and_holes_are_refused(gpt2, row):
    mask = torch.tensor([[1] * 6, row])
    tokens = _tokens(2)
    if not _one_run(row):
        with pytest.raises(InputError, match="row 1 of the attention mask has a hole"):
            gpt2.prepare((tokens, mask))
        return
    [batch] = gpt2.prepare((tokens, mask))
    n, start = sum(row), row.index(1)
    assert batch.attention_mask[1].tolist() == [1] * n + [0] * (6 - n)
    assert torch.equal(batch.tokens[1, :n], tokens[1, start : start + n])
    assert torch.equal(batch.tokens[0], tokens[0]) and batch.attention_mask[0].all()


@pytest.mark.parametrize(
    "mask, match",
    [
        (torch.tensor([[1, 1, 2, 0, 0, 0]] * 2), "holds the value 2"),
        (torch.tensor([[1.0, 0.5, 0, 0, 0, 0]] * 2), "holds the value 0.5"),
        (torch.tensor([[1] * 6, [0] * 6]), "row 1 of the attention mask marks no token"),
        (torch.ones(2, 6, dtype=torch.complex64), "dtype"),
    ],
)
def test_bad_mask_values(gpt2, mask, match):
    with pytest.raises(InputError, match=match):
        gpt2.prepare((_tokens(2), mask))


def test_float_and_bool_masks_of_zeros_and_ones_are_accepted(gpt2):
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6])
    for m in (mask.float(), mask.bool()):
        [batch] = gpt2.prepare((_tokens(2), m))
        assert torch.equal(batch.attention_mask, mask)


# ---- labels -------------------------------------------------------------------------------
@given(
    value=st.one_of(st.integers(-(10**6), -101), st.integers(VOCAB, 10**6), st.integers(-99, -1))
)
@FAST
def test_labels_outside_the_vocabulary_are_refused(gpt2, value):
    labels = torch.full((2, 6), 3)
    labels[1, 2] = value
    with pytest.raises(InputError, match=f"label {value} is neither"):
        gpt2.prepare({"input_ids": _tokens(2), "labels": labels})


def test_float_labels_and_all_ignored_labels(gpt2):
    with pytest.raises(InputError, match="labels have dtype"):
        gpt2.prepare({"input_ids": _tokens(2), "labels": torch.ones(2, 6)})
    with pytest.raises(InputError, match="no position of the data has a target"):
        gpt2.prepare({"input_ids": _tokens(2), "labels": torch.full((2, 6), -100)})
    with pytest.raises(InputError, match="no position of the data has a target"):
        probekit.contributions(gpt2, _tokens(4, 1))


# ---- token tensors ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_integer_token_dtypes_are_accepted(gpt2, dtype):
    [batch] = gpt2.prepare(_tokens().to(dtype))
    assert batch.tokens.dtype == torch.long


@pytest.mark.parametrize(
    "tokens, match",
    [
        (torch.ones(2, 6, dtype=torch.complex64), "dtype"),
        (torch.ones(2, 6, dtype=torch.bool), "dtype"),
        (torch.ones(2, 6, dtype=torch.float16), "dtype"),
        (torch.ones(2, 3, 4, dtype=torch.long), "shape"),
    ],
)
def test_other_token_tensors_are_refused(gpt2, tokens, match):
    with pytest.raises(InputError, match=match):
        gpt2.prepare(tokens)


def test_a_one_dimensional_tensor_is_one_sequence(gpt2):
    [batch] = gpt2.prepare(torch.tensor([3, 4, 5]))
    assert batch.tokens.shape == (1, 3)


# ---- activations that overflow ------------------------------------------------------------
def test_overflowing_activations_name_the_first_layer():
    hf = make_hf("gpt2", n_layers=3)
    with torch.no_grad():  # finite weights whose products overflow float32
        hf.transformer.h[1].mlp.c_fc.weight.fill_(1e30)
        hf.transformer.h[1].mlp.c_proj.weight.fill_(1e30)
    model = probekit.load(hf)
    with pytest.raises(NumericalError, match="first in the output of layer 1"):
        probekit.contributions(model, _tokens())


# ---- checkpoint files ---------------------------------------------------------------------
@pytest.fixture()
def checkpoint(tmp_path):
    make_hf("gpt2", n_layers=2).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


@pytest.mark.parametrize("content", ["[1, 2]", "null", '"gpt2"'])
def test_config_json_that_is_not_an_object(checkpoint, content):
    (checkpoint / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match="not an object"):
        probekit.load(checkpoint, device="cpu")


@pytest.mark.parametrize("archs", ["GPT2LMHeadModel", [1], {"a": 1}])
def test_architectures_that_are_not_a_list_of_names(checkpoint, archs):
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = archs
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not a list of class names"):
        probekit.load(checkpoint, device="cpu")


@pytest.mark.parametrize("header", [b"[1, 2]", b"null"])
def test_safetensors_header_that_is_not_an_object(checkpoint, header):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match="corrupt safetensors"):
        probekit.load(checkpoint, device="cpu")


def test_a_fifo_as_weights_is_refused_without_hanging(checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    with pytest.raises(CheckpointError, match="not a regular file"):
        probekit.load(checkpoint, device="cpu")


def test_result_load_of_a_json_list(tmp_path):
    (tmp_path / "r.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not an object"):
        Result.load(tmp_path / "r.json")


# ---- the caller's model -------------------------------------------------------------------
def test_loading_an_in_memory_model_leaves_it_as_it_was(tmp_path):
    hf = make_hf("gpt2", n_layers=2)
    names = [n for n, _ in hf.named_parameters()]
    modules = [type(m).__name__ for m in hf.modules()]
    before = {n: p.clone() for n, p in hf.named_parameters()}
    model = probekit.load(hf, dtype=torch.float64)
    probekit.contributions(model, _tokens())
    assert [n for n, _ in hf.named_parameters()] == names
    assert [type(m).__name__ for m in hf.modules()] == modules
    assert all(torch.equal(p, before[n]) for n, p in hf.named_parameters())
    assert next(hf.parameters()).dtype == torch.float32
    hf.save_pretrained(tmp_path / "again")
    reloaded = probekit.load(tmp_path / "again", device="cpu")
    assert torch.allclose(reloaded.logits(_tokens()), model.logits(_tokens()).float(), atol=1e-5)


def test_copy_model_false_wraps_in_place():
    hf = make_hf("gpt2", n_layers=2)
    model = probekit.load(hf, copy_model=False)
    assert model.hf_model is hf


# ---- configs far bigger than their weights or than memory ---------------------------------
@pytest.mark.parametrize(
    "key, value",
    [("n_layer", 10**9), ("n_embd", 10**6), ("n_positions", 10**12), ("vocab_size", 10**11)],
)
def test_huge_configs_are_refused_before_building(checkpoint, key, value):
    config = json.loads((checkpoint / "config.json").read_text())
    config[key] = value
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="describes about .* parameters but the weights"):
        probekit.load(checkpoint, device="cpu")


def test_a_model_larger_than_memory_is_refused(checkpoint, monkeypatch):
    import probekit.model.checkpoint as model_module

    monkeypatch.setattr(model_module, "available_memory", lambda device: 1000)
    with pytest.raises(CheckpointError, match="GiB are available"):
        probekit.load(checkpoint, device="cpu")


def test_parameter_estimate_is_close_for_real_configs():
    import transformers

    from probekit.model import estimate_parameters

    for config, klass in (
        (transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4), transformers.GPT2LMHeadModel),
        (
            transformers.LlamaConfig(
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=128,
                num_attention_heads=4,
                num_key_value_heads=4,
                tie_word_embeddings=True,
            ),
            transformers.LlamaForCausalLM,
        ),
    ):
        real = sum(p.numel() for p in klass(config).parameters())
        assert 0.8 * real <= estimate_parameters(config.to_dict()) <= real


# ---- intervention and analyzer arguments --------------------------------------------------
@pytest.mark.parametrize("layer", [True, 1.0, "1", None, [0, False]])
def test_interventions_refuse_layers_that_are_not_integers(gpt2, layer):
    from probekit import interventions

    with pytest.raises(InputError, match="not an integer"):
        with interventions.skip_layer(gpt2, layer):
            pass


def test_a_huge_bootstrap_is_refused_before_work(gpt2, monkeypatch):
    monkeypatch.setattr(type(gpt2), "trace", lambda *a, **k: pytest.fail("ran a forward"))
    with pytest.raises(InputError, match="more than 10000 replicates"):
        probekit.layer_swaps(gpt2, _tokens(), n_bootstrap=10**7)
