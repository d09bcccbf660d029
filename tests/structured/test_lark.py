"""Lark texts: the standard grammars on known sentences, the common terminals against
Python regexes, ``%ignore``, random grammars against the languages of their trees, every
error with its line and column, and fuzzed text."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyagent_ref.structured.grammar import GrammarError, Terminal
from pyagent_ref.structured.lark_grammar import IGNORE_RULE, parse_lark
from tests.structured.grammar_oracle import (
    accepts,
    grammars,
    parsed_language,
    render_lark,
    tree_language,
)

# The JSON grammar of Lark's tutorial, and its calculator example
JSON_LARK = r"""
?start: value

?value: object
      | array
      | string
      | SIGNED_NUMBER      -> number
      | "true"             -> true
      | "false"            -> false
      | "null"             -> null

array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value

string : ESCAPED_STRING

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

CALC_LARK = r"""
?start: sum
      | NAME "=" sum    -> assign_var

?sum: product
    | sum "+" product   -> add
    | sum "-" product   -> sub

?product: atom
    | product "*" atom  -> mul
    | product "/" atom  -> div

?atom: NUMBER           -> number
     | "-" atom         -> neg
     | NAME             -> var
     | "(" sum ")"

%import common.CNAME -> NAME
%import common.NUMBER
%import common.WS_INLINE

%ignore WS_INLINE
"""


def test_json_grammar():
    grammar = parse_lark(JSON_LARK)
    value = {"name": "Ada", "tags": ["x", "y"], "n": -12.5e3, "ok": True, "none": None}
    for text in (json.dumps(value), json.dumps(value, indent=2), "[]", '"\\u00e9"', "-1.5e+3"):
        assert accepts(grammar, text), text
    for text in ['{"a" 1}', "[1,]", '{"a": tru}', '"a\nb"', "- 1"]:
        assert not accepts(grammar, text), text


def test_calculator_grammar():
    grammar = parse_lark(CALC_LARK)
    for text in ["1+2", "x = (1 + 2.5) * -y_1 / 3", "-(-a)"]:
        assert accepts(grammar, text), text
    for text in ["1 +", "x = = 1", "1x", " 1"]:
        assert not accepts(grammar, text), text


def test_ignore_follows_every_lexeme_of_a_rule():
    """Ignored text may come between lexemes and after the last, not before the first,
    and never inside a terminal; a rule (lowercase) is not a lexeme, a terminal is."""
    grammar = parse_lark(
        """
        start: "a" DIGITS digits
        DIGITS: DIGIT+
        digits: DIGIT+
        %import common.DIGIT
        %ignore " "
        %ignore /;+/
        """
    )
    for text in ["a12 3 4", "a 12;;3", "a12 3;4 ;", "a1 2"]:
        assert accepts(grammar, text), text
    for text in [" a12 3", "a1 2 3 4x", "a"]:
        assert not accepts(grammar, text), text
    ((terminal,),) = grammar.rules["start"]  # regular, so all one lexeme:
    skip = r"(?:\ |\;+)*"
    assert terminal.pattern == rf"a{skip}[0-9]+{skip}(?:[0-9]{skip})+"


def test_terminals_are_one_lexeme():
    grammar = parse_lark('start: A\nA: "x" B* "y"i\nB: "b" | /c+/')
    ((terminal,),) = grammar.rules["start"]
    assert isinstance(terminal, Terminal) and list(grammar.rules) == ["start"]
    for text, ok in [("xY", True), ("xbccby", True), ("x", False), ("xdy", False)]:
        assert accepts(grammar, text) == ok, text
    assert IGNORE_RULE not in grammar.rules


COMMON = {
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[0-9a-fA-F]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "DECIMAL": r"[0-9]+\.[0-9]*|\.[0-9]+",
    "FLOAT": r"[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?",
    "NUMBER": r"[0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+",
    "SIGNED_NUMBER": r"[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
    r"|[0-9]+)",
    "ESCAPED_STRING": r'"([^"\\\n]|\\[^\n])*"',
    "WORD": r"[a-zA-Z]+",
    "CNAME": r"[a-zA-Z_][a-zA-Z_0-9]*",
    "WS": r"[ \t\f\r\n]+",
    "WS_INLINE": r"[ \t]+",
    "NEWLINE": r"(\r?\n)+",
    "C_COMMENT": r"/\*(.|\n)*?\*/",
    "CPP_COMMENT": r"//[^\n]*",
    "SH_COMMENT": r"#[^\n]*",
}
COMMON_CHARS = '0123456789.eE+-_aZ "\\\n\r\t*/#'


@pytest.mark.parametrize("name", sorted(COMMON))
@given(text=st.text(COMMON_CHARS, max_size=8))
def test_common_terminals(name, text):
    grammar = parse_lark(f"start: {name}\n%import common.{name}")
    expected = re.fullmatch(COMMON[name], text) is not None
    if name == "C_COMMENT":  # Lark's lexer stops at the first */
        expected = (
            expected and "*/" not in text[2:-2] and text[2:-1].find("*/") in (-1, len(text) - 4)
        )
    assert accepts(grammar, text) == expected, repr(text)


@pytest.mark.parametrize(
    ("text", "sentences", "non_sentences"),
    [
        ('start: "ab"i', ["ab", "AB", "aB"], ["a"]),
        ('start: /ab|c/i "é"', ["Abé", "Cé"], ["ab"]),
        ("start: /a.b/", ["a-b", "aéb"], ["a\nb"]),
        ("start: /a.b/s", ["a\nb", "a.b"], ["ab"]),
        (r"start: /[.]\./s", [".."], ["a."]),
        ('start: "a".."c"+', ["abc", "c"], ["d", ""]),
        ('start: "a"~2 "b"~1..2 "c"{2,} "d"{,1}', ["aabcc", "aabbcccd"], ["abcc", "aabc"]),
        ('start: ["a" "b"] "c"', ["c", "abc"], ["ac"]),
        ('start: x x\nx: "a"\n  | "b"', ["ab", "ba"], ["a"]),
        ('start: (  "a"\n  | "b"\n)+ // comment\n# another', ["ab"], [""]),
        ('start: A\nA.2: "a" | "b" -> alias\n!x: "c"\n_y: "d"', ["a"], ["c"]),
        ('start: "\\x41\\u00e9\\U0001F600\\"\\\\/"', ['Aé😀"\\/'], [""]),
        ('start: "a" | \n\n | "b"', ["a", "b", ""], ["ab"]),
        ("%import common (INT, WS)\nstart: INT WS INT", ["1 2"], ["12"]),
        ('start: left\nleft: left "a" | "a"', ["a", "aaa"], [""]),
    ],
)
def test_syntax(text, sentences, non_sentences):
    grammar = parse_lark(text)
    for sentence in sentences:
        assert accepts(grammar, sentence), sentence
    for sentence in non_sentences:
        assert not accepts(grammar, sentence), sentence


def test_start_symbol_is_configurable():
    grammar = parse_lark('value: "a" | "b"', start="value")
    assert accepts(grammar, "a") and not accepts(grammar, "c")


@given(grammars(), st.integers(0, 1))
def test_random_grammars_match_their_trees(rules, style):
    text = render_lark(rules, style)
    assert parsed_language(parse_lark(text)) == tree_language(rules), text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('start: "a', "line 1, column 8: unterminated string literal"),
        ("start: /a", "line 1, column 8: unterminated regex"),
        ("start: x{a}", "line 1, column 9: templates 'name{...}' are not supported"),
        ("start: <|end|>", "line 1, column 8: special tokens (<|...|>, <[id]>) are not supported"),
        ('start "a"', "line 1, column 7: expected ':' after the name 'start', found '\"a\"'"),
        (
            'start: ("a"',
            "line 1, column 9: missing ')' to close the '(' at line 1, column 8; found the end",
        ),
        ('start: ["a")', "missing ']' to close the '[' at line 1, column 8; found ')'"),
        ('start: "a" )', "line 1, column 12: expected the end of the line, found ')'"),
        ('start: "a"\n"b"', "line 2, column 1: expected a rule or terminal name, found '\"b\"'"),
        ('start: "a"\nx: y', "line 2, column 4: undefined rule 'y'"),
        ('start: "a"{3,2}', "line 1, column 11: repetition {3,2}: the minimum exceeds the maximum"),
        ('start: "a"~3..2', "line 1, column 11: repetition ~: the minimum exceeds the maximum"),
        ('start: "a"~10001', "line 1, column 11: repetition ~ is over the limit of 10000"),
        ('start: "a"~', "line 1, column 11: expected a count after '~', found the end of the gr"),
        (r'start: "\q"', "line 1, column 8: bad escape '\\q' in \"\\q\""),
        (r'start: "\x4"', "line 1, column 8: bad escape '\\x' in \"\\x4\""),
        ('start: "ab".."c"', 'line 1, column 8: a range \'"a".."z"\' needs two one-character'),
        ('start: "c".."a"', 'line 1, column 8: bad range "c".."a": its start is after its end'),
        ("start: /a(/", "line 1, column 8: bad regex /a(/: missing ')' to close the group"),
        ("start: /a/x", "line 1, column 8: regex flag 'x' is not supported (only i and s)"),
        ('start: A\nA: a\na: "x"', "line 2, column 4: a terminal cannot use the rule 'a'"),
        ('start: A\nA: B "x"\nB: A', "line 3, column 4: terminal 'A' is recursive (A -> B -> A)"),
        ('start: A\nA: "x" A', "line 2, column 8: terminal 'A' is recursive (A -> A)"),
        ('start: "a"\nstart: "b"', "line 2, column 1: 'start' is defined twice"),
        ("%import common.NOPE\nstart: NOPE", "line 1, column 16: common has no terminal 'NOPE'"),
        ("%import other.X", "line 1, column 9: only '%import common...' is supported"),
        ("%declare X", "line 1, column 1: directive %declare is not supported"),
        (
            'start: %json {"type": "object"}',
            "line 1, column 8: embedded grammars and options (%json, %lark",
        ),
        ('start[lazy]: "a"', "line 1, column 6: rule options 'start[...]' are not supported"),
        ('%ignore x\nx: "a"\nstart: "b"', "line 1, column 9: a terminal cannot use the rule"),
        ('start: ?"a"', "line 1, column 8: unexpected '?'"),
        ('start: "a" ; "b"', "line 1, column 12: unexpected character ';'"),
        ("start: " + "(" * 51 + '"a"' + ")" * 51, "column 58: groups are nested deeper than 50"),
        ('x: "a"', "Lark grammar has no rule 'start' (the start symbol)"),
        ("start: /[^\\x00-\\U0010FFFF]/", "bad regex"),
    ],
)
def test_errors_name_line_and_column(text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        parse_lark(text)


def test_deeply_nested_regex_is_a_grammar_error():
    with pytest.raises(GrammarError, match="groups nest more than 100 deep"):
        parse_lark("start: /" + "(" * 400 + "a" + ")" * 400 + "/")


GRAMMAR_CHARS = 'start:xA "a\\b|()[]^-*+?{},.~/%#\n\t 019<>_i'


@given(st.text(GRAMMAR_CHARS, max_size=40))
def test_random_text_gives_a_grammar_or_a_grammar_error(text):
    try:
        parse_lark(text)
    except GrammarError:
        pass


@given(grammars(), st.data())
def test_damaged_grammars_give_a_grammar_or_a_grammar_error(rules, data):
    text = render_lark(rules, data.draw(st.integers(0, 1)))
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 3))
    text = text[:at] + data.draw(st.text(GRAMMAR_CHARS, max_size=2)) + text[at + cut :]
    try:
        parse_lark(text)
    except GrammarError:
        pass
