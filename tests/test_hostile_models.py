"""Issue 25: hostile models, lenses, checkpoints and texts end in a correct result or one
ProbekitError naming the problem and the fix (CLI: exit 2, one line, nothing left in --out).

Covered here: a tuned lens of another model, of no recorded model, with NaN translators, with
float ``fit_sequences``, lens folders with a FIFO, a huge config or a non-object ``fit_info``;
sentence-transformers and model configs nested 200,000 deep; gradients that overflow in the
backward of a finite forward (``gradient_norms`` and ``diagnose``); resuming checkpoints that
hold NaN weights; and a ``--text`` file read only as far as the sequences need.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import probekit
from probekit.analyses import gradient_norms
from probekit.analyses.depth.tuned_lens import TunedLens, model_identity, tuned_lens
from probekit.anchor import train
from probekit.errors import CheckpointError, InputError, NumericalError
from probekit.lm import LMConfig, train_lm
from probekit.report import diagnose, write_report
from probekit.sources import TEXT_CHECK_BYTES, check_text_file, text_tokens
from tests.conftest import TINY_LM, make_hf, sample_tokens, tiny_anchor, twin
from tests.test_cli_fuzz import assert_one_error, diagnose_argv, run_cli

DEEP = "[" * 200_000 + "]" * 200_000
"""JSON nested 200,000 deep: Python's parser raises RecursionError on it."""


def _gpt2(seed: int = 0, n_layers: int = 2) -> probekit.Model:
    return probekit.load(make_hf("gpt2", n_layers=n_layers, seed=seed))


@pytest.fixture(scope="module")
def lens_dir(tmp_path_factory) -> Path:
    """A lens fit (3 steps) on the 2-layer GPT-2 of seed 0, saved."""
    path = tmp_path_factory.mktemp("lens") / "lens"
    TunedLens.fit(_gpt2(), sample_tokens(), steps=3, progress=False).save(path)
    return path


def _copy_lens(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("config.json", "lens.safetensors"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


# ---- item 1: a lens carries the identity of its model ------------------------------------------
def test_the_lens_records_its_model_and_is_read_on_that_model(lens_dir):
    model = _gpt2()
    saved = json.loads((lens_dir / "config.json").read_text())
    assert saved["version"] == 3
    assert (
        saved["fit_info"]["model_identity"]["fingerprint"] == model_identity(model)["fingerprint"]
    )
    res = tuned_lens(model, sample_tokens(seed=3), lens=lens_dir)
    assert res.df.value.notna().all()
    # the same weights in bfloat16 are the same model (the fingerprint compares to bf16 rounding)
    half = probekit.load(make_hf("gpt2", n_layers=2), dtype=torch.bfloat16)
    TunedLens.load(lens_dir, half)


@pytest.mark.parametrize("other", ["gpt2 of another seed", "llama of the same shapes"])
def test_a_lens_of_another_model_of_the_same_shapes_is_refused_naming_both(lens_dir, other):
    if other.startswith("gpt2"):
        model = _gpt2(seed=1)
        reason = "the weights differ in the embedding"
    else:
        model = probekit.load(make_hf("llama", n_layers=2))
        reason = "its architecture is"
    assert (model.n_layers, model.d_model, model.d_vocab) == (2, 32, _gpt2().d_vocab)
    with pytest.raises(InputError) as info:
        TunedLens.load(lens_dir, model)
    message = str(info.value)
    assert reason in message and "GPT2LMHeadModel" in message and str(lens_dir) in message
    assert "not on this model" in message and "TunedLens.fit" in message
    assert model.architecture in message.split("not on this model")[1]  # both models named
    lens = TunedLens.load(lens_dir)  # without a model: read, for inspection
    with pytest.raises(InputError, match="not on this model"):
        tuned_lens(model, sample_tokens(), lens=lens)
    with pytest.raises(InputError, match="not on this model"):
        diagnose(model, sample_tokens(), n_bootstrap=0, lens=lens)


def test_a_lens_that_records_no_model_is_refused_with_the_way_to_record_it(lens_dir, tmp_path):
    """Version-1 lenses (saved before lenses recorded their model) are refused, not trusted;
    ``identify`` records the model for a lens known to be fit on it."""
    folder = _copy_lens(lens_dir, tmp_path / "old")
    config = json.loads((folder / "config.json").read_text())
    del config["fit_info"]["model_identity"]
    _edit_config(folder, version=1, fit_info=config["fit_info"])
    model = _gpt2()
    with pytest.raises(InputError, match="records no identity") as info:
        TunedLens.load(folder, model)
    assert "lens.identify(model)" in str(info.value)
    lens = TunedLens.load(folder)
    lens.identify(model)
    lens.save(folder)
    assert TunedLens.load(folder, model).fit_info["model_identity"]["n_layers"] == 2
    with pytest.raises(InputError, match="not on this model"):
        TunedLens.load(folder, _gpt2(seed=1))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_lens_with_a_non_finite_translator_is_refused(lens_dir, tmp_path, value):
    folder = _copy_lens(lens_dir, tmp_path / "bad")
    tensors = load_file(str(folder / "lens.safetensors"))
    tensors["translators.1.weight"][3, 4] = value
    save_file(tensors, str(folder / "lens.safetensors"))
    with pytest.raises(NumericalError, match=r"NaN or infinite values in translators\.1\.weight"):
        TunedLens.load(folder)
    lens = TunedLens.load(lens_dir)
    with torch.no_grad():
        lens.translators[0].bias[0] = value
    with pytest.raises(NumericalError, match=r"translators\.0\.bias"):
        tuned_lens(_gpt2(), sample_tokens(), lens=lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_fit_sequences_of_another_dtype_are_refused_not_counted_as_no_overlap(
    lens_dir, tmp_path, dtype
):
    folder = _copy_lens(lens_dir, tmp_path / "float")
    tensors = load_file(str(folder / "lens.safetensors"))
    tensors["fit_sequences"] = tensors["fit_sequences"].to(dtype)
    save_file(tensors, str(folder / "lens.safetensors"))
    with pytest.raises(CheckpointError, match=f"fit_sequences .* are a {dtype}"):
        TunedLens.load(folder, _gpt2())
    # the int64 hashes count the overlap: the lens read on its own fit data overlaps fully
    res = tuned_lens(_gpt2(), sample_tokens(), lens=lens_dir)
    assert res.meta["overlap_sequences"] == len(sample_tokens()[0])


# ---- item 8: lens folders -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lens.safetensors", "config.json"])
def test_a_fifo_in_a_lens_folder_is_refused_without_blocking(lens_dir, tmp_path, name):
    folder = _copy_lens(lens_dir, tmp_path / "fifo")
    (folder / name).unlink()
    os.mkfifo(folder / name)
    done: list[BaseException] = []

    def read() -> None:
        try:
            TunedLens.load(folder)
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            done.append(err)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # unblock the reader before failing
        with open(folder / name, "wb"):
            pass
        pytest.fail(f"reading a lens whose {name} is a FIFO blocked")
    assert isinstance(done[0], CheckpointError) and "not a regular file" in str(done[0])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(["n_layers", "d_model"]),
    value=st.one_of(
        st.integers(min_value=2**16, max_value=10**18),
        st.integers(max_value=0),
        st.sampled_from([True, 2.5, "3", None, [2], 1e999]),
    ),
)
def test_a_config_declaring_impossible_shapes_is_refused_before_anything_is_built(
    lens_dir, tmp_path, key, value, monkeypatch
):
    folder = tmp_path / "huge"
    if not folder.exists():
        _copy_lens(lens_dir, folder)
    config = json.loads((lens_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))

    def built(*args, **kwargs):
        raise AssertionError("a lens was built")

    monkeypatch.setattr(TunedLens, "__init__", built)
    with pytest.raises(CheckpointError, match="cannot read a tuned lens"):
        TunedLens.load(folder)
    with pytest.raises((CheckpointError, InputError)):
        TunedLens.load(folder, _gpt2())


def test_a_lens_too_big_for_memory_is_refused(lens_dir, tmp_path, monkeypatch):
    from probekit.analyses.depth import lens_checks as module

    monkeypatch.setattr(module, "available_memory", lambda device="cpu": 1000)
    with pytest.raises(CheckpointError, match="more than the .* GiB of memory available"):
        TunedLens.load(lens_dir)


@pytest.mark.parametrize(
    "fit_info, match",
    [([1, 2], "fit_info is a JSON list"), ("x", "fit_info is a JSON str"), (3, "JSON int")],
)
def test_fit_info_that_is_not_an_object_is_refused_by_name(lens_dir, tmp_path, fit_info, match):
    folder = _copy_lens(lens_dir, tmp_path / "info")
    _edit_config(folder, fit_info=fit_info)
    with pytest.raises(CheckpointError, match=match):
        TunedLens.load(folder)


def test_deep_or_broken_lens_configs_are_one_checkpoint_error(lens_dir, tmp_path):
    folder = _copy_lens(lens_dir, tmp_path / "deep")
    (folder / "config.json").write_text(DEEP)
    with pytest.raises(CheckpointError, match="nested too deep"):
        TunedLens.load(folder)
    (folder / "config.json").write_text('{"format": ')
    with pytest.raises(CheckpointError, match="not valid JSON"):
        TunedLens.load(folder)


# ---- the command line: a wrong lens is one line, exit 2, nothing in --out ---------------------
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, lens_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    paths = {}
    for name, hf in (("same", make_hf("gpt2", n_layers=2)), ("other", make_hf("gpt2", 2, 1))):
        hf.save_pretrained(root / name)
        paths[name] = root / name
    blown = make_hf("gpt2", n_layers=2)
    with torch.no_grad():
        blown.transformer.h[0].mlp.c_fc.weight.mul_(1e30)
    blown.save_pretrained(root / "blown")
    paths["blown"] = root / "blown"
    return paths


def test_the_cli_refuses_a_lens_of_another_model_in_one_line(checkpoints, lens_dir, tmp_path):
    out = tmp_path / "report"
    argv = diagnose_argv(checkpoints["other"], out, "--random-tokens", "--lens", str(lens_dir))
    line = assert_one_error(*run_cli(argv)[::2])
    assert "not on this model" in line and "weights differ" in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    fifo = _copy_lens(lens_dir, tmp_path / "fifo")
    (fifo / "lens.safetensors").unlink()
    os.mkfifo(fifo / "lens.safetensors")
    argv = diagnose_argv(checkpoints["same"], out, "--random-tokens", "--lens", str(fifo))
    assert "not a regular file" in assert_one_error(*run_cli(argv)[::2])
    assert not out.exists()


# ---- item 9: configs nested 200,000 deep ---------------------------------------------------------
@pytest.mark.parametrize("which", ["modules.json", "1_Pooling/config.json"])
def test_sentence_transformers_files_nested_deep_are_one_checkpoint_error(tmp_path, which):
    from tests.test_headless import sentence_folder

    folder = sentence_folder(tmp_path)
    (folder / which).write_text(DEEP)
    with pytest.raises(CheckpointError, match=f"{Path(which).name} is not valid JSON.*too deep"):
        probekit.load(folder)


def test_a_model_config_nested_deep_is_one_checkpoint_error(tmp_path):
    make_hf("gpt2", n_layers=2).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(DEEP)
    with pytest.raises(CheckpointError, match="config.json is not valid JSON.*too deep"):
        probekit.load(tmp_path / "m")
    code, _, err = run_cli(diagnose_argv(tmp_path / "m", tmp_path / "r", "--random-tokens"))
    assert "too deep" in assert_one_error(code, err) and not (tmp_path / "r").exists()


# ---- item 2: gradients that overflow in the backward of a finite forward -----------------------
def _blown_gpt2(factor: float = 1e30, dtype: torch.dtype | None = None) -> probekit.Model:
    hf = make_hf("gpt2", n_layers=2)
    with torch.no_grad():
        hf.transformer.h[0].mlp.c_fc.weight.mul_(factor)
    return probekit.load(hf, dtype=dtype)


def test_gradients_that_overflow_name_the_first_layer():
    model = _blown_gpt2()
    logits = model.logits(*sample_tokens())
    assert torch.isfinite(logits).all()  # the forward is finite: only the backward overflows
    with pytest.raises(NumericalError, match="gradients of layer 0 .* forward is finite"):
        gradient_norms(model, sample_tokens())
    before = [(p.grad, p.requires_grad) for p in model.hf_model.parameters()]
    with pytest.raises(NumericalError):
        gradient_norms(model, sample_tokens())
    after = [(p.grad, p.requires_grad) for p in model.hf_model.parameters()]
    assert all(a[0] is b[0] and a[1] == b[1] for a, b in zip(before, after, strict=True))


def test_float16_gradient_overflow_is_named_with_the_dtype_fix():
    model = _blown_gpt2(1e3, dtype=torch.float16)
    try:
        logits = model.logits(*sample_tokens())
    except probekit.ProbekitError:  # pragma: no cover - a torch without float16 on the CPU
        pytest.skip("no float16 forward on this CPU")
    if not torch.isfinite(logits).all():  # pragma: no cover - the forward overflows already
        pytest.skip("the float16 forward overflows before the backward")
    with pytest.raises(NumericalError, match=r"overflows in float16.*--dtype float32"):
        gradient_norms(model, sample_tokens())


def test_a_diagnosis_reports_undefined_gradients_with_the_reason(tmp_path):
    diagnosis = diagnose(_blown_gpt2(), sample_tokens(), n_bootstrap=0)
    assert "gradients" not in diagnosis.results and "contributions" in diagnosis.results
    assert "gradients of layer 0" in diagnosis.not_defined["gradients"]
    write_report(diagnosis, tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "gradients of layer 0" in summary["not_defined"]["gradients"]
    assert "Not defined: the gradients of layer 0" in (tmp_path / "r" / "report.html").read_text()
    assert not (tmp_path / "r" / "gradients.json").exists()
    for name in diagnosis.results:  # every number the report shows is finite
        saved = json.loads((tmp_path / "r" / f"{name}.json").read_text())
        assert "NaN" not in json.dumps(saved["df"]), name


def test_the_cli_says_which_analysis_is_not_defined_in_one_line(checkpoints, tmp_path):
    out = tmp_path / "report"
    code, _, err = run_cli(diagnose_argv(checkpoints["blown"], out, "--random-tokens"))
    assert code == 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if "not defined" in line]
    assert len(lines) == 1 and lines[0].startswith("probekit: warning: gradients not defined")
    assert "not_defined" in json.loads((out / "summary.json").read_text())


# ---- item 3: resuming checkpoints that hold NaN weights -----------------------------------------
def _poison(path: Path, key: str | None = None) -> str:
    tensors = load_file(str(path))
    key = key or next(k for k, v in tensors.items() if v.is_floating_point() and v.ndim == 2)
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, str(path))
    return key


def test_a_finished_anchor_run_with_nan_weights_is_not_resumed(tmp_path):
    out = tmp_path / "run"
    train(tiny_anchor(steps=2, checkpoint_every=2), out, progress=False)
    for folder in ("checkpoint", "checkpoint.previous"):
        if (out / folder / "model.safetensors").exists():
            key = _poison(out / folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"NaN or infinite values in {key}") as info:
        train(tiny_anchor(steps=2, checkpoint_every=2), out, progress=False)
    assert "--no-resume" in str(info.value)
    again = train(tiny_anchor(steps=2, checkpoint_every=2), out, resume=False, progress=False)
    assert again.status == "ok"


def test_an_unfinished_anchor_run_with_nan_weights_falls_back_to_the_previous(
    tmp_path, monkeypatch
):
    from tests.test_training_faults import Killed, kill_at

    out = tmp_path / "run"
    kill_at(monkeypatch, 5)
    with pytest.raises(Killed):
        train(tiny_anchor(), out, progress=False)
    monkeypatch.undo()
    assert (out / "checkpoint.previous").is_dir()
    _poison(out / "checkpoint" / "model.safetensors")
    with pytest.warns(UserWarning, match="NaN or infinite.*previous checkpoint"):
        resumed = train(tiny_anchor(), out, progress=False)
    assert resumed.metrics["step"].max() == 8
    weights = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_an_lm_run_with_nan_weights_falls_back_or_refuses(tmp_path):
    out = tmp_path / "run"
    train_lm(LMConfig(**TINY_LM), out, progress=False, device="cpu")
    key = _poison(out / "final" / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"NaN or infinite values in {key}.*--no-resume"):
        train_lm(LMConfig(**TINY_LM), out, progress=False, device="cpu")
    saved = tmp_path / "saved"
    train_lm(LMConfig(**TINY_LM, save_every=2), saved, progress=False, device="cpu")
    _poison(saved / "final" / "model.safetensors")
    with pytest.warns(UserWarning, match="NaN or infinite.*resuming from .*step2"):
        train_lm(LMConfig(**TINY_LM, save_every=2), saved, progress=False, device="cpu")


# ---- item 10: --text reads only what the sequences need -----------------------------------------
def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")  # pragma: no cover


class _Chars:
    """A stand-in model whose tokenizer maps characters to their code points."""

    n_ctx = 64

    @staticmethod
    def tokenizer(text):
        _Chars.tokenized += len(text)
        return {"input_ids": [ord(c) for c in text]}

    tokenized = 0


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_a_big_text_file_is_read_only_as_far_as_the_sequences_need(tmp_path):
    big = tmp_path / "big.txt"
    line = "the quick brown fox jumps over the lazy dog\n" * 1000
    with open(big, "w") as handle:
        for _ in range(24 * 2**20 // len(line)):  # 24 MB
            handle.write(line)
    size = big.stat().st_size
    start = _bytes_read()
    assert check_text_file(big) is None
    ids = text_tokens("m", _Chars(), big, n_sequences=8, seq_len=64)
    read = _bytes_read() - start
    assert ids.shape == (8, 64)
    assert read <= TEXT_CHECK_BYTES + 3 * 2**20 < size // 4, read
    assert _Chars.tokenized <= 2 * 2**20


def test_a_nul_byte_in_the_part_read_is_refused(tmp_path):
    late = tmp_path / "late.txt"
    late.write_bytes(b"text\n" * (TEXT_CHECK_BYTES // 5 + 10) + b"\0binary")
    assert check_text_file(late) is None  # past the checked start
    with pytest.raises(InputError, match="binary file"):
        text_tokens("m", _Chars(), late, n_sequences=10**6, seq_len=64)
    cut = tmp_path / "cut.txt"
    cut.write_bytes(b"a" * (TEXT_CHECK_BYTES - 1) + "\u00e9".encode() + b"\nmore\n")
    assert check_text_file(cut) is None  # a character cut at the checked end is not an error


def test_twin_models_share_the_fingerprint():
    hf = make_hf("gpt2", n_layers=2)
    a, b = probekit.load(hf), probekit.load(twin(hf))
    assert model_identity(a)["fingerprint"] == model_identity(b)["fingerprint"]


def test_the_train_cli_refuses_to_resume_nan_weights_in_one_line(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--n-layers", "1", "--d-model", "16", "--n-heads", "2"]
    argv += ["--n-train", "128", "--n-test", "32", "--steps", "2", "--batch-size", "16"]
    argv += ["--warmup-steps", "1", "--eval-every", "2", "--checkpoint-every", "2"]
    argv += ["--device", "cpu", "--quiet"]
    code, _, err = run_cli(argv)
    assert code == 0, err
    for folder in ("checkpoint", "checkpoint.previous"):
        if (out / folder / "model.safetensors").exists():
            key = _poison(out / folder / "model.safetensors")
    line = assert_one_error(*run_cli(argv)[::2])
    assert f"NaN or infinite values in {key}" in line and "--no-resume" in line
    code, _, err = run_cli([*argv, "--no-resume"])
    assert code == 0, err
