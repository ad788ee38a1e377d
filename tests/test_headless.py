"""Base models without an LM head and sentence-transformers folders (issue 9): load, their
output (final hidden state / pooled embedding), hidden-space measures against a plain-HF
reference, refusals of the vocabulary-bound analyses, bad input."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import warnings

import pytest
import torch
import transformers

import probekit
from probekit.analyses import contributions, gradient_norms, layer_swaps, logit_lens, skip_effects
from probekit.errors import CheckpointError, ProbekitError, UnsupportedModelError
from probekit.model.headless import head_class_for
from probekit.report import diagnose
from tests import reference as ref
from tests.conftest import FAMILIES, VOCAB, family_tokens, hf_config, make_family


def _close(got, want):
    got, want = got.double(), want.double()
    return bool((got - want).abs().max() <= 1e-5 * max(1.0, float(want.abs().max())))


def base_model(family: str, n_layers: int = 3, seed: int = 0):
    """A tiny random base model (no head) of ``family``."""
    config = hf_config(family, n_layers)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.AutoModel.from_config(config).eval()


def sentence_folder(tmp_path, mode: str = "mean", normalize: bool = True, family: str = "bert"):
    """A sentence-transformers folder written by hand: the base model at the root, modules.json,
    1_Pooling/config.json and optionally a Normalize module."""
    folder = tmp_path / f"st-{mode}"
    base_model(family).save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    flags = {
        "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": mode == "lasttoken",
    }
    config = {"word_embedding_dimension": 32, **flags, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return folder


def padded_tokens():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, VOCAB, (4, 8), generator=g)
    mask = torch.ones_like(tokens)
    mask[1, 5:] = 0
    mask[3, 3:] = 0
    return tokens * mask, mask


def test_head_class_comes_from_the_auto_mappings():
    assert head_class_for("GPT2Model") == "GPT2LMHeadModel"
    assert head_class_for("LlamaModel") == "LlamaForCausalLM"
    assert head_class_for("Qwen2Model") == "Qwen2ForCausalLM"
    assert head_class_for("BertModel") == "BertForMaskedLM"
    assert head_class_for("RobertaModel") == "RobertaForMaskedLM"
    assert head_class_for("NotAModel") is None


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert"])
def test_base_model_output_is_its_last_hidden_state(family):
    base = base_model(family)
    model = probekit.load(base)
    assert model.output_kind == "hidden" and model.architecture == type(base).__name__
    assert model.is_causal == (family != "bert")
    tokens, mask = padded_tokens()
    [batch] = model.prepare((tokens, mask))
    got = model.forward(batch)
    want = ref.last_hidden(base, tokens, mask)
    real = mask.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)
    # the wrapper's head is never random: every weight outside the base model is zero or the
    # (tied) token embedding
    embedding = base.get_input_embeddings().weight
    base_ids = {id(p) for p in model.hf_model.base_model.parameters()}
    for name, param in model.hf_model.named_parameters():
        if id(param) not in base_ids:
            assert param is embedding or not bool(param.any()), name


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_contributions_match_a_plain_reference(family):
    base = base_model(family)
    tokens, mask = padded_tokens()
    res = contributions(probekit.load(base), (tokens, mask), components=["layer"])
    assert res.summary["measure"] == "rel_l2" and "hidden state" in res.summary["output"]
    assert set(res.df.measure) == {"rel_l2", "cos_dist"}
    clean = ref.last_hidden(base, tokens, mask)
    for layer in range(3):
        changed = ref.last_hidden(ref.base_without_layer(base, layer), tokens, mask)
        want = ref.mean_over(ref.relative_changes(clean, changed), mask.bool())
        got = res.profile("rel_l2")[layer]
        assert got == pytest.approx(float(want), rel=1e-4), layer
    assert 0 <= res.summary["second_half_share"] <= 1


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken"])
def test_sentence_transformers_folder_pools_as_configured(tmp_path, mode):
    folder = sentence_folder(tmp_path, mode, normalize=mode == "mean")
    model = probekit.load(folder, device="cpu")
    assert model.output_kind == "embedding" and mode in model.output_description
    base = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokens, mask = padded_tokens()
    [batch] = model.prepare((tokens, mask))
    got = model.pool(model.forward(batch), batch.attention_mask)
    want = ref.pooled(ref.last_hidden(base, tokens, mask), mask, mode, mode == "mean")
    assert torch.allclose(got, want, atol=1e-5)
    if mode == "mean":
        assert torch.allclose(got.norm(dim=-1), torch.ones(4), atol=1e-5)
        res = contributions(model, (tokens, mask), components=["layer"])
        clean = ref.pooled(ref.last_hidden(base, tokens, mask), mask, mode, True)
        for layer in range(3):
            hidden = ref.last_hidden(ref.base_without_layer(base, layer), tokens, mask)
            changed = ref.pooled(hidden, mask, mode, True)
            want_change = ref.relative_changes(clean, changed).mean()  # per sequence
            assert res.profile("rel_l2")[layer] == pytest.approx(float(want_change), rel=1e-4)


def test_skips_swaps_and_diagnose_use_hidden_measures():
    model = probekit.load(base_model("llama"))
    tokens, mask = padded_tokens()
    skips = skip_effects(model, (tokens, mask))
    swaps = layer_swaps(model, (tokens, mask), n_bootstrap=3)
    for res in (skips, swaps):
        assert res.summary["measure"] == "rel_l2"
    assert (skips.output_effect() > 0).all()
    assert swaps.summary["tolerance"] == 0.02
    diagnosis = diagnose(model, (tokens, mask), n_bootstrap=2)
    assert "logit_lens" not in diagnosis.results and "gradients" not in diagnosis.results
    assert diagnosis.headline["measure"] == "rel_l2"
    assert "final hidden state" in diagnosis.verdict[0]


@pytest.mark.parametrize("analysis", [logit_lens, gradient_norms])
def test_vocabulary_analyses_are_refused(analysis):
    model = probekit.load(base_model("gpt2"))
    with pytest.raises(UnsupportedModelError, match="without an LM head"):
        analysis(model, padded_tokens())
    with pytest.raises(UnsupportedModelError, match="without an LM head"):
        model.unembedding  # noqa: B018


def test_neither_checkpoint_kind_is_one_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="neither a transformers checkpoint"):
        probekit.load(tmp_path)


def test_unknown_pooling_mode_is_one_error(tmp_path):
    folder = sentence_folder(tmp_path)
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    config["pooling_mode_mean_tokens"] = False
    config["pooling_mode_magic"] = True
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unknown pooling mode"):
        probekit.load(folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "median"}))
    with pytest.raises(CheckpointError, match="median"):
        probekit.load(folder)


def test_unread_modules_are_refused(tmp_path):
    folder = sentence_folder(tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append(
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModelError, match="Dense"):
        probekit.load(folder)


def test_dtype_the_device_cannot_run_is_one_error(monkeypatch):
    """A forward torch cannot run in the dtype ('not implemented for Half') is one error
    naming the fix, raised at load."""
    model = base_model("gpt2")
    original = torch.nn.Embedding.forward

    def refuse(self, x):
        if self.weight.dtype == torch.float16:
            raise RuntimeError("\"embedding\" not implemented for 'Half'")
        return original(self, x)

    monkeypatch.setattr(torch.nn.Embedding, "forward", refuse)
    with pytest.raises(ProbekitError, match="cannot run this model in torch.float16"):
        probekit.load(model, dtype=torch.float16)


@pytest.mark.parametrize("bad", ["neither", pytest.param("pooling", marks=pytest.mark.slow)])
def test_cli_bad_folders_exit_2_and_write_nothing(tmp_path, bad):
    if bad == "neither":
        folder = tmp_path / "empty"
        folder.mkdir()
        (folder / "notes.txt").write_text("hello")
    else:
        folder = sentence_folder(tmp_path)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "median"}))
    out = tmp_path / "report"
    with warnings.catch_warnings():
        proc = subprocess.run(
            [sys.executable, "-m", "probekit", "diagnose", str(folder), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Fix:" in proc.stderr
    assert not out.exists()


def _word_tokenizer(folder, padding_side: str = "left", pad: bool = True):
    """A tiny BERT-style word tokenizer ([CLS] text [SEP]), saved into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c", "d", "e"]
    vocab = {w: i for i, w in enumerate(words)}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    extra = {"pad_token": "[PAD]"} if pad else {}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=inner,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        padding_side=padding_side,
        **extra,
    )
    tok.save_pretrained(folder)
    return tok


def test_text_uses_the_checkpoints_tokenizer_right_padded(tmp_path):
    folder = sentence_folder(tmp_path, "cls", normalize=False)
    _word_tokenizer(folder, padding_side="left")
    model = probekit.load(folder, device="cpu")
    batch = model.tokenize(["a b c d", "e"])
    assert batch.tokens.tolist() == [[2, 4, 5, 6, 7, 3], [2, 8, 3, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert model.tokenizer.padding_side == "left"  # the tokenizer itself is left as it was
    [prepared] = model.prepare(batch)
    base = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    hidden = ref.last_hidden(base, batch.tokens, batch.attention_mask)
    got = model.pool(model.forward(prepared), prepared.attention_mask)
    assert torch.allclose(got, hidden[:, 0], atol=1e-5)  # CLS pooling reads [CLS] per text
    assert (
        model.tokenize(["a b c d e a b c d e a b c d e a b c"], max_length=5).tokens.shape[1] == 5
    )


def test_tokenizer_pads_with_an_id_in_the_vocabulary(tmp_path):
    folder = tmp_path / "gpt2"
    base_model("gpt2").save_pretrained(folder)
    _word_tokenizer(folder, padding_side="right", pad=False)
    model = probekit.load(folder, device="cpu")
    before = model.tokenizer.pad_token  # the bridge may have set one (to its EOS)
    batch = model.tokenize(["a b", "c"])
    assert batch.tokens.tolist() == [[2, 4, 5, 3], [2, 6, 3, 1]]  # padded with an id < vocab
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert model.tokenizer.pad_token == before


def test_text_windows_each_carry_the_special_tokens(tmp_path):
    from probekit.sources import check_checkpoint_folder, text_tokens

    folder = sentence_folder(tmp_path, "cls", normalize=False)
    _word_tokenizer(folder, padding_side="left")
    model = probekit.load(folder, device="cpu")
    text = tmp_path / "t.txt"
    text.write_text(" ".join("abcde" * 3))  # 15 words: three windows of four between [CLS] [SEP]
    ids = text_tokens(folder, model, text, n_sequences=3, seq_len=6)
    assert ids.shape == (3, 6)
    assert ids[:, 0].tolist() == [2, 2, 2] and ids[:, -1].tolist() == [3, 3, 3]  # [CLS] ... [SEP]
    assert ids[0, 1:5].tolist() == [4, 5, 6, 7] and ids[1, 1:5].tolist() == [8, 4, 5, 6]
    assert text_tokens(folder, model, text, 2, 6, after=True)[0, 1:5].tolist() == [7, 8, 4, 5]
    with pytest.raises(ProbekitError, match="special tokens"):
        text_tokens(folder, model, text, 3, 2)
    (folder / "config.json").rename(folder / "moved.json")  # the old layout keeps it in a subfolder
    check_checkpoint_folder(folder)  # modules.json marks the folder as a checkpoint of its own


HEADLESS_FAST = ("gpt2", "gpt_neox", "llama", "bert")
"""Families whose base model runs in the default suite; the others run with ``-m slow``."""


@pytest.mark.parametrize(
    "name",
    [n if n in HEADLESS_FAST else pytest.param(n, marks=pytest.mark.slow) for n in FAMILIES],
)
def test_every_family_loads_headless_and_matches_deleted_layers(name):
    """The base model (no head) of every family of the architecture table: its output is its
    last_hidden_state, and the whole-layer rel_l2 of contributions equals the plain model
    with the layer physically deleted."""
    base = copy.deepcopy(make_family(name).base_model).eval()
    model = probekit.load(base)
    assert model.output_kind == "hidden"
    tokens, mask = family_tokens()
    real = mask.bool()
    [batch] = model.prepare((tokens, mask))
    clean = ref.last_hidden(base, tokens, mask)
    assert _close(model.forward(batch)[real], clean[real])
    res = contributions(model, (tokens, mask), components=["layer"])
    for layer in (0, model.n_layers - 1):
        changed = ref.last_hidden(ref.base_without_layer(base, layer), tokens, mask)
        want = float(ref.mean_over(ref.relative_changes(clean, changed), real))
        assert res.profile("rel_l2")[layer] == pytest.approx(want, rel=1e-4, abs=1e-7), layer
