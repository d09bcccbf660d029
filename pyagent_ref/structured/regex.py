"""Regular expressions parsed into a small syntax tree: the first stage of structured output.

The dialect is the common ground of the JSON Schema ``pattern`` keyword (ECMA-262 regular
expressions) and Python's `re`, so that a pattern means the same thing to both wherever
this module accepts it:

* literals; ``.`` (any character but ``\\n``, as Python without DOTALL; ECMA-262's ``.``
  also excludes ``\\r``, U+2028 and U+2029);
* classes ``[abc]``, ``[a-z]``, ``[^...]``; ``]`` right after ``[`` or ``[^`` is an error
  (an empty class in ECMA-262, a literal ``]`` in Python): write ``\\]``;
* escapes ``\\d \\w \\s \\D \\W \\S``, defined as JSON Schema (ECMA-262) defines them:
  ``\\d`` is ``[0-9]``, ``\\w`` is ``[A-Za-z0-9_]`` (ASCII only, like Python's `re.ASCII`,
  whereas Python's default ``\\d``/``\\w`` are Unicode-aware) and ``\\s`` is ECMA-262's
  whitespace (`SPACE`: ``[\\t\\n\\v\\f\\r ]`` plus U+00A0, U+1680, U+2000-U+200A, U+2028,
  U+2029, U+202F, U+205F, U+3000, U+FEFF; Python's differs on U+001C-U+001F, U+0085 and
  U+FEFF); ``\\uXXXX`` and ``\\u{X...}`` (a ``\\uD8xx\\uDCxx`` surrogate pair is one code
  point), ``\\xHH``, ``\\n \\t \\r \\f \\v \\0``, ``[\\b]`` (backspace), and any other
  character that is not an ASCII letter or digit escaped stands for itself;
* groups ``( )``, ``(?: )``, ``(?P<name> )``, ``(?<name> )`` (all the same: nothing is
  captured); alternation ``|``;
* quantifiers ``* + ? {n} {n,} {n,m}`` (counts of at most 9 digits), each optionally lazy
  (``*?``: the same language);
  a ``{`` that does not start a quantifier is a literal (as in both dialects), but
  ``{,m}`` is an error (Python's ``{0,m}``, a literal in ECMA-262);
* anchors: the whole string must always match (like `re.fullmatch`), so ``^`` is accepted
  at the start and ``$`` at the end of the pattern or of a top-level alternative, where
  they change nothing; anywhere else they are an error.

Everything else (backreferences, lookaround, ``\\b``, inline flags, ``\\p{...}``, octal
escapes, possessive quantifiers), groups nested more than `MAX_GROUP_NESTING` deep and
every malformed pattern raise `RegexError`, whose message names the problem and its
position.

`parse_regex` is a recursive-descent parser of the grammar::

    pattern     := alternation                 (with the anchors described above)
    alternation := sequence ('|' sequence)*
    sequence    := (atom quantifier?)*
    atom        := '(' group-kind? alternation ')' | '[' class ']' | '.' | '\\' escape | char
    quantifier  := ('*' | '+' | '?' | '{' n '}' | '{' n ',' '}' | '{' n ',' m '}') '?'?

Its result is a tree of four node types: `Chars` (one character from a set of code-point
ranges: literals, ``.``, classes and escapes alike), `Concat`, `Alt` and `Repeat`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "DIGIT",
    "MAX_CODE_POINT",
    "MAX_GROUP_NESTING",
    "SPACE",
    "WORD",
    "Alt",
    "Chars",
    "Concat",
    "Node",
    "RegexError",
    "Repeat",
    "complement",
    "map_chars",
    "normalize_ranges",
    "parse_regex",
]

MAX_CODE_POINT = 0x10FFFF
MAX_GROUP_NESTING = 100
"""The deepest nesting of groups a pattern may have (the parser and every pass over the
tree recurse once per level)."""

Ranges = tuple[tuple[int, int], ...]
"""Inclusive code-point ranges ``(lo, hi)``, sorted, disjoint and not adjacent."""

DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE: Ranges = (
    (0x09, 0x0D),  # \t \n \v \f \r
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
)


class RegexError(ValueError):
    """A pattern that is malformed, unsupported, or too large to compile.

    ``position`` is the index in ``pattern`` of the problem (None for a size limit).
    """

    def __init__(self, problem: str, pattern: str | None = None, position: int | None = None):
        self.problem, self.pattern, self.position = problem, pattern, position
        where = "" if position is None else f" at position {position} of {pattern!r}"
        super().__init__(problem + where)


@dataclass(frozen=True)
class Chars:
    """Exactly one character whose code point lies in one of ``ranges`` (no ranges: none)."""

    ranges: Ranges


@dataclass(frozen=True)
class Concat:
    """``items`` one after the other; no items: the empty string."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    """Any one of ``options`` (at least two)."""

    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    """``item`` from ``min`` to ``max`` times in a row (``max`` None: unbounded)."""

    item: Node
    min: int
    max: int | None


Node = Chars | Concat | Alt | Repeat


def map_chars(node: Node, change) -> Node:
    """``node`` with every `Chars` leaf ``c`` replaced by the tree ``change(c)``."""
    if isinstance(node, Chars):
        return change(node)
    if isinstance(node, Concat):
        return Concat(tuple(map_chars(item, change) for item in node.items))
    if isinstance(node, Alt):
        return Alt(tuple(map_chars(option, change) for option in node.options))
    return Repeat(map_chars(node.item, change), node.min, node.max)


def normalize_ranges(ranges) -> Ranges:
    """The same code points as ``ranges`` (any order, overlapping), sorted and merged."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def complement(ranges: Ranges) -> Ranges:
    """The code points of 0..`MAX_CODE_POINT` not in the normalized ``ranges``."""
    result, next_lo = [], 0
    for lo, hi in ranges:
        if lo > next_lo:
            result.append((next_lo, lo - 1))
        next_lo = hi + 1
    if next_lo <= MAX_CODE_POINT:
        result.append((next_lo, MAX_CODE_POINT))
    return tuple(result)


def parse_regex(pattern: str) -> Node:
    """The syntax tree of ``pattern`` (the dialect of the module docstring).

    Raises:
        RegexError: the pattern is malformed or uses an unsupported construct; the message
            names the problem and its position.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a regex pattern must be a str, got {type(pattern).__name__}")
    return _Parser(pattern).parse()


_SINGLE_ESCAPES = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B}
_CLASS_ESCAPES = {"d": DIGIT, "w": WORD, "s": SPACE}
_UNSUPPORTED_ESCAPES = {
    "b": "word boundary '\\b' is not supported",
    "B": "word boundary '\\B' is not supported",
    "p": "Unicode property escapes '\\p{...}' are not supported",
    "P": "Unicode property escapes '\\P{...}' are not supported",
    "k": "backreferences are not supported",
    "c": "control escapes '\\cX' are not supported",
    "A": "anchor '\\A' is not supported (the whole string is always matched)",
    "Z": "anchor '\\Z' is not supported (the whole string is always matched)",
    "z": "anchor '\\z' is not supported (the whole string is always matched)",
}
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
_NO_MINIMUM = re.compile(r"\{,\d+\}")
_GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*>")


class _Parser:
    """One pass over the pattern; ``pos`` is the index of the next character to read."""

    def __init__(self, pattern: str):
        self.pattern, self.pos = pattern, 0
        self.open_groups = 0

    def error(self, problem: str, position: int | None = None) -> RegexError:
        return RegexError(problem, self.pattern, self.pos if position is None else position)

    def peek(self, ahead: int = 0) -> str | None:
        i = self.pos + ahead
        return self.pattern[i] if i < len(self.pattern) else None

    def parse(self) -> Node:
        node = self.alternation(depth=0)
        if self.peek() == ")":
            raise self.error("unbalanced ')': no group is open")
        return node

    def alternation(self, depth: int) -> Node:
        options = [self.sequence(depth)]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence(depth))
        if len(options) == 1:
            return options[0]
        # an option that is itself a group of options joins this one (as in `sequence`)
        return Alt(tuple(o for option in options for o in _options(option)))

    def sequence(self, depth: int) -> Node:
        items: list[Node] = []
        if depth == 0 and self.peek() == "^":
            self.pos += 1
        while (char := self.peek()) is not None and char not in "|)":
            if char in "^$":
                self.anchor(char, depth)
                continue
            start = self.pos
            if self.quantifier() is not None:
                raise self.error("nothing to repeat before the quantifier", start)
            atom = self.atom()
            bounds = self.quantifier()
            if bounds is not None:
                atom = Repeat(atom, *bounds)
                again = self.pos
                if self.quantifier() is not None:
                    raise self.error("a quantifier cannot follow a quantifier", again)
            # a group's sequence joins this one: a Concat never holds a Concat (nor an
            # Alt an Alt), so one tree however a pattern groups it (`render` relies on it)
            items.extend(atom.items if isinstance(atom, Concat) else (atom,))
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def anchor(self, char: str, depth: int) -> None:
        """Accept ``$`` that ends a top-level alternative; every other anchor is an error."""
        at_end = self.peek(1) is None or self.peek(1) == "|"
        if char == "$" and depth == 0 and at_end:
            self.pos += 1
            return
        where = "start" if char == "^" else "end"
        raise self.error(
            f"anchor {char!r} is only supported at the {where} of the pattern or of a "
            "top-level alternative (the whole string is always matched)"
        )

    def quantifier(self) -> tuple[int, int | None] | None:
        """Read a quantifier (and a lazy ``?`` after it): its (min, max), or None if none."""
        char, start = self.peek(), self.pos
        if char in ("*", "+", "?"):
            self.pos += 1
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        elif char == "{" and (m := _QUANTIFIER.match(self.pattern, self.pos)):
            if max(len(m.group(1)), len(m.group(3) or "")) > 9:
                raise self.error("a repetition count has at most 9 digits", start)
            self.pos = m.end()
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if high is not None and high < low:
                raise self.error(f"bad repetition bounds {m.group(0)}: min exceeds max", start)
            bounds = (low, high)
        elif char == "{" and _NO_MINIMUM.match(self.pattern, self.pos):
            raise self.error("'{,m}' means {0,m} in Python but is literal text in JSON Schema")
        else:
            return None
        if self.peek() == "?":  # lazy: another match order, the same language
            self.pos += 1
        return bounds

    def atom(self) -> Node:
        char = self.peek()
        if char == "(":
            return self.group()
        if char == "[":
            return Chars(self.char_class())
        if char == ".":
            self.pos += 1
            return Chars(complement(((0x0A, 0x0A),)))
        if char == "\\":
            escaped = self.escape(in_class=False)
            return Chars(((escaped, escaped),) if isinstance(escaped, int) else escaped)
        code = self.literal()
        return Chars(((code, code),))

    def literal(self) -> int:
        code = ord(self.pattern[self.pos])
        if 0xD800 <= code <= 0xDFFF:
            raise self.error("a lone surrogate cannot be matched in UTF-8")
        self.pos += 1
        return code

    def group(self) -> Node:
        open_at = self.pos
        if self.open_groups == MAX_GROUP_NESTING:
            raise self.error(f"groups nest more than {MAX_GROUP_NESTING} deep", open_at)
        self.pos += 1
        if self.peek() == "?":
            self.group_kind(open_at)
        self.open_groups += 1
        node = self.alternation(depth=1)
        self.open_groups -= 1
        if self.peek() != ")":
            raise self.error("missing ')' to close the group", open_at)
        self.pos += 1
        return node

    def group_kind(self, open_at: int) -> None:
        """After ``(?``: accept a non-capturing or named group; name what is unsupported."""
        rest = self.pattern[self.pos + 1 :]
        for prefix, problem in (
            ("=", "lookahead '(?=' is not supported"),
            ("!", "negative lookahead '(?!' is not supported"),
            ("<=", "lookbehind '(?<=' is not supported"),
            ("<!", "negative lookbehind '(?<!' is not supported"),
            ("P=", "backreferences '(?P=name)' are not supported"),
            ("#", "comments '(?#...)' are not supported"),
        ):
            if rest.startswith(prefix):
                raise self.error(problem, open_at)
        if rest.startswith(":"):
            self.pos += 2
        elif rest.startswith(("P<", "<")):
            name_at = self.pos + (3 if rest.startswith("P<") else 2)
            m = _GROUP_NAME.match(self.pattern, name_at)
            if m is None:
                raise self.error("bad group name: expected an identifier and '>'", name_at)
            self.pos = m.end()
        else:
            raise self.error("inline flags and other '(?' extensions are not supported", open_at)

    def char_class(self) -> Ranges:
        """Read ``[...]``: its code points (negated for ``[^...]``)."""
        open_at = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        if self.peek() == "]":
            raise self.error(
                "']' right after '[' is an empty class in JSON Schema and a literal in "
                "Python: write '\\]' for the character"
            )
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if self.peek() is None:
                raise self.error("missing ']' to close the character class", open_at)
            item_at = self.pos
            low = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", None):
                self.pos += 1
                high = self.class_atom()
                if not (isinstance(low, int) and isinstance(high, int)):
                    raise self.error("a class escape cannot be a range endpoint", item_at)
                if high < low:
                    end = self.pattern[item_at : self.pos]
                    raise self.error(f"bad range {end!r}: its start is after its end", item_at)
                ranges.append((low, high))
            else:
                ranges.extend([(low, low)] if isinstance(low, int) else low)
        self.pos += 1
        ranges = normalize_ranges(ranges)
        return complement(ranges) if negated else ranges

    def class_atom(self) -> int | Ranges:
        return self.escape(in_class=True) if self.peek() == "\\" else self.literal()

    def escape(self, in_class: bool) -> int | Ranges:
        """Read ``\\...``: one code point, or the ranges of a class escape (``\\d``...)."""
        start = self.pos
        self.pos += 1
        char = self.peek()
        if char is None:
            raise self.error("the pattern ends with a lone backslash", start)
        self.pos += 1
        if char in _SINGLE_ESCAPES:
            return _SINGLE_ESCAPES[char]
        if char.lower() in _CLASS_ESCAPES:
            ranges = _CLASS_ESCAPES[char.lower()]
            return complement(ranges) if char.isupper() else ranges
        if char == "b" and in_class:
            return 0x08
        if char == "0":
            if (self.peek() or "").isdigit():
                raise self.error("octal escapes are not supported", start)
            return 0
        if char in "123456789":
            problem = f"escape '\\{char}' (a backreference or octal) is not supported"
            raise self.error(problem, start)
        if char == "x":
            return self.hex_digits(start, 2)
        if char == "u":
            return self.unicode_escape(start)
        if char in _UNSUPPORTED_ESCAPES:
            raise self.error(_UNSUPPORTED_ESCAPES[char], start)
        if char.isascii() and char.isalnum():
            raise self.error(f"unknown escape '\\{char}'", start)
        return ord(char)

    def hex_digits(self, start: int, count: int) -> int:
        digits = self.pattern[self.pos : self.pos + count]
        if len(digits) != count or not all(c in "0123456789abcdefABCDEF" for c in digits):
            escape = self.pattern[start : self.pos]
            raise self.error(f"expected {count} hex digits after '{escape}'", start)
        self.pos += count
        return int(digits, 16)

    def unicode_escape(self, start: int) -> int:
        """After ``\\u``: ``XXXX`` or ``{X...}``; a surrogate pair of escapes is one character."""
        if self.peek() == "{":
            close = self.pattern.find("}", self.pos)
            digits = self.pattern[self.pos + 1 : close] if close > 0 else ""
            if not digits or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise self.error("expected hex digits and '}' after '\\u{'", start)
            self.pos = close + 1
            code = int(digits, 16)
            if code > MAX_CODE_POINT:
                raise self.error("code point above U+10FFFF", start)
        else:
            code = self.hex_digits(start, 4)
            low_start = self.pos
            if 0xD800 <= code <= 0xDBFF and self.pattern.startswith("\\u", low_start):
                self.pos += 2
                low = self.hex_digits(low_start, 4)
                if 0xDC00 <= low <= 0xDFFF:
                    return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                self.pos = low_start
        if 0xD800 <= code <= 0xDFFF:
            raise self.error("a lone surrogate cannot be matched in UTF-8", start)
        return code


def _options(node: Node) -> tuple[Node, ...]:
    """The options ``node`` stands for in an alternation: its own if it is one."""
    return node.options if isinstance(node, Alt) else (node,)
