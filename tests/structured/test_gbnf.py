"""GBNF texts: the standard grammars on known sentences, random grammars against the
languages of their trees, every error with its line and column, and fuzzed text."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured.gbnf import parse_gbnf
from pyagent_ref.structured.grammar import GrammarError, Terminal
from tests.structured.grammar_oracle import (
    accepts,
    grammars,
    parsed_language,
    render_gbnf,
    tree_language,
)

# llama.cpp's grammars/json.gbnf, arithmetic.gbnf and chess.gbnf
JSON_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

ARITHMETIC_GBNF = r"""
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
"""

CHESS_GBNF = r"""
# `root` specifies the pattern for the overall output
root   ::= (
    # it must start with the characters "1. " followed by a sequence
    # of characters that match the `move` rule, followed by a space, followed
    # by another move, and then a newline
    "1. " move " " move "\n"

    # it's followed by one or more subsequent moves, numbered with one or two digits
    ([1-9] [0-9]? ". " move " " move "\n")+
)

# `move` is an abstract representation, which can be a pawn, nonpawn, or castle.
# The `[+#]?` denotes the possibility of checking or mate signs after moves
move   ::= (pawn | nonpawn | castle) [+#]?

pawn   ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?
"""


def test_json_grammar():
    grammar = parse_gbnf(JSON_GBNF)
    good = [
        {"a": 1},
        {"name": "Ada", "tags": ["x", "y"], "n": -12.5e3, "ok": True, "none": None},
        {"nested": {"deep": [[], {}, [1, [2, [3]]]]}, "esc": 'q"\\/\n\u00e9'},
    ]
    for value in good:
        for text in (json.dumps(value), json.dumps(value, indent=2)):
            assert accepts(grammar, text), text
    for text in ['{"a" 1}', "[1, 2]", '{"a": 01}', '{"a": tru}', '{"a": "\x01"}', '{"a": 1,}']:
        assert not accepts(grammar, text), text
    assert accepts(grammar, '{"a":\n    [1 ,2]}')


def test_json_grammar_lexemes():
    """string, number and ws are regular, so each use of one is (part of) one lexeme."""
    grammar = parse_gbnf(JSON_GBNF)
    assert set(grammar.rules) <= {"root", "value", "object", "array"} | {
        name for name in grammar.rules if "#" in name
    }
    (alternative,) = grammar.rules["object"]
    assert isinstance(alternative[0], Terminal) and alternative[0].dfa.match(b"{\n  ")


def test_arithmetic_grammar():
    grammar = parse_gbnf(ARITHMETIC_GBNF)
    for text in ["1+2=3\n", "( a +b_1)*c = 42\n", "x=y\nz=(1)\n"]:
        assert accepts(grammar, text), text
    for text in ["1+2=3", "1+=3\n", "(1=2\n", "=1\n"]:
        assert not accepts(grammar, text), text


def test_chess_grammar():
    grammar = parse_gbnf(CHESS_GBNF)
    good = "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n4. O-O exd4+\n10. Qxf7# O-O-O\n"
    assert accepts(grammar, good)
    for text in [
        "1. e4 e5\n",
        "1. e9 e5\n2. a3 a4\n",
        "1. e4 e5\n2. Ke4\n",
        "1. Px4 e5\n2. a3 a4\n",
    ]:
        assert not accepts(grammar, text), text


@given(grammars(), st.integers(0, 1))
def test_random_grammars_match_their_trees(rules, style):
    text = render_gbnf(rules, style)
    assert parsed_language(parse_gbnf(text)) == tree_language(rules), text


@pytest.mark.parametrize(
    ("text", "sentences", "non_sentences"),
    [
        (r'root ::= "\x41\u00e9\U0001F600\t\\\"\[\]"', ['Aé😀\t\\"[]'], ["A"]),
        (r"root ::= [^\n\x00-\x1f]", ["a", "é", " "], ["\n", "\x01", ""]),
        (r'root ::= "\e\a\?\$" [\.\*\^]', ["\x1b\x07?$.", "\x1b\x07?$^"], ["\x1b\x07?$a"]),
        (r"root ::= [a-cx\-]+", ["abcx-", "-"], ["d", ""]),
        (r"root ::= [-a]", ["-", "a"], ["b"]),
        ("root ::= .", ["\n", "a", "😀"], ["", "ab"]),
        ("root ::= [^]", ["\n", "é"], [""]),
        ('root ::= "a"{2} "b"{,2} "c"{1,}', ["aa" + "c", "aabbccc"], ["ac", "aabbbc"]),
        ('root ::= ""', [""], ["a"]),
        ('root ::= | "a"', ["", "a"], ["aa"]),
        ('root ::= x\nx ::= "a" x | "b"', ["b", "aab"], ["a"]),
        ('root ::= root "a" | "a"', ["a", "aaa"], [""]),
        ('root ::=\n  "a"\n  "b" # a comment\nr2 ::= "c"', ["ab"], ["a"]),
        ('root ::= ( "a" |\n "b" ) # (" ]\n', ["a", "b"], [""]),
        ('root ::= [+#]? "#" ', ["+#", "##", "#"], [""]),
    ],
)
def test_syntax(text, sentences, non_sentences):
    grammar = parse_gbnf(text)
    for sentence in sentences:
        assert accepts(grammar, sentence), sentence
    for sentence in non_sentences:
        assert not accepts(grammar, sentence), sentence


def test_start_symbol_is_configurable():
    grammar = parse_gbnf('value ::= "a" | "b"', start="value")
    assert accepts(grammar, "a") and not accepts(grammar, "c")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('root ::= "a', "line 1, column 10: unterminated string literal"),
        ('root ::= "a\nb"', "line 1, column 10: unterminated string literal"),
        ("root ::= [a", "line 1, column 10: unterminated character class"),
        ("root ::=\n  <think> x", "line 2, column 3: token elements (<[id]>, <name>, !<...>) are"),
        ('root = "a"', "line 1, column 6: a rule is written 'name ::= ...'"),
        ('root: "a"', "line 1, column 5: a rule is written 'name ::= ...'"),
        ('root ::= ("a"', "line 1, column 11: missing ')' to close the group opened at line 1, "),
        ('root ::= "a" )', "line 1, column 14: unbalanced ')': no group is open"),
        ('root ::= "a"\n\nx ::= y', "line 3, column 7: undefined rule 'y'"),
        (
            'root ::= "a"{3,2}',
            "line 1, column 13: repetition {3,2}: the minimum exceeds the maximum",
        ),
        ('root ::= "a"{10001}', "line 1, column 13: repetition {10001} is over the limit of 10000"),
        ('root ::= "a"{}', "line 1, column 13: repetition {} needs a count"),
        (r'root ::= "\q"', "line 1, column 10: unknown escape '\\q' in \"\\q\""),
        (r'root ::= "\x4"', "line 1, column 10: expected 2 hex digits after '\\x' in \"\\x4\""),
        (r'root ::= "\ud800"', "line 1, column 10: '\\ud800' in \"\\ud800\" is not a character"),
        ("root ::= [z-a]", "line 1, column 10: bad range in [z-a]: 'z' is after 'a'"),
        ('root ::= "a"**', "line 1, column 14: a quantifier cannot follow a quantifier"),
        ("root ::= *", "line 1, column 10: nothing to repeat before '*'"),
        ('root ::= "a"\nroot ::= "b"', "line 2, column 1: rule 'root' is defined twice"),
        ('root ::= TagDispatch(("a", b))', "column 10: XGrammar's macro TagDispatch(...) is not"),
        ('root ::= (= "a")', "line 1, column 10: lookahead assertions '(= ...)' are not supported"),
        ('root ::= "a" ::= "b"', "line 1, column 14: '::=' must follow a rule name"),
        ('"a" ::= "b"', "line 1, column 1: expected a rule 'name ::= ...', found '\"a\"'"),
        ('root ::= "a" $', "line 1, column 14: unexpected character '$'"),
        ("root ::= " + "(" * 51 + '"a"' + ")" * 51, "column 60: groups are nested deeper than 50"),
        ('x ::= "a"', "GBNF grammar has no rule 'root' (the start symbol)"),
        ("root ::= []", "rule 'root' has an alternative that can derive no sentence"),
        ("", "GBNF grammar has no rule 'root'"),
    ],
)
def test_errors_name_line_and_column(text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        parse_gbnf(text)


def test_type_error():
    with pytest.raises(TypeError, match="a grammar must be a str, got bytes"):
        parse_gbnf(b'root ::= "a"')


GRAMMAR_CHARS = 'root::=x "a\\b|()[]^-*+?{},.#\n\t 019<>=_'


@given(st.text(GRAMMAR_CHARS, max_size=40))
def test_random_text_gives_a_grammar_or_a_grammar_error(text):
    try:
        parse_gbnf(text)
    except GrammarError:
        pass


@given(grammars(), st.data())
def test_damaged_grammars_give_a_grammar_or_a_grammar_error(rules, data):
    text = render_gbnf(rules, data.draw(st.integers(0, 1)))
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 3))
    text = text[:at] + data.draw(st.text(GRAMMAR_CHARS, max_size=2)) + text[at + cut :]
    try:
        parse_gbnf(text)
    except GrammarError:
        pass
