"""A tuned lens belongs to one model: its fingerprint covers every parameter tensor, so a
model differing only in a middle block or only in a LayerNorm weight is refused (issue 31,
item 3: the check sampled only the embedding, the unembedding and the first and last block),
while the same model -- a twin, bfloat16, a change within the dtype's tolerance -- is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import probekit
from probekit.analyses.depth.lens_checks import FINGERPRINT_OF, model_identity
from probekit.analyses.depth.tuned_lens import TunedLens
from probekit.errors import InputError
from tests.conftest import make_hf, twin


@pytest.fixture(scope="module")
def hf():
    return make_hf("gpt2", n_layers=4)


@pytest.fixture(scope="module")
def lens_dir(hf, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lens") / "lens"
    TunedLens.zeros(probekit.load(twin(hf))).save(path)
    return path


def _changed(hf, edit) -> probekit.Model:
    other = twin(hf)
    with torch.no_grad():
        edit(other)
    return probekit.load(other)


CHANGES = {
    "a middle block's MLP": (
        lambda m: m.transformer.h[1].mlp.c_fc.weight.mul_(1.1),
        "transformer.h.1.mlp.c_fc.weight",
    ),
    "a middle block's attention bias": (
        lambda m: m.transformer.h[2].attn.c_proj.bias.add_(0.05),
        "transformer.h.2.attn.o.bias",
    ),
    "a LayerNorm weight": (
        lambda m: m.transformer.h[2].ln_2.weight.mul_(1.5),
        "transformer.h.2.ln_2.weight",
    ),
    "the final LayerNorm's bias": (
        lambda m: m.transformer.ln_f.bias.add_(0.1),
        "transformer.ln_f.bias",
    ),
    "one value of a LayerNorm weight": (
        lambda m: m.transformer.h[1].ln_1.weight[7].mul_(2.0),
        "transformer.h.1.ln_1.weight",
    ),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_a_model_differing_in_one_tensor_is_refused_naming_it(hf, lens_dir, what):
    edit, name = CHANGES[what]
    with pytest.raises(InputError, match="not on this model") as info:
        TunedLens.load(lens_dir, _changed(hf, edit))
    assert f"the weights differ in {name}" in str(info.value)
    assert "Fix:" in str(info.value)


def test_the_same_model_is_accepted_also_in_bfloat16_and_within_tolerance(hf, lens_dir):
    TunedLens.load(lens_dir, probekit.load(twin(hf)))
    TunedLens.load(lens_dir, probekit.load(twin(hf), dtype=torch.bfloat16))

    def nudge(m):  # 1e-5 relative: within float32's tolerance of 1e-3
        for p in m.parameters():
            p.mul_(1 + 1e-5)

    TunedLens.load(lens_dir, _changed(hf, nudge))


def test_every_parameter_tensor_is_fingerprinted(hf):
    model = probekit.load(twin(hf))
    identity = model_identity(model)
    assert identity["fingerprint_of"] == FINGERPRINT_OF
    names = set(identity["fingerprint"])
    for layer in range(4):
        for part in ("ln_1.weight", "ln_1.bias", "ln_2.weight", "mlp.c_fc.weight"):
            assert f"transformer.h.{layer}.{part}" in names
    assert {"embedding", "transformer.ln_f.weight"} <= names
    entry = identity["fingerprint"]["transformer.h.0.ln_1.weight"]
    assert entry["shape"] == [32] and len(entry["values"]) == 32  # a small tensor whole


def test_a_version_2_lens_is_refused_until_re_identified(hf, lens_dir, tmp_path):
    """A version-2 lens fingerprints only the embedding, unembedding, first and last block."""
    folder = tmp_path / "v2"
    folder.mkdir()
    for name in ("config.json", "lens.safetensors"):
        (folder / name).write_bytes((lens_dir / name).read_bytes())
    config = json.loads((folder / "config.json").read_text())
    identity = config["fit_info"]["model_identity"]
    identity.pop("fingerprint_of")
    identity["fingerprint"] = {k: [0.0] * 16 for k in ("embedding", "first block", "last block")}
    config["version"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    model = probekit.load(twin(hf))
    with pytest.raises(InputError, match="only some of its model's weights") as info:
        TunedLens.load(folder, model)
    assert "lens.identify(model)" in str(info.value) and "TunedLens.fit" in str(info.value)
    lens = TunedLens.load(folder)  # readable without a model, for inspection
    lens.identify(model).save(folder)
    TunedLens.load(folder, model)
    assert json.loads((folder / "config.json").read_text())["version"] == 3
