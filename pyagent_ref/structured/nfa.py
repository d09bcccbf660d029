"""Thompson's construction: a regex syntax tree becomes a nondeterministic automaton over bytes.

Tokens are byte strings (a token can end in the middle of a character), so the automaton
reads UTF-8 bytes, not characters: each set of code points (`Chars`) becomes the UTF-8
byte-range sequences that encode exactly its characters (`utf8_sequences`). Surrogates
(U+D800-U+DFFF) have no UTF-8 encoding and are left out.

`build_nfa` is Thompson's construction, one case per node type; every fragment has one
start and one end state, joined by epsilon (empty) moves:

* `Chars`: start ─byte range─► ... ─byte range─► end, one chain per UTF-8 sequence,
  chains sharing their states where the rest of their sequences agree (so that the
  continuation bytes after ``E1-EC`` and after ``EE-EF`` lead through the same states);
* `Concat`: the fragments in a row, each end ─ε─► the next start;
* `Alt`: a new start ─ε─► each option's start, each option's end ─ε─► a new end;
* `Repeat(x, n, m)`: ``n`` copies of ``x`` in a row, then either a loop state (``m``
  None: ``x*``) or ``m - n`` nested optional copies (``(x(x(x)?)?)?``), each with an ε exit.

Bounded repetition is expanded into copies, so ``x{1000}`` has a thousand copies of
``x``; `max_states` bounds the growth: construction stops with `RegexError` as soon as the
automaton would exceed it, so the work done is bounded by the limit, not by the pattern's
numbers.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .regex import Alt, Chars, Concat, Node, RegexError, Repeat

__all__ = ["MAX_NFA_STATES", "NFA", "build_nfa", "utf8_sequences"]

MAX_NFA_STATES = 100_000

ByteSequence = tuple[tuple[int, int], ...]
"""Inclusive byte ranges, one per byte of an encoding: ``((0xCE, 0xCE), (0xB1, 0xBF))``."""

_LENGTH_ENDS = (0x7F, 0x7FF, 0xFFFF, 0x10FFFF)  # last code point of each UTF-8 length
_SURROGATES = (0xD800, 0xDFFF)


@functools.lru_cache(maxsize=4096)
def utf8_sequences(lo: int, hi: int) -> tuple[ByteSequence, ...]:
    """The UTF-8 byte-range sequences matching exactly the encodings of code points lo..hi.

    The byte strings matched by the sequences (each byte in its range) are the UTF-8
    encodings of the non-surrogate code points in ``lo..hi``, each matched by exactly one
    sequence. The standard algorithm: split the range at the surrogates and where the
    encoded length changes; then split a same-length range until, for every number ``i``
    of trailing continuation bytes, the range either stays within one value of the
    leading bytes or covers all of the trailing ``i`` bytes' values; then the encodings of
    its two ends, byte by byte, are the ranges of one sequence.
    """
    pieces = [(lo, hi)]
    if lo <= _SURROGATES[1] and hi >= _SURROGATES[0]:
        pieces = [(lo, _SURROGATES[0] - 1), (_SURROGATES[1] + 1, hi)]
    sequences = []
    for piece_lo, piece_hi in pieces:
        start = 0
        for length, end in enumerate(_LENGTH_ENDS, start=1):
            a, b = max(piece_lo, start), min(piece_hi, end)
            if a <= b:
                sequences.extend(_same_length(a, b, length))
            start = end + 1
    return tuple(sequences)


def _same_length(lo: int, hi: int, length: int) -> Iterator[ByteSequence]:
    for trailing in range(1, length):
        mask = (1 << (6 * trailing)) - 1  # the bits of the last `trailing` bytes
        if lo & ~mask == hi & ~mask:
            continue  # the leading bytes agree: the trailing bytes are one range each
        if lo & mask != 0:  # lo starts mid-block: its block alone, then the rest
            yield from _same_length(lo, lo | mask, length)
            yield from _same_length((lo | mask) + 1, hi, length)
            return
        if hi & mask != mask:  # hi ends mid-block: the whole blocks, then hi's block
            yield from _same_length(lo, (hi & ~mask) - 1, length)
            yield from _same_length(hi & ~mask, hi, length)
            return
    yield tuple(zip(chr(lo).encode("utf-8"), chr(hi).encode("utf-8"), strict=True))


@dataclass
class NFA:
    """A byte automaton: states 0..n-1, one `start`, one `accept` state.

    ``edges[q]`` lists the byte moves of state ``q`` as ``(lo, hi, target)`` (any byte in
    ``lo..hi`` leads to ``target``); ``epsilons[q]`` lists the states ``q`` reaches without
    reading a byte. A byte string is accepted if some path from `start` reads it and ends
    in `accept`.
    """

    start: int
    accept: int
    edges: list[list[tuple[int, int, int]]]
    epsilons: list[list[int]]

    @property
    def num_states(self) -> int:
        return len(self.edges)

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        """``states`` and every state reachable from them by epsilon moves alone."""
        stack = list(states)
        seen = set(stack)
        while stack:
            for target in self.epsilons[stack.pop()]:
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return frozenset(seen)

    def step(self, states: frozenset[int], byte: int) -> frozenset[int]:
        """The closure of the states that ``byte`` leads to from ``states``."""
        return self.closure(t for q in states for lo, hi, t in self.edges[q] if lo <= byte <= hi)

    def match(self, data: bytes) -> bool:
        """Whether the whole of ``data`` is accepted (simulating all paths at once)."""
        states = self.closure([self.start])
        for byte in data:
            states = self.step(states, byte)
        return self.accept in states


def build_nfa(node: Node, max_states: int = MAX_NFA_STATES) -> NFA:
    """Thompson's construction: an `NFA` accepting the UTF-8 encodings of ``node``'s strings.

    Raises:
        RegexError: the automaton needs more than ``max_states`` states (the message names
            the limit); raised as soon as the limit is passed.
    """
    builder = _Builder(max_states)
    start, end = builder.fragment(node)
    return NFA(start, end, builder.edges, builder.epsilons)


class _Builder:
    def __init__(self, max_states: int):
        self.max_states = max_states
        self.edges: list[list[tuple[int, int, int]]] = []
        self.epsilons: list[list[int]] = []

    def state(self) -> int:
        if len(self.edges) >= self.max_states:
            raise RegexError(
                f"the pattern needs more than {self.max_states} NFA states (max_nfa_states); "
                "large repetition counts are expanded into copies"
            )
        self.edges.append([])
        self.epsilons.append([])
        return len(self.edges) - 1

    def fragment(self, node: Node) -> tuple[int, int]:
        """Build ``node``'s fragment; return its (start, end) states."""
        if isinstance(node, Chars):
            start, end = self.state(), self.state()
            suffix_states = {(): end}  # "read these byte ranges, then end": one state each

            def state_before(rest: ByteSequence) -> int:
                if rest not in suffix_states:
                    suffix_states[rest] = self.state()
                    self.edges[suffix_states[rest]].append((*rest[0], state_before(rest[1:])))
                return suffix_states[rest]

            for lo, hi in node.ranges:
                for sequence in utf8_sequences(lo, hi):
                    self.edges[start].append((*sequence[0], state_before(sequence[1:])))
            return start, end
        if isinstance(node, Concat):
            start = end = self.state()
            for item in node.items:
                end = self.then(end, item)
            return start, end
        if isinstance(node, Alt):
            start, end = self.state(), self.state()
            for option in node.options:
                option_start, option_end = self.fragment(option)
                self.epsilons[start].append(option_start)
                self.epsilons[option_end].append(end)
            return start, end
        if isinstance(node, Repeat):
            start = end = self.state()
            for _ in range(node.min):
                end = self.then(end, node.item)
            if node.max is None:  # a loop: end ─ε─► loop ─ε─► item ─ε─► loop
                loop = self.state()
                self.epsilons[end].append(loop)
                item_start, item_end = self.fragment(node.item)
                self.epsilons[loop].append(item_start)
                self.epsilons[item_end].append(loop)
                return start, loop
            exit_ = self.state()
            for _ in range(node.max - node.min):
                self.epsilons[end].append(exit_)
                end = self.then(end, node.item)
            self.epsilons[end].append(exit_)
            return start, exit_
        raise TypeError(f"not a regex node: {node!r}")

    def then(self, end: int, node: Node) -> int:
        """Append ``node``'s fragment after state ``end``; return the fragment's end."""
        start, node_end = self.fragment(node)
        self.epsilons[end].append(start)
        return node_end
