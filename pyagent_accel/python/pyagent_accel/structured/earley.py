"""The byte-level Earley parser in Rust: `pyagent_ref.structured.earley.EarleyParser`'s twin.

`CompiledGrammar` flattens a grammar once into the tables the Rust parser reads: rules
numbered in the grammar's order, each alternative a list of symbols (a rule's number, or
``-1 - t`` for terminal t), and each terminal's minimal DFA (byte classes, transitions
row by row, accepting states, start). Terminals are numbered by identity, as the
reference's parser tells them apart. One `CompiledGrammar` serves any number of parsers.
"""

from __future__ import annotations

from typing import Any

from .. import _native

__all__ = ["MAX_COLUMN_ITEMS", "CompiledGrammar", "EarleyParser"]

MAX_COLUMN_ITEMS = 100_000
"""The most items one column may hold; past it, ValueError (as the reference's GrammarError)."""


class CompiledGrammar:
    """A grammar as flat tables for Rust, built once and shared by its parsers.

    Args:
        grammar: a `pyagent_ref.structured.grammar.Grammar`, or any object with its
            ``rules`` (name -> tuple of alternatives, each a tuple of rule names and
            terminals with a ``dfa``) and ``start``.
    Raises:
        ValueError: a symbol that names no rule, a malformed DFA, or an empty-language
            terminal (a `Grammar` admits none of these).
    """

    def __init__(self, grammar: Any) -> None:
        self.grammar = grammar
        names = {name: i for i, name in enumerate(grammar.rules)}
        terminals: dict[int, int] = {}  # id(terminal) -> its number
        dfas: list[tuple[bytes, list[int], list[bool], int]] = []

        def number(symbol: Any) -> int:
            if isinstance(symbol, str):
                if symbol not in names:
                    raise ValueError(f"grammar uses undefined symbol {symbol!r}")
                return names[symbol]
            t = terminals.get(id(symbol))
            if t is None:
                t = terminals[id(symbol)] = len(dfas)
                dfa = symbol.dfa
                dfas.append(
                    (
                        bytes(dfa.byte_class),
                        [q for row in dfa.transitions for q in row],
                        list(dfa.accepting),
                        dfa.start,
                    )
                )
            return -1 - t

        rules = [[[number(s) for s in alt] for alt in alts] for alts in grammar.rules.values()]
        if grammar.start not in names:
            raise ValueError(f"start symbol {grammar.start!r} has no rule")
        self._core = _native.CompiledGrammarCore(rules, names[grammar.start], dfas)

    def nullable(self) -> frozenset[str]:
        """The rules that derive the empty string (the reference's `Grammar.nullable`)."""
        flags = self._core.nullable()
        return frozenset(name for name, flag in zip(self.grammar.rules, flags, strict=True) if flag)


class EarleyParser:
    """Recognises a grammar's sentences byte by byte, with undo (contract:
    `pyagent_ref.structured.earley.EarleyParser`).

    Args:
        grammar: a `CompiledGrammar`, or a grammar to compile (see `CompiledGrammar`;
            compile once when many parsers share a grammar).
    Raises:
        ValueError: the grammar cannot be compiled, or its first column exceeds
            `MAX_COLUMN_ITEMS`.
    """

    def __init__(self, grammar: Any) -> None:
        self.compiled = (
            grammar if isinstance(grammar, CompiledGrammar) else CompiledGrammar(grammar)
        )
        self.grammar = self.compiled.grammar
        self._core = _native.EarleyCore(self.compiled._core)

    def push(self, byte: int) -> bool:
        """Read one byte (0..255); False, and no change, if no sentence continues this way.

        Raises:
            ValueError: a byte outside [0, 255], or a column over `MAX_COLUMN_ITEMS`.
        """
        return self._core.push(byte)

    def pop(self, n: int = 1) -> None:
        """Undo the last ``n`` pushed bytes (ValueError: ``n`` outside [0, bytes pushed])."""
        self._core.pop(n)

    def is_accepting(self) -> bool:
        """Whether the bytes pushed so far are a whole sentence."""
        return self._core.is_accepting()

    def num_bytes(self) -> int:
        """How many bytes have been pushed (and not popped)."""
        return self._core.num_bytes()

    def copy(self) -> EarleyParser:
        """An independent parser in the same state."""
        clone = object.__new__(EarleyParser)
        clone.compiled, clone.grammar = self.compiled, self.grammar
        clone._core = self._core.copy()
        return clone
