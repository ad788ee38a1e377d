"""Published tuned lenses: a lens saved by the tuned-lens package loads through
``TunedLens.from_tuned_lens`` and gives the package's own logits at every depth (within 1e-5),
on GPT-2 and Llama toy models with left padding; so does a folder built by hand in the
package's exact format, against a plain-PyTorch reference; and what is not a lens of this
model, or not tensors, is refused before anything runs (a pickle is never executed)."""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import probekit
from probekit.analyses.depth.tuned_lens import TunedLens, as_lens, tuned_lens
from probekit.errors import CheckpointError, InputError, NumericalError, UnsupportedModelError
from probekit.toy import toy_hf_model
from tests import reference as ref
from tests.conftest import twin

N_LAYERS, D_MODEL = 3, 32
ARCHS = ("gpt2", "llama")


def _data() -> dict:
    """Three sequences, two of them padded on the left."""
    tokens = torch.randint(2, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    return {"input_ids": tokens, "attention_mask": mask}


def _right_padded(data: dict) -> dict:
    """The same sequences padded on the right: a plain HF forward numbers the positions of a
    left-padded row from its padding, probekit (like right padding) from its first real token."""
    rows = [int((m == 0).sum()) for m in data["attention_mask"]]
    roll = lambda x: torch.stack([r.roll(-n) for r, n in zip(x, rows, strict=True)])  # noqa: E731
    return {key: roll(value) for key, value in data.items()}


def _probekit_logits(model: probekit.Model, lens: TunedLens, data: dict) -> list[torch.Tensor]:
    """probekit's lens logits at every depth 0..L, at the real tokens."""
    (batch,) = model.prepare(data, None)
    trace = model.trace(batch)
    with torch.no_grad():
        return [
            lens.logits(model, d, trace.residuals[d])[batch.valid].float()
            for d in range(model.n_layers + 1)
        ]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], mask: torch.Tensor) -> None:
    assert len(got) == len(want) == N_LAYERS + 1
    for depth, (a, b) in enumerate(zip(got, want, strict=True)):
        diff = float((a - b[mask.bool()].float()).abs().max())
        assert diff <= 1e-5, f"depth {depth}: {diff}"


# ---- a lens written by the tuned-lens package itself ----------------------------------------
@pytest.fixture
def package(monkeypatch):
    """The tuned-lens package's lens class (the package is in the dev extra). Its 0.1/0.2
    ``model_surgery`` tests ``isinstance(model, transformer_lens.HookedTransformer)``, a class
    TransformerLens 4 (a probekit requirement) removed; the package's own switch for "no
    TransformerLens" turns that branch off."""
    from tuned_lens import model_surgery as package_surgery
    from tuned_lens.nn.lenses import TunedLens as PackageLens

    monkeypatch.setattr(package_surgery, "_transformer_lens_available", False)
    return PackageLens


def _package_lens(package, hf, folder: Path, seed: int = 0):
    """A lens made and saved by the package for ``hf``, its translators drawn at random (an
    untrained lens is the logit lens, which would hide a wrong layer mapping)."""
    lens = package.from_model(hf)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lens.layer_translators.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    lens.save(folder)
    return lens


@pytest.mark.parametrize("arch", ARCHS)
def test_a_lens_saved_by_the_package_gives_its_outputs_at_every_layer(arch, package, tmp_path):
    hf = toy_hf_model(arch, n_layers=N_LAYERS, d_model=D_MODEL)
    plain = twin(hf)
    package_lens = _package_lens(package, plain, tmp_path / "lens")
    data = _data()
    with torch.no_grad():
        out = plain(**_right_padded(data), output_hidden_states=True, use_cache=False)
        want = [package_lens(out.hidden_states[i], idx=i) for i in range(N_LAYERS)]
    model = probekit.load(hf)
    lens = TunedLens.from_tuned_lens(tmp_path / "lens", model)
    got = _probekit_logits(model, lens, data)
    _assert_close(got, [*want, out.logits], _right_padded(data)["attention_mask"])
    # the files are the package's: they also load through its own reader
    again = package.from_model_and_pretrained(plain, str(tmp_path / "lens"))
    theirs, mine = again.layer_translators.parameters(), lens.translators.parameters()
    for a, b in zip(theirs, mine, strict=True):
        assert torch.equal(a, b)


def test_a_package_folder_is_read_wherever_a_lens_folder_is(package, tmp_path):
    """tuned_lens(lens=folder), and so diagnose --lens, read a package folder too."""
    hf = toy_hf_model("gpt2", n_layers=N_LAYERS, d_model=D_MODEL)
    _package_lens(package, twin(hf), tmp_path / "lens")
    model = probekit.load(hf)
    lens = TunedLens.from_tuned_lens(tmp_path / "lens", model)
    routed = as_lens(tmp_path / "lens", model)
    assert torch.equal(routed.translators[1].weight, lens.translators[1].weight)
    by_folder = tuned_lens(model, _data(), lens=str(tmp_path / "lens"), positions="last")
    by_lens = tuned_lens(model, _data(), lens=lens, positions="last")
    assert by_folder.df.equals(by_lens.df)
    lens.save(tmp_path / "probekit")  # saved in probekit's format, it reads back as usual
    assert TunedLens.load(tmp_path / "probekit", model).fit_info["source"] == "tuned-lens package"


@pytest.mark.slow  # a whole diagnosis (~5 s); the default suite checks the routing by as_lens
def test_diagnose_reads_a_package_lens_given_with_lens(tmp_path):
    """``probekit diagnose CHECKPOINT --lens FOLDER`` reads a package lens made for it."""
    from probekit.cli import main

    checkpoint = tmp_path / "gpt2"
    toy_hf_model("gpt2", n_layers=N_LAYERS, d_model=D_MODEL).save_pretrained(checkpoint)
    hf = type(toy_hf_model("gpt2")).from_pretrained(checkpoint)  # named by its folder
    assert hf.config.name_or_path == str(checkpoint)
    folder = write_package_folder(tmp_path / "lens", hf, random_params())
    out = tmp_path / "report"
    argv = ["diagnose", str(checkpoint), "--out", str(out), "--lens", str(folder)]
    argv += ["--n-sequences", "2", "--seq-len", "6", "--bootstrap", "0", "--device", "cpu"]
    assert main([*argv, "--no-images", "--quiet"]) == 0
    tuned = json.loads((out / "tuned_lens.json").read_text())
    assert tuned["meta"]["fit_data"] is None  # read, not fitted: no fit data recorded
    assert (
        "tuned_lens_formed_at_depth" in json.loads((out / "summary.json").read_text())["headline"]
    )


# ---- a folder built by hand in the package's exact format -----------------------------------
def package_unembed_hash(hf) -> str:
    """The package's ``unembed_hash`` of ``hf`` (``Unembed.unembedding_hash``)."""
    return package_unembed_hash_of(hf.get_output_embeddings().weight)


@pytest.mark.parametrize(
    "shape, scale",
    [((50, 32), 0.02), ((300, 64), 1.0), ((7, 200), 3.0), ((1000, 1), 1.0), ((3, 500), 50.0)],
)
def test_the_unembedding_hash_is_the_packages(shape, scale):
    """Hashing the corners only gives the package's hash of the whole printed matrix."""
    from probekit.analyses.depth.tuned_lens_files import unembedding_hash

    g = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(shape, generator=g) * scale
    weight[-1, -1] = -123.456  # a wide number in a corner widens every printed column
    full = hashlib.sha256(str.encode(np.array_str(weight.numpy(), precision=1))).hexdigest()
    assert unembedding_hash(weight) == full
    assert unembedding_hash(weight.bfloat16()) == package_unembed_hash_of(weight.bfloat16())


def package_unembed_hash_of(weight: torch.Tensor) -> str:
    """tuned_lens.utils.tensor_hash (0.2.0) of a matrix, written out."""
    values = weight.detach().cpu().float().numpy()
    return hashlib.sha256(str.encode(np.array_str(values, precision=1))).hexdigest()


def write_package_folder(folder: Path, hf, params: dict, **config_changes) -> Path:
    """A lens folder as tuned-lens 0.2.0's ``TunedLens.save`` writes it (nn/lenses.py):
    ``config.json`` = ``TunedLensConfig.to_dict()`` (base_model_name_or_path, d_model,
    num_hidden_layers, bias, base_model_revision, unembed_hash, lens_type) and ``params.pt`` =
    ``torch.save(layer_translators.state_dict())`` ("{i}.weight", "{i}.bias")."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "base_model_name_or_path": hf.config.name_or_path,
        "d_model": hf.config.hidden_size,
        "num_hidden_layers": hf.config.num_hidden_layers,
        "bias": True,
        "base_model_revision": None,
        "unembed_hash": package_unembed_hash(hf),
        "lens_type": "linear_tuned_lens",
    }
    (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
    torch.save(OrderedDict(params), folder / "params.pt")
    return folder


def random_params(n_layers: int = N_LAYERS, d: int = D_MODEL, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(n_layers):
        out[f"{i}.weight"] = torch.randn(d, d, generator=g) * 0.2
        out[f"{i}.bias"] = torch.randn(d, generator=g) * 0.2
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_a_hand_built_folder_gives_the_plain_reference(arch, tmp_path):
    hf = toy_hf_model(arch, n_layers=N_LAYERS, d_model=D_MODEL)
    plain, params, data = twin(hf), random_params(), _data()
    folder = write_package_folder(tmp_path / "lens", plain, params)
    right = _right_padded(data)
    want = ref.package_lens_logits(plain, arch, right["input_ids"], right["attention_mask"], params)
    model = probekit.load(hf)
    got = _probekit_logits(model, TunedLens.from_tuned_lens(folder, model), data)
    _assert_close(got, want, right["attention_mask"])


def test_a_safetensors_copy_and_half_precision_translators_are_read(tmp_path):
    from safetensors.torch import save_file

    hf = toy_hf_model("gpt2", n_layers=N_LAYERS, d_model=D_MODEL)
    params = random_params()
    folder = write_package_folder(tmp_path / "lens", twin(hf), params)
    model = probekit.load(hf)
    want = TunedLens.from_tuned_lens(folder, model)
    (folder / "params.pt").unlink()
    save_file(params, str(folder / "params.safetensors"))
    copy = TunedLens.from_tuned_lens(folder, model)
    assert all(torch.equal(a, b) for a, b in zip(want.parameters(), copy.parameters(), strict=True))
    half = {k: v.half() for k, v in params.items()}
    folder = write_package_folder(tmp_path / "half", twin(hf), half)
    lens = TunedLens.from_tuned_lens(folder, model)
    assert lens.translators[0].weight.dtype == torch.float32
    assert torch.equal(lens.translators[0].weight, half["0.weight"].float())


# ---- refusals ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf():
    return toy_hf_model("gpt2", n_layers=N_LAYERS, d_model=D_MODEL)


@pytest.fixture(scope="module")
def model(hf):
    return probekit.load(twin(hf))


def test_a_lens_of_another_model_is_refused_naming_the_difference(hf, model, tmp_path):
    deeper = toy_hf_model("gpt2", n_layers=N_LAYERS + 1, d_model=D_MODEL)
    folder = write_package_folder(tmp_path / "a", deeper, random_params(N_LAYERS + 1))
    with pytest.raises(InputError, match="num_hidden_layers=4, d_model=32; this") as info:
        TunedLens.from_tuned_lens(folder, model)
    assert "Fix:" in str(info.value)
    other = toy_hf_model("gpt2", n_layers=N_LAYERS, d_model=D_MODEL, seed=5)  # same shapes
    folder = write_package_folder(tmp_path / "b", other, random_params())
    with pytest.raises(InputError, match="unembedding differs"):
        TunedLens.from_tuned_lens(folder, model)
    llama = toy_hf_model("llama", n_layers=N_LAYERS, d_model=D_MODEL)
    folder = write_package_folder(tmp_path / "c", llama, random_params())
    with pytest.raises(InputError, match="unembedding differs"):
        TunedLens.from_tuned_lens(folder, model)


def test_a_lens_named_for_another_model_is_refused_unless_told(hf, model, tmp_path):
    folder = tmp_path / "named"
    write_package_folder(folder, hf, random_params(), base_model_name_or_path="gpt2-xl")
    with pytest.raises(InputError, match="made for 'gpt2-xl'") as info:
        TunedLens.from_tuned_lens(folder, model)
    assert "check_name=False" in str(info.value)
    TunedLens.from_tuned_lens(folder, model, check_name=False)  # the unembedding still matches
    write_package_folder(folder, hf, random_params(), unembed_hash=None)  # nothing to go by
    with pytest.raises(InputError, match="records neither"):
        TunedLens.from_tuned_lens(folder, model)


def test_a_headless_model_is_refused(tmp_path):
    base = toy_hf_model("gpt2", n_layers=N_LAYERS, d_model=D_MODEL).transformer
    folder = write_package_folder(tmp_path / "lens", toy_hf_model("gpt2"), random_params())
    with pytest.raises(UnsupportedModelError):
        TunedLens.from_tuned_lens(folder, probekit.load(base))


def _with(params: dict, **changes) -> dict:
    out = {**params, **changes}
    return {k: v for k, v in out.items() if v is not None}


BAD_TENSORS = {
    "a missing translator": (_with(random_params(), **{"2.bias": None}), "missing \\['2.bias'\\]"),
    "an extra tensor": (_with(random_params(), **{"3.weight": torch.zeros(32, 32)}), "unexpected"),
    "a wrong shape": (
        _with(random_params(), **{"1.weight": torch.zeros(32, 33)}),
        "shape \\(32, 33\\), not \\(32, 32\\)",
    ),
    "an integer tensor": (
        _with(random_params(), **{"0.bias": torch.zeros(32, dtype=torch.long)}),
        "torch.int64 tensor, not a dense floating-point",
    ),
}


@pytest.mark.parametrize("what", list(BAD_TENSORS))
def test_tensors_unlike_the_packages_are_refused(hf, model, tmp_path, what):
    params, message = BAD_TENSORS[what]
    folder = write_package_folder(tmp_path / "lens", hf, params)
    with pytest.raises(CheckpointError, match=message):
        TunedLens.from_tuned_lens(folder, model)


def test_non_finite_translators_are_refused(hf, model, tmp_path):
    params = random_params()
    params["1.weight"][3, 4] = float("nan")
    folder = write_package_folder(tmp_path / "lens", hf, params)
    with pytest.raises(NumericalError, match="translators.1.weight"):
        TunedLens.from_tuned_lens(folder, model)


class _Armed:
    """Unpickling it calls ``open(path, "w")``: creates a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("how", ["torch.save", "pickle.dump"])
def test_a_pickle_that_would_run_code_is_refused_without_running_it(hf, model, tmp_path, how):
    marker = tmp_path / "created_by_the_pickle"
    folder = write_package_folder(tmp_path / "lens", hf, random_params())
    params = {**random_params(), "0.weight": _Armed(marker)}
    with (folder / "params.pt").open("wb") as f:
        torch.save(params, f) if how == "torch.save" else pickle.dump(params, f, protocol=2)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="other than tensors .* was not run") as info:
        TunedLens.from_tuned_lens(folder, model)
    assert "weights_only=True" in str(info.value)
    assert not marker.exists()
    if how == "torch.save":  # the pickle is armed: an unrestricted load would have run it
        torch.load(folder / "params.pt", weights_only=False)
        assert marker.exists()


def test_not_a_mapping_of_tensors_is_refused(hf, model, tmp_path):
    folder = write_package_folder(tmp_path / "lens", hf, random_params())
    torch.save(list(random_params().values()), folder / "params.pt")
    with pytest.raises(CheckpointError, match="not hold a mapping of names to tensors"):
        TunedLens.from_tuned_lens(folder, model)


def test_missing_files_and_bad_configs_are_refused(hf, model, tmp_path):
    folder = write_package_folder(tmp_path / "lens", hf, random_params())
    (folder / "params.pt").unlink()
    with pytest.raises(CheckpointError, match="holds no params.pt"):
        TunedLens.from_tuned_lens(folder, model)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        TunedLens.from_tuned_lens(folder, model)
    with pytest.raises(CheckpointError, match="not a folder"):
        TunedLens.from_tuned_lens(tmp_path / "nowhere", model)
    bad = {
        "d_model": ("32", "d_model '32' is not a whole number"),
        "lens_type": ("mlp_tuned_lens", "lens_type 'mlp_tuned_lens' is not"),
        "bias": ("yes", "bias 'yes' is not true or false"),
    }
    for key, (value, message) in bad.items():
        write_package_folder(tmp_path / key, hf, random_params(), **{key: value})
        with pytest.raises(CheckpointError, match=message):
            TunedLens.from_tuned_lens(tmp_path / key, model)
    old = write_package_folder(tmp_path / "old", hf, random_params())
    config = json.loads((old / "config.json").read_text())
    config["num_layers"] = config.pop("num_hidden_layers")
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="0.0.x format"):
        TunedLens.from_tuned_lens(old, model)
