"""Lark grammars, the subset written for structured output (as llguidance and XGrammar read
it), parsed to a `Grammar`.

The accepted syntax, written in itself (spaces and tabs between tokens are implied; a
newline ends a definition unless the next line starts with ``|`` or a bracket is open)::

    start: (definition | directive)*
    definition: ("?" | "!")? NAME ("." INT)? ":" expansions
    directive: "%import" "common" ("." NAME ("->" NAME)? | "(" NAME ("," NAME)* ")")
             | "%ignore" expansions
    expansions: alias ("|" alias)*
    alias: expr* ("->" NAME)?
    expr: atom ("?" | "*" | "+" | "~" INT (".." INT)? | COUNT)?
    atom: "(" expansions ")" | "[" expansions "]" | STRING (".." STRING)? | REGEX | NAME
    COUNT: "{" INT? ("," INT?)? "}"
    NAME: /_*[A-Za-z][A-Za-z0-9_]*(-[A-Za-z0-9_]+)*/
    STRING: /"([^"\\\\\\n]|\\\\.)*"i?/
    REGEX: /\\/([^\\/\\\\\\n]|\\\\.)+\\/[is]*/
    %ignore /[ \\t]+|\\/\\/[^\\n]*|#[^\\n]*/

* A NAME whose first letter is uppercase is a *terminal*, any other a *rule*. A terminal
  may use strings, regexes and other terminals, never a rule nor itself (directly or
  not): it is a regular language, compiled as one lexeme. Rules may use anything and
  recurse in any way. The start symbol is ``start`` unless `parse_lark` is given another.
* Strings take the escapes ``\\" \\\\ \\/ \\' \\n \\r \\t \\b \\f \\v \\0 \\xHH \\uHHHH
  \\UHHHHHHHH``; ``"..."i`` matches ASCII letters in either case; ``"a".."z"`` is one
  character of a range. Regexes are in the dialect of `regex` (a whole match), with the
  flags ``i`` (ASCII letters in either case) and ``s`` (``.`` matches a newline too).
* ``[x]`` and ``x?`` are optional; ``x~n`` and ``x{n}`` repeat n times, ``x~m..n`` and
  ``x{m,n}`` m to n times, ``x{m,}`` at least m, ``x{,n}`` at most n.
* ``?rule`` and ``!rule`` (tree shaping), ``_`` prefixes, priorities ``.n`` and aliases
  ``-> name`` are accepted and change nothing: they shape Lark's parse trees, not the
  language, and a recognizer has no lexer conflicts to settle.
* ``%import common.X`` provides Lark's common terminals (`COMMON_TERMINALS`).
* ``%ignore X`` (any terminal expression; several are alternatives) declares text that
  may follow every lexeme: precisely, the rule ``%ignore: (X | Y ...)*`` is defined and
  every string, range, regex and terminal used *in a rule* is followed by it. So ignored
  text may come between any two lexemes and after the last one, never before the first
  one nor inside a terminal (as llguidance and XGrammar without ``allow_initial_skip``).

Not supported, each a `GrammarError` that says so: templates (``name{x}``), other
imports and directives (``%declare``, ``%override``, ``%json``, ...), special tokens
(``<|...|>``, ``<[id]>``), rule options (``name[lazy]``), and regex flags other than
``i`` and ``s``. Every error names the line and column, and what was found there.
"""

from __future__ import annotations

import functools
import re

from .grammar import Grammar, GrammarError
from .grammar_text import (
    MAX_NESTING,
    Expr,
    Ref,
    Token,
    build_grammar,
    check_bounds,
    count_bounds,
    literal,
    refs,
    substitute,
    text_error,
    tokenize,
)
from .regex import (
    Alt,
    Chars,
    Concat,
    Node,
    RegexError,
    Repeat,
    map_chars,
    normalize_ranges,
    parse_regex,
)

__all__ = ["COMMON_TERMINALS", "IGNORE_RULE", "parse_lark"]

IGNORE_RULE = "%ignore"
"""The rule of the text ``%ignore`` allows after each lexeme of a rule."""

COMMON_TERMINALS = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" /([^"\\\n]|\\[^\n])*/ "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*([^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
"""
"""The terminals ``%import common.X`` provides, with the languages of Lark's
``common.lark`` (``ESCAPED_STRING``: a double-quoted string in which a backslash escapes
any character but a newline; ``C_COMMENT``: ``/* ... */`` ending at the first ``*/``)."""

_TOKEN = re.compile(
    r"""(?P<skip>(?:[ \t\r]|//[^\n]*|\#[^\n]*)+)
    | (?P<newline>\n)
    | (?P<bad_embedded>%(?:json|lark|regex|llguidance|grammar_options)\b)
    | (?P<directive>%[A-Za-z_]+)
    | (?P<name>_*[A-Za-z][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
    | (?P<bad_string>")
    | (?P<regex>/(?:[^/\\\n]|\\.)+/[a-z]*)
    | (?P<bad_regex>/)
    | (?P<arrow>->)
    | (?P<dots>\.\.)
    | (?P<int>\d+)
    | (?P<count>\{[ \t]*\d*[ \t]*(?:,[ \t]*\d*[ \t]*)?\})
    | (?P<bad_template>\{)
    | (?P<bad_token><)
    | (?P<punct>[:|()\[\]*+?~.!,])
    """,
    re.VERBOSE,
)
_PROBLEMS = {
    "bad_string": "unterminated string literal (a newline in a literal is written \\n)",
    "bad_regex": "unterminated regex (a '/' inside it is written \\/)",
    "bad_embedded": "embedded grammars and options (%json, %lark, %regex, %llguidance, "
    "%grammar_options) are not supported",
    "bad_template": "templates 'name{...}' are not supported",
    "bad_token": "special tokens (<|...|>, <[id]>) are not supported: a grammar of text is "
    "matched byte by byte",
}
_ESCAPES = {
    "n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v", "0": "\0",
    "\\": "\\", '"': '"', "'": "'", "/": "/",
}  # fmt: skip
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_ENDS = (None, "|", ")", "]", "->", "\n")  # what ends a sequence


def parse_lark(text: str, start: str = "start") -> Grammar:
    """The `Grammar` of Lark ``text`` (the subset of the module docstring), from ``start``.

    Raises:
        GrammarError: malformed or unsupported syntax, an undefined or twice-defined name,
            a terminal that uses a rule or itself, an unknown common terminal, counts over
            `grammar_text.MAX_REPETITION`; the message names the line, the column and the
            offending text. Also the errors of `grammar_text.build_grammar`.
    """
    if not isinstance(text, str):
        raise TypeError(f"a grammar must be a str, got {type(text).__name__}")
    return build_grammar(_parse(text), start, "Lark")


def _parse(text: str, syntax: str = "Lark") -> dict[str, Expr]:
    """The rule trees of ``text``, with the `IGNORE_RULE` if it has ``%ignore``."""
    parser = _Parser(tokenize(text, _TOKEN, syntax, _PROBLEMS), syntax)
    parser.definitions()
    _check_terminals(parser.rules, syntax)
    return parser.rules


@functools.cache
def _common() -> dict[str, Node]:
    """`COMMON_TERMINALS`, each tree self-contained (the terminals it uses inlined)."""
    rules = _parse(COMMON_TERMINALS, "Lark common library")
    done: dict[str, Node] = {}
    for name in rules:  # in order: each uses only terminals defined above it
        done[name] = substitute(rules[name], done)
    return done


def _is_terminal(name: str) -> bool:
    """Whether ``name`` is a terminal's: its first letter (past ``_``) is uppercase."""
    return name.lstrip("_")[:1].isupper()


class _Parser:
    """Recursive descent over the tokens; ``pos`` indexes the next token, ``depth`` counts
    the open brackets (inside which newlines are spaces), ``in_rule`` says whether the
    definition being read is a rule (whose lexemes ``%ignore`` follows) or a terminal."""

    def __init__(self, tokens: list[Token], syntax: str):
        self.tokens, self.syntax, self.pos, self.depth = tokens, syntax, 0, 0
        self.rules: dict[str, Expr] = {}
        self.ignored: list[Expr] = []
        self.in_rule = False
        self.skips = any(t.kind == "directive" and t.text == "%ignore" for t in tokens)

    def peek(self, ahead: int = 0) -> Token | None:
        """The token ``ahead`` of the next one (inside brackets, newlines are skipped)."""
        if self.depth:  # inside brackets a newline is a space
            while self.pos < len(self.tokens) and self.tokens[self.pos].kind == "newline":
                self.pos += 1
        i = self.pos + ahead
        return self.tokens[i] if i < len(self.tokens) else None

    def text(self) -> str | None:
        """The next token's text (a newline's is ``"\\n"``), None at the end."""
        token = self.peek()
        return None if token is None else token.text

    def error(self, problem: str, token: Token | None = None) -> GrammarError:
        """The error for ``problem`` at ``token`` (default: the next one, or the last)."""
        token = token or self.peek() or self.tokens[-1]
        return text_error(self.syntax, token.line, token.column, problem)

    def found(self) -> str:
        """The next token, as an error message quotes it."""
        token = self.peek()
        if token is None:
            return "the end of the grammar"
        return "the end of the line" if token.kind == "newline" else repr(token.text)

    def expect(self, kind: str, what: str) -> Token:
        """Read the next token, which must be of ``kind`` (or have that text)."""
        token = self.peek()
        if token is None or (token.kind != kind and token.text != kind):
            raise self.error(f"expected {what}, found {self.found()}")
        self.pos += 1
        return token

    def definitions(self) -> None:
        """``start``: every definition and directive into ``rules``, then `IGNORE_RULE`."""
        while self.peek() is not None:
            if self.text() == "\n":
                self.pos += 1
                continue
            if self.peek().kind == "directive":
                self.directive()
            else:
                self.definition()
            if self.peek() is not None and self.text() != "\n":
                raise self.error(f"expected the end of the line, found {self.found()}")
        if self.skips:
            ignored = self.ignored[0] if len(self.ignored) == 1 else Alt(tuple(self.ignored))
            self.rules[IGNORE_RULE] = Repeat(ignored, 0, None)

    def definition(self) -> None:
        """``definition``: one rule or terminal."""
        if self.text() in ("?", "!"):
            self.pos += 1
        name = self.expect("name", "a rule or terminal name")
        if self.text() == ".":  # a priority: no effect on the language
            self.pos += 1
            self.expect("int", "a priority number after '.'")
        if self.text() == "[":
            raise self.error(f"rule options '{name.text}[...]' are not supported")
        self.expect(":", f"':' after the name {name.text!r}")
        if name.text in self.rules:
            raise self.error(f"{name.text!r} is defined twice", name)
        self.in_rule = not _is_terminal(name.text)
        self.rules[name.text] = self.expansions()

    def directive(self) -> None:
        """``directive``: ``%ignore`` (collected) or ``%import``; others are errors."""
        token = self.peek()
        self.pos += 1
        if token.text == "%ignore":
            self.in_rule = False
            self.ignored.append(self.expansions())
        elif token.text == "%import":
            self.import_common()
        else:
            raise self.error(f"directive {token.text} is not supported", token)

    def import_common(self) -> None:
        """After ``%import``: define the named common terminals (or the alias)."""
        module = self.expect("name", "a module name after %import")
        if module.text != "common":
            raise self.error("only '%import common...' is supported", module)
        if self.text() == ".":
            self.pos += 1
            names = [self.expect("name", "a terminal name after 'common.'")]
        else:
            self.expect("(", "'.' or '(' after 'common'")
            self.depth += 1
            names = [self.expect("name", "a terminal name")]
            while self.text() == ",":
                self.pos += 1
                names.append(self.expect("name", "a terminal name after ','"))
            self.expect(")", "')' to close the import list")
            self.depth -= 1
        alias = None
        if self.text() == "->" and len(names) == 1:
            self.pos += 1
            alias = self.expect("name", "a name after '->'")
        for name in names:
            if name.text not in _common():
                raise self.error(f"common has no terminal {name.text!r}", name)
            defined = (alias or name).text
            if defined in self.rules:
                raise self.error(f"{defined!r} is defined twice", alias or name)
            self.rules[defined] = _common()[name.text]

    def expansions(self) -> Expr:
        """``expansions``: one tree, an `Alt` if there is a ``|`` (at the top level, also
        one that starts the next line)."""
        options = [self.alias()]
        while True:
            if self.text() == "\n" and not self.depth:  # a line starting with '|' goes on
                ahead = self.pos
                while ahead < len(self.tokens) and self.tokens[ahead].kind == "newline":
                    ahead += 1
                if ahead < len(self.tokens) and self.tokens[ahead].text == "|":
                    self.pos = ahead
            if self.text() != "|":
                break
            self.pos += 1
            options.append(self.alias())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias(self) -> Expr:
        """``alias``: a sequence (its ``-> name`` read and dropped)."""
        items = []
        while self.text() not in _ENDS:
            items.append(self.expr())
        if self.text() == "->":  # tree shaping only
            self.pos += 1
            self.expect("name", "a name after '->'")
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def expr(self) -> Expr:
        """``expr``: an atom and its repetition, if any."""
        item = self.atom()
        token = self.peek()
        if token is None:
            return item
        if token.text in ("?", "*", "+"):
            self.pos += 1
            return Repeat(item, *{"?": (0, 1), "*": (0, None), "+": (1, None)}[token.text])
        if token.kind == "count":
            self.pos += 1
            return Repeat(item, *count_bounds(token, self.syntax))
        if token.text == "~":
            self.pos += 1
            low = int(self.expect("int", "a count after '~'").text)
            high = low
            if self.text() == "..":
                self.pos += 1
                high = int(self.expect("int", "a count after '..'").text)
            return Repeat(item, *check_bounds(token, self.syntax, low, high))
        return item

    def atom(self) -> Expr:
        """``atom``: a group, a literal or range, a regex, or a name."""
        token = self.peek()
        if token.text in ("(", "["):
            return self.group(token)
        self.pos += 1
        if token.kind == "string":
            node = self.string(token)
            if self.text() == "..":
                self.pos += 1
                node = self.char_range(token, node, self.expect("string", "a string after '..'"))
            return self.lexeme(node, token)
        if token.kind == "regex":
            return self.lexeme(self.regex(token), token)
        if token.kind == "name":
            ref = Ref(token.text, token.line, token.column)
            if _is_terminal(token.text):
                return self.lexeme(ref, token)
            if not self.in_rule:
                raise self.error(f"a terminal cannot use the rule {token.text!r}", token)
            return ref
        if token.kind == "directive":
            raise self.error(f"directive {token.text} cannot be used in an expression", token)
        raise self.error(f"unexpected {token.text!r}", token)

    def group(self, opening: Token) -> Expr:
        """``( expansions )``, or ``[ expansions ]``: the same, optional."""
        self.pos += 1
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"groups are nested deeper than {MAX_NESTING}", opening)
        inside = self.expansions()
        closing = ")" if opening.text == "(" else "]"
        if self.text() != closing:
            raise self.error(
                f"missing {closing!r} to close the {opening.text!r} at line {opening.line}, "
                f"column {opening.column}; found {self.found()}"
            )
        self.depth -= 1
        self.pos += 1
        return inside if closing == ")" else Repeat(inside, 0, 1)

    def lexeme(self, node: Expr, token: Token) -> Expr:
        """``node``, followed in a rule by the ignored text when there is ``%ignore``."""
        if not (self.in_rule and self.skips):
            return node
        return Concat((node, Ref(IGNORE_RULE, token.line, token.column)))

    def string(self, token: Token) -> Node:
        """The tree of a string token (ASCII letters in either case with ``i``)."""
        folded = token.text.endswith("i")
        body, chars, i = token.text[1 : -2 if folded else -1], [], 0
        while i < len(body):
            if body[i] != "\\":
                chars.append(body[i])
                i += 1
                continue
            escape = body[i + 1]
            if escape in _ESCAPES:
                chars.append(_ESCAPES[escape])
                i += 2
                continue
            size = _HEX_ESCAPES.get(escape)
            digits = body[i + 2 : i + 2 + (size or 0)]
            if size is None or len(digits) != size or not re.fullmatch("[0-9a-fA-F]+", digits):
                raise self.error(f"bad escape '\\{escape}' in {token.text}", token)
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.error(f"'\\{escape}{digits}' is not a character", token)
            chars.append(chr(code))
            i += 2 + size
        node = literal("".join(chars))
        return _fold_case(node) if folded else node

    def char_range(self, first: Token, low: Node, last: Token) -> Node:
        """``"a".."z"``: one character from ``low`` to the one of string ``last``."""
        high = self.string(last)
        if not (isinstance(low, Chars) and isinstance(high, Chars)) or "i" in (
            first.text[-1],
            last.text[-1],
        ):
            raise self.error('a range \'"a".."z"\' needs two one-character strings', first)
        (lo, _), (hi, _) = low.ranges[0], high.ranges[0]
        if hi < lo:
            problem = f"bad range {first.text}..{last.text}: its start is after its end"
            raise self.error(problem, first)
        return Chars(((lo, hi),))

    def regex(self, token: Token) -> Node:
        """The tree of a regex token ``/pattern/flags``."""
        pattern, _, flags = token.text[1:].rpartition("/")
        for flag in flags:
            if flag not in "is":
                raise self.error(f"regex flag {flag!r} is not supported (only i and s)", token)
        try:
            parse_regex(pattern)  # errors name positions in the pattern as written
            tree = parse_regex(_dot_all(pattern) if "s" in flags else pattern)
        except RegexError as error:
            raise self.error(f"bad regex {token.text}: {error}", token) from None
        return _fold_case(tree) if "i" in flags else tree


def _check_terminals(rules: dict[str, Expr], syntax: str) -> None:
    """Refuse a terminal that uses itself, directly or through other terminals (a
    depth-first walk, iterative: chains of terminals may be long)."""

    def uses(name: str):
        return iter([r for r in refs(rules[name]) if r.name in rules and _is_terminal(r.name)])

    state: dict[str, str] = {}
    for root in filter(_is_terminal, rules):
        if root in state:
            continue
        state[root] = "open"
        stack = [(root, uses(root))]
        while stack:
            name, used = stack[-1]
            ref = next(used, None)
            if ref is None:
                state[name] = "done"
                stack.pop()
            elif state.get(ref.name) == "open":
                path = [n for n, _ in stack]
                cycle = " -> ".join([*path[path.index(ref.name) :], ref.name])
                problem = f"terminal {ref.name!r} is recursive ({cycle})"
                raise text_error(syntax, ref.line, ref.column, problem)
            elif ref.name not in state:
                state[ref.name] = "open"
                stack.append((ref.name, uses(ref.name)))


def _fold_case(tree: Node) -> Node:
    """``tree`` with every ASCII letter also matching its other case."""
    return map_chars(tree, _fold_chars)


def _fold_chars(chars: Chars) -> Chars:
    extra = []
    for lo, hi in chars.ranges:
        for first, last, shift in ((0x41, 0x5A, 0x20), (0x61, 0x7A, -0x20)):
            if lo <= last and hi >= first:
                extra.append((max(lo, first) + shift, min(hi, last) + shift))
    return Chars(normalize_ranges(chars.ranges + tuple(extra)))


def _dot_all(pattern: str) -> str:
    """``pattern`` with each ``.`` outside a class written ``[\\s\\S]`` (any character)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        out.append("[\\s\\S]" if char == "." and not in_class else char)
        i += 1
    return "".join(out)
