"""`pyagent_accel.tokenize.bpe` gives the reference's ids, text and errors (PEP 399).

The reference is checked against `tokenizers` and `tiktoken` in `test_bpe_equivalence`;
here the Rust twin is checked against the reference: the corpus on the three real
vocabularies, generated text (differential and round trip), every ``tokenizer.json``
feature (the normalizing encodings take the Python path for steps 1-2), `encode_batch`,
and the class and message of every error. With PYAGENT_REQUIRE_ACCEL=1 a missing
accelerator is an error, not a skip.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.tokenize import bpe as ref

from .bpe_corpus import cl100k_config, corpus, embedded_tokenizer_json, llama3_tokenizer_json
from .test_bpe_equivalence import FRAGMENTS, VARIANT_FRAGMENTS, VARIANTS, fragment_text


def _accel():
    try:
        return importlib.import_module("pyagent_accel.tokenize.bpe")
    except ImportError as exc:
        if os.environ.get("PYAGENT_REQUIRE_ACCEL") == "1":
            raise
        pytest.skip(f"pyagent_accel is not installed: {exc}")


accel = pytest.fixture(scope="module")(lambda: _accel())


def _pair(module, vocab: str):
    """The encoding of ``vocab`` built by ``module`` (ref or accel)."""
    if vocab == "embedded":
        return module.BytePairEncoding.from_tokenizer_json(embedded_tokenizer_json())
    if vocab == "llama3":
        return module.BytePairEncoding.from_tokenizer_json(llama3_tokenizer_json())
    config = cl100k_config()
    return module.BytePairEncoding.from_tiktoken(
        config["mergeable_ranks"], config["pat_str"], config["special_tokens"]
    )


@pytest.fixture(scope="module", params=["embedded", "llama3", "cl100k"])
def encodings(request, accel):
    """(reference, accelerated) encodings of one vocabulary."""
    return _pair(ref, request.param), _pair(accel, request.param)


TEXTS = corpus()


def test_corpus_ids_and_text_are_identical(encodings):
    ours, theirs = encodings
    texts = list(TEXTS.values())
    expected = [ours.encode(t, allowed_special="all") for t in texts]
    assert theirs.encode_batch(texts, allowed_special="all") == expected
    for text, ids in zip(texts, expected, strict=True):
        assert theirs.encode(text, allowed_special="all") == ids
        assert theirs.decode(ids) == text


def test_generated_text_is_identical(encodings):
    ours, theirs = encodings

    @given(st.one_of(st.text(), fragment_text), st.booleans())
    def check(text, specials):
        kwargs = {"allowed_special": "all"} if specials else {"disallowed_special": ()}
        ids = ours.encode(text, **kwargs)
        assert theirs.encode(text, **kwargs) == ids
        assert theirs.decode(ids) == text

    check()


def test_decode_of_any_ids_is_identical(encodings):
    ours, theirs = encodings
    valid = sorted({*ours.vocab.values(), *(t.id for t in ours.added_tokens.values())})

    @given(st.lists(st.sampled_from(valid), max_size=12))
    def check(ids):
        assert theirs.decode(ids) == ours.decode(ids)

    check()


def test_it_is_the_reference_class_and_api(accel):
    assert issubclass(accel.BytePairEncoding, ref.BytePairEncoding)
    assert accel.UnsupportedTokenizerError is ref.UnsupportedTokenizerError
    assert set(accel.__all__) <= set(ref.__all__)
    encoding = _pair(accel, "embedded")
    assert type(encoding) is accel.BytePairEncoding
    tokenizer = ref.BPETokenizer(encoding)  # the engine's tokenizer takes it as is
    assert tokenizer.decode(tokenizer.encode("Hello <|eos|>")) == "Hello <|eos|>"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tokenizer_json_features_are_identical(variant, bpe, accel):
    tk = tokenizers.Tokenizer.from_str(bpe.to_str())
    VARIANTS[variant](tk)
    data = json.loads(tk.to_str())
    ours = ref.BytePairEncoding.from_tokenizer_json(data)
    theirs = accel.BytePairEncoding.from_tokenizer_json(data)
    text = "".join([*FRAGMENTS, *VARIANT_FRAGMENTS]) + TEXTS["stress"][:3000]
    for kwargs in ({"allowed_special": "all"}, {"disallowed_special": ()}):
        assert theirs.encode(text, **kwargs) == ours.encode(text, **kwargs)
    pieces = [text[i : i + 97] for i in range(0, len(text), 97)]
    assert theirs.encode_batch(pieces, allowed_special="all", add_special_tokens=True) == (
        ours.encode_batch(pieces, allowed_special="all", add_special_tokens=True)
    )


BYTES = {bytes([b]): b for b in range(256)}


def _tiny(module, **kwargs):
    """Single bytes, ``ab`` and ``abc``; ``<|end|>`` special, ``<note>`` not."""
    vocab = {**BYTES, b"ab": 256, b"abc": 257}
    merges = {(b"a", b"b"): 0, (b"ab", b"c"): 1}
    added = [ref.AddedToken("<|end|>", 300), ref.AddedToken("<note>", 301, special=False)]
    return module.BytePairEncoding(vocab, merges, [ref.GPT2_PATTERN], added_tokens=added, **kwargs)


def test_ignore_merges_and_template_are_identical(accel):
    vocab = {**BYTES, b"bc": 256, b"abc": 257}
    for ignore in (False, True):
        encodings = [
            m.BytePairEncoding(
                vocab, {(b"b", b"c"): 0}, [], ignore_merges=ignore, template=([1], [2, 3])
            )
            for m in (ref, accel)
        ]
        results = [e.encode_batch(["abc", "xbc"], add_special_tokens=True) for e in encodings]
        assert results[0] == results[1]


# Each call raises in both implementations; the class and the message must agree.
BAD_CALLS = [
    ("encode", (b"abc",), {}),
    ("encode", ("a\ud800",), {}),
    ("encode", ("a\ud800",), {"allowed_special": {"<nope>"}}),
    ("encode", ("a",), {"add_special_tokens": 1}),
    ("encode", ("a",), {"allowed_special": {"<nope>"}}),
    ("encode", ("a",), {"disallowed_special": "none"}),
    ("encode", ("ab<|end|>",), {}),
    ("encode", ("<note><|end|>",), {"allowed_special": set(), "disallowed_special": {"<|end|>"}}),
    ("encode_batch", ("abc",), {}),
    ("encode_batch", (3,), {}),
    ("encode_batch", (["ok", "x<|end|>", "a\ud800"],), {}),
    ("encode_batch", (["ok", b"x"],), {"allowed_special": {"<nope>"}}),
    ("decode", ([0, 302],), {}),
    ("decode", ([299],), {}),
    ("decode", ([True],), {}),
    ("decode", ("ab",), {}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), BAD_CALLS)
def test_errors_are_identical(method, args, kwargs, accel):
    errors = []
    for module in (ref, accel):
        with pytest.raises((TypeError, ValueError)) as info:
            getattr(_tiny(module), method)(*args, **kwargs)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_constructor_errors_are_identical(accel):
    for args, kwargs in [
        (({b"a": 0}, {}, []), {}),
        ((BYTES, {(b"x", b"y"): 0}, []), {}),
        ((BYTES, {}, ["("]), {}),
        ((BYTES, {}, []), {"normal_forms": ["NFX"]}),
    ]:
        errors = []
        for module in (ref, accel):
            with pytest.raises(ValueError) as info:
                module.BytePairEncoding(*args, **kwargs)
            errors.append(str(info.value))
        assert errors[0] == errors[1]
    with pytest.raises(ref.UnsupportedTokenizerError, match="pyagent_accel"):
        accel.BytePairEncoding(BYTES, {}, [r"\X"])  # Python regex only
    with pytest.raises(ref.UnsupportedTokenizerError, match="Metaspace"):
        data = json.loads(embedded_tokenizer_json().read_text(encoding="utf-8"))
        data["pre_tokenizer"] = {"type": "Metaspace"}
        accel.BytePairEncoding.from_tokenizer_json(data)
