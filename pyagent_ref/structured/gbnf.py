"""GBNF, llama.cpp's grammar format (also the "EBNF" of XGrammar and vLLM), parsed to a `Grammar`.

The accepted syntax, written in itself (``ws`` between tokens is implied)::

    grammar      ::= rule*
    rule         ::= name "::=" alternatives
    alternatives ::= sequence ("|" sequence)*
    sequence     ::= (atom quantifier?)*
    atom         ::= name | string | class | "." | "(" alternatives ")"
    quantifier   ::= "*" | "+" | "?" | "{" count "}" | "{" count? "," count? "}"
    name         ::= [a-zA-Z0-9_-]+
    string       ::= "\\"" ([^"\\\\\\n] | escape)* "\\""
    class        ::= "[" "^"? ([^\\]\\\\\\n] | escape)* "]"
    ws           ::= ([ \\t\\r\\n] | "#" [^\\n]*)*

* A rule ends where the next ``name ::=`` begins: newlines are whitespace, so a rule may
  span lines anywhere (llama.cpp ends a rule at a newline outside parentheses and after
  ``|``; every grammar it reads means the same here). Rules may come in any order and
  recurse in any way (left recursion included); a rule defined twice is an error.
* Strings and classes match code points, written as themselves or escaped: ``\\n \\r
  \\t \\\\ \\" \\' \\[ \\] \\- \\/ \\b \\f \\v \\0``, ``\\xHH`` (exactly two digits, as
  llama.cpp; XGrammar reads any number), ``\\uHHHH``, ``\\UHHHHHHHH``. In a class,
  ``a-z`` is a range, ``^`` first negates, ``[^]`` is any character and ``[]`` none.
  ``.`` is any character, newline included.
* ``x{m}``, ``x{m,}``, ``x{m,n}``, ``x{,n}`` repeat (counts up to `MAX_REPETITION`);
  a quantifier cannot follow a quantifier (write ``(x+)*``).
* The start symbol is ``root`` unless `parse_gbnf` is given another.

Not supported, each a `GrammarError` that says so: llama.cpp's token elements
(``<[id]>``, ``<think>``, ``!<...>``), XGrammar's macros (``TagDispatch(...)``,
``Token(...)``...), rule options (``name[temperature=...]``) and lookahead assertions
``(= ...)``. A grammar of text is matched byte by byte; tokens are another layer.

Every error names the line and column, and what was found there.
"""

from __future__ import annotations

import re

from .grammar import Grammar
from .grammar_text import (
    MAX_NESTING,
    Expr,
    Ref,
    Token,
    build_grammar,
    count_bounds,
    literal,
    text_error,
    tokenize,
)
from .regex import MAX_CODE_POINT, Alt, Chars, Concat, Repeat, complement, normalize_ranges

__all__ = ["parse_gbnf"]

_TOKEN = re.compile(
    r"""(?P<skip>(?:[ \t\r\n]|\#[^\n]*)+)
    | (?P<define>::=)
    | (?P<name>[A-Za-z0-9_-]+)
    | (?P<string>"(?:[^"\\\n]|\\.)*")
    | (?P<bad_string>")
    | (?P<char_class>\[(?:[^\]\\\n]|\\.)*\])
    | (?P<bad_class>\[)
    | (?P<bad_token>!?<)
    | (?P<bad_lookahead>\(\s*=)
    | (?P<bad_define>::?=?|=)
    | (?P<punct>[.()|*+?,])
    | (?P<count>\{[ \t]*\d*[ \t]*(?:,[ \t]*\d*[ \t]*)?\})
    """,
    re.VERBOSE,
)
_PROBLEMS = {
    "bad_string": "unterminated string literal (a newline in a literal is written \\n)",
    "bad_class": "unterminated character class (a newline in a class is written \\n)",
    "bad_token": "token elements (<[id]>, <name>, !<...>) are not supported: "
    "a grammar of text is matched byte by byte",
    "bad_lookahead": "lookahead assertions '(= ...)' are not supported",
    "bad_define": "a rule is written 'name ::= ...'",
}
_ESCAPES = {
    "n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v", "0": "\0",
    "\\": "\\", '"': '"', "'": "'", "[": "[", "]": "]", "-": "-", "/": "/", "^": "^",
}  # fmt: skip
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_HEX = re.compile("[0-9a-fA-F]+")
_MACROS = ("TagDispatch", "TokenTagDispatch", "Token", "ExcludeToken")


def parse_gbnf(text: str, start: str = "root") -> Grammar:
    """The `Grammar` of GBNF ``text`` (the syntax of the module docstring), from ``start``.

    Raises:
        GrammarError: malformed or unsupported syntax, an undefined or twice-defined rule,
            a count over `MAX_REPETITION`, groups nested deeper than `MAX_NESTING`; the
            message names the line, the column and the offending text. Also the errors of
            `grammar_text.build_grammar` (no rule ``start``, size limits, a rule that can
            derive no sentence).
    """
    if not isinstance(text, str):
        raise TypeError(f"a grammar must be a str, got {type(text).__name__}")
    return build_grammar(_Parser(tokenize(text, _TOKEN, "GBNF", _PROBLEMS)).rules(), start, "GBNF")


class _Parser:
    """Recursive descent over the tokens; ``pos`` indexes the next token."""

    def __init__(self, tokens: list[Token]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self, ahead: int = 0) -> Token | None:
        i = self.pos + ahead
        return self.tokens[i] if i < len(self.tokens) else None

    def error(self, problem: str, token: Token | None = None):
        token = token or self.peek() or self.tokens[-1]
        return text_error("GBNF", token.line, token.column, problem)

    def found(self) -> str:
        token = self.peek()
        return "the end of the grammar" if token is None else repr(token.text)

    def rules(self) -> dict[str, Expr]:
        rules: dict[str, Expr] = {}
        while (token := self.peek()) is not None:
            after = self.peek(1)
            if token.kind != "name" or after is None or after.kind != "define":
                raise self.error(f"expected a rule 'name ::= ...', found {self.found()}")
            if token.text in rules:
                raise self.error(f"rule {token.text!r} is defined twice", token)
            self.pos += 2
            rules[token.text] = self.alternatives()
            if self.peek() is not None and self.peek().text == ")":
                raise self.error("unbalanced ')': no group is open")
        return rules

    def alternatives(self) -> Expr:
        options = [self.sequence()]
        while (token := self.peek()) is not None and token.text == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Expr:
        items: list[Expr] = []
        while (token := self.peek()) is not None and token.text not in ("|", ")"):
            after = self.peek(1)
            if token.kind == "name" and after is not None and after.kind == "define":
                break  # the next rule
            item = self.atom()
            if (bounds := self.quantifier()) is not None:
                item = Repeat(item, *bounds)
                if self.quantifier() is not None:
                    raise self.error("a quantifier cannot follow a quantifier: write (x+)*")
            items.append(item)
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def atom(self) -> Expr:
        token = self.peek()
        self.pos += 1
        if token.kind == "name":
            after = self.peek()
            if token.text in _MACROS and after is not None and after.text == "(":
                raise self.error(f"XGrammar's macro {token.text}(...) is not supported", token)
            return Ref(token.text, token.line, token.column)
        if token.kind == "string":
            return literal(self.string(token))
        if token.kind == "char_class":
            return Chars(self.char_class(token))
        if token.text == ".":
            return Chars(((0, MAX_CODE_POINT),))
        if token.text == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.error(f"groups are nested deeper than {MAX_NESTING}", token)
            inside = self.alternatives()
            if self.peek() is None or self.peek().text != ")":
                raise self.error(
                    f"missing ')' to close the group opened at line "
                    f"{token.line}, column {token.column}; found {self.found()}"
                )
            self.pos += 1
            self.depth -= 1
            return inside
        if token.kind == "count" or token.text in "*+?":
            raise self.error(f"nothing to repeat before {token.text!r}", token)
        if token.kind == "define":
            raise self.error("'::=' must follow a rule name at the start of a rule", token)
        raise self.error(f"unexpected {token.text!r}", token)

    def quantifier(self) -> tuple[int, int | None] | None:
        """Read a quantifier: its (min, max), max None for no bound; None if there is none."""
        token = self.peek()
        if token is None or not (token.kind == "count" or token.text in ("*", "+", "?")):
            return None
        self.pos += 1
        if token.text in ("*", "+", "?"):
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[token.text]
        return count_bounds(token, "GBNF")

    def char_class(self, token: Token) -> tuple[tuple[int, int], ...]:
        """The code points of a class token ``[...]``: ``^`` first negates, an unescaped
        ``-`` between two characters makes a range."""
        body = token.text[1:-1]
        negated = body.startswith("^")
        ranges, i = [], int(negated)
        while i < len(body):
            low, i = self.char(token, body, i)
            high = low
            if body[i : i + 1] == "-" and i + 1 < len(body):
                high, i = self.char(token, body, i + 1)
                if high < low:
                    raise self.error(
                        f"bad range in {token.text}: {chr(low)!r} is after {chr(high)!r}", token
                    )
            ranges.append((low, high))
        ranges = normalize_ranges(ranges)
        return complement(ranges) if negated else ranges

    def string(self, token: Token) -> str:
        """The characters of a string token."""
        body, chars, i = token.text[1:-1], [], 0
        while i < len(body):
            code, i = self.char(token, body, i)
            chars.append(chr(code))
        return "".join(chars)

    def char(self, token: Token, body: str, i: int) -> tuple[int, int]:
        """The code point at ``body[i]`` (a character or an escape) and the index after it."""
        if body[i] != "\\":
            return ord(body[i]), i + 1
        escape = body[i + 1]
        if escape in _ESCAPES:
            return ord(_ESCAPES[escape]), i + 2
        if escape not in _HEX_ESCAPES:
            raise self.error(f"unknown escape '\\{escape}' in {token.text}", token)
        digits = body[i + 2 : i + 2 + _HEX_ESCAPES[escape]]
        if len(digits) != _HEX_ESCAPES[escape] or not _HEX.fullmatch(digits):
            raise self.error(
                f"expected {_HEX_ESCAPES[escape]} hex digits after '\\{escape}' in {token.text}",
                token,
            )
        code = int(digits, 16)
        if code > MAX_CODE_POINT or 0xD800 <= code <= 0xDFFF:
            raise self.error(
                f"'\\{escape}{digits}' in {token.text} is not a character "
                "(a surrogate, or above U+10FFFF)",
                token,
            )
        return code, i + 2 + len(digits)
