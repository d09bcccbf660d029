"""Subset construction and minimisation: the byte NFA becomes a minimal deterministic automaton.

The token-level stage asks one question per token, many times: where does the automaton go
on these bytes, and can it still accept? A `DFA` answers it with one table look-up per
byte. It is built in two steps:

1. `determinize`: the subset construction. A DFA state is a set of NFA states (those the
   NFA can be in after the same bytes). Bytes are first partitioned into *byte classes*:
   the cuts at every NFA edge's range ends split 0..255 into intervals whose bytes no
   transition distinguishes, so each state has one move per class instead of 256.
   `max_states` bounds the construction: past it, `RegexError` (the number of states can
   grow exponentially: ``(a|b)*a(a|b){20}`` needs about 2^21).
2. `minimize`: Hopcroft's partition refinement merges the states no byte string tells
   apart; the result is the unique minimal DFA of the language (up to numbering).

Both results are *trimmed* and *canonical*: a state from which no accepting state can be
reached is the `DEAD` state (not stored; every move into it is `DEAD`, so a byte that can
never lead to a match is rejected at once), states are numbered breadth-first from the
start (0), and byte classes are merged wherever their moves agree in every state and
numbered by their smallest byte. So two DFAs of one language from `minimize` are equal.

`compile_regex` runs the whole pipeline: pattern → `parse_regex` → `build_nfa` →
`determinize` → `minimize`, with a small cache. `intersect` and `subtract` combine two DFAs
(the product construction), for languages no single regex of the dialect writes down: a
JSON Schema string with both a ``pattern`` and a ``maxLength``, or the property names a
schema does not list.

The compilers (`compile_regex`, `grammar.Terminal`, `json_schema`) call these
constructions through `automata()`, the `Automata` in use: the functions of this module,
unless a caller installs others with `using_automata` (``pyagent_accel.structured``
installs its Rust twins, which return equal DFAs; the caches of compiled regexes and
terminals are shared by both).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .nfa import MAX_NFA_STATES, NFA, build_nfa
from .regex import Node, RegexError, parse_regex

__all__ = [
    "DEAD",
    "DFA",
    "MAX_DFA_STATES",
    "REFERENCE_AUTOMATA",
    "Automata",
    "automata",
    "compile_regex",
    "determinize",
    "intersect",
    "minimal_dfa",
    "minimize",
    "node_dfa",
    "subtract",
    "using_automata",
]

DEAD = -1
"""The state after a byte string that is no prefix of any match."""

MAX_DFA_STATES = 10_000


@dataclass(frozen=True)
class DFA:
    """A deterministic, trimmed automaton over bytes.

    ``byte_class[b]`` is the class of byte ``b`` (0..255); ``transitions[q][c]`` is the
    state after reading a byte of class ``c`` in state ``q`` (`DEAD` if no match can follow);
    ``accepting[q]`` says whether the bytes read so far are a match. States are
    ``0..num_states-1``; `start` is 0, or `DEAD` when the language is empty. Every state
    but `DEAD` can reach an accepting state.
    """

    byte_class: tuple[int, ...]
    transitions: tuple[tuple[int, ...], ...]
    accepting: tuple[bool, ...]
    start: int

    @property
    def num_states(self) -> int:
        return len(self.transitions)

    @property
    def num_classes(self) -> int:
        return max(self.byte_class) + 1

    def step(self, state: int, byte: int) -> int:
        """The state after ``byte`` (0..255) in ``state``; `DEAD` stays `DEAD`."""
        return DEAD if state == DEAD else self.transitions[state][self.byte_class[byte]]

    def walk(self, state: int, data: bytes) -> int:
        """The state after all of ``data`` (a token's bytes) from ``state``, or `DEAD`."""
        for byte in data:
            if state == DEAD:
                break
            state = self.transitions[state][self.byte_class[byte]]
        return state

    def is_accepting(self, state: int) -> bool:
        """Whether the bytes that led to ``state`` are a whole match."""
        return state != DEAD and self.accepting[state]

    def can_reach_accept(self, state: int) -> bool:
        """Whether some continuation leads from ``state`` to a match (true but for `DEAD`)."""
        return state != DEAD

    def match(self, data: bytes) -> bool:
        """Whether the whole of ``data`` is in the language (`re.fullmatch` on bytes)."""
        return self.is_accepting(self.walk(self.start, data))

    def class_ranges(self, cls: int) -> list[tuple[int, int]]:
        """The bytes of class ``cls`` as inclusive ranges, in increasing order."""
        ranges: list[tuple[int, int]] = []
        for byte in range(256):
            if self.byte_class[byte] == cls:
                if ranges and ranges[-1][1] == byte - 1:
                    ranges[-1] = (ranges[-1][0], byte)
                else:
                    ranges.append((byte, byte))
        return ranges

    def format_table(self) -> str:
        """The transition table as text: a row per state, a column per byte class that
        leads anywhere, labelled by its bytes (``[0-9]``, ``.``, ``[\\x80-\\xbf]``); ``-`` is
        `DEAD`, and the bytes of no column lead to `DEAD` everywhere."""
        table = self.transitions
        columns = [c for c in range(self.num_classes) if any(r[c] != DEAD for r in table)]
        header = ["state", *(_class_label(self.class_ranges(c)) for c in columns), "accepting"]
        rows = [
            [
                str(q),
                *(str(r[c]) if r[c] != DEAD else "-" for c in columns),
                "yes" if self.accepting[q] else "no",
            ]
            for q, r in enumerate(self.transitions)
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        return "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]
        )


def _class_label(ranges: list[tuple[int, int]]) -> str:
    def show(b: int) -> str:
        return chr(b) if 0x21 <= b <= 0x7E else f"\\x{b:02x}"

    label = "".join(show(lo) if lo == hi else f"{show(lo)}-{show(hi)}" for lo, hi in ranges)
    return label if ranges == [(ranges[0][0], ranges[0][0])] else f"[{label}]"


def determinize(nfa: NFA, max_states: int = MAX_DFA_STATES) -> DFA:
    """The subset construction: a `DFA` (trimmed, not minimal) with ``nfa``'s language.

    A subset is named by its NFA states that read a byte, plus the accept state (states with
    only epsilon moves add nothing once the closure is taken).

    Raises:
        RegexError: more than ``max_states`` states (the message names the limit); raised
            as soon as the limit is passed, so the time spent is bounded by the limit.
    """
    ends = {b for edges in nfa.edges for lo, hi, _ in edges for b in (lo, hi + 1)}
    cuts = sorted({0, 256} | ends)
    byte_class = [0] * 256
    for cls, (lo, end) in enumerate(zip(cuts, cuts[1:], strict=False)):
        byte_class[lo:end] = [cls] * (end - lo)
    reads = {q for q, edges in enumerate(nfa.edges) if edges} | {nfa.accept}

    def subset(states) -> frozenset[int]:
        return frozenset(q for q in nfa.closure(states) if q in reads)

    subsets = [subset([nfa.start])]
    index = {subsets[0]: 0}
    rows: list[list[int]] = []
    for current in subsets:  # a worklist: new subsets are appended while we iterate
        targets: list[set[int]] = [set() for _ in range(len(cuts) - 1)]
        for q in current:
            for lo, hi, target in nfa.edges[q]:
                for cls in range(byte_class[lo], byte_class[hi] + 1):
                    targets[cls].add(target)
        row = []
        for cls_targets in targets:
            following = subset(cls_targets)
            if following and following not in index:
                if len(subsets) == max_states:
                    raise RegexError(
                        f"the pattern's DFA has more than {max_states} states (max_states)"
                    )
                index[following] = len(subsets)
                subsets.append(following)
            row.append(index[following] if following else DEAD)
        rows.append(row)
    return _canonical(byte_class, rows, [nfa.accept in s for s in subsets], start=0)


def minimize(dfa: DFA) -> DFA:
    """Hopcroft's algorithm: the minimal DFA of ``dfa``'s language, in canonical form.

    Start from the partition {accepting, non-accepting} (with `DEAD` as an explicit sink,
    so that every state moves on every class). Take a pending block A as the splitter; for
    each class c, the states whose move on c lands in A split every block they cut in two.
    When a block splits, both halves become pending if it was pending, else the smaller
    half only (Hopcroft's trick, which gives O(n log n) splits). When nothing is pending,
    the blocks are the equivalence classes of states: one state each in the minimal DFA.
    """
    if dfa.start == DEAD:
        return dfa
    sink = n = dfa.num_states
    k = dfa.num_classes

    def move(q: int, cls: int) -> int:
        target = DEAD if q == sink else dfa.transitions[q][cls]
        return sink if target == DEAD else target

    into: list[list[list[int]]] = [[[] for _ in range(n + 1)] for _ in range(k)]
    for q in range(n + 1):
        for cls in range(k):
            into[cls][move(q, cls)].append(q)
    accepting = {q for q in range(n) if dfa.accepting[q]}
    blocks = [b for b in (set(accepting), set(range(n + 1)) - accepting) if b]
    block_of = [0] * (n + 1)
    for b, members in enumerate(blocks):
        for q in members:
            block_of[q] = b
    pending = set(range(len(blocks)))
    while pending:
        splitter = list(blocks[pending.pop()])
        for cls in range(k):
            cut: dict[int, set[int]] = defaultdict(set)  # block -> its states moving into A
            for target in splitter:
                for q in into[cls][target]:
                    cut[block_of[q]].add(q)
            for b, inside in cut.items():
                if len(inside) == len(blocks[b]):
                    continue  # all of block b moves into A: no split
                new = len(blocks)
                blocks[b] -= inside
                blocks.append(inside)
                for q in inside:
                    block_of[q] = new
                if b in pending or len(inside) <= len(blocks[b]):
                    pending.add(new)  # both halves pending, or the new half is the smaller
                else:
                    pending.add(b)  # the rest of b is the smaller half

    dead_block = block_of[sink]
    rows, accepts = [], []
    for members in blocks:
        q = next(iter(members))
        row = [block_of[move(q, cls)] for cls in range(k)]
        rows.append([DEAD if b == dead_block else b for b in row])
        accepts.append(q in accepting)
    return _canonical(list(dfa.byte_class), rows, accepts, start=block_of[dfa.start])


def intersect(a: DFA, b: DFA, max_states: int = MAX_DFA_STATES) -> DFA:
    """The minimal DFA of the byte strings that both ``a`` and ``b`` accept.

    Raises:
        RegexError: the product has more than ``max_states`` states.
    """
    return _product(a, b, lambda in_a, in_b: in_a and in_b, max_states)


def subtract(a: DFA, b: DFA, max_states: int = MAX_DFA_STATES) -> DFA:
    """The minimal DFA of the byte strings that ``a`` accepts and ``b`` does not.

    Raises:
        RegexError: the product has more than ``max_states`` states.
    """
    return _product(a, b, lambda in_a, in_b: in_a and not in_b, max_states)


def _product(a: DFA, b: DFA, keep, max_states: int) -> DFA:
    """The product construction: a state is a pair (state of ``a``, state of ``b``), either
    of which may be `DEAD`; it accepts when ``keep(a accepts, b accepts)``. Only pairs
    reachable from the start pair are built; a pair whose ``a`` side is `DEAD` is `DEAD`
    (both operations need ``a`` to accept), and `_canonical` trims the rest."""
    if a.start == DEAD:
        return a
    classes = list(dict.fromkeys(zip(a.byte_class, b.byte_class, strict=True)))
    class_of = {pair: i for i, pair in enumerate(classes)}
    byte_class = [class_of[pair] for pair in zip(a.byte_class, b.byte_class, strict=True)]
    pairs = [(a.start, b.start)]
    index = {pairs[0]: 0}
    rows: list[list[int]] = []
    for qa, qb in pairs:  # a worklist: new pairs are appended while we iterate
        row = []
        for ca, cb in classes:
            ta = a.transitions[qa][ca]
            tb = DEAD if qb == DEAD else b.transitions[qb][cb]
            if ta == DEAD:
                row.append(DEAD)
                continue
            if (ta, tb) not in index:
                if len(pairs) == max_states:
                    raise RegexError(f"the product DFA has more than {max_states} states")
                index[ta, tb] = len(pairs)
                pairs.append((ta, tb))
            row.append(index[ta, tb])
        rows.append(row)
    accepting = [keep(a.accepting[qa], qb != DEAD and b.accepting[qb]) for qa, qb in pairs]
    return minimize(_canonical(byte_class, rows, accepting, start=0))


def _canonical(
    byte_class: Sequence[int], rows: Sequence[Sequence[int]], accepting: Sequence[bool], start: int
) -> DFA:
    """The `DFA` of a transition table: trimmed, numbered breadth-first from ``start`` with
    classes tried by smallest byte, and classes whose columns agree merged into one."""
    predecessors: list[list[int]] = [[] for _ in rows]
    for q, row in enumerate(rows):
        for target in row:
            if target != DEAD:
                predecessors[target].append(q)
    live = {q for q, yes in enumerate(accepting) if yes}
    stack = list(live)
    while stack:
        for q in predecessors[stack.pop()]:
            if q not in live:
                live.add(q)
                stack.append(q)
    if start not in live:
        return DFA((0,) * 256, (), (), DEAD)

    by_first_byte = list(dict.fromkeys(byte_class))  # classes in order of their first byte
    number = {start: 0}
    order = [start]
    for q in order:  # breadth-first; `order` grows while we iterate
        for cls in by_first_byte:
            target = rows[q][cls]
            if target in live and target not in number:
                number[target] = len(order)
                order.append(target)
    renumbered = [[number.get(target, DEAD) for target in rows[q]] for q in order]

    columns: dict[tuple[int, ...], int] = {}
    new_class = {}
    for cls in by_first_byte:
        column = tuple(row[cls] for row in renumbered)
        new_class[cls] = columns.setdefault(column, len(columns))
    return DFA(
        byte_class=tuple(new_class[cls] for cls in byte_class),
        transitions=tuple(tuple(column[q] for column in columns) for q in range(len(order))),
        accepting=tuple(bool(accepting[q]) for q in order),
        start=0,
    )


def minimal_dfa(nfa: NFA, max_states: int = MAX_DFA_STATES) -> DFA:
    """``minimize(determinize(nfa, max_states))``: the minimal DFA of an NFA's language.

    Raises:
        RegexError: the subset construction passes ``max_states`` states.
    """
    return minimize(determinize(nfa, max_states))


def node_dfa(
    node: Node, max_states: int = MAX_DFA_STATES, max_nfa_states: int = MAX_NFA_STATES
) -> DFA:
    """The minimal DFA of a regex syntax tree: `build_nfa`, then `minimal_dfa`.

    Raises:
        RegexError: past ``max_nfa_states`` NFA states or ``max_states`` DFA states.
    """
    return minimal_dfa(build_nfa(node, max_nfa_states), max_states)


@dataclass(frozen=True)
class Automata:
    """The automaton constructions the compilers call, as one set that can be swapped.

    Each field has the contract of this module's function of the same name (its limits
    optional, the same defaults): it returns an equal `DFA` and raises the same
    `RegexError`.
    """

    node_dfa: Callable[..., DFA]
    minimal_dfa: Callable[..., DFA]
    intersect: Callable[..., DFA]
    subtract: Callable[..., DFA]


REFERENCE_AUTOMATA = Automata(node_dfa, minimal_dfa, intersect, subtract)
"""This module's constructions: what `automata` returns unless `using_automata` is active."""

_AUTOMATA: contextvars.ContextVar[Automata] = contextvars.ContextVar(
    "automata", default=REFERENCE_AUTOMATA
)


def automata() -> Automata:
    """The constructions in use in this context (thread, task): `REFERENCE_AUTOMATA`, or
    those a `using_automata` block installed."""
    return _AUTOMATA.get()


@contextlib.contextmanager
def using_automata(implementation: Automata) -> Iterator[None]:
    """Within the block, in this context only, the compilers build automata with
    ``implementation``.

    Raises:
        TypeError: ``implementation`` is not an `Automata`.
    """
    if not isinstance(implementation, Automata):
        raise TypeError(f"implementation must be an Automata, got {type(implementation).__name__}")
    token = _AUTOMATA.set(implementation)
    try:
        yield
    finally:
        _AUTOMATA.reset(token)


@functools.lru_cache(maxsize=256)
def compile_regex(
    pattern: str, max_states: int = MAX_DFA_STATES, max_nfa_states: int = MAX_NFA_STATES
) -> DFA:
    """The minimal byte `DFA` of the strings that match ``pattern`` as a whole.

    ``pattern`` is in the dialect of `pyagent_ref.structured.regex`; the DFA reads UTF-8.
    Results are cached by arguments (a `DFA` is immutable).

    Raises:
        RegexError: a malformed or unsupported pattern (naming the position), or an
            automaton over ``max_nfa_states`` NFA states or ``max_states`` DFA states.
    """
    return automata().node_dfa(parse_regex(pattern), max_states, max_nfa_states)
