"""The compiler's automaton constructions in Rust: `pyagent_ref.structured.dfa`'s twins.

`node_dfa` (Thompson's construction from a regex syntax tree, then the rest),
`determinize`, `minimize`, `minimal_dfa`, `intersect` and `subtract` take and return the
reference's syntax trees, `NFA` and `DFA` objects and give the same results table for
table (both end in the canonical numbering, which depends only on the automaton), with
the same `RegexError` past the same state limits. They are most of the time of compiling a JSON
Schema or a grammar (nine tenths, in the reference), so the package's compilers
(`compile_regex`, `json_schema_grammar`, `compile_grammar`, `choice_grammar`,
`constraint_grammar`) are the reference's, run with these constructions installed
(``dfa.using_automata(rust_automata())``): the same grammars, built faster. The other
stages (parsing patterns and grammars, the JSON Schema rules) stay the reference's
Python.

Like the rest of this package it reads the reference's objects duck-typed and looks its
classes up in `pyagent_ref.structured` on first use.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from .. import _native

__all__ = [
    "choice_grammar",
    "compile_grammar",
    "compile_regex",
    "constraint_grammar",
    "determinize",
    "intersect",
    "json_schema_grammar",
    "minimal_dfa",
    "minimize",
    "node_dfa",
    "rust_automata",
    "subtract",
]

MAX_DFA_STATES = 10_000
"""The reference's default DFA state limit (`pyagent_ref.structured.dfa.MAX_DFA_STATES`)."""
MAX_NFA_STATES = 100_000
"""The reference's default NFA state limit (`pyagent_ref.structured.nfa.MAX_NFA_STATES`)."""


@functools.cache
def _ref(module: str) -> Any:
    return importlib.import_module(f"pyagent_ref.structured.{module}")


def _dfa(tables: tuple[bytes, list[int], list[bool], int]) -> Any:
    """The reference's `DFA` of the tables Rust returns (transitions row by row)."""
    byte_class, transitions, accepting, start = tables
    rows = tuple(zip(*[iter(transitions)] * (max(byte_class) + 1), strict=True))
    return _ref("dfa").DFA(tuple(byte_class), rows, tuple(accepting), start)


def _tables(dfa: Any) -> tuple[bytes, list[int], list[bool], int]:
    return (
        bytes(dfa.byte_class),
        [q for row in dfa.transitions for q in row],
        list(dfa.accepting),
        dfa.start,
    )


def _regex_error(exc: ValueError) -> Exception:
    return _ref("regex").RegexError(str(exc))


def _from_nfa(nfa: Any, max_states: int, minimal: bool) -> Any:
    try:
        tables = _native.nfa_to_dfa(
            nfa.start, nfa.accept, nfa.edges, nfa.epsilons, max_states, minimal
        )
    except ValueError as exc:
        raise _regex_error(exc) from None
    return _dfa(tables)


def _flatten(node: Any, out: list[int], cap: int) -> None:
    """Append the prefix encoding of a regex tree that Rust decodes (`Node::decode`).
    Repetition counts are capped at ``cap`` (one past the NFA state limit: a repetition
    that large needs more states either way, so the same error comes)."""
    regex = _ref("regex")
    if isinstance(node, regex.Chars):
        out += (0, len(node.ranges))
        for lo, hi in node.ranges:
            out += (lo, hi)
        return
    if isinstance(node, regex.Repeat):
        low = min(node.min, cap)
        out += (3, low, -1 if node.max is None else max(low, min(node.max, cap)))
        _flatten(node.item, out, cap)
        return
    if isinstance(node, regex.Concat):
        tag, items = 1, node.items
    elif isinstance(node, regex.Alt):
        tag, items = 2, node.options
    else:
        raise TypeError(f"not a regex node: {node!r}")
    out += (tag, len(items))
    for item in items:
        _flatten(item, out, cap)


def node_dfa(
    node: Any, max_states: int = MAX_DFA_STATES, max_nfa_states: int = MAX_NFA_STATES
) -> Any:
    """The minimal DFA of a regex syntax tree (contract: the reference's `node_dfa`).

    Raises:
        RegexError: past ``max_nfa_states`` NFA states or ``max_states`` DFA states.
    """
    code: list[int] = []
    _flatten(node, code, max(max_nfa_states, 0) + 1)
    try:
        tables = _native.regex_tree_to_dfa(code, max_nfa_states, max_states)
    except ValueError as exc:
        raise _regex_error(exc) from None
    return _dfa(tables)


def determinize(nfa: Any, max_states: int = MAX_DFA_STATES) -> Any:
    """The subset construction (contract: the reference's `determinize`).

    Raises:
        RegexError: more than ``max_states`` states.
    """
    return _from_nfa(nfa, max_states, minimal=False)


def minimize(dfa: Any) -> Any:
    """Hopcroft's minimisation (contract: the reference's `minimize`)."""
    return _dfa(_native.minimize_dfa(_tables(dfa)))


def minimal_dfa(nfa: Any, max_states: int = MAX_DFA_STATES) -> Any:
    """``minimize(determinize(nfa, max_states))`` in one call (the reference's
    `minimal_dfa`).

    Raises:
        RegexError: the subset construction passes ``max_states`` states.
    """
    return _from_nfa(nfa, max_states, minimal=True)


def _product(a: Any, b: Any, subtract: bool, max_states: int) -> Any:
    try:
        tables = _native.product_dfa(_tables(a), _tables(b), subtract, max_states)
    except ValueError as exc:
        raise _regex_error(exc) from None
    return _dfa(tables)


def intersect(a: Any, b: Any, max_states: int = MAX_DFA_STATES) -> Any:
    """The minimal DFA of the strings both accept (contract: the reference's `intersect`).

    Raises:
        RegexError: the product has more than ``max_states`` states.
    """
    return _product(a, b, False, max_states)


def subtract(a: Any, b: Any, max_states: int = MAX_DFA_STATES) -> Any:
    """The minimal DFA of the strings ``a`` accepts and ``b`` does not (contract: the
    reference's `subtract`).

    Raises:
        RegexError: the product has more than ``max_states`` states.
    """
    return _product(a, b, True, max_states)


@functools.cache
def rust_automata() -> Any:
    """This module's constructions as the reference's `dfa.Automata`, for
    `dfa.using_automata` (built on first use)."""
    return _ref("dfa").Automata(node_dfa, minimal_dfa, intersect, subtract)


def _with_rust_automata(reference: Any) -> Any:
    """The reference compiler `reference`, run with this module's constructions."""

    @functools.wraps(reference)
    def compile_with_rust_automata(*args: Any, **kwargs: Any) -> Any:
        with _ref("dfa").using_automata(rust_automata()):
            return reference(*args, **kwargs)

    return compile_with_rust_automata


def compile_regex(
    pattern: str, max_states: int = MAX_DFA_STATES, max_nfa_states: int = MAX_NFA_STATES
) -> Any:
    """The minimal byte DFA of ``pattern`` (contract: the reference's `compile_regex`;
    its cache is shared).

    Raises:
        RegexError: a malformed or unsupported pattern, or past a state limit.
    """
    return _with_rust_automata(_ref("dfa").compile_regex)(pattern, max_states, max_nfa_states)


def json_schema_grammar(
    schema: Any,
    *,
    whitespace: str | None = None,
    any_whitespace: bool = True,
    additional_properties: bool = True,
) -> Any:
    """The grammar of a JSON Schema (contract: the reference's `json_schema_grammar`)."""
    return _with_rust_automata(_ref("json_schema").json_schema_grammar)(
        schema,
        whitespace=whitespace,
        any_whitespace=any_whitespace,
        additional_properties=additional_properties,
    )


def compile_grammar(text: str, syntax: str = "auto", start: str | None = None) -> Any:
    """The grammar of GBNF or Lark text (contract: the reference's `compile_grammar`)."""
    return _with_rust_automata(_ref("ebnf").compile_grammar)(text, syntax, start)


def choice_grammar(options: Any) -> Any:
    """The grammar of one of several strings (contract: the reference's `choice_grammar`)."""
    return _with_rust_automata(_ref("grammar").choice_grammar)(options)


def constraint_grammar(params: Any) -> Any:
    """The grammar of a request's `StructuredOutputsParams` (contract: the reference's
    `structured.constraints.constraint_grammar`; the engine calls it on this backend)."""
    return _with_rust_automata(_ref("constraints").constraint_grammar)(params)
