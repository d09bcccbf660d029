"""What the grammar-text parsers share: tokens, rule trees, and the lowering to a `Grammar`.

`gbnf` and `lark_grammar` parse their syntax into *rule trees*: the regex syntax tree of
`regex` (`Chars`, `Concat`, `Alt`, `Repeat`) plus one more leaf, `Ref` (a use of another
rule). A literal ``"ab"`` is ``Concat((Chars a, Chars b))``, a class ``[a-z]`` one `Chars`,
``x*`` a `Repeat`. `build_grammar` then lowers the trees to a `Grammar` whose terminals
are as large as possible, because every lexeme the Earley parser reads as one DFA saves it
items and steps:

1. A rule is *regular* when its tree uses no rule that is recursive (directly or not) or
   not regular itself. `Ref`s to regular rules are replaced by their trees, so
   ``num ::= [0-9]+ frac?`` with a regular ``frac`` is one regex.
2. In every tree, a regular subtree, or a run of regular items in a sequence, becomes one
   `Terminal` (its tree rendered back to a pattern by `render`). Everything else becomes
   rules: a `Ref` to a non-regular rule stays a nonterminal, an alternation a helper rule,
   a repetition helper rules (``x*`` is ``R ::= ε | R x``: left recursion, the case an
   Earley parser handles in constant items per byte; ``x{m,n}`` is ``x`` ``m`` times then
   a chain of ``n - m`` optional copies). Helper rules are named ``owner#k``, a name no
   syntax can write.
3. Lexemes stay small enough to compile: a regular rule whose inlined tree passes
   `MAX_LEXEME_WEIGHT` (about the number of NFA states it needs) or `MAX_LEXEME_DEPTH`
   nested groups stays a rule, and a lexeme whose DFA passes the state limit is split
   into rules along its tree. Neither changes the language, only how it is read.

Limits give a `GrammarError`, never a hang: repetition counts over `MAX_REPETITION`,
groups nested deeper than `MAX_NESTING`, and a lowered grammar over the symbol limit of
`grammar.MAX_GRAMMAR_SYMBOLS`. Errors found in the text name ``line L, column C``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .grammar import MAX_GRAMMAR_SYMBOLS, Grammar, GrammarError, Symbol, Terminal
from .regex import MAX_CODE_POINT, Alt, Chars, Concat, Node, RegexError, Repeat

__all__ = [
    "MAX_LEXEME_DEPTH",
    "MAX_LEXEME_WEIGHT",
    "MAX_NESTING",
    "MAX_REPETITION",
    "Expr",
    "Ref",
    "Token",
    "build_grammar",
    "check_bounds",
    "count_bounds",
    "literal",
    "refs",
    "render",
    "substitute",
    "text_error",
    "tokenize",
]

MAX_REPETITION = 10_000
"""The largest count a repetition (``{m,n}``, ``~ m..n``) may use."""

MAX_NESTING = 50
"""The deepest nesting of groups a grammar text may use."""

MAX_LEXEME_WEIGHT = 2_000
"""The largest tree (counting repetitions as copies) merged into one lexeme."""

MAX_LEXEME_DEPTH = 40
"""The deepest nesting of groups merged into one lexeme (the regex parser recurses)."""


@dataclass(frozen=True)
class Ref:
    """A use of rule ``name`` at ``line``, ``column`` of the grammar text (1-based)."""

    name: str
    line: int
    column: int


Expr = Node | Ref
"""A rule tree: regex nodes whose leaves may also be `Ref`s."""

EMPTY = Concat(())
"""The tree of the empty string."""


def literal(text: str) -> Node:
    """The tree matching exactly ``text``."""
    chars = [Chars(((ord(c), ord(c)),)) for c in text]
    return chars[0] if len(chars) == 1 else Concat(tuple(chars))


def text_error(syntax: str, line: int, column: int, problem: str) -> GrammarError:
    """The error for ``problem`` at ``line``, ``column`` of a grammar text in ``syntax``."""
    return GrammarError(f"{syntax} grammar, line {line}, column {column}: {problem}")


@dataclass(frozen=True)
class Token:
    """One token of a grammar text: its ``kind`` (a group name of the token pattern)."""

    kind: str
    text: str
    line: int
    column: int


def tokenize(
    text: str, pattern: re.Pattern[str], syntax: str, problems: Mapping[str, str]
) -> list[Token]:
    """Split ``text`` by ``pattern``, whose named groups are the token kinds.

    Groups named ``skip`` (spaces, comments) are dropped; a group named in ``problems``
    is an error with that message, so a syntax names its common mistakes (an
    unterminated string) where they start. Anything no group matches is an
    "unexpected character" error at its line and column.
    """
    tokens, pos, line, line_start = [], 0, 1, 0
    while pos < len(text):
        match = pattern.match(text, pos)
        column = pos - line_start + 1
        if match is None or match.end() == pos:
            raise text_error(syntax, line, column, f"unexpected character {text[pos]!r}")
        kind = match.lastgroup or ""
        if kind in problems:
            raise text_error(syntax, line, column, problems[kind])
        if kind != "skip":
            tokens.append(Token(kind, match.group(), line, column))
        newlines = match.group().count("\n")
        if newlines:
            line += newlines
            line_start = pos + match.group().rindex("\n") + 1
        pos = match.end()
    return tokens


def count_bounds(token: Token, syntax: str) -> tuple[int, int | None]:
    """The (min, max) of a count token ``{m}``, ``{m,}``, ``{m,n}`` or ``{,n}`` (max None:
    no bound).

    Raises:
        GrammarError: ``{}`` or ``{,}``, a count over `MAX_REPETITION`, or max < min.
    """
    low_text, comma, high_text = token.text[1:-1].replace(" ", "").replace("\t", "").partition(",")
    if not low_text and not high_text:
        raise text_error(syntax, token.line, token.column, f"repetition {token.text} needs a count")
    low = int(low_text) if low_text else 0
    high = int(high_text) if high_text else (None if comma else low)
    return check_bounds(token, syntax, low, high)


def check_bounds(token: Token, syntax: str, low: int, high: int | None) -> tuple[int, int | None]:
    """``(low, high)`` of a repetition written at ``token``, checked: both at most
    `MAX_REPETITION`, and ``low <= high``."""
    if max(low, high or 0) > MAX_REPETITION:
        problem = f"repetition {token.text} is over the limit of {MAX_REPETITION}"
        raise text_error(syntax, token.line, token.column, problem)
    if high is not None and high < low:
        problem = f"repetition {token.text}: the minimum exceeds the maximum"
        raise text_error(syntax, token.line, token.column, problem)
    return low, high


def build_grammar(rules: Mapping[str, Expr], start: str, syntax: str) -> Grammar:
    """The `Grammar` of ``rules`` (name to tree) from rule ``start``, lowered as the
    module docstring describes; only the rules reachable from ``start`` are kept.

    Raises:
        GrammarError: a `Ref` to an undefined rule (with its line and column), no rule
            ``start``, a lowered grammar over `MAX_GRAMMAR_SYMBOLS`, or a rule that can
            derive no sentence (from `Grammar`).
    """
    for tree in rules.values():
        for ref in refs(tree):
            if ref.name not in rules:
                raise text_error(syntax, ref.line, ref.column, f"undefined rule {ref.name!r}")
    if start not in rules:
        raise GrammarError(f"{syntax} grammar has no rule {start!r} (the start symbol)")
    return _Lowering(rules).grammar(start)


def refs(tree: Expr) -> Iterable[Ref]:
    """The `Ref` leaves of ``tree``, left to right."""
    if isinstance(tree, Ref):
        yield tree
    elif isinstance(tree, Concat | Alt):
        for child in tree.items if isinstance(tree, Concat) else tree.options:
            yield from refs(child)
    elif isinstance(tree, Repeat):
        yield from refs(tree.item)


def substitute(tree: Expr, trees: Mapping[str, Node]) -> Node:
    """``tree`` with every `Ref` replaced by ``trees[name]`` (not copied: shared)."""
    if isinstance(tree, Ref):
        return trees[tree.name]
    if isinstance(tree, Concat):
        return Concat(tuple(substitute(t, trees) for t in tree.items))
    if isinstance(tree, Alt):
        return Alt(tuple(substitute(t, trees) for t in tree.options))
    if isinstance(tree, Repeat):
        return Repeat(substitute(tree.item, trees), tree.min, tree.max)
    return tree


def _children(tree: Expr) -> tuple[Expr, ...]:
    if isinstance(tree, Concat):
        return tree.items
    if isinstance(tree, Alt):
        return tree.options
    return (tree.item,) if isinstance(tree, Repeat) else ()


class _Lowering:
    """Lowers rule trees to grammar rules; ``inlined`` holds each regular rule's tree."""

    def __init__(self, rules: Mapping[str, Expr]):
        self.rules = rules
        self.weight: dict[str, int] = {}  # of each inlined rule, as `_measure` counts
        self.depth: dict[str, int] = {}
        self.too_large: set[str] = set()  # patterns whose DFA passed the state limit
        self.inlined = self._regular_rules()
        self.out: dict[str, list[tuple[Symbol, ...]]] = {}
        self.queue: list[str] = []
        self.size = 0
        self.helpers = 0

    def grammar(self, start: str) -> Grammar:
        """Lower ``start`` and every rule it reaches."""
        self.use(start)
        while self.queue:
            name = self.queue.pop()
            tree = self.rules[name]
            if isinstance(tree, Alt) and not self.regular(tree):
                self.add(name, [self.sequence(option, name) for option in tree.options])
            else:
                self.add(name, [self.sequence(tree, name)])
        return Grammar({name: tuple(alts) for name, alts in self.out.items()}, start)

    def _regular_rules(self) -> dict[str, Node]:
        """Each regular rule's tree with its `Ref`s replaced, by a depth-first walk in
        post-order (iterative: rule chains may be long). A rule reached again while still
        open is on a cycle, so it and every open rule above it are not regular; a rule
        over the lexeme limits is not inlined, so neither is any rule that uses it."""
        inlined: dict[str, Node] = {}
        state: dict[str, str] = {}  # "open", then "done"
        for root in self.rules:
            if root in state:
                continue
            state[root] = "open"
            regular = {root: True}
            stack = [(root, iter(refs(self.rules[root])))]
            while stack:
                name, used = stack[-1]
                ref = next(used, None)
                if ref is not None:
                    if ref.name not in state:
                        state[ref.name] = "open"
                        regular[ref.name] = True
                        stack.append((ref.name, iter(refs(self.rules[ref.name]))))
                    elif ref.name not in inlined:  # open (a cycle), or done and not regular
                        regular[name] = False
                    continue
                stack.pop()
                state[name] = "done"
                if regular.pop(name):
                    tree = self.rules[name]
                    weight, depth = _measure(tree, self.weight, self.depth)
                    if weight <= MAX_LEXEME_WEIGHT and depth <= MAX_LEXEME_DEPTH:
                        inlined[name] = substitute(tree, inlined)
                        self.weight[name], self.depth[name] = weight, depth
                if stack and name not in inlined:
                    regular[stack[-1][0]] = False
        return inlined

    def regular(self, tree: Expr) -> bool:
        """Whether ``tree`` uses only regular rules (so it is a regular language)."""
        return all(ref.name in self.inlined for ref in refs(tree))

    def use(self, name: str) -> str:
        """``name`` as a nonterminal: queue its rule for lowering once."""
        if name not in self.out and name not in self.queue:
            self.queue.append(name)
        return name

    def add(self, name: str, alternatives: list[list[Symbol]]) -> None:
        """Define rule ``name``, counting its symbols against the grammar's limit."""
        self.size += sum(len(alt) for alt in alternatives)
        if self.size > MAX_GRAMMAR_SYMBOLS:
            raise GrammarError(
                f"the grammar has more than {MAX_GRAMMAR_SYMBOLS} symbols once its "
                "repetitions are expanded"
            )
        self.out[name] = [tuple(alt) for alt in alternatives]

    def helper(self, owner: str, alternatives: list[list[Symbol]]) -> str:
        """A new rule ``owner#k`` with ``alternatives``."""
        self.helpers += 1
        name = f"{owner}#{self.helpers}"
        self.add(name, alternatives)
        return name

    def sequence(self, tree: Expr, owner: str) -> list[Symbol]:
        """The symbols of ``tree`` (helper rules, if any, are named after ``owner``)."""
        if self.regular(tree):
            return self.lexeme(tree, owner)
        if isinstance(tree, Ref):
            return [self.use(tree.name)]
        if isinstance(tree, Alt):
            return [self.helper(owner, [self.sequence(o, owner) for o in tree.options])]
        if isinstance(tree, Repeat):
            return self.repeat(self.sequence(tree.item, owner), tree.min, tree.max, owner)
        symbols: list[Symbol] = []
        run: list[Expr] = []  # consecutive regular items: one lexeme
        for item in (*tree.items, None):
            if item is not None and self.regular(item):
                run.append(item)
                continue
            if run:
                symbols += self.lexeme(run[0] if len(run) == 1 else Concat(tuple(run)), owner)
                run = []
            if item is not None:
                symbols += self.sequence(item, owner)
        return symbols

    def lexeme(self, tree: Expr, owner: str) -> list[Symbol]:
        """A regular ``tree`` as one `Terminal` (none for the empty string), or, where it
        is too large for one, as rules over smaller lexemes."""
        if tree == EMPTY:
            return []
        weight, depth = _measure(tree, self.weight, self.depth)
        if weight <= MAX_LEXEME_WEIGHT and depth <= MAX_LEXEME_DEPTH:
            pattern = render(substitute(tree, self.inlined))
            if pattern not in self.too_large:
                try:
                    return [Terminal.regex(pattern)]
                except RegexError:  # its DFA is over the state limit: split it
                    self.too_large.add(pattern)
        if isinstance(tree, Ref):
            return [self.use(tree.name)]
        if isinstance(tree, Concat):
            return [symbol for item in tree.items for symbol in self.lexeme(item, owner)]
        if isinstance(tree, Alt):
            return [self.helper(owner, [self.lexeme(o, owner) for o in tree.options])]
        if isinstance(tree, Repeat):
            return self.repeat(self.lexeme(tree.item, owner), tree.min, tree.max, owner)
        return [Terminal.regex(render(tree))]  # a character set: always compiles

    def repeat(self, item: list[Symbol], low: int, high: int | None, owner: str) -> list[Symbol]:
        """``item`` from ``low`` to ``high`` times (None: unbounded) as rules."""
        if max(low, high or 0) > MAX_REPETITION:
            count = f"{{{low},{'' if high is None else high}}}"
            raise GrammarError(
                f"rule {owner.partition('#')[0]!r}: repetition {count} is over the limit "
                f"of {MAX_REPETITION}"
            )
        if not item:
            return []
        copies = low + (1 if high is None else high - low)
        if len(item) > 1 and copies > 1:  # one rule, not copies of the sequence
            item = [self.helper(owner, [item])]
        if high is None:  # R ::= item{low} | R item
            self.helpers += 1
            loop = f"{owner}#{self.helpers}"
            self.add(loop, [item * low, [loop, *item]])
            return [loop]
        tail: list[Symbol] = []  # O_k ::= ε | item O_(k-1)
        for _ in range(high - low):
            tail = [self.helper(owner, [[], item + tail])]
        return item * low + tail


def _measure(tree: Expr, weight: Mapping[str, int], depth: Mapping[str, int]) -> tuple[int, int]:
    """(weight, depth) of ``tree`` once its `Ref`s are inlined: its number of nodes, with
    repetitions counted as copies (which bounds its rendered pattern and, roughly, its
    NFA), and its nesting (which bounds the recursion of `render` and the regex parser).
    ``weight`` and ``depth`` give those of the rules its `Ref`s name."""
    if isinstance(tree, Ref):
        return weight[tree.name], depth[tree.name]
    if isinstance(tree, Chars):
        return 1, 0
    parts = [_measure(child, weight, depth) for child in _children(tree)]
    total = 1 + sum(w for w, _ in parts)
    deepest = 1 + max((d for _, d in parts), default=0)
    if isinstance(tree, Repeat):
        total *= max(tree.min, tree.max or 1, 1)
    return total, deepest


def render(tree: Node) -> str:
    """A pattern for regex ``tree`` that our dialect and Python's `re` read alike."""
    if isinstance(tree, Chars):
        if len(tree.ranges) == 1 and tree.ranges[0][0] == tree.ranges[0][1]:
            return _char(tree.ranges[0][0])
        ranges = tree.ranges or ((0, MAX_CODE_POINT),)
        body = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)
        return f"[{'' if tree.ranges else '^'}{body}]"
    if isinstance(tree, Concat):
        return "".join(f"(?:{render(t)})" if isinstance(t, Alt) else render(t) for t in tree.items)
    if isinstance(tree, Alt):
        return "|".join(render(t) for t in tree.options)
    item = render(tree.item)
    if not isinstance(tree.item, Chars):
        item = f"(?:{item})"
    low, high = tree.min, tree.max
    quantifier = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((low, high))
    if quantifier is None:
        quantifier = f"{{{low}}}" if low == high else f"{{{low},{'' if high is None else high}}}"
    return item + quantifier


def _char(code: int) -> str:
    """Code point ``code`` in a pattern (in or out of a class): ASCII letters and digits
    as themselves, other ASCII escaped, everything else literal."""
    char = chr(code)
    if char.isascii() and char.isalnum():
        return char
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    return "\\" + char if code < 0x80 else char
