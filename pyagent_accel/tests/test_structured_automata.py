"""pyagent_accel.structured's automaton constructions (Rust) against pyagent_ref.structured.dfa.

Differential, table for table: the canonical numbering makes equal automata equal
`DFA` objects, so the subset construction, the minimisation and the products must give
the reference's exact tables (byte classes, transitions, accepting states, start) on

1. random patterns of the regex dialect (`tests.structured.helpers.trees`, hypothesis),
   their unminimised and minimal DFAs (from the NFA, and from the syntax tree with
   Thompson's construction in Rust too), and the products of pairs of them;
2. random, untrimmed DFAs (unreachable, dead and equivalent states) for `minimize`;
3. every pattern of the conformance corpus and the JSON Schemas of the MaskBench slice in
   the repository: `json_schema_grammar` gives the same rules with equal terminal DFAs;
4. errors: the state limits raise the reference's `RegexError` with its message.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyagent_accel.structured import automata

from conformance import matcher_corpus as corpus
from pyagent_accel import _native
from pyagent_accel import structured as accel
from pyagent_ref.structured import dfa as ref
from pyagent_ref.structured.dfa import DFA
from pyagent_ref.structured.grammar import Terminal
from pyagent_ref.structured.json_schema import json_schema_grammar
from pyagent_ref.structured.nfa import build_nfa
from pyagent_ref.structured.regex import RegexError, parse_regex
from tests.structured.helpers import render, trees


def nfa_of(tree):
    return build_nfa(parse_regex(render(tree)))


@settings(deadline=None)  # the reference's constructions are slow on a loaded machine
@given(trees())
def test_subsets_and_minimal_dfas_are_the_references(tree):
    nfa = nfa_of(tree)
    subsets = ref.determinize(nfa)
    assert accel.determinize(nfa) == subsets
    minimal = ref.minimize(subsets)
    assert accel.minimize(subsets) == minimal
    assert accel.minimal_dfa(nfa) == minimal
    assert accel.node_dfa(parse_regex(render(tree))) == minimal


@settings(deadline=None)  # the reference's constructions are slow on a loaded machine
@given(trees(max_leaves=5), trees(max_leaves=5))
def test_products_are_the_references(first, second):
    a, b = ref.minimal_dfa(nfa_of(first)), ref.minimal_dfa(nfa_of(second))
    assert accel.intersect(a, b) == ref.intersect(a, b)
    assert accel.subtract(a, b) == ref.subtract(a, b)
    assert accel.subtract(b, a) == ref.subtract(b, a)


def test_minimize_of_random_untrimmed_dfas():
    """Unreachable, dead and equivalent states, seeded: 2000 DFAs of up to 16 states."""
    rng = random.Random(28)
    for _ in range(2000):
        n, k = rng.randint(1, 16), rng.randint(1, 4)
        rows = tuple(tuple(rng.randint(-1, n - 1) for _ in range(k)) for _ in range(n))
        accepting = tuple(rng.random() < 0.3 for _ in range(n))
        start = rng.randint(0, n - 1)
        dfa = DFA(tuple(range(k)) + (0,) * (256 - k), rows, accepting, start)
        assert accel.minimize(dfa) == ref.minimize(dfa), dfa


def test_empty_languages():
    empty = ref.compile_regex("[^\\x00-\\x7f]").__class__((0,) * 256, (), (), ref.DEAD)
    a = ref.compile_regex("ab")
    assert accel.minimize(empty) == empty
    assert accel.intersect(empty, a) == empty == accel.subtract(a, a)
    assert accel.intersect(a, empty) == ref.intersect(a, empty) == empty


WIDE_PATTERNS = (
    ".{3}",
    '[^"\\\\]*',
    "[\\x00-\\u{10ffff}]",
    "[\\ud000-\\uffff]+",
    "[\\u0080-\\u07ff\\u0800-\\u{10000}]",
    "\\D\\W\\S",
    "(a|b|c){2,4}(de)*x{0}",
)
"""Classes across UTF-8 lengths and around the surrogates, and every kind of repetition."""


@pytest.mark.parametrize("pattern", [*(c.source for c in corpus.REGEX_CONSTRAINTS), *WIDE_PATTERNS])
def test_corpus_patterns(pattern):
    tree = parse_regex(pattern)
    nfa = build_nfa(tree)
    assert accel.minimal_dfa(nfa) == ref.minimal_dfa(nfa)
    assert accel.node_dfa(tree) == ref.node_dfa(tree)


def grammar_tables(grammar) -> dict:
    """A grammar's rules with each terminal as its DFA (terminals compare by identity)."""

    def symbol(s):
        return s if isinstance(s, str) else s.dfa

    return {
        name: tuple(tuple(symbol(s) for s in alt) for alt in alts)
        for name, alts in grammar.rules.items()
    }


def compiled(compile, source):
    """`compile(source)` as rule tables, or its refusal (class and message), with the
    terminal caches emptied first so that every DFA is built by `compile`'s automata."""
    clear_caches()
    try:
        return grammar_tables(compile(source))
    except ValueError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("constraint", list(corpus.load_maskbench()), ids=repr)
def test_json_schema_grammars_are_the_references(constraint):
    """The MaskBench slice: the same grammar, or the same refusal."""
    saved = clear_caches()
    try:
        expected = compiled(json_schema_grammar, constraint.source)
        assert compiled(accel.json_schema_grammar, constraint.source) == expected
    finally:
        restore_caches(saved)


def clear_caches():
    """Empty the reference's caches of terminals and regexes; returns the terminals."""
    from pyagent_ref.structured import grammar

    saved = dict(grammar._TERMINALS), dict(grammar._NODE_TERMINALS)
    grammar._TERMINALS.clear()
    grammar._NODE_TERMINALS.clear()
    ref.compile_regex.cache_clear()
    return saved


def restore_caches(saved):
    from pyagent_ref.structured import grammar

    clear_caches()
    grammar._TERMINALS.update(saved[0])
    grammar._NODE_TERMINALS.update(saved[1])


def test_rust_automata_only_inside_the_accelerators_compilers(monkeypatch):
    calls = []
    native = automata._native

    class Recording:
        def __getattr__(self, name):
            def call(*args):
                calls.append(name)
                return getattr(native, name)(*args)

            return call

    monkeypatch.setattr(automata, "_native", Recording())
    saved = clear_caches()
    try:
        Terminal.regex("x[0-9]+y")  # the reference's compiler: its own constructions
        assert calls == []
        accel.compile_regex("x[0-9]+z")
        assert calls == ["regex_tree_to_dfa"]
        assert ref.automata() is ref.REFERENCE_AUTOMATA
    finally:
        restore_caches(saved)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.compile_regex("(a|b)*a(a|b){20}"), "more than 10000 states"),
        (lambda m: m.compile_regex("(a|b)*a(a|b){3}", max_states=8), "more than 8 states"),
        (lambda m: m.compile_regex("abcdefghijk", max_nfa_states=10), "more than 10 NFA"),
        (lambda m: m.compile_regex("[^a]{999999999}"), "more than 100000 NFA"),
        (lambda m: m.compile_regex("((a{100}){100}){100}"), "more than 100000 NFA"),
        (lambda m: m.compile_regex("x{3,999999999}", max_nfa_states=50), "50 NFA"),
        (
            lambda m: m.intersect(
                ref.compile_regex("[ab]*a[ab]{6}"), ref.compile_regex("[ab]*b[ab]{6}"), 100
            ),
            "the product DFA has more than 100 states",
        ),
    ],
)
def test_limits_raise_the_references_errors(call, message):
    saved = clear_caches()
    try:
        with pytest.raises(RegexError, match=message) as expected:
            call(ref)
        with pytest.raises(RegexError) as got:
            call(accel)
        assert str(got.value) == str(expected.value)
    finally:
        restore_caches(saved)


@pytest.mark.parametrize(
    "call",
    [
        lambda: _native.nfa_to_dfa(0, 5, [[]], [[]], 10, True),
        lambda: _native.nfa_to_dfa(0, 0, [[(2, 1, 0)]], [[]], 10, True),
        lambda: _native.nfa_to_dfa(0, 0, [[(1, 2, 3)]], [[]], 10, True),
        lambda: _native.regex_tree_to_dfa([0, 1, 5], 10, 10),
        lambda: _native.regex_tree_to_dfa([0, 1, 5, 4], 10, 10),
        lambda: _native.regex_tree_to_dfa([3, 2, 1, 0, 0], 10, 10),
        lambda: _native.regex_tree_to_dfa([9, 0], 10, 10),
        lambda: _native.regex_tree_to_dfa([1, 0, 1], 10, 10),
        lambda: _native.minimize_dfa((b"\0" * 255, [], [], -1)),
        lambda: _native.minimize_dfa((b"\0" * 256, [1], [True], 0)),
        lambda: _native.minimize_dfa((b"\0" * 256, [], [], 0)),
    ],
)
def test_malformed_tables_are_value_errors(call):
    with pytest.raises(ValueError):
        call()


@settings(deadline=None)  # the reference's constructions are slow on a loaded machine
@given(st.lists(st.sampled_from(["ab", "a", "", "é", "abc"]), min_size=1, max_size=4))
def test_choice_grammars_are_the_references(options):
    from pyagent_ref.structured.grammar import choice_grammar

    assert grammar_tables(accel.choice_grammar(options)) == grammar_tables(choice_grammar(options))


@pytest.mark.parametrize(
    "fields",
    [
        {"regex": "[a-z]{2,5}@[a-z]+\\.(com|org)"},
        {"choice": ["yes", "no", "maybe"]},
        {"grammar": 'root ::= "[" [0-9]+ ("," [0-9]+)* "]"'},
        {"json": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}}}},
        {"json_object": True},
    ],
    ids=lambda fields: next(iter(fields)),
)
def test_constraint_grammars_are_the_references(fields):
    """What the engine compiles on this backend: every kind of request constraint."""
    from pyagent_ref.sample.params import StructuredOutputsParams
    from pyagent_ref.structured.constraints import constraint_grammar

    params = StructuredOutputsParams(**fields)
    saved = clear_caches()
    try:
        expected = compiled(constraint_grammar, params)
        assert compiled(accel.constraint_grammar, params) == expected
    finally:
        restore_caches(saved)
