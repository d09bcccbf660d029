"""Test helpers: patterns in the dialect Python's `re` and JSON Schema share, and a check
of DFA minimality.

A pattern is drawn as a small tree of tuples, independent of `pyagent_ref.structured.regex`
(so the parser under test is not its own oracle), rendered to text, and paired with
strings that match it. Strings are drawn from `ALPHABET`, which has no non-ASCII
whitespace: there ECMA-262's ``\\s`` (ours) and Python's differ; with `re.ASCII` Python's
``\\d \\w \\s`` are ours on every other character.
"""

from __future__ import annotations

import re

from hypothesis import strategies as st

LITERALS = "ab0_ -.\né😀α{}"
ALPHABET = "ab0_ -.\n\t\r\x0b\x0c\x1c\x85é😀αzZ9\x00ω{}"
CLASS_ITEMS = (
    "a",
    "b",
    "0",
    "α",
    "😀",
    "\\-",
    "\\]",
    "a-c",
    "0-9",
    "α-ω",
    "\\d",
    "\\w",
    "\\s",
    "\\D",
    "\\W",
    "\\S",
    "\\n",
    "\\t",
    "\\x61",
    "\\u00e9",
    ".",
)
ESCAPES = ("\\d", "\\w", "\\s", "\\D", "\\W", "\\S", "\\.", "\\n", "\\t", "\\x41", "\\u03b1")
QUANTIFIERS = ("*", "+", "?", "{0}", "{2}", "{1,}", "{0,2}", "{1,3}")

_META = set("\\.^$|?*+()[]{}")


def render_literal(char: str) -> str:
    return "\\n" if char == "\n" else ("\\" + char if char in _META else char)


def trees(max_leaves: int = 8):
    """Trees of ``("text", s)`` atoms and ``("cat" | "alt" | "group" | "rep", ...)`` nodes."""
    atoms = st.one_of(
        st.sampled_from(LITERALS).map(lambda c: ("text", render_literal(c))),
        st.just(("text", ".")),
        st.sampled_from(ESCAPES).map(lambda e: ("text", e)),
        st.tuples(
            st.booleans(), st.lists(st.sampled_from(CLASS_ITEMS), min_size=1, max_size=3)
        ).map(lambda t: ("text", "[" + "^" * t[0] + "".join(t[1]) + "]")),
    )

    def extend(children):
        return st.one_of(
            st.lists(children, min_size=2, max_size=3).map(lambda xs: ("cat", xs)),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: ("alt", xs)),
            st.tuples(children, st.sampled_from(["(", "(?:", "(?P<"])).map(
                lambda t: ("group", t[0], t[1])
            ),
            st.tuples(children, st.sampled_from(QUANTIFIERS), st.booleans()).map(
                lambda t: ("rep", t[0] if t[0][0] == "text" else ("group", t[0], "(?:"), *t[1:])
            ),
        )

    return st.recursive(atoms, extend, max_leaves=max_leaves)


def render(tree, names=None) -> str:
    """The pattern text of ``tree``; named groups get distinct names (g0, g1, ...)."""
    names = [] if names is None else names
    kind = tree[0]
    if kind == "text":
        return tree[1]
    if kind == "cat":
        return "".join(render(t, names) for t in tree[1])
    if kind == "alt":
        return "|".join(render(t, names) for t in tree[1])
    if kind == "group":
        opening = tree[2]
        if opening == "(?P<":
            opening = f"(?P<g{len(names)}>"
            names.append(opening)
        return opening + render(tree[1], names) + ")"
    return render(tree[1], names) + tree[2] + "?" * tree[3]


def _bounds(quantifier: str) -> tuple[int, int]:
    if quantifier in "*+?":
        return {"*": (0, 3), "+": (1, 3), "?": (0, 1)}[quantifier]
    low, _, high = quantifier.strip("{}").partition(",")
    if "," not in quantifier:
        return int(low), int(low)
    return int(low), int(high) if high else int(low) + 2


@st.composite
def matching(draw, tree) -> str:
    """A string that matches ``tree`` (each atom drawn from the `ALPHABET` characters it
    matches according to Python's `re`; any character where none does)."""
    kind = tree[0]
    if kind == "text":
        fits = [c for c in ALPHABET if re.fullmatch(tree[1], c, re.ASCII)]
        return draw(st.sampled_from(fits or ALPHABET))
    if kind == "cat":
        return "".join(draw(matching(t)) for t in tree[1])
    if kind == "alt":
        return draw(matching(draw(st.sampled_from(tree[1]))))
    if kind == "group":
        return draw(matching(tree[1]))
    low, high = _bounds(tree[2])
    count = draw(st.integers(low, high))
    return "".join(draw(matching(tree[1])) for _ in range(count))


@st.composite
def patterns_and_strings(draw):
    """(pattern, strings): a pattern, optionally anchored, and strings to try on it: one
    drawn to match, a random one, and the matching one with a character changed."""
    tree = draw(trees())
    pattern = render(tree)
    if draw(st.booleans()):
        pattern = "^" + pattern + "$"
    hit = draw(matching(tree))
    strings = [hit, draw(st.text(alphabet=ALPHABET, max_size=8))]
    if hit:
        i = draw(st.integers(0, len(hit) - 1))
        strings.append(hit[:i] + draw(st.sampled_from(ALPHABET)) + hit[i + 1 :])
    return pattern, strings


def count_equivalence_classes(dfa) -> int:
    """The number of classes of equivalent states of ``dfa`` (DEAD included), by Moore's
    refinement: an algorithm independent of the Hopcroft refinement under test."""
    n = dead = dfa.num_states

    def move(q, cls):
        target = dead if q == dead else dfa.transitions[q][cls]
        return dead if target == -1 else target

    block = [q < n and dfa.accepting[q] for q in range(n + 1)]
    while True:
        signature = [
            (block[q], *(block[move(q, c)] for c in range(dfa.num_classes))) for q in range(n + 1)
        ]
        refined = [list(dict.fromkeys(signature)).index(s) for s in signature]
        if len(set(refined)) == len(set(block)):
            return len(set(refined))
        block = refined


def assert_minimal(dfa) -> None:
    """No two states (DEAD included) are equivalent, every state is reachable from the start
    and every state can reach an accepting one."""
    if dfa.start == -1:
        assert dfa.num_states == 0
        return
    n = dfa.num_states
    assert count_equivalence_classes(dfa) == n + 1, "two states of the DFA are equivalent"
    assert _reachable(dfa, [0]) == set(range(n))
    for q in range(n):
        assert any(dfa.accepting[s] for s in _reachable(dfa, [q])), f"state {q} is not live"


def _reachable(dfa, sources) -> set[int]:
    seen, stack = set(sources), list(sources)
    while stack:
        for target in dfa.transitions[stack.pop()]:
            if target != -1 and target not in seen:
                seen.add(target)
                stack.append(target)
    return seen
