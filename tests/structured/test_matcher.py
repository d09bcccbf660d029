"""GrammarMatcher against a brute-force oracle on small vocabularies.

The grammars have finite languages (`choice_grammar`), so the oracle is a set of strings:
a token is allowed iff some sentence starts with the bytes consumed so far followed by the
token's bytes, and EOS iff the bytes so far are a sentence. Nothing of the matcher or the
parser is used to compute it.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.ops.structured import apply_token_bitmask
from pyagent_ref.structured.earley import EarleyParser
from pyagent_ref.structured.grammar import Grammar, Terminal, choice_grammar
from pyagent_ref.structured.matcher import GrammarMatcher, pack_token_ids
from pyagent_ref.structured.vocab import TokenTrie

EOS = 0
# id 0: EOS (no bytes), id 1: a special token, then every string over "ab" of length 1-3
VOCAB: list[bytes | None] = [None, None] + [
    "".join(p).encode() for n in (1, 2, 3) for p in itertools.product("ab", repeat=n)
]
TRIE = TokenTrie(VOCAB)


def oracle(language: set[bytes], consumed: bytes) -> list[int]:
    allowed = [
        i for i, t in enumerate(VOCAB) if t and any(s.startswith(consumed + t) for s in language)
    ]
    return sorted(allowed + ([EOS] if consumed in language else []))


def matcher(options) -> GrammarMatcher:
    return GrammarMatcher(EarleyParser(choice_grammar(options)), TRIE, [EOS])


def mask_ids(m: GrammarMatcher) -> list[int]:
    bitmask = np.zeros((2, 2), np.int32)
    m.fill_next_token_bitmask(bitmask, index=1)
    assert not bitmask[0].any()
    out = apply_token_bitmask(np.zeros((1, len(VOCAB))), bitmask[1:])
    return np.flatnonzero(np.isfinite(out[0])).tolist()


options = st.lists(st.text("ab", min_size=1, max_size=5), min_size=1, max_size=5)


@given(options, st.lists(st.integers(0, len(VOCAB) - 1), max_size=12))
def test_masks_accepts_and_rollbacks_match_the_oracle(options, attempts):
    language = {o.encode() for o in options}
    m = matcher(options)
    consumed, history = b"", []
    for token in attempts:
        allowed = oracle(language, consumed)
        assert m.allowed_tokens() == allowed and mask_ids(m) == allowed, consumed
        snapshot = m.copy()
        assert m.accept_token(token) == (token in allowed)
        if token in allowed:
            history.append((consumed, snapshot))
            consumed += VOCAB[token] or b""
            if token == EOS:
                assert m.is_terminated() and m.allowed_tokens() == []
                break
    # rollback returns to every earlier state; copies taken then were not disturbed
    for back, (before, snapshot) in enumerate(reversed(history), start=1):
        undone = m.copy()
        undone.rollback(back)
        assert not undone.is_terminated()
        assert undone.allowed_tokens() == oracle(language, before) == snapshot.allowed_tokens()
        assert undone.num_accepted_tokens() == m.num_accepted_tokens() - back


@given(options, st.lists(st.sampled_from("ab"), max_size=4))
def test_jump_forward_is_the_forced_run(options, walk):
    language = {o.encode() for o in options}
    m = matcher(options)
    consumed = b""
    for char in walk:
        token = VOCAB.index(char.encode())
        if not m.accept_token(token):
            break
        consumed += char.encode()
    forced = b""
    while consumed + forced not in language:
        nexts = {s[len(consumed + forced)] for s in language if s.startswith(consumed + forced)}
        if len(nexts) != 1:
            break
        forced += bytes(nexts)
    assert m.find_jump_forward_bytes() == forced
    assert m.allowed_tokens() == oracle(language, consumed)  # left unchanged


def test_an_infinite_language():
    digits = Grammar({"root": ((Terminal.regex("[ab]+a"),),)}, "root")
    m = GrammarMatcher(EarleyParser(digits), TRIE, [EOS])
    assert EOS not in m.allowed_tokens() and not m.accept_token(EOS)
    assert m.accept_token(VOCAB.index(b"bba"))
    assert EOS in m.allowed_tokens()
    assert sorted(m.allowed_tokens()) == [EOS, *range(2, len(VOCAB))]
    assert m.accept_token(VOCAB.index(b"b")) and EOS not in m.allowed_tokens()
    assert m.find_jump_forward_bytes() == b""  # a or b: nothing is forced


def test_errors():
    m = matcher(["ab"])
    with pytest.raises(ValueError, match="token_id must be in"):
        m.accept_token(len(VOCAB))
    with pytest.raises(ValueError, match="num_tokens must be in"):
        m.rollback(1)
    with pytest.raises(ValueError, match="at least 1 words"):
        m.fill_next_token_bitmask(np.zeros((1, 0), np.int32))
    with pytest.raises(TypeError, match="bitmask must be int32"):
        m.fill_next_token_bitmask(np.zeros((1, 1), np.int64))
    with pytest.raises(ValueError, match="index must be"):
        m.fill_next_token_bitmask(np.zeros((1, 1), np.int32), index=1)
    with pytest.raises(ValueError, match="eos_token_ids holds"):
        GrammarMatcher(EarleyParser(choice_grammar(["a"])), TRIE, [len(VOCAB)])
    assert not m.accept_token(1)  # a special token that is not EOS


def test_pack_token_ids():
    row = pack_token_ids([0, 31, 32, 70], 3)
    assert row.dtype == np.int32 and row.tolist() == [1 - 2**31, 1, 64]
