"""The automata read UTF-8 bytes: code-point ranges become exact byte-range sequences."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured import DEAD, compile_regex, utf8_sequences

MAX = 0x10FFFF


def in_sequence(data: bytes, sequence) -> bool:
    if len(data) != len(sequence):
        return False
    return all(lo <= b <= hi for b, (lo, hi) in zip(data, sequence, strict=True))


def check_exact(lo: int, hi: int) -> None:
    """The sequences match every encoding of lo..hi once, and nothing else: they cover every
    encoding, and the number of byte strings they match, counted with multiplicity, is
    the number of encodings."""
    sequences = utf8_sequences(lo, hi)
    encodings = [chr(c).encode() for c in range(lo, hi + 1) if not 0xD800 <= c <= 0xDFFF]
    for data in encodings:
        assert any(in_sequence(data, s) for s in sequences), (hex(lo), hex(hi), data)
    matched = sum(math.prod(b - a + 1 for a, b in s) for s in sequences)
    assert matched == len(encodings), (hex(lo), hex(hi))


@given(st.integers(0, MAX), st.integers(0, 3000))
def test_utf8_sequences_are_exact_on_random_ranges(lo, span):
    check_exact(lo, min(lo + span, MAX))


def test_utf8_sequences_at_the_boundaries():
    for lo, hi in [
        (0, 0x7F),
        (0x7F, 0x80),
        (0x7FF, 0x800),
        (0xD7FF, 0xE000),
        (0xD800, 0xDFFF),
        (0xFFFF, 0x10000),
        (0x10FFFF, 0x10FFFF),
        (0x80, 0x10FF),
        (0xFFF0, 0x1003F),
    ]:
        check_exact(lo, hi)
    # the whole range: the nine sequences of the UTF-8 standard (Table 3-7) plus ASCII
    assert len(utf8_sequences(0, MAX)) == 9
    assert sum(math.prod(b - a + 1 for a, b in s) for s in utf8_sequences(0, MAX)) == (
        MAX + 1 - 0x800
    )
    assert utf8_sequences(0xD800, 0xDFFF) == ()


def test_multibyte_classes_byte_by_byte():
    greek = compile_regex("[α-ω]")
    for code in range(ord("α"), ord("ω") + 1):
        assert greek.match(chr(code).encode())
    assert not greek.match(b"a") and not greek.match("ά".encode()) and not greek.match(b"\xce")
    middle = greek.walk(greek.start, "β".encode()[:1])  # a token may end inside a character
    assert middle != DEAD and not greek.is_accepting(middle)
    assert greek.is_accepting(greek.walk(middle, "β".encode()[1:]))
    assert greek.step(greek.start, ord("a")) == DEAD

    not_a = compile_regex("[^a]")
    assert not_a.match("😀".encode()) and not_a.match(b"b") and not not_a.match(b"a")
    assert not_a.match(b"\n")
    emoji = "😀".encode()
    for end in range(1, 4):
        state = not_a.walk(not_a.start, emoji[:end])
        assert state != DEAD and not not_a.is_accepting(state)


INVALID = [
    b"\xff",
    b"\xc0\x80",
    b"\xc1\xbf",
    b"\xe0\x80\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80",
    b"\x80",
    b"\xf0\x9f\x98",
    b"\xe2\x82",
]


def test_dot_matches_every_character_but_newline_and_no_invalid_utf8():
    dot = compile_regex(".")
    for code in list(range(0x800)) + [0xFFFF, 0x10000, 0x1F600, MAX, 0xE000, 0xD7FF]:
        assert dot.match(chr(code).encode()) == (code != 10), hex(code)
    for data in INVALID:
        assert not dot.match(data), data
    assert not dot.match("😀😀".encode())


def test_every_one_and_two_byte_string():
    """``.`` and ``[^a]``, byte-wise: a byte string matches iff it is UTF-8 for one allowed
    character; a prefix is live iff it extends to one."""
    for pattern, excluded in ((".", "\n"), ("[^a]", "a")):
        dfa = compile_regex(pattern)
        for first in range(256):
            for data in [bytes([first])] + [bytes([first, second]) for second in range(256)]:
                try:
                    ok = len(data.decode()) == 1 and data.decode() != excluded
                except UnicodeDecodeError:
                    ok = False
                assert dfa.match(data) == ok, (pattern, data)


@st.composite
def near_utf8(draw) -> bytes:
    """A 3- or 4-byte encoding with perhaps one byte replaced, or random bytes."""
    data = draw(st.characters(min_codepoint=0x800, exclude_categories=["Cs"])).encode()
    if draw(st.booleans()):
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    return draw(st.one_of(st.just(data), st.binary(min_size=3, max_size=4)))


@given(near_utf8())
def test_three_and_four_byte_strings(data):
    dfa = compile_regex(".")
    try:
        ok = len(data.decode()) == 1
    except UnicodeDecodeError:
        ok = False
    assert dfa.match(data) == ok


@given(st.text(min_size=1, max_size=1))
def test_any_character_by_its_bytes(char):
    assert compile_regex("[^a]").match(char.encode()) == (char != "a")
    assert compile_regex(".+").match((char * 3).encode()) == (char != "\n")
