"""Accelerated structured output: the token-level stage of `pyagent_ref.structured` in Rust.

`EarleyParser`, `TokenTrie` and `GrammarMatcher` have the reference's methods and give
the same results (the same masks bit for bit, the same accepted tokens, rollbacks and
forced bytes); the grammars themselves are still compiled by the reference
(`pyagent_ref.structured`: regex, JSON Schema, GBNF / Lark to a `Grammar`) and handed
over once as flat tables (`CompiledGrammar`). This package does not import
`pyagent_ref`: a grammar is read duck-typed (``rules``, ``start``, each terminal's
``dfa``)::

    from pyagent_accel.structured import CompiledGrammar, EarleyParser, GrammarMatcher, TokenTrie

    compiled = CompiledGrammar(grammar)        # once per grammar
    trie = TokenTrie(token_bytes(tokenizer))   # once per vocabulary
    matcher = GrammarMatcher(EarleyParser(compiled), trie, [eos_id])
    matcher.fill_next_token_bitmask(bitmask, index)

How a mask is computed fast is in `pyagent_accel`'s Rust sources (``src/grammar/walk.rs``).
"""

from __future__ import annotations

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
]
