"""`BPETokenizer` is a drop-in for `HFTokenizer` on byte-level BPE checkpoints, and
`load_tokenizer(backend=...)` picks it."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from pyagent_ref.tokenize import (
    BPETokenizer,
    BytePairEncoding,
    HFTokenizer,
    IncrementalDetokenizer,
    UnsupportedTokenizerError,
    load_tokenizer,
)

from .bpe_corpus import EMBEDDED_MODEL, corpus
from .helpers import id_batches, write_hf_dir

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo 😀 <|end|> wörld"},
]


@pytest.fixture(scope="module")
def pair() -> tuple[BPETokenizer, HFTokenizer]:
    return BPETokenizer.from_pretrained(EMBEDDED_MODEL), HFTokenizer.from_pretrained(EMBEDDED_MODEL)


def test_same_tokenizer_as_hf_on_the_embedded_model(pair):
    ours, hf = pair
    for attr in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "all_special_ids"):
        assert getattr(ours, attr) == getattr(hf, attr), attr
    assert ours.special_tokens_map == hf.special_tokens_map
    assert ours.chat_templates == hf.chat_templates
    assert ours.model_max_length == hf.model_max_length == 1024
    text = corpus()["stress"]
    for add in (True, False):
        assert ours.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add)
    prompt = ours.apply_chat_template(MESSAGES, tokenize=True)
    assert prompt == hf.apply_chat_template(MESSAGES, tokenize=True)
    assert prompt[0] == ours.bos_token_id


@given(ids=st.lists(st.integers(0, 4095), max_size=16), skip=st.booleans())
def test_decode_and_token_strings_match_hf(pair, ids, skip):
    ours, hf = pair
    tokens = ours.convert_ids_to_tokens(ids)
    assert tokens == hf.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens)
    assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    kept = [i for i in ids if not (skip and i in ours.all_special_ids)]
    assert ours.decode(ids, skip) == ours.convert_tokens_to_string(ours.convert_ids_to_tokens(kept))


def test_streamed_text_matches_hf(pair):
    """What the engine streams: the incremental detokenizer gives the same deltas."""
    ours, hf = pair

    @given(id_batches(ours), st.booleans())
    def check(batches, skip):
        a = IncrementalDetokenizer(ours, skip_special_tokens=skip)
        b = IncrementalDetokenizer(hf, skip_special_tokens=skip)
        for batch in batches:
            assert a.add_tokens(batch) == b.add_tokens(batch)
        assert a.finish() == b.finish()

    check()


def test_added_tokens_spelled_and_decoded_like_hf(bpe):
    """Added tokens with a space or with byte-level characters decode as HF decodes them."""
    tk = Tokenizer.from_str(bpe.to_str())
    tk.add_special_tokens([AddedToken(t, normalized=False) for t in ("Ġhi", "é x")])
    tk.add_tokens([AddedToken("plain z", normalized=False)])
    tk.normalizer = normalizers.NFC()
    tk.add_tokens([AddedToken("nai\u0308f", normalized=True)])  # spelled and decoded as NFC
    ours = BPETokenizer(BytePairEncoding.from_tokenizer_json(json.loads(tk.to_str())))
    hf = HFTokenizer(tk)
    text = "aĠhi b é x plain z nai\u0308f"
    ids = ours.encode(text)
    assert ids == hf.encode(text)
    tokens = ours.convert_ids_to_tokens(ids)
    assert tokens == hf.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens)
    assert ours.decode(ids) == hf.decode(ids) == "a hi b é x plain z na\ufffdf"


def test_bad_arguments_are_named(pair):
    ours, _ = pair
    with pytest.raises(ValueError, match=r"ids\[1\] = 4096 is outside the vocabulary range"):
        ours.decode([1, 4096])
    with pytest.raises(ValueError, match=r"ids\[0\] = -1 is outside"):
        ours.convert_ids_to_tokens([-1])
    with pytest.raises(TypeError, match=r"tokens\[0\] must be a str"):
        ours.convert_tokens_to_string([1])
    with pytest.raises(TypeError, match="skip_special_tokens must be a bool"):
        ours.decode([1], skip_special_tokens=None)
    with pytest.raises(UnsupportedTokenizerError, match="'<nope>' is not an added token"):
        BPETokenizer(ours.encoding, special_tokens={"eos_token": "<nope>"})
    with pytest.raises(ValueError, match="unknown name 'boss_token'"):
        BPETokenizer(ours.encoding, special_tokens={"boss_token": "<|bos|>"})


# ------------------------------------------------------------------------------ the loader


def _word_level_dir(path):
    """A tokenizer.json that is not byte-level BPE."""
    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return write_hf_dir(path, tk)


def test_load_tokenizer_backends(tmp_path, bpe):
    assert isinstance(load_tokenizer(EMBEDDED_MODEL), HFTokenizer)
    assert isinstance(load_tokenizer(EMBEDDED_MODEL, backend="library"), HFTokenizer)
    assert isinstance(load_tokenizer(EMBEDDED_MODEL, backend="pyagent"), BPETokenizer)
    assert isinstance(load_tokenizer(EMBEDDED_MODEL, backend="auto"), BPETokenizer)
    word_level = _word_level_dir(tmp_path / "wl")
    assert isinstance(load_tokenizer(word_level, backend="auto"), HFTokenizer)
    with pytest.raises(UnsupportedTokenizerError, match="model type 'WordLevel'"):
        load_tokenizer(word_level, backend="pyagent")
    # a special token that only tokenizer_config.json names: HF adds it, we do not
    extra = write_hf_dir(tmp_path / "extra", bpe, {"eos_token": "<|new|>"})
    assert isinstance(load_tokenizer(extra, backend="auto"), HFTokenizer)
    with pytest.raises(
        UnsupportedTokenizerError, match=re.escape("'<|new|>' is not in tokenizer.json")
    ):
        load_tokenizer(extra, backend="pyagent")
    with pytest.raises(ValueError, match="backend must be one of"):
        load_tokenizer(EMBEDDED_MODEL, backend="fast")
