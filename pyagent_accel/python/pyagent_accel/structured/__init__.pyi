from typing import Any

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
]

# the reference compiler's names (pyagent_ref.structured), looked up on first use
def __getattr__(name: str) -> Any: ...
