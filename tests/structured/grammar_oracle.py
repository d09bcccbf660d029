"""Test helpers for the grammar texts: random grammars as trees, rendered to GBNF and to
Lark, with their languages computed from the trees alone (never by the code under test).

A tree is a tuple: ``("lit", s)``, ``("set", chars, negated)``, ``("any",)``,
``("ref", i)`` (rule ``i``), ``("seq", [...])``, ``("alt", [...])``, ``("rep", x, low,
high)`` (high None: unbounded). A grammar is a list of such trees, rule 0 the start; each
rule's first alternative uses no rule, so every rule derives some sentence.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from pyagent_ref.structured.earley import EarleyParser

ALPHABET = "abé"
MAX_LEN = 4
RULES = 3


def accepts(grammar, text: str) -> bool:
    """Whether ``text`` is a sentence of ``grammar`` (by the Earley parser)."""
    parser = EarleyParser(grammar)
    return all(parser.push(byte) for byte in text.encode()) and parser.is_accepting()


def parsed_language(grammar, alphabet: str = ALPHABET, max_len: int = MAX_LEN) -> set[str]:
    """The sentences of ``grammar`` over ``alphabet`` of at most ``max_len`` characters,
    by a depth-first walk of the parser (push a character's bytes, recurse, pop)."""
    found: set[str] = set()

    def walk(parser: EarleyParser, prefix: str) -> None:
        if parser.is_accepting():
            found.add(prefix)
        if len(prefix) == max_len:
            return
        for char in alphabet:
            data = char.encode()
            pushed = 0
            for byte in data:
                if not parser.push(byte):
                    break
                pushed += 1
            if pushed == len(data):
                walk(parser, prefix + char)
            parser.pop(pushed)

    walk(EarleyParser(grammar), "")
    return found


def tree_language(rules, alphabet: str = ALPHABET, max_len: int = MAX_LEN) -> set[str]:
    """The sentences of rule 0 of ``rules`` (trees) of at most ``max_len`` characters over
    ``alphabet``: a fixpoint over sets of strings, as the trees define them."""
    langs = [set() for _ in rules]

    def cat(left: set[str], right: set[str]) -> set[str]:
        return {a + b for a in left for b in right if len(a) + len(b) <= max_len}

    def lang(tree) -> set[str]:
        kind = tree[0]
        if kind == "lit":
            return {tree[1]} if len(tree[1]) <= max_len else set()
        if kind == "set":
            return {c for c in alphabet if (c in tree[1]) != tree[2]}
        if kind == "any":
            return set(alphabet)
        if kind == "ref":
            return langs[tree[1]]
        if kind == "seq":
            out = {""}
            for item in tree[1]:
                out = cat(out, lang(item))
            return out
        if kind == "alt":
            return set().union(*(lang(option) for option in tree[1]))
        item, low, high = lang(tree[1]), tree[2], tree[3]
        out, power = set(), {""}
        for count in itertools.count():
            if count >= low:
                out |= power
            if (high is not None and count == high) or count > max_len + low:
                return out
            power = cat(power, item)

    changed = True
    while changed:
        changed = False
        for i, tree in enumerate(rules):
            new = lang(tree)
            if not new <= langs[i]:
                langs[i] |= new
                changed = True
    return langs[0]


def trees(rules: int = RULES, max_leaves: int = 6):
    """A strategy of rule trees over `ALPHABET` that may use rules ``0..rules-1``."""
    chars = st.sampled_from(ALPHABET)
    leaves = st.one_of(
        st.text(ALPHABET, max_size=2).map(lambda s: ("lit", s)),
        st.tuples(st.sets(chars, min_size=1, max_size=2), st.booleans()).map(
            lambda t: ("set", "".join(sorted(t[0])), t[1])
        ),
        st.just(("any",)),
        st.integers(0, rules - 1).map(lambda i: ("ref", i)),
    )
    bounds = st.sampled_from([(0, None), (1, None), (0, 1), (2, 2), (1, 2), (2, None), (0, 0)])

    def extend(children):
        return st.one_of(
            st.lists(children, min_size=2, max_size=3).map(lambda xs: ("seq", xs)),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: ("alt", xs)),
            st.tuples(children, bounds).map(lambda t: ("rep", t[0], *t[1])),
        )

    return st.recursive(leaves, extend, max_leaves=max_leaves)


def _no_refs(tree) -> bool:
    if tree[0] == "ref":
        return False
    if tree[0] in ("seq", "alt"):
        return all(_no_refs(t) for t in tree[1])
    return _no_refs(tree[1]) if tree[0] == "rep" else True


@st.composite
def grammars(draw, rules: int = RULES):
    """A list of ``rules`` trees, each ``base | anything`` with a base that uses no rule."""
    out = []
    for _ in range(rules):
        base = draw(trees(rules).filter(_no_refs))
        more = draw(st.lists(trees(rules), max_size=2))
        out.append(("alt", [base, *more]) if more else base)
    return out


def _escape(char: str, style: int) -> str:
    """``char`` in a string or class: itself, or escaped (0: as is, 1: \\x or \\u)."""
    if char in '"\\[]-^/':
        return "\\" + char
    if style and ord(char) < 0x100:
        return f"\\x{ord(char):02x}"
    return f"\\u{ord(char):04x}" if style else char


def render_gbnf(rules, style: int = 0) -> str:
    """GBNF text of ``rules`` (rule 0 is ``root``); ``style`` varies escapes and layout."""
    names = ["root", *(f"r{i}" for i in range(1, len(rules)))]

    def atom(tree) -> str:  # what a quantifier may follow
        return f"({text(tree, False)})" if tree[0] == "rep" else text(tree, True)

    def text(tree, nested: bool) -> str:
        kind = tree[0]
        if kind == "lit":
            return '"' + "".join(_escape(c, style) for c in tree[1]) + '"'
        if kind == "set":
            return "[" + "^" * tree[2] + "".join(_escape(c, style) for c in tree[1]) + "]"
        if kind == "any":
            return "."
        if kind == "ref":
            return names[tree[1]]
        if kind == "seq":
            body = " ".join(text(t, True) for t in tree[1])
            return f"({body})" if nested else body
        if kind == "alt":
            separator = " |\n    " if style else " | "
            body = separator.join(text(t, False) for t in tree[1])
            return f"({body})" if nested else body
        low, high = tree[2], tree[3]
        quantifier = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((low, high))
        if quantifier is None:
            quantifier = (
                f"{{{low}}}" if low == high else f"{{{low},{'' if high is None else high}}}"
            )
        return atom(tree[1]) + quantifier

    comment = "# a comment\n" if style else ""
    return comment + "\n".join(f"{names[i]} ::= {text(t, False)}" for i, t in enumerate(rules))


def render_lark(rules, style: int = 0) -> str:
    """Lark text of ``rules`` (rule 0 is ``start``); ``style`` varies the spellings."""
    names = ["start", *(f"r{i}" for i in range(1, len(rules)))]

    def atom(tree) -> str:  # what a quantifier may follow
        return f"({text(tree, False)})" if tree[0] == "rep" else text(tree, True)

    def text(tree, nested: bool) -> str:
        kind = tree[0]
        if kind == "lit":
            return '"' + "".join(_escape(c, style) for c in tree[1]) + '"'
        if kind == "set":
            chars = "".join(_escape(c, 0) for c in tree[1])
            if style and not tree[2] and len(tree[1]) == 2 and tree[1] == "ab":
                return '"a".."b"'
            return "/[" + "^" * tree[2] + chars + "]/"
        if kind == "any":
            return "/./"
        if kind == "ref":
            return names[tree[1]]
        if kind == "seq":
            body = " ".join(text(t, True) for t in tree[1])
            return f"({body})" if nested else body
        if kind == "alt":
            separator = "\n    | " if style and not nested else " | "
            body = separator.join(text(t, False) for t in tree[1])
            return f"({body})" if nested else body
        low, high, item = tree[2], tree[3], atom(tree[1])
        if (low, high) == (0, 1):
            return f"[{text(tree[1], False)}]" if style else item + "?"
        quantifier = {(0, None): "*", (1, None): "+"}.get((low, high))
        if quantifier is None and high is not None:
            quantifier = f"~{low}" if low == high else f"~{low}..{high}"
        if quantifier is None:
            quantifier = f"{{{low},}}"
        return item + quantifier

    comment = "// a comment\n" if style else ""
    return comment + "\n".join(f"{names[i]}: {text(t, False)}" for i, t in enumerate(rules))
