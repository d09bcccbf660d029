"""The DFA: its API, minimality, canonical form and state limit."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured import (
    DEAD,
    DFA,
    NFA,
    RegexError,
    build_nfa,
    compile_regex,
    determinize,
    minimize,
    parse_regex,
)

from .helpers import assert_minimal, count_equivalence_classes


def test_the_api_the_token_level_needs():
    dfa = compile_regex("ab|ac+")
    assert dfa.start == 0 and not dfa.is_accepting(dfa.start)
    after_a = dfa.step(dfa.start, ord("a"))
    assert after_a != DEAD and dfa.can_reach_accept(after_a) and not dfa.is_accepting(after_a)
    assert dfa.is_accepting(dfa.step(after_a, ord("b")))
    assert dfa.step(dfa.step(after_a, ord("b")), ord("b")) == DEAD  # "abb" can never match
    assert dfa.step(dfa.start, ord("x")) == DEAD and not dfa.can_reach_accept(DEAD)
    assert dfa.step(DEAD, ord("a")) == DEAD and not dfa.is_accepting(DEAD)
    assert dfa.walk(dfa.start, b"acc") == dfa.walk(dfa.walk(dfa.start, b"a"), b"cc")
    assert dfa.is_accepting(dfa.walk(dfa.start, b"acccc"))
    assert dfa.walk(dfa.start, b"xacc") == DEAD and dfa.walk(DEAD, b"") == DEAD
    assert dfa.walk(after_a, b"") == after_a
    assert [dfa.match(s) for s in (b"ab", b"ac", b"accc", b"a", b"abc", b"")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("pattern", "states"),
    [
        ("(a|b)*abb", 4),  # the dragon book's example: 4 states (and DEAD, not stored)
        ("[0-9]+(\\.[0-9]+)?", 4),
        ("a*", 1),
        ("", 1),
        ("(a|b)*", 1),
        ("a{3}", 4),
        ("a{2,4}", 5),
        ("(ab|cd)*", 3),
        ("x*|x+y", 3),
        ("(a|b)*a(a|b){3}", 16),  # needs to remember the last 4 letters
    ],
)
def test_minimal_state_counts(pattern, states):
    dfa = compile_regex(pattern)
    assert dfa.num_states == states
    assert_minimal(dfa)


def test_the_dragon_book_table():
    assert compile_regex("(a|b)*abb").format_table().splitlines() == [
        "state  a  b  accepting",
        "0      1  0  no",
        "1      1  2  no",
        "2      1  3  no",
        "3      1  0  yes",
    ]


@pytest.mark.parametrize(
    "same",
    [
        ("a+", "aa*", "a*a", "(?:a|aa)+"),
        ("(a|b)*", "[ab]*", "(a*b*)*", "(?:a?b?)*"),
        ("(ab)*a", "a(ba)*"),
        ("[0-9]{2,3}", "\\d\\d\\d?", "[0-9][0-9]{1,2}"),
        (".", "[^\\n]"),
    ],
)
def test_equal_languages_give_equal_dfas(same):
    """The canonical minimal DFA is unique: patterns of one language compile to one DFA."""
    first = compile_regex(same[0])
    assert all(compile_regex(p) == first for p in same[1:])


def test_empty_language():
    dfa = compile_regex("[^\\x00-\\u{10FFFF}]")
    assert dfa.start == DEAD and dfa.num_states == 0
    assert not dfa.match(b"") and not dfa.match(b"a") and dfa.walk(dfa.start, b"a") == DEAD
    assert compile_regex("a[^\\x00-\\u{10FFFF}]|b").match(b"b")


def test_byte_classes_partition_the_bytes():
    dfa = compile_regex("[a-f]x|[0-9]")
    assert len(dfa.byte_class) == 256
    assert dfa.num_classes == 4  # a-f, 0-9, x, and every other byte
    assert [dfa.class_ranges(c) for c in range(dfa.num_classes)] == [
        [(0, 0x2F), (0x3A, 0x60), (0x67, 0x77), (0x79, 0xFF)],
        [(0x30, 0x39)],
        [(0x61, 0x66)],
        [(0x78, 0x78)],
    ]
    for byte in range(256):  # bytes of one class move alike in every state
        for other in range(256):
            if dfa.byte_class[byte] == dfa.byte_class[other]:
                assert all(dfa.step(q, byte) == dfa.step(q, other) for q in range(dfa.num_states))


@st.composite
def random_dfas(draw) -> DFA:
    """Any small DFA over the bytes 0..k-1 (every other byte in class 0), not trimmed."""
    n, k = draw(st.integers(1, 10)), draw(st.integers(1, 3))
    rows = tuple(tuple(draw(st.integers(-1, n - 1)) for _ in range(k)) for _ in range(n))
    accepting = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return DFA(tuple(range(k)) + (0,) * (256 - k), rows, accepting, start=0)


@given(random_dfas())
def test_minimize_any_dfa(dfa):
    """Hopcroft's minimisation of arbitrary DFAs (unreachable, dead and equivalent states
    included) keeps the language on every string up to length 6, and is minimal."""
    smallest = minimize(dfa)
    assert_minimal(smallest)
    symbols = bytes(range(max(dfa.byte_class) + 1))
    for length in range(7):
        for data in itertools.product(symbols, repeat=length):
            assert dfa.match(bytes(data)) == smallest.match(bytes(data))


def test_minimize_agrees_with_moores_refinement_on_random_dfas():
    """Hopcroft's bookkeeping (which halves of a split block stay pending) goes wrong only
    on some larger automata: 3000 random DFAs of up to 16 states, seeded."""
    rng = random.Random(13)
    for _ in range(3000):
        n, k = rng.randint(1, 16), rng.randint(1, 3)
        rows = tuple(tuple(rng.randint(-1, n - 1) for _ in range(k)) for _ in range(n))
        accepting = tuple(rng.random() < 0.3 for _ in range(n))
        dfa = DFA(tuple(range(k)) + (0,) * (256 - k), rows, accepting, start=0)
        trimmed = determinize_dfa(dfa)
        assert minimize(dfa).num_states == count_equivalence_classes(trimmed) - 1


def determinize_dfa(dfa: DFA) -> DFA:
    """``dfa`` trimmed to its reachable, live states (an NFA of it, determinized)."""
    edges = [
        [(lo, hi, t) for c, t in enumerate(row) if t != DEAD for lo, hi in dfa.class_ranges(c)]
        for row in dfa.transitions
    ]
    accept = len(edges)
    epsilons = [[accept] if yes else [] for yes in dfa.accepting] + [[]]
    return determinize(NFA(dfa.start, accept, edges + [[]], epsilons))


@pytest.mark.parametrize(
    ("pattern", "limit"),
    [
        ("(a|b)*a(a|b){20}", "10000 states (max_states)"),  # 2^21 states
        ("(.|\\n)*a.{12}", "10000 states (max_states)"),
        ("a{1000000}", "100000 NFA states (max_nfa_states)"),
        ("((a{100}){100}){100}", "100000 NFA states (max_nfa_states)"),
        ("[^a]{999999999}", "100000 NFA states (max_nfa_states)"),
    ],
)
def test_pathological_patterns_hit_the_limit_fast(pattern, limit):
    start = time.process_time()  # this process's CPU time: other processes' load aside
    with pytest.raises(RegexError, match=limit.replace("(", "\\(").replace(")", "\\)")):
        compile_regex(pattern)
    assert time.process_time() - start < 2.0


def test_limits_are_parameters():
    assert compile_regex("(a|b)*a(a|b){3}", max_states=20).num_states == 16
    with pytest.raises(RegexError, match="more than 8 states"):
        compile_regex("(a|b)*a(a|b){3}", max_states=8)
    with pytest.raises(RegexError, match="more than 10 NFA states"):
        compile_regex("abcdefghijk", max_nfa_states=10)
    nfa = build_nfa(parse_regex("a{5}"))
    assert determinize(nfa, max_states=6).num_states == 6


def test_large_bounded_repetition_within_the_limits():
    dfa = compile_regex(".{200}")
    assert dfa.match(("é" * 100 + "x" * 99 + "😀").encode())
    assert not dfa.match(("é" * 199).encode()) and not dfa.match(b"x" * 201)
    assert dfa.num_states == 200 * 8 + 1  # per character: a boundary and 7 partial states


def test_compile_is_cached():
    assert compile_regex("[a-z]+@[a-z]+") is compile_regex("[a-z]+@[a-z]+")


def test_the_compilers_build_automata_with_the_set_in_use():
    """`using_automata` swaps the constructions the compilers call, in its block only."""
    from pyagent_ref.structured import dfa

    calls = []

    def traced(node, *limits):
        calls.append(node)
        return dfa.node_dfa(node, *limits)

    traced_set = dfa.Automata(traced, dfa.minimal_dfa, dfa.intersect, dfa.subtract)
    assert dfa.automata() is dfa.REFERENCE_AUTOMATA
    with dfa.using_automata(traced_set):
        assert dfa.automata() is traced_set
        assert dfa.compile_regex("q[0-9]{2,3}q") == dfa.node_dfa(parse_regex("q[0-9]{2,3}q"))
    assert dfa.automata() is dfa.REFERENCE_AUTOMATA and len(calls) == 1
    with pytest.raises(TypeError, match="must be an Automata"):
        with dfa.using_automata(dfa.node_dfa):
            pass
