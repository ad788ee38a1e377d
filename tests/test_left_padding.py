"""Left-padded batches (a left-padding tokenizer's output) give the numbers of the same text
padded on the right, for absolute-position (GPT-2) and rotary (Llama) models."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import probekit
from probekit.toy import toy_hf_model

TEXTS = ["w3 w7 w1 w9 w4 w2", "w5 w5 w8", "w2 w6 w1 w3"]


def padded_tokenizer(side: str) -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(10)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", padding_side=side
    )


def padded_texts(side: str) -> dict:
    return dict(padded_tokenizer(side)(TEXTS, padding=True, return_tensors="pt"))


@pytest.mark.parametrize("arch", ["gpt2", "llama", "post_ln_paper"])
def test_left_padding_gives_the_numbers_of_right_padding(arch):
    left, right = padded_texts("left"), padded_texts("right")
    assert not torch.equal(left["attention_mask"], right["attention_mask"])  # really left
    model = probekit.load(toy_hf_model(arch, n_layers=3))
    for analyzer in (probekit.contributions, probekit.residual_stats, probekit.logit_lens):
        a, b = analyzer(model, left), analyzer(model, right)
        assert a.df.equals(b.df), analyzer.__name__
        assert a.summary == b.summary or str(a.summary) == str(b.summary)
    last_left = probekit.contributions(model, left, positions="last")
    last_right = probekit.contributions(model, right, positions="last")
    assert last_left.df.equals(last_right.df)
