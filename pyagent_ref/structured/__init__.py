"""Structured output: constraints on generated text compiled to automata and token masks.

A request may demand that its output match a regex, a JSON Schema, one of several strings,
or a grammar. Issue 13 builds the whole path, each stage its own readable module:

1. **regex → byte DFA** (exists): `regex.parse_regex` parses the pattern (the JSON Schema
   ``pattern`` dialect and Python's common subset) into a syntax tree; `nfa.build_nfa`
   turns it into a Thompson NFA over UTF-8 bytes; `dfa.determinize` and `dfa.minimize`
   make the minimal DFA, bounded by a state limit. `compile_regex` runs all three.
2. **grammars** (exists): `grammar.Grammar`, context-free rules whose terminals are
   lexemes (`grammar.Terminal`, a regex compiled by stage 1); `earley.EarleyParser`
   reads a grammar's sentences byte by byte with undo; ``choice`` (one of several
   strings) is `grammar.choice_grammar`. Grammar texts: `ebnf.compile_grammar` reads
   GBNF (`gbnf.parse_gbnf`, llama.cpp's format, XGrammar's "EBNF") or Lark
   (`lark_grammar.parse_lark`); both parse into rule trees that `grammar_text` lowers to
   rules over the largest regular lexemes.
3. **JSON Schema → grammar** (exists): `json_schema.json_schema_grammar`: types,
   properties, items, formats, ``$ref``..., with strings and numbers as lexemes.
4. **token masks** (exists): `vocab.TokenTrie`, a trie over the vocabulary's token bytes
   (`vocab.token_bytes`), walked against the parser to fill the bitmask of allowed next
   tokens; `matcher.GrammarMatcher` with ``accept_token``, ``rollback`` and forced bytes.
5. **the op** (exists): ``ops.structured.apply_token_bitmask(logits, bitmask)`` before
   sampling.

Everything reads bytes, because tokens are bytes: a token may end in the middle of a
character. docs/structured.md works through an example.
"""

from .dfa import (
    DEAD,
    DFA,
    MAX_DFA_STATES,
    compile_regex,
    determinize,
    intersect,
    minimal_dfa,
    minimize,
    node_dfa,
    subtract,
)
from .earley import EarleyParser
from .ebnf import compile_grammar, detect_syntax
from .gbnf import parse_gbnf
from .grammar import Grammar, GrammarError, Terminal, choice_grammar, regex_escape
from .json_schema import SchemaError, json_schema_grammar
from .lark_grammar import parse_lark
from .matcher import GrammarMatcher
from .nfa import MAX_NFA_STATES, NFA, build_nfa, utf8_sequences
from .regex import RegexError, parse_regex
from .vocab import TokenTrie, token_bytes

__all__ = [
    "DEAD",
    "DFA",
    "EarleyParser",
    "Grammar",
    "GrammarError",
    "GrammarMatcher",
    "MAX_DFA_STATES",
    "MAX_NFA_STATES",
    "NFA",
    "RegexError",
    "SchemaError",
    "Terminal",
    "TokenTrie",
    "build_nfa",
    "choice_grammar",
    "compile_grammar",
    "compile_regex",
    "detect_syntax",
    "determinize",
    "intersect",
    "json_schema_grammar",
    "minimal_dfa",
    "minimize",
    "node_dfa",
    "parse_gbnf",
    "parse_lark",
    "parse_regex",
    "regex_escape",
    "subtract",
    "token_bytes",
    "utf8_sequences",
]
