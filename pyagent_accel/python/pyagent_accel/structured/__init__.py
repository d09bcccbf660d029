"""Accelerated structured output: the token-level stage of `pyagent_ref.structured` in Rust.

`EarleyParser`, `TokenTrie` and `GrammarMatcher` have the reference's methods and give
the same results (the same masks bit for bit, the same accepted tokens, rollbacks and
forced bytes). The compilers (`compile_regex`, `json_schema_grammar`, `compile_grammar`,
`choice_grammar`) are the reference's with their automaton constructions (subset
construction, minimisation, products: most of their time) in Rust (`automata`), giving
the same `Grammar`; it is handed over once as flat tables (`CompiledGrammar`). This
package does not import `pyagent_ref` at import time: a grammar is read duck-typed
(``rules``, ``start``, each terminal's ``dfa``)::

    from pyagent_accel.structured import CompiledGrammar, EarleyParser, GrammarMatcher, TokenTrie

    compiled = CompiledGrammar(grammar)        # once per grammar
    trie = TokenTrie(token_bytes(tokenizer))   # once per vocabulary
    matcher = GrammarMatcher(EarleyParser(compiled), trie, [eos_id])
    matcher.fill_next_token_bitmask(bitmask, index)

How a mask is computed fast is in `pyagent_accel`'s Rust sources (``src/grammar/walk.rs``).

The compiler's other names (`Grammar`, `Terminal`, `token_bytes`, ... every other name
of `pyagent_ref.structured`) are looked up in
`pyagent_ref.structured` on first use, so this package stands in for the reference's
wherever the token level runs (the engine, the conformance suite, the benchmark);
without `pyagent_ref` they raise ImportError.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import automata
from .automata import choice_grammar as choice_grammar
from .automata import compile_grammar as compile_grammar
from .automata import compile_regex as compile_regex
from .automata import constraint_grammar as constraint_grammar
from .automata import determinize as determinize
from .automata import intersect as intersect
from .automata import json_schema_grammar as json_schema_grammar
from .automata import minimal_dfa as minimal_dfa
from .automata import minimize as minimize
from .automata import node_dfa as node_dfa
from .automata import rust_automata as rust_automata
from .automata import subtract as subtract
from .earley import MAX_COLUMN_ITEMS, CompiledGrammar, EarleyParser
from .matcher import MAX_JUMP_FORWARD_BYTES, GrammarMatcher
from .vocab import TokenTrie

__all__ = [
    "MAX_COLUMN_ITEMS",
    "MAX_JUMP_FORWARD_BYTES",
    "CompiledGrammar",
    "EarleyParser",
    "GrammarMatcher",
    "TokenTrie",
    *automata.__all__,
]


def __getattr__(name: str) -> Any:
    """A name of the reference's compiler (`pyagent_ref.structured`), looked up there."""
    reference = importlib.import_module("pyagent_ref.structured")
    if name.startswith("_") or name not in reference.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(reference, name)
