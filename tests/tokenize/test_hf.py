"""HFTokenizer: same ids as transformers on the same files, special tokens, errors."""

from __future__ import annotations

import json
import warnings

import pytest
from tokenizers import Tokenizer

from pyagent_ref.tokenize import HFTokenizer
from pyagent_ref.tokenize import Tokenizer as TokenizerProtocol

from .helpers import CORPUS, with_bos_post_processor, write_hf_dir

TEXTS = [
    "",
    "Hello world",
    " leading and trailing spaces  ",
    "<s>Café 😀<|im_start|>user\n日本語</s>",
    "  <pad> x <|endoftext|>",
    "<new> token ☃ and world",
    "never seen: ∮ Ж ꙮ 🦀",
    *CORPUS,
]


def _padded(bpe: Tokenizer) -> Tokenizer:
    """tokenizer.json with padding and truncation switched on (transformers ignores both)."""
    out = with_bos_post_processor(bpe)
    out.enable_padding(pad_id=5, pad_token="<pad>", length=64)
    out.enable_truncation(max_length=3)
    return out


CONFIGS = {
    "no config file": (lambda bpe: bpe, None),
    "empty config": (lambda bpe: bpe, {}),
    "post-processor adds BOS": (
        with_bos_post_processor,
        {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 2048},
    ),
    # transformers 5 ignores these flags when tokenizer.json exists; so must we.
    "flags without post-processor": (
        lambda bpe: bpe,
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": True},
    ),
    "flag off, post-processor on": (
        with_bos_post_processor,
        {"bos_token": "<s>", "add_bos_token": False},
    ),
    "new special tokens": (
        lambda bpe: bpe,
        {
            "bos_token": {
                "__type": "AddedToken",
                "content": "<new>",
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            },
            "eos_token": "world",  # an ordinary vocabulary token made special
            "additional_special_tokens": ["☃"],
        },
    ),
    "extra_special_tokens (v5 name)": (lambda bpe: bpe, {"extra_special_tokens": ["∮", "<new>"]}),
    "padding and truncation in tokenizer.json": (_padded, {"bos_token": "<s>"}),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_encode_matches_transformers(case, bpe, tmp_path):
    transformers = pytest.importorskip("transformers")
    make, config = CONFIGS[case]
    model_dir = write_hf_dir(tmp_path / "tok", make(bpe), config)
    ours = HFTokenizer.from_pretrained(model_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = transformers.PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    for text in TEXTS:
        for add_special_tokens in (True, False):
            assert ours.encode(text, add_special_tokens=add_special_tokens) == ref.encode(
                text, add_special_tokens=add_special_tokens
            ), (text, add_special_tokens)
    assert ours.bos_token_id == ref.bos_token_id
    assert ours.eos_token_id == ref.eos_token_id
    assert ours.pad_token_id == ref.pad_token_id
    assert ours.vocab_size == len(ref)
    assert set(ref.all_special_ids) <= ours.all_special_ids
    ids = ours.encode(TEXTS[3])
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
            ids, skip_special_tokens=skip
        )


def test_known_ids_and_properties(bpe, tmp_path):
    model_dir = write_hf_dir(
        tmp_path / "tok",
        with_bos_post_processor(bpe),
        {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": 1e30},
    )
    tok = HFTokenizer.from_pretrained(model_dir)
    assert isinstance(tok, TokenizerProtocol)
    assert tok.bos_token_id == bpe.token_to_id("<s>") == 1
    assert tok.eos_token_id == 2
    assert tok.pad_token_id is None
    assert tok.add_bos_token and not tok.add_eos_token
    assert tok.model_max_length is None  # transformers' "unlimited" sentinel
    assert tok.encode("Hello", add_special_tokens=True)[0] == 1
    assert tok.encode("Hello", add_special_tokens=False)[0] != 1
    # Every special token of tokenizer.json is skipped by decode(skip_special_tokens=True).
    assert tok.all_special_ids == frozenset(range(6))
    assert tok.special_tokens_map == {"bos_token": "<s>", "eos_token": "</s>"}


def test_constructor_flags_override_post_processor(bpe):
    tok = HFTokenizer(
        bpe, special_tokens={"bos_token": "<s>", "eos_token": "</s>"}, add_eos_token=True
    )
    assert tok.encode("Hi") == [*bpe.encode("Hi").ids, 2]
    assert tok.add_eos_token and not tok.add_bos_token
    both = HFTokenizer(bpe, special_tokens={"bos_token": "<s>"}, add_bos_token=True)
    assert both.encode("Hi") == [1, *bpe.encode("Hi").ids]
    with pytest.raises(ValueError, match="add_eos_token is True but the tokenizer has no eos"):
        HFTokenizer(bpe, add_eos_token=True)


def test_constructor_does_not_modify_its_argument(bpe):
    before = bpe.to_str()
    HFTokenizer(bpe, special_tokens={"bos_token": "<brand-new>"}, add_bos_token=True)
    assert bpe.to_str() == before


def test_tokens_and_strings_agree_with_decode(hf_tok):
    ids = hf_tok.encode("<|im_start|>naïve 🎉 日本<|im_end|>")
    tokens = hf_tok.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|im_start|>"
    assert hf_tok.convert_tokens_to_string(tokens) == hf_tok.decode(ids)
    kept = [t for t, i in zip(tokens, ids, strict=True) if i not in hf_tok.all_special_ids]
    assert hf_tok.convert_tokens_to_string(kept) == hf_tok.decode(ids, skip_special_tokens=True)
    assert hf_tok.decode(ids, skip_special_tokens=True) == "naïve 🎉 日本"


def test_bad_ids_are_named(hf_tok):
    with pytest.raises(ValueError, match=r"ids\[1\] = -1 is outside the vocabulary"):
        hf_tok.decode([5, -1])
    with pytest.raises(ValueError, match=rf"ids\[0\] = {hf_tok.vocab_size} is outside"):
        hf_tok.convert_ids_to_tokens([hf_tok.vocab_size])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got 'a'"):
        hf_tok.decode(["a"])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got True"):
        hf_tok.decode([True])
    with pytest.raises(TypeError, match="text must be a str"):
        hf_tok.encode(b"bytes")
    with pytest.raises(TypeError, match="add_special_tokens must be a bool"):
        hf_tok.encode("x", add_special_tokens=1)
    with pytest.raises(TypeError, match=r"tokens\[1\] must be a str"):
        hf_tok.convert_tokens_to_string(["a", 3])
    with pytest.raises(ValueError, match="special_tokens: unknown name 'boss_token'"):
        HFTokenizer(Tokenizer.from_str(hf_tok.backend.to_str()), special_tokens={"boss_token": "x"})
    with pytest.raises(TypeError, match="tokenizer must be a tokenizers.Tokenizer"):
        HFTokenizer("tokenizer.json")


def test_missing_or_bad_files(bpe, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        HFTokenizer.from_pretrained(tmp_path / "nope")
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / "tokenizer.model").write_bytes(b"\x00")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json.*sentencepiece"):
        HFTokenizer.from_pretrained(tmp_path / "sp")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="is not a valid tokenizer.json"):
        HFTokenizer.from_pretrained(bad)
    cfg = write_hf_dir(tmp_path / "cfg", bpe)
    (cfg / "tokenizer_config.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        HFTokenizer.from_pretrained(cfg)
    (cfg / "tokenizer_config.json").write_text(json.dumps({"bos_token": 3}), encoding="utf-8")
    with pytest.raises(ValueError, match="bos_token must be a token string"):
        HFTokenizer.from_pretrained(cfg)
