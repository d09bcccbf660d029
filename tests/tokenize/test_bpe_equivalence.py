"""`tokenize.bpe` gives the ids of `tokenizers` and of `tiktoken` on the same vocabularies.

Three real vocabularies (the embedded model's, Llama 3's, cl100k_base) over the corpus of
`bpe_corpus` and over generated text; and small tokenizers that switch on each
``tokenizer.json`` feature the module supports (prefix space, normalizers, ``Split``
steps, added tokens of every kind, ``ignore_merges``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken, normalizers, pre_tokenizers

from pyagent_ref.tokenize.bpe import BytePairEncoding, normalize

from .bpe_corpus import (
    FRAGMENTS,
    cl100k_config,
    corpus,
    embedded_tokenizer_json,
    llama3_tokenizer_json,
    with_model_flag,
)

Encode = Callable[[str], list[int]]

fragment_text = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=25
).map("".join)


def _hf_pair(tk: tokenizers.Tokenizer) -> tuple[BytePairEncoding, tokenizers.Tokenizer]:
    """Ours, built from ``tk``'s tokenizer.json, and ``tk``."""
    return BytePairEncoding.from_tokenizer_json(json.loads(tk.to_str())), tk


@pytest.fixture(scope="module")
def embedded() -> tuple[BytePairEncoding, tokenizers.Tokenizer]:
    path = embedded_tokenizer_json()
    return BytePairEncoding.from_tokenizer_json(path), tokenizers.Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def llama3() -> tuple[BytePairEncoding, tokenizers.Tokenizer]:
    path = llama3_tokenizer_json()
    return BytePairEncoding.from_tokenizer_json(path), tokenizers.Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def cl100k():
    import tiktoken

    config = cl100k_config()
    ours = BytePairEncoding.from_tiktoken(
        config["mergeable_ranks"], config["pat_str"], config["special_tokens"]
    )
    return ours, tiktoken.Encoding(**config)


def _encoders(vocab: str, request: pytest.FixtureRequest) -> tuple[Encode, Encode]:
    """(ours, the library's) for a vocabulary, both with every special token allowed."""
    ours, theirs = request.getfixturevalue(vocab)
    if vocab == "cl100k":
        return (
            lambda t: ours.encode(t, allowed_special="all"),
            lambda t: theirs.encode(t, allowed_special="all"),
        )
    return (
        lambda t: ours.encode(t, allowed_special="all"),
        lambda t: theirs.encode(t, add_special_tokens=False).ids,
    )


VOCABS = ["embedded", "llama3", "cl100k"]
TEXTS = corpus()


def _first_difference(a: list[int], b: list[int]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    at = min(len(a), len(b)) if at is None else at
    return f"first difference at id {at}: ours {a[at : at + 5]}, library {b[at : at + 5]}"


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("vocab", VOCABS)
def test_corpus_ids_are_identical(vocab, name, request):
    ours, theirs = _encoders(vocab, request)
    a, b = ours(TEXTS[name]), theirs(TEXTS[name])
    assert a == b, _first_difference(a, b)


@pytest.mark.parametrize("vocab", VOCABS)
def test_generated_text_ids_are_identical(vocab, request):
    ours, theirs = _encoders(vocab, request)

    @given(fragment_text)
    def check(text):
        assert ours(text) == theirs(text)

    check()


@pytest.mark.parametrize("vocab", VOCABS)
def test_decode_encode_is_the_identity(vocab, request):
    ours, _ = request.getfixturevalue(vocab)

    @given(st.one_of(st.text(), fragment_text))
    def check(text):
        assert ours.decode(ours.encode(text, allowed_special="all")) == text

    check()


@pytest.mark.parametrize("vocab", VOCABS)
def test_decode_of_any_ids_is_identical(vocab, request):
    """Random ids, most of them cutting characters apart: the same U+FFFD as the library."""
    ours, theirs = request.getfixturevalue(vocab)
    valid = sorted({*ours.vocab.values(), *(t.id for t in ours.added_tokens.values())})

    @given(st.lists(st.sampled_from(valid), max_size=12))
    def check(ids):
        if vocab == "cl100k":
            assert ours.decode(ids) == theirs.decode(ids)
        else:
            assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=False)

    check()


def test_add_special_tokens_follows_the_post_processor(llama3, embedded):
    for ours, hf in (llama3, embedded):
        text = "Hello <|eot_id|> world"
        assert ours.encode(text, allowed_special="all", add_special_tokens=True) == (
            hf.encode(text, add_special_tokens=True).ids
        )
    assert llama3[0].template == ((128000,), ())


@pytest.mark.parametrize("path", [embedded_tokenizer_json, llama3_tokenizer_json])
def test_ignore_merges_is_identical(path):
    """Llama 3's newer tokenizer.json sets ignore_merges: a piece that is a token is kept."""
    source = with_model_flag(path(), ignore_merges=True)
    hf = tokenizers.Tokenizer.from_str(source)
    ours = BytePairEncoding.from_tokenizer_json(json.loads(source))
    assert ours.ignore_merges
    for name in ("stress", "textwrap.py"):
        if name in TEXTS:
            a = ours.encode(TEXTS[name], allowed_special="all")
            b = hf.encode(TEXTS[name], add_special_tokens=False).ids
            assert a == b, _first_difference(a, b)


# ------------------------------------------------------------------------------ features

QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _prefix_space(tk):
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)


def _qwen2_like(tk):
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(QWEN2_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _string_split_and_nfkd(tk):
    tk.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.NFKD()])
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _added_tokens_of_every_kind(tk):
    """Normalized and raw, special and not, with spaces and with byte-level characters."""
    tk.normalizer = normalizers.NFC()
    tk.add_tokens([AddedToken("café", normalized=True), AddedToken("plainé z", normalized=False)])
    tk.add_tokens([AddedToken("nai\u0308f", normalized=True)])  # matched as NFC "naïf"
    tk.add_special_tokens(
        [AddedToken("Ġhi", normalized=False), AddedToken("é x", normalized=False)]
    )
    tk.add_special_tokens([AddedToken("<|im_start|>x", normalized=False)])  # longest wins


VARIANTS = {
    "prefix_space": _prefix_space,
    "qwen2_like": _qwen2_like,
    "string_split_and_nfkd": _string_split_and_nfkd,
    "added_tokens": _added_tokens_of_every_kind,
}
VARIANT_FRAGMENTS = [
    "café",
    "cafe\u0301",
    "plainé z",
    "Ġhi",
    "é x",
    "<|im_start|>x",
    "ǅ",
    "㍿",
    "naïf",
    "nai\u0308f",
]


def _same_in_both_tables(text: str, ours: BytePairEncoding, tk: tokenizers.Tokenizer) -> str:
    """``text`` without the characters whose normal form differs between Python's
    `unicodedata` and the `tokenizers` library: the two use different Unicode versions
    (NFKC differs on 72 characters assigned in Unicode 12.1 to 14, NFC on none)."""
    if tk.normalizer is None:
        return text
    return "".join(
        c for c in text if tk.normalizer.normalize_str(c) == normalize(c, ours.normal_forms)
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tokenizer_json_features_are_identical(variant, bpe):
    tk = tokenizers.Tokenizer.from_str(bpe.to_str())
    VARIANTS[variant](tk)
    ours, hf = _hf_pair(tk)
    text_strategy = st.lists(
        st.one_of(st.sampled_from([*FRAGMENTS, *VARIANT_FRAGMENTS]), st.text(max_size=3)),
        max_size=25,
    ).map("".join)

    @given(text_strategy)
    def check(text):
        text = _same_in_both_tables(text, ours, tk)
        ids = hf.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, allowed_special="all") == ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)

    check()
    every_fragment = "".join([*FRAGMENTS, *VARIANT_FRAGMENTS])
    ids = hf.encode(every_fragment).ids
    assert ours.encode(every_fragment, allowed_special="all") == ids
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)
    stress = _same_in_both_tables(TEXTS["stress"], ours, tk)
    assert ours.encode(stress, allowed_special="all") == hf.encode(stress).ids
