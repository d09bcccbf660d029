"""Tokenizers shared by the tokenize tests, built once per session from local text."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from pyagent_ref.tokenize import HFTokenizer, TiktokenTokenizer

from .helpers import (
    TIKTOKEN_PATTERN,
    TIKTOKEN_SPECIALS,
    byte_level_ranks,
    train_byte_level_bpe,
)


@pytest.fixture(scope="session")
def bpe() -> Tokenizer:
    """A byte-level BPE trained on multilingual text (emoji, CJK, accents)."""
    return train_byte_level_bpe()


@pytest.fixture(scope="session")
def hf_tok(bpe: Tokenizer) -> HFTokenizer:
    return HFTokenizer(
        bpe,
        special_tokens={"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"},
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],
    )


@pytest.fixture(scope="session")
def tiktoken_tok(bpe: Tokenizer) -> TiktokenTokenizer:
    """The same merges as `bpe`, as a tiktoken encoding with three special tokens."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = byte_level_ranks(bpe)
    specials = {s: len(ranks) + i for i, s in enumerate(TIKTOKEN_SPECIALS)}
    enc = tiktoken.Encoding(
        "local", pat_str=TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )
    return TiktokenTokenizer(enc, eos_token="<|endoftext|>")
