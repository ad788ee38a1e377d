"""The offline byte-level corpus of Python source files."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

import probekit
from probekit.analyses.depth.loss import perplexity
from probekit.errors import ConfigError
from probekit.lm.corpus import EOS, VOCAB_SIZE, ByteCorpus


def test_stdlib_corpus_splits_are_deterministic_and_disjoint():
    a = ByteCorpus(max_files=60)
    b = ByteCorpus(max_files=60)
    assert a.splits == b.splits
    assert not set(a.splits["train"]) & set(a.splits["validation"])
    assert a.splits["validation"]
    stream = a.stream("train")
    assert stream.max() < VOCAB_SIZE and (stream == EOS).sum() >= 1
    seqs = a.sequences("validation", 32, n=4)
    assert seqs.shape == (4, 32) and torch.equal(seqs[0], a.stream("validation")[:32])
    assert torch.equal(a.batch("train", 16, 3, seed=1, step=5), b.batch("train", 16, 3, 1, 5))
    assert not torch.equal(a.batch("train", 16, 3, 1, 5), a.batch("train", 16, 3, 1, 6))


def test_folder_without_text_is_refused(tmp_path):
    (tmp_path / "empty.py").write_text("")
    with pytest.raises(ConfigError, match="no readable text"):
        ByteCorpus(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        ByteCorpus(tmp_path / "missing")


def test_perplexity_matches_plain_cross_entropy():
    corpus = ByteCorpus(max_files=40)
    tokens = corpus.sequences("validation", 16, n=6)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=257,
        eos_token_id=258,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        logits = hf(tokens, use_cache=False).logits
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB_SIZE).double(), tokens[:, 1:].reshape(-1)
    )
    assert perplexity(probekit.load(hf), tokens) == pytest.approx(math.exp(float(ce)), rel=1e-5)
