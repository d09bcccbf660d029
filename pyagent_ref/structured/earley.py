"""An Earley parser that reads a `Grammar`'s sentences one byte at a time.

The token-level stage needs one question answered very often: *can the bytes so far still
be extended to a sentence?* It walks a trie of token bytes, pushing a byte on the way down
and popping it on the way back, so the parser must take bytes one at a time and undo them
cheaply. Earley's algorithm fits: it handles every context-free grammar (left recursion,
ambiguity, empty rules) and its state after ``n`` bytes is a list of ``n + 1`` *columns*,
each built from the previous one, so undoing a byte is dropping the last column.

A column holds *items* ``(rule, alternative, dot, origin)``: "``rule``'s alternative has
been matched up to ``dot`` by the bytes since column ``origin``". Terminals are lexemes
(`Terminal`, a byte DFA), matched by *runs* ``(terminal, origin, state)``: "the bytes since
column ``origin`` have taken ``terminal``'s DFA to ``state``". One step:

1. **scan** (`push`): every run of the last column steps its DFA on the byte; a run that
   survives goes to the new column, and where it reaches an accepting state the terminal
   may end here, so every item of column ``origin`` waiting for that terminal moves its
   dot past it into the new column.
2. **close** (`_close`), until nothing new appears: an item waiting for a nonterminal
   *predicts* that nonterminal's alternatives (origin: this column); an item waiting for a
   terminal starts a run; a finished item *completes*: the items of its origin column
   waiting for its rule move their dot. Nullable symbols (`Grammar.nullable`, empty
   terminals) are stepped over at prediction (Aycock and Horspool's fix), which is what
   makes completion within one column correct.

Because `Grammar` admits only productive alternatives and DFAs are trimmed, every item
and run can still reach a sentence: the bytes are a viable prefix exactly when the new
column is not empty, and a sentence when the start rule is finished from column 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .dfa import DEAD
from .grammar import Grammar, GrammarError, Symbol, Terminal

__all__ = ["MAX_COLUMN_ITEMS", "EarleyParser"]

MAX_COLUMN_ITEMS = 100_000
"""The most items one column may hold; past it, `GrammarError` (a pathological grammar)."""

Item = tuple[str, int, int, int]
"""``(rule, alternative, dot, origin)``."""

Run = tuple[Terminal, int, int]
"""``(terminal, origin, DFA state)``."""


@dataclass
class _Column:
    """The items and runs after some bytes; ``waiting[symbol]``: its items expecting ``symbol``."""

    items: set[Item] = field(default_factory=set)
    runs: set[Run] = field(default_factory=set)
    waiting: dict[Symbol, list[Item]] = field(default_factory=dict)


class EarleyParser:
    """Recognises a `Grammar`'s sentences byte by byte, with undo.

    Contract: after any sequence of successful `push` calls with bytes ``s``, ``s`` is a
    prefix of some sentence of the grammar; `push` refuses (returns False, changes
    nothing) exactly the bytes that would break this; `is_accepting` says whether ``s``
    itself is a sentence; `pop` undoes pushes; `copy` is an independent parser in the same
    state (cheap: columns are never modified once built).
    """

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        first = _Column()
        self._columns: list[_Column] = [first]
        self._close(
            first, 0, [(grammar.start, alt, 0, 0) for alt in self._alternatives(grammar.start)]
        )

    def push(self, byte: int) -> bool:
        """Read one byte (0..255); False, and no change, if no sentence continues this way."""
        here = len(self._columns)
        column = _Column()
        moved: list[Item] = []
        for terminal, origin, state in self._columns[-1].runs:
            state = terminal.dfa.step(state, byte)
            if state == DEAD:
                continue
            column.runs.add((terminal, origin, state))
            if terminal.dfa.is_accepting(state):
                moved += [_advance(item) for item in self._columns[origin].waiting[terminal]]
        if not column.runs:
            return False
        self._columns.append(column)
        self._close(column, here, moved)
        return True

    def pop(self, n: int = 1) -> None:
        """Undo the last ``n`` pushed bytes."""
        if not 0 <= n < len(self._columns):
            raise ValueError(f"n must be in [0, {len(self._columns) - 1}] (bytes pushed), got {n}")
        del self._columns[len(self._columns) - n :]

    def is_accepting(self) -> bool:
        """Whether the bytes pushed so far are a whole sentence."""
        start = self.grammar.start
        items = self._columns[-1].items
        return any(
            (start, alt, len(body), 0) in items
            for alt, body in enumerate(self.grammar.rules[start])
        )

    def num_bytes(self) -> int:
        """How many bytes have been pushed (and not popped)."""
        return len(self._columns) - 1

    def copy(self) -> EarleyParser:
        """An independent parser in the same state."""
        clone = object.__new__(EarleyParser)
        clone.grammar = self.grammar
        clone._columns = list(self._columns)
        return clone

    def _alternatives(self, rule: str) -> range:
        return range(len(self.grammar.rules[rule]))

    def _close(self, column: _Column, here: int, agenda: list[Item]) -> None:
        """Add ``agenda`` to ``column`` (number ``here``) and all it predicts and completes."""
        rules, nullable = self.grammar.rules, self.grammar.nullable
        while agenda:
            item = agenda.pop()
            if item in column.items:
                continue
            column.items.add(item)
            if len(column.items) > MAX_COLUMN_ITEMS:
                raise GrammarError(f"more than {MAX_COLUMN_ITEMS} Earley items at byte {here}")
            rule, alt, dot, origin = item
            body = rules[rule][alt]
            if dot == len(body):  # complete
                source = column if origin == here else self._columns[origin]
                agenda += [_advance(parent) for parent in source.waiting.get(rule, ())]
                continue
            symbol = body[dot]
            column.waiting.setdefault(symbol, []).append(item)
            if isinstance(symbol, Terminal):  # start a run of the lexeme
                column.runs.add((symbol, here, symbol.dfa.start))
                if symbol.nullable:
                    agenda.append(_advance(item))
            else:  # predict
                agenda += [(symbol, a, 0, here) for a in self._alternatives(symbol)]
                if symbol in nullable:
                    agenda.append(_advance(item))


def _advance(item: Item) -> Item:
    rule, alt, dot, origin = item
    return (rule, alt, dot + 1, origin)
