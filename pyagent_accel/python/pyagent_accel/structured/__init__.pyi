from typing import Any

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
from .earley import MAX_COLUMN_ITEMS as MAX_COLUMN_ITEMS
from .earley import CompiledGrammar as CompiledGrammar
from .earley import EarleyParser as EarleyParser
from .matcher import MAX_JUMP_FORWARD_BYTES as MAX_JUMP_FORWARD_BYTES
from .matcher import GrammarMatcher as GrammarMatcher
from .vocab import TokenTrie as TokenTrie

__all__ = [
    "MAX_COLUMN_ITEMS",
    "MAX_JUMP_FORWARD_BYTES",
    "CompiledGrammar",
    "EarleyParser",
    "GrammarMatcher",
    "TokenTrie",
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

# the reference compiler's names (pyagent_ref.structured), looked up on first use
def __getattr__(name: str) -> Any: ...
