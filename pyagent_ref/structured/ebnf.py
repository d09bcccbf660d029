"""Grammar texts compiled to a `Grammar`: GBNF (`gbnf`) or Lark (`lark_grammar`).

`compile_grammar` is the entry point of vLLM's ``grammar`` field: one text, in either
syntax, told apart by `detect_syntax`. Both syntaxes parse into the same rule trees, which
`grammar_text.build_grammar` lowers to rules over lexemes: a GBNF rule that is not
recursive and uses only such rules becomes one lexeme, and so does every Lark terminal.
"""

from __future__ import annotations

import re

from .gbnf import parse_gbnf
from .grammar import Grammar, GrammarError
from .lark_grammar import parse_lark

__all__ = ["compile_grammar", "detect_syntax"]

_COMMENT_OR_BLANK = re.compile(r"\s*(?:(?:#|//).*)?$")
_GBNF_RULE = re.compile(r"\s*[A-Za-z0-9_-]+\s*::=")
_LARK_DEFINITION = re.compile(r"\s*(?:%|[?!]?_*[A-Za-z][\w-]*(?:\.\d+)?\s*:)")


def detect_syntax(text: str) -> str:
    """``"gbnf"`` or ``"lark"``: the syntax of ``text``, told by its first line that is
    neither blank nor a comment (``#`` or ``//``): ``name ::=`` starts a GBNF rule;
    ``name:`` (with Lark's optional ``?``, ``!`` and ``.priority``) or a ``%``
    directive starts a Lark grammar.

    Raises:
        GrammarError: that line is neither (it is quoted, with its number).
    """
    for number, line in enumerate(text.splitlines(), 1):
        if _COMMENT_OR_BLANK.match(line):
            continue
        if _GBNF_RULE.match(line):
            return "gbnf"
        if _LARK_DEFINITION.match(line):
            return "lark"
        raise GrammarError(
            f"cannot tell the grammar's syntax from line {number}, {line.strip()[:60]!r}: "
            "expected a GBNF rule 'name ::= ...' or a Lark definition 'name: ...' "
            "(or pass syntax='gbnf' or 'lark')"
        )
    raise GrammarError("the grammar is empty: it has no rule")


def compile_grammar(text: str, syntax: str = "auto", start: str | None = None) -> Grammar:
    """The `Grammar` of grammar ``text``.

    Args:
        text: a GBNF or Lark grammar (see `gbnf` and `lark_grammar` for what each accepts).
        syntax: ``"gbnf"``, ``"lark"``, or ``"auto"`` (`detect_syntax`).
        start: the start rule; None for the syntax's own (``root`` in GBNF, ``start`` in
            Lark).
    Raises:
        GrammarError: the text cannot be compiled (the message names the line and column).
        ValueError: an unknown ``syntax``.
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"a grammar must be a str, got {type(text).__name__}")
    if syntax not in ("auto", "gbnf", "lark"):
        raise ValueError(f"syntax must be 'auto', 'gbnf' or 'lark', got {syntax!r}")
    if syntax == "auto":
        syntax = detect_syntax(text)
    if syntax == "gbnf":
        return parse_gbnf(text, "root" if start is None else start)
    return parse_lark(text, "start" if start is None else start)
