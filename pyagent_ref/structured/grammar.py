"""Grammars: context-free rules whose terminals are regular languages over bytes.

Every constraint of structured output becomes a `Grammar`: a regex is a grammar of one
terminal, ``choice`` one of literal alternatives, a JSON Schema a grammar of objects,
arrays, strings and numbers, and EBNF / GBNF / Lark text a grammar written by hand.

A grammar maps each nonterminal (a name) to its alternatives; an alternative is a sequence
of symbols, each a nonterminal name or a `Terminal`. A terminal is a *lexeme*: a regular
language, written as a regex (stage 1 compiles it to a byte `DFA`), that matches whole
strings of its language. Lexemes keep grammars small and fast (a JSON string is one
terminal, not a dozen rules) without changing what a grammar means: a sentence is any
byte string the rules derive, with each terminal replaced by any string of its language.
There is no separate lexer and no greedy tokenisation (``"a"* "a"`` accepts ``aaa``).

`Grammar.__post_init__` checks the rules once, so the parser can trust them: every
nonterminal used is defined, the start symbol can derive a sentence, and alternatives that
can never derive one (they use a non-productive nonterminal or an empty-language terminal)
are refused by name, because a parser needs "some continuation exists" to be true of every
item it keeps. It also computes which nonterminals are *nullable* (derive the empty
string), which `earley.EarleyParser` needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .dfa import DEAD, DFA, automata, compile_regex
from .regex import Node

__all__ = ["Grammar", "GrammarError", "Symbol", "Terminal", "choice_grammar", "regex_escape"]

MAX_GRAMMAR_SYMBOLS = 200_000
"""The most symbol occurrences a grammar may have (summed over all alternatives)."""


class GrammarError(ValueError):
    """A grammar that cannot be used: names the rule and the problem."""


@dataclass(frozen=True, eq=False)
class Terminal:
    """A lexeme: the byte strings that match ``pattern`` (our regex dialect) as a whole.

    Terminals compare by identity; `Terminal.regex` and `Terminal.literal` return the one
    terminal of a pattern, so equal patterns share one DFA and one parser run. A terminal
    built by a program rather than written as text (`from_node`: a syntax tree;
    `from_dfa`: an automaton, such as the product of two) has a *label* in place of
    ``pattern``: a name for people (shown by repr), never parsed.
    """

    pattern: str
    dfa: DFA = field(repr=False)

    @staticmethod
    def regex(pattern: str) -> Terminal:
        """The terminal of a regex (raises `RegexError` for a bad pattern)."""
        return _terminal(pattern)

    @staticmethod
    def literal(text: str) -> Terminal:
        """The terminal that matches exactly ``text``."""
        return _terminal(regex_escape(text))

    @staticmethod
    def from_node(node: Node, label: str) -> Terminal:
        """The terminal of a regex syntax tree (`regex.Node`) built by a program.

        Equal trees share one terminal (the first one's label is kept).

        Raises:
            RegexError: the automaton is over the NFA or DFA state limits.
        """
        terminal = _NODE_TERMINALS.get(node)
        if terminal is None:
            if len(_NODE_TERMINALS) > 4096:
                _NODE_TERMINALS.clear()
            dfa = automata().node_dfa(node)
            terminal = _NODE_TERMINALS[node] = Terminal(label, dfa)
        return terminal

    @staticmethod
    def from_dfa(dfa: DFA, label: str) -> Terminal:
        """The terminal of an automaton built by a program (`dfa.intersect`, `dfa.subtract`)."""
        return Terminal(label, dfa)

    @property
    def nullable(self) -> bool:
        """Whether the empty string is in the terminal's language."""
        return self.dfa.is_accepting(self.dfa.start)

    def __repr__(self) -> str:
        return f"Terminal({self.pattern!r})"


_TERMINALS: dict[str, Terminal] = {}
_NODE_TERMINALS: dict[Node, Terminal] = {}


def _terminal(pattern: str) -> Terminal:
    terminal = _TERMINALS.get(pattern)
    if terminal is None:
        if len(_TERMINALS) > 4096:
            _TERMINALS.clear()
        terminal = _TERMINALS[pattern] = Terminal(pattern, compile_regex(pattern))
    return terminal


def regex_escape(text: str) -> str:
    """A pattern matching exactly ``text``: ASCII punctuation is escaped, the rest literal."""
    return "".join("\\" + c if c.isascii() and not c.isalnum() and c > " " else c for c in text)


Symbol = str | Terminal
"""A nonterminal's name, or a terminal."""


@dataclass(frozen=True)
class Grammar:
    """Context-free rules over `Terminal` lexemes, checked on construction.

    ``rules[name]`` is the tuple of ``name``'s alternatives, each a tuple of symbols (the
    empty tuple derives the empty string). ``start`` names the whole sentence's rule.

    Raises:
        GrammarError: no rules, an undefined start or nonterminal (named), a grammar over
            `MAX_GRAMMAR_SYMBOLS`, or an alternative that can derive no sentence (named).
    """

    rules: Mapping[str, tuple[tuple[Symbol, ...], ...]]
    start: str
    nullable: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rules = {name: tuple(tuple(alt) for alt in alts) for name, alts in self.rules.items()}
        object.__setattr__(self, "rules", rules)
        if self.start not in rules:
            raise GrammarError(f"start symbol {self.start!r} has no rule")
        size = sum(len(alt) for alts in rules.values() for alt in alts)
        if size > MAX_GRAMMAR_SYMBOLS:
            raise GrammarError(f"grammar has {size} symbols, over {MAX_GRAMMAR_SYMBOLS}")
        for name, alts in rules.items():
            for alt in alts:
                for symbol in alt:
                    if isinstance(symbol, str) and symbol not in rules:
                        raise GrammarError(f"rule {name!r} uses undefined symbol {symbol!r}")
                    if not isinstance(symbol, str | Terminal):
                        raise GrammarError(f"rule {name!r} has a bad symbol {symbol!r}")
        productive = _fixpoint(rules, _terminal_productive)
        for name, alts in rules.items():
            for alt in alts:
                dead = [
                    s
                    for s in alt
                    if not (_terminal_productive(s) if isinstance(s, Terminal) else s in productive)
                ]
                if dead:
                    raise GrammarError(
                        f"rule {name!r} has an alternative that can derive no sentence "
                        f"(because of {dead[0]!r})"
                    )
        object.__setattr__(self, "nullable", _fixpoint(rules, _terminal_nullable))

    def symbols(self) -> Iterable[Symbol]:
        """Every symbol occurrence, rule by rule."""
        for alts in self.rules.values():
            for alt in alts:
                yield from alt


def _terminal_productive(terminal: Terminal) -> bool:
    return terminal.dfa.start != DEAD


def _terminal_nullable(terminal: Terminal) -> bool:
    return terminal.nullable


def _fixpoint(rules, terminal_ok) -> frozenset[str]:
    """The nonterminals with an alternative whose every symbol is ok, to a fixpoint.

    With ``terminal_ok`` "non-empty language" this is the productive set (derives some
    sentence); with "accepts the empty string" it is the nullable set.
    """
    known: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, alts in rules.items():
            if name in known:
                continue
            for alt in alts:
                if all(terminal_ok(s) if isinstance(s, Terminal) else s in known for s in alt):
                    known.add(name)
                    changed = True
                    break
    return frozenset(known)


def choice_grammar(options: Iterable[str]) -> Grammar:
    """The grammar whose sentences are exactly the given strings (vLLM's ``choice``)."""
    alternatives = tuple((Terminal.literal(text),) for text in dict.fromkeys(options))
    if not alternatives:
        raise GrammarError("choice needs at least one option")
    return Grammar({"root": alternatives}, "root")
