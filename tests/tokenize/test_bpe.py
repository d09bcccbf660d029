"""The steps of `tokenize.bpe` one by one, and its errors on bad input."""

from __future__ import annotations

import doctest
import json

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.tokenize import bpe
from pyagent_ref.tokenize.bpe import (
    GPT2_PATTERN,
    AddedToken,
    BytePairEncoding,
    UnsupportedTokenizerError,
    bpe_merge,
    byte_level_alphabet,
    merges_from_ranks,
    pre_tokenize,
    resolve_special_sets,
    split_added_tokens,
)

from .bpe_corpus import embedded_tokenizer_json

BYTES = {bytes([b]): b for b in range(256)}


def tiny(**kwargs) -> BytePairEncoding:
    """Single bytes, ``ab`` and ``abc``; ``<|end|>`` special, ``<note>`` not."""
    vocab = {**BYTES, b"ab": 256, b"abc": 257}
    merges = {(b"a", b"b"): 0, (b"ab", b"c"): 1}
    added = [AddedToken("<|end|>", 300), AddedToken("<note>", 301, special=False)]
    return BytePairEncoding(vocab, merges, [GPT2_PATTERN], added_tokens=added, **kwargs)


def test_module_examples_run():
    result = doctest.testmod(bpe)
    assert result.attempted > 0 and result.failed == 0


def test_byte_level_alphabet():
    alphabet = byte_level_alphabet()
    assert len(set(alphabet)) == 256
    assert (alphabet[ord(" ")], alphabet[ord("\n")], alphabet[ord("a")]) == ("Ġ", "Ċ", "a")
    assert alphabet[0] == "Ā" and alphabet[0xAD] == "Ń"  # soft hyphen: the 68th unprintable
    assert all(c.isprintable() and not c.isspace() for c in alphabet)


def test_split_added_tokens_leftmost_longest():
    tokens = {"<a>": 1, "<a><b>": 2, "b>": 3}
    assert split_added_tokens(["x<a><b><a>y"], tokens) == ["x", 2, 1, "y"]
    assert split_added_tokens(["", 7, "<a>"], tokens) == [7, 1]
    assert split_added_tokens(["text", ""], {}) == ["text"]


def test_pre_tokenize_splits_and_prefix_space():
    pattern = regex.compile(GPT2_PATTERN)
    assert pre_tokenize("I'm  here", [pattern]) == ["I", "'m", " ", " here"]
    assert pre_tokenize("hi", [pattern], add_prefix_space=True) == [" hi"]
    assert pre_tokenize(" hi", [pattern], add_prefix_space=True) == [" hi"]
    # gaps between matches are pieces too: nothing is dropped
    assert pre_tokenize("a1b", [regex.compile(r"\d")]) == ["a", "1", "b"]


def test_bpe_merge_lowest_rank_then_leftmost():
    merges = {(b"a", b"a"): 0}
    assert bpe_merge(b"aaa", merges) == [b"aa", b"a"]
    assert bpe_merge(b"aaaa", merges) == [b"aa", b"aa"]
    assert bpe_merge(b"xyz", merges) == [b"x", b"y", b"z"]
    assert bpe_merge(b"", merges) == []


@given(st.lists(st.sampled_from([b"a", b"b", b"c", b"x"]), max_size=12).map(b"".join))
def test_merges_from_ranks_is_tiktokens_rule(piece):
    """Brute force: tiktoken merges the adjacent pair whose concatenation has the lowest rank."""
    ranks = {**BYTES, b"ab": 256, b"bc": 257, b"abc": 258, b"aa": 259, b"aaa": 260}
    merges = merges_from_ranks(ranks)
    assert merges[(b"ab", b"c")] == merges[(b"a", b"bc")] == 258
    parts = [bytes([b]) for b in piece]
    while True:
        joined = [
            (ranks[a + b], i)
            for i, (a, b) in enumerate(zip(parts, parts[1:], strict=False))
            if a + b in ranks
        ]
        if not joined:
            break
        _, i = min(joined)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    assert bpe_merge(piece, merges) == parts


def test_resolve_special_sets():
    special = frozenset({"<a>", "<b>"})
    assert resolve_special_sets(special, frozenset(), "all") == (frozenset(), special)
    assert resolve_special_sets(special, {"<a>"}, "all") == ({"<a>"}, {"<b>"})
    assert resolve_special_sets(special, "all", "all") == (special, frozenset())
    assert resolve_special_sets(special, set(), set()) == (frozenset(), frozenset())
    with pytest.raises(ValueError, match=r"allowed_special names \['<c>'\]"):
        resolve_special_sets(special, {"<c>"}, "all")
    with pytest.raises(TypeError, match="disallowed_special must be 'all' or a set"):
        resolve_special_sets(special, set(), "none")


def test_encode_specials_allowed_disallowed_and_as_text():
    enc = tiny()
    assert enc.encode("abc ab") == [257, ord(" "), 256]
    assert enc.encode("abc<|end|>", allowed_special={"<|end|>"}) == [257, 300]
    as_text = enc.encode("<|end|>", disallowed_special=())
    assert 300 not in as_text and enc.decode(as_text) == "<|end|>"
    assert enc.encode("x<note>") == [ord("x"), 301]  # not special: always matched
    with pytest.raises(ValueError, match=r"special token '<\|end\|>' at index 2, which is disal"):
        enc.encode("ab<|end|>")


def test_ignore_merges_and_template():
    # ab+c merges first into abc only via (ab, c); with ignore_merges "abc" is taken whole.
    vocab = {**BYTES, b"bc": 256, b"abc": 257}
    merges = {(b"b", b"c"): 0}
    assert BytePairEncoding(vocab, merges, []).encode("abc") == [ord("a"), 256]
    whole = BytePairEncoding(vocab, merges, [], ignore_merges=True, template=([1], [2, 3]))
    assert whole.encode("abc") == [257]
    assert whole.encode("abc", add_special_tokens=True) == [1, 257, 2, 3]


def test_encode_rejects_bad_text():
    enc = tiny()
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        enc.encode(b"abc")
    with pytest.raises(ValueError, match="lone surrogate U\\+D800 at index 1"):
        enc.encode("a\ud800")
    with pytest.raises(TypeError, match="add_special_tokens must be a bool"):
        enc.encode("a", add_special_tokens=1)


def test_decode_and_its_errors():
    enc = tiny()
    assert enc.decode([257, 300, 0xC3, 0xA9, 0xC3]) == "abc<|end|>é\ufffd"
    assert enc.token_bytes([256, 301]) == [b"ab", b"<note>"]
    assert enc.vocab_size == 302
    with pytest.raises(ValueError, match=r"ids\[1\] = 302 is outside the vocabulary range"):
        enc.decode([0, 302])
    with pytest.raises(ValueError, match=r"ids\[0\] = 299 is not the id of any token"):
        enc.decode([299])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got True"):
        enc.decode([True])


def test_constructor_names_inconsistent_data():
    with pytest.raises(ValueError, match="all 256 single bytes .* missing 0x00, 0x01"):
        BytePairEncoding({b"a": 0}, {}, [])
    with pytest.raises(ValueError, match=r"merges: b'x' \+ b'y' \(rank 0\) is not in vocab"):
        BytePairEncoding(BYTES, {(b"x", b"y"): 0}, [])
    with pytest.raises(ValueError, match="normal_forms: 'NFX'"):
        BytePairEncoding(BYTES, {}, [], normal_forms=["NFX"])
    with pytest.raises(ValueError, match=r"pattern '\(' is not a valid regex"):
        BytePairEncoding(BYTES, {}, ["("])
    with pytest.raises(ValueError, match="vocab: id 0 is used twice"):
        BytePairEncoding({**BYTES, b"zz": 0}, {}, [])


# ------------------------------------------------------------------------------ tokenizer.json


@pytest.fixture(scope="module")
def embedded_json() -> dict:
    return json.loads(embedded_tokenizer_json().read_text(encoding="utf-8"))


def _edited(data: dict, path: list, value) -> dict:
    """A deep copy of ``data`` with ``data[path[0]][path[1]]... = value``."""
    out = json.loads(json.dumps(data))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


UNSUPPORTED = [
    (["model", "type"], "WordPiece", "model type 'WordPiece'"),
    (["model", "dropout"], 0.1, "BPE dropout 0.1"),
    (["model", "continuing_subword_prefix"], "##", "continuing_subword_prefix"),
    (["pre_tokenizer"], None, "no pre_tokenizer"),
    (["pre_tokenizer"], {"type": "Metaspace"}, "pre_tokenizer ending in 'Metaspace'"),
    (
        ["pre_tokenizer"],
        {"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": "ByteLevel"}]},
        "pre_tokenizer step 'Digits'",
    ),
    (["normalizer"], {"type": "Lowercase"}, "normalizer 'Lowercase'"),
    (["post_processor"], {"type": "BertProcessing"}, "post_processor 'BertProcessing'"),
    (["decoder"], None, "decoder None"),
    (["added_tokens", 0, "lstrip"], True, "added token '<|bos|>' with lstrip"),
]


@pytest.mark.parametrize(("path", "value", "feature"), UNSUPPORTED)
def test_unsupported_features_are_named(embedded_json, path, value, feature):
    with pytest.raises(UnsupportedTokenizerError, match=regex.escape(feature)):
        BytePairEncoding.from_tokenizer_json(_edited(embedded_json, path, value))


def test_a_vocab_without_every_byte_is_unsupported(embedded_json):
    data = json.loads(json.dumps(embedded_json))
    del data["model"]["vocab"]["Ā"]  # byte 0x00
    with pytest.raises(UnsupportedTokenizerError, match="without all 256 single bytes"):
        BytePairEncoding.from_tokenizer_json(data)


def test_invalid_tokenizer_json(tmp_path, embedded_json):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer.json is not valid JSON"):
        BytePairEncoding.from_tokenizer_json(bad)
    no_model = dict(embedded_json)
    del no_model["model"]
    with pytest.raises(ValueError, match="is not a valid tokenizer.json: KeyError\\('model'\\)"):
        BytePairEncoding.from_tokenizer_json(no_model)
    broken_merge = _edited(embedded_json, ["model", "merges", 0], ["Ġ", "zzzz"])
    with pytest.raises(ValueError, match="is not in vocab"):
        BytePairEncoding.from_tokenizer_json(broken_merge)
