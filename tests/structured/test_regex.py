"""The pattern parser: the syntax tree of each construct, and a clear error for the rest."""

from __future__ import annotations

import re
import unicodedata

import pytest

from pyagent_ref.structured import RegexError, compile_regex, parse_regex
from pyagent_ref.structured.regex import MAX_CODE_POINT, Alt, Chars, Concat, Repeat


def one(char: str) -> Chars:
    return Chars(((ord(char), ord(char)),))


def test_the_tree_of_each_construct():
    a, b = one("a"), one("b")
    assert parse_regex("") == Concat(())
    assert parse_regex("ab") == Concat((a, b))
    assert parse_regex("a|b|") == Alt((a, b, Concat(())))
    assert parse_regex("(?:a|b)*") == Repeat(Alt((a, b)), 0, None)
    assert parse_regex("(?P<x>a)+?") == Repeat(a, 1, None)
    assert parse_regex("(?<x>a){2,}") == Repeat(a, 2, None)
    assert parse_regex("a{2,5}b{3}c??") == Concat(
        (Repeat(a, 2, 5), Repeat(b, 3, 3), Repeat(one("c"), 0, 1))
    )
    assert parse_regex("[a-cx-z_]") == Chars(((0x5F, 0x5F), (0x61, 0x63), (0x78, 0x7A)))
    assert parse_regex("[^\\x00-\\u00ff]") == Chars(((0x100, MAX_CODE_POINT),))
    assert parse_regex(".") == Chars(((0, 9), (11, MAX_CODE_POINT)))
    assert parse_regex("^a$") == a
    assert parse_regex("^a|b$") == Alt((a, b))


@pytest.mark.parametrize(
    ("pattern", "code_point"),
    [
        ("\\n", 10),
        ("\\t", 9),
        ("\\r", 13),
        ("\\f", 12),
        ("\\v", 11),
        ("\\0", 0),
        ("\\x41", 0x41),
        ("\\u03B1", 0x3B1),
        ("\\u{1F600}", 0x1F600),
        ("\\uD83D\\uDE00", 0x1F600),  # a surrogate pair is one character
        ("\\.", 0x2E),
        ("\\/", 0x2F),
        ("\\-", 0x2D),
        ("\\{", 0x7B),
        ("[\\b]", 8),
        ("\\é", 0xE9),
        ("{", 0x7B),
        ("}", 0x7D),
        ("]", 0x5D),
        ("a{x}", None),  # no quantifier: literal text
    ],
)
def test_escapes_and_literal_braces(pattern, code_point):
    node = parse_regex(pattern)
    if code_point is None:
        assert compile_regex(pattern).match(pattern.encode())
    else:
        assert node == Chars(((code_point, code_point),))


def test_class_escapes_are_the_ascii_ecma_sets():
    """``\\d \\w`` are ASCII (Python's are Unicode-aware); ``\\s`` is ECMA-262's WhiteSpace
    and LineTerminator: TAB VT FF LF CR, U+FEFF, U+2028 U+2029 and category Zs."""
    digit, word, space = (compile_regex(p) for p in ("\\d", "\\w", "\\s"))
    not_digit, not_word, not_space = (compile_regex(p) for p in ("\\D", "\\W", "\\S"))
    for code in range(0x10000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        data = char.encode()
        ecma_space = code in (9, 10, 11, 12, 13, 0xFEFF, 0x2028, 0x2029) or (
            unicodedata.category(char) == "Zs"
        )
        assert digit.match(data) == ("0" <= char <= "9") != not_digit.match(data)
        assert word.match(data) == (char.isascii() and (char.isalnum() or char == "_"))
        assert word.match(data) != not_word.match(data)
        assert space.match(data) == ecma_space != not_space.match(data), hex(code)
    # where Python's Unicode classes differ
    assert re.fullmatch("\\d", "٣") and not digit.match("٣".encode())
    assert re.fullmatch("\\s", "\x1c") and not space.match(b"\x1c")
    assert not re.fullmatch("\\s", "\ufeff") and space.match("\ufeff".encode())


@pytest.mark.parametrize(
    ("pattern", "position", "problem"),
    [
        ("*a", 0, "nothing to repeat"),
        ("a|+b", 2, "nothing to repeat"),
        ("(?:{2})", 3, "nothing to repeat"),
        ("^*", 1, "nothing to repeat"),
        ("a**", 2, "cannot follow a quantifier"),
        ("a{2}{3}", 4, "cannot follow a quantifier"),
        ("a*?+", 3, "cannot follow a quantifier"),
        ("a{3,2}", 1, "min exceeds max"),
        ("a{,3}", 1, "{,m}"),
        ("a{1,9999999999}", 1, "at most 9 digits"),
        ("a{" + "9" * 5000 + "}", 1, "at most 9 digits"),
        ("(ab", 0, "missing ')'"),
        ("(" * 300 + "a" + ")" * 300, 100, "groups nest more than 100 deep"),
        ("a(b(c)", 1, "missing ')'"),
        ("ab)", 2, "unbalanced ')'"),
        ("[ab", 0, "missing ']'"),
        ("x[^", 1, "missing ']'"),
        ("[]a]", 1, "empty class"),
        ("[^]", 2, "empty class"),
        ("[z-a]", 1, "bad range"),
        ("[a\\d-z]", 2, "range endpoint"),
        ("(a)\\1", 3, "backreference"),
        ("\\k<x>", 0, "backreference"),
        ("(?P=x)", 0, "backreference"),
        ("(?=a)", 0, "lookahead"),
        ("a(?!b)", 1, "negative lookahead"),
        ("(?<=a)b", 0, "lookbehind"),
        ("(?<!a)b", 0, "negative lookbehind"),
        ("(?i)a", 0, "inline flags"),
        ("(?#x)", 0, "comments"),
        ("(?P<1>a)", 4, "bad group name"),
        ("(?<a", 3, "bad group name"),
        ("\\bword", 0, "word boundary"),
        ("\\p{L}", 0, "Unicode property"),
        ("a\\Z", 1, "anchor '\\Z'"),
        ("\\cA", 0, "control escape"),
        ("\\q", 0, "unknown escape"),
        ("\\012", 0, "octal"),
        ("ab\\", 2, "lone backslash"),
        ("\\x4", 0, "hex digits"),
        ("\\u12", 0, "hex digits"),
        ("\\u{110000}", 0, "above U+10FFFF"),
        ("\\u{}", 0, "hex digits"),
        ("\\uD800", 0, "lone surrogate"),
        ("[\\uDC00]", 1, "lone surrogate"),
        ("a\ud800", 1, "lone surrogate"),
        ("a^b", 1, "anchor '^'"),
        ("(^a)", 1, "anchor '^'"),
        ("a$b", 1, "anchor '$'"),
        ("(a$)", 2, "anchor '$'"),
        ("(a$|b)", 2, "anchor '$'"),
        ("a$*", 1, "anchor '$'"),
    ],
)
def test_malformed_and_unsupported_patterns_name_the_problem_and_position(
    pattern, position, problem
):
    with pytest.raises(RegexError) as info:
        compile_regex(pattern)
    assert isinstance(info.value, ValueError)
    assert info.value.position == position
    assert problem in str(info.value)
    assert f"at position {position} of {pattern!r}" in str(info.value)


def test_a_pattern_must_be_text():
    with pytest.raises(TypeError, match="must be a str"):
        parse_regex(b"abc")
