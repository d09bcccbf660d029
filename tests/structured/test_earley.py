"""The grammar IR and the byte-level Earley parser, against a brute-force language oracle.

The oracle enumerates each nonterminal's language up to `MAX_LEN` bytes by a fixpoint over
string sets, with terminals matched by Python's `re.fullmatch` (not by our DFAs), so the
parser is never its own oracle.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pyagent_ref.structured.earley import EarleyParser
from pyagent_ref.structured.grammar import (
    Grammar,
    GrammarError,
    Terminal,
    choice_grammar,
    regex_escape,
)

MAX_LEN = 6
ALPHABET = "ab"
PATTERNS = ("a", "b", "ab", "a*", "[ab]", "b?", "(ab)+", "")
NAMES = ("S", "A", "B")


def language(grammar: Grammar, max_len: int = MAX_LEN) -> set[str]:
    """The start symbol's sentences of at most ``max_len`` characters (over `ALPHABET`)."""
    strings = [
        "".join(p) for n in range(max_len + 1) for p in itertools.product(ALPHABET, repeat=n)
    ]
    terminal_language = {}
    for symbol in grammar.symbols():
        if isinstance(symbol, Terminal) and symbol not in terminal_language:
            terminal_language[symbol] = {s for s in strings if re.fullmatch(symbol.pattern, s)}
    lang: dict[str, set[str]] = {name: set() for name in grammar.rules}
    changed = True
    while changed:
        changed = False
        for name, alts in grammar.rules.items():
            for alt in alts:
                partial = {""}
                for symbol in alt:
                    parts = (
                        terminal_language[symbol] if isinstance(symbol, Terminal) else lang[symbol]
                    )
                    partial = {p + q for p in partial for q in parts if len(p) + len(q) <= max_len}
                if not partial <= lang[name]:
                    lang[name] |= partial
                    changed = True
    return lang[grammar.start]


def parse_prefixes(grammar: Grammar, text: str) -> list[tuple[bool, bool]]:
    """(push accepted, is_accepting) after each byte of ``text``, stopping at a refusal."""
    parser = EarleyParser(grammar)
    out = []
    for byte in text.encode():
        ok = parser.push(byte)
        out.append((ok, parser.is_accepting()))
        if not ok:
            break
    return out


symbols = st.one_of(st.sampled_from(NAMES), st.sampled_from(PATTERNS).map(Terminal.regex))
alternatives = st.lists(st.lists(symbols, max_size=3).map(tuple), min_size=1, max_size=3)


@st.composite
def grammars(draw) -> Grammar:
    rules = {name: tuple(draw(alternatives)) for name in NAMES}
    try:
        return Grammar(rules, "S")
    except GrammarError:
        assume(False)
        raise


@given(grammars(), st.text(ALPHABET, max_size=MAX_LEN))
def test_parser_agrees_with_the_language(grammar, text):
    sentences = language(grammar)
    prefixes = {s[:i] for s in sentences for i in range(len(s) + 1)}
    parser = EarleyParser(grammar)
    assert parser.is_accepting() == ("" in sentences)
    for i, byte in enumerate(text.encode()):
        prefix = text[: i + 1]
        accepted = parser.push(byte)
        if prefix in prefixes:
            assert accepted, f"refused viable prefix {prefix!r}"
        if not accepted:
            assert parser.num_bytes() == i  # nothing changed
            break
        assert parser.is_accepting() == (prefix in sentences), prefix


@given(grammars(), st.text(ALPHABET, max_size=MAX_LEN), st.integers(0, MAX_LEN))
def test_pop_and_copy_restore_the_state(grammar, text, n):
    parser = EarleyParser(grammar)
    pushed = 0
    for byte in text.encode():
        if not parser.push(byte):
            break
        pushed += 1
    n = min(n, pushed)
    snapshot = parser.copy()
    parser.pop(n)
    assert parser.num_bytes() == pushed - n and snapshot.num_bytes() == pushed
    fresh = EarleyParser(grammar)
    for byte in text.encode()[: pushed - n]:
        assert fresh.push(byte)
    assert parser.is_accepting() == fresh.is_accepting()
    for byte in b"ab":  # the same continuations are open
        a, b = parser.copy(), fresh.copy()
        assert a.push(byte) == b.push(byte)


def test_left_recursion_ambiguity_and_empty_rules():
    a = Terminal.literal("a")
    # left-recursive, ambiguous, with nullable rules in the middle
    grammar = Grammar({"S": (("S", "E", "S"), (a,)), "E": ((), (Terminal.literal("+"),))}, "S")
    for text, ok in [("a", True), ("aa", True), ("a+a", True), ("a++a", False), ("+a", False)]:
        results = parse_prefixes(grammar, text)
        assert (len(results) == len(text) and all(r[0] for r in results) and results[-1][1]) == ok


def test_lexemes_are_not_greedy():
    grammar = Grammar({"S": ((Terminal.regex("a*"), Terminal.literal("a")),)}, "S")
    parser = EarleyParser(grammar)
    assert not parser.is_accepting()
    for _ in range(3):
        assert parser.push(ord("a")) and parser.is_accepting()


def test_multibyte_terminals_and_refusals():
    grammar = Grammar({"S": ((Terminal.regex("é+"), Terminal.literal("!")),)}, "S")
    parser = EarleyParser(grammar)
    data = "éé!".encode()
    for byte in data[:-1]:
        assert parser.push(byte)
    assert not parser.push(ord("x")) and parser.num_bytes() == len(data) - 1
    assert parser.push(ord("!")) and parser.is_accepting()
    assert not parser.push(ord("!"))


def test_choice():
    grammar = choice_grammar(["yes", "no", "yes", "a.b"])
    assert grammar.rules["root"] == tuple((Terminal.literal(s),) for s in ("yes", "no", "a.b"))
    for text in ("yes", "no", "a.b"):
        results = parse_prefixes(grammar, text)
        assert results[-1] == (True, True)
    assert parse_prefixes(grammar, "axb")[-1][0] is False
    with pytest.raises(GrammarError, match="at least one option"):
        choice_grammar([])


def test_regex_escape_matches_exactly():
    text = "a.b*c?[d]{1}(e)|f^g$h\\i/j k\n-"
    assert re.fullmatch(regex_escape(text), text)
    assert Terminal.literal(text).dfa.match(text.encode())
    assert not Terminal.literal(text).dfa.match(b"x" + text[1:].encode())


@pytest.mark.parametrize(
    ("rules", "start", "message"),
    [
        ({"S": (("A",),)}, "S", "rule 'S' uses undefined symbol 'A'"),
        ({"S": ((),)}, "T", "start symbol 'T' has no rule"),
        (
            {"S": (("S", Terminal.literal("a")),)},
            "S",
            "rule 'S' has an alternative that can derive",
        ),
        ({"S": ((3,),)}, "S", "rule 'S' has a bad symbol 3"),
    ],
)
def test_bad_grammars_are_named(rules, start, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        Grammar(rules, start)


def test_pop_checks_its_argument():
    parser = EarleyParser(choice_grammar(["ab"]))
    assert parser.push(ord("a"))
    with pytest.raises(ValueError, match=r"n must be in \[0, 1\] \(bytes pushed\), got 2"):
        parser.pop(2)
