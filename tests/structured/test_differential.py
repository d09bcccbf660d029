"""The compiled DFA against Python's `re.fullmatch`, and its stages against each other."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured import build_nfa, compile_regex, determinize, minimize, parse_regex

from .helpers import ALPHABET, assert_minimal, patterns_and_strings


@given(patterns_and_strings())
def test_dfa_matches_like_python_fullmatch(case):
    pattern, strings = case
    dfa = compile_regex(pattern)
    for text in strings:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert dfa.match(text.encode()) == expected, (pattern, text)


@given(patterns_and_strings(), st.lists(st.text(alphabet=ALPHABET, max_size=6), max_size=4))
def test_nfa_determinized_and_minimized_accept_the_same_strings(case, more):
    pattern, strings = case
    nfa = build_nfa(parse_regex(pattern))
    dfa = determinize(nfa)
    smallest = minimize(dfa)
    assert smallest.num_states <= dfa.num_states
    for text in strings + more:
        data = text.encode()
        assert nfa.match(data) == dfa.match(data) == smallest.match(data), (pattern, text)
        # every byte-wise prefix too: the partial states agree on liveness
        for end in range(len(data)):
            partial = dfa.walk(dfa.start, data[:end])
            assert smallest.can_reach_accept(smallest.walk(smallest.start, data[:end])) == (
                dfa.can_reach_accept(partial)
            )


@given(patterns_and_strings())
def test_minimized_dfa_is_minimal_and_trimmed(case):
    pattern, _ = case
    dfa = compile_regex(pattern)
    assert_minimal(dfa)
