"""compile_grammar and the lowering both syntaxes share: syntax detection, which parts
become one lexeme, the shapes of repetitions, and the limits (bounded in time)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured.earley import EarleyParser
from pyagent_ref.structured.ebnf import compile_grammar, detect_syntax
from pyagent_ref.structured.grammar import GrammarError, Terminal
from pyagent_ref.structured.grammar_text import MAX_LEXEME_DEPTH, render
from pyagent_ref.structured.regex import parse_regex
from tests.structured.grammar_oracle import accepts
from tests.structured.helpers import patterns_and_strings


@pytest.mark.parametrize(
    ("text", "syntax"),
    [
        ('root ::= "a"', "gbnf"),
        ('# comment\n\n  root-2 ::= "a"\nroot ::= root-2', "gbnf"),
        ('start: "a"', "lark"),
        ('// comment\n?start: x\nx: "a"', "lark"),
        ('%import common.WS\nstart: "a"', "lark"),
        ('!start.2 : "a"', "lark"),
    ],
)
def test_detect_syntax(text, syntax):
    assert detect_syntax(text) == syntax
    assert accepts(compile_grammar(text), "a")
    assert accepts(compile_grammar(text, syntax=syntax), "a")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('"a" | "b"', 'cannot tell the grammar\'s syntax from line 1, \'"a" | "b"\''),
        ("# only a comment\n", "the grammar is empty"),
        ("", "the grammar is empty"),
    ],
)
def test_detect_syntax_errors(text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        compile_grammar(text)


def test_compile_grammar_arguments():
    assert accepts(compile_grammar('x ::= "a"', start="x"), "a")
    assert accepts(compile_grammar('x: "a"', start="x"), "a")
    with pytest.raises(GrammarError, match="GBNF grammar, line 1, column 5: a rule is written"):
        compile_grammar('root: "a"', syntax="gbnf")
    with pytest.raises(ValueError, match="syntax must be 'auto', 'gbnf' or 'lark', got 'ebnf'"):
        compile_grammar('root ::= "a"', syntax="ebnf")
    with pytest.raises(TypeError, match="a grammar must be a str, got NoneType"):
        compile_grammar(None)


def test_regular_rules_become_one_lexeme():
    grammar = compile_grammar('root ::= num ("," num)*\nnum ::= "-"? [0-9]+')
    assert grammar.rules == {"root": ((Terminal.regex(r"\-?[0-9]+(?:\,\-?[0-9]+)*"),),)}


def test_runs_of_regular_items_in_recursive_rules_merge():
    grammar = compile_grammar('root ::= "(" ws root ws ")" | "x"\nws ::= " "*')
    open_, close, x = (Terminal.regex(p) for p in (r"\(\ *", r"\ *\)", "x"))
    assert grammar.rules == {"root": ((open_, "root", close), (x,))}


def test_repetitions_of_rules_are_left_recursive_or_chained():
    grammar = compile_grammar('root ::= ("a" root)* | "b"')
    a, b = Terminal.literal("a"), Terminal.literal("b")
    assert grammar.rules == {"root#1": ((), ("root#1", a, "root")), "root": (("root#1",), (b,))}
    grammar = compile_grammar('root ::= ("a" root){1,3} | "b"')
    assert grammar.rules["root#1"] == ((a, "root"),)  # the item, used three times
    assert grammar.rules["root"] == (("root#1", "root#3"), (b,))
    assert grammar.rules["root#3"] == ((), ("root#1", "root#2"))  # one more, or none
    assert grammar.rules["root#2"] == ((), ("root#1",))
    for text, ok in [("b", True), ("aab", True), ("ababab", True), ("abababab", False)]:
        assert accepts(grammar, text) == ok, text


def test_large_repetitions_of_one_lexeme_are_rules():
    grammar = compile_grammar("root ::= [0-9]{5000}")
    (digits,) = grammar.rules["root"]
    assert len(digits) == 5000 and accepts(grammar, "7" * 5000)
    assert not accepts(grammar, "7" * 4999)


def test_a_lexeme_over_the_dfa_limit_is_split():
    """``[ab]*a[ab]{20}`` needs 2^21 DFA states as one lexeme; as rules it is fine."""
    start = time.perf_counter()
    grammar = compile_grammar('root ::= [ab]* "a" [ab]{20}')
    assert time.perf_counter() - start < 5
    pattern = "[ab]*a[ab]{20}"
    for text in ["a" * 21, "b" * 21, "a" + "b" * 20, "ba" + "b" * 19, "bba" + "a" * 20]:
        assert accepts(grammar, text) == bool(re.fullmatch(pattern, text)), text


def test_exponential_inlining_stays_linear():
    """Each rule doubles the one before: inlined, rule 40 would be 2^40 characters."""
    rules = ['a0 ::= "x" | "y"'] + [f"a{i} ::= a{i - 1} a{i - 1}" for i in range(1, 41)]
    start = time.perf_counter()
    grammar = compile_grammar("\n".join(rules), start="a40")
    assert time.perf_counter() - start < 2
    parser = EarleyParser(grammar)
    assert all(parser.push(byte) for byte in b"xyyx" * 16) and not parser.is_accepting()
    assert accepts(compile_grammar("\n".join(rules[:5]), start="a4"), "xyxyxyxyxyxyxyxy")


def test_long_rule_chains():
    rules = [f'r{i} ::= "a" r{i + 1}' for i in range(2000)] + ['r2000 ::= "b"']
    grammar = compile_grammar("\n".join(rules), start="r0")
    assert accepts(grammar, "a" * 2000 + "b") and not accepts(grammar, "a" * 1999 + "b")
    depth = max(
        len(re.findall(r"\(\?:", t.pattern)) for t in grammar.symbols() if isinstance(t, Terminal)
    )
    assert depth <= MAX_LEXEME_DEPTH


def test_size_limit():
    uses = " ".join(["x{10000}"] * 25)
    start = time.perf_counter()
    with pytest.raises(GrammarError, match="the grammar has more than 200000 symbols once"):
        compile_grammar(f'root ::= {uses}\nx ::= "a" x | "b"')
    assert time.perf_counter() - start < 2


@given(patterns_and_strings())
def test_render_reads_alike_in_both_dialects(case):
    """A rendered tree is a pattern our regex parser and Python's `re` agree on."""
    pattern, strings = case
    rendered = render(parse_regex(pattern))
    assert parse_regex(rendered) == parse_regex(pattern)
    terminal = Terminal.regex(rendered)
    for text in strings:
        expected = re.fullmatch(rendered, text) is not None
        assert terminal.dfa.match(text.encode()) == expected, (rendered, text)


@given(st.text(max_size=6))
def test_literals_render_exactly(text):
    from pyagent_ref.structured.grammar_text import literal

    rendered = render(literal(text)) if text else ""
    assert re.fullmatch(rendered, text) and Terminal.regex(rendered).dfa.match(text.encode())
