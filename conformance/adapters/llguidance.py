"""llguidance behind the `ops.structured` signature and the `matcher` contract.

    python -m conformance conformance.adapters.llguidance structured matcher

`structured` (built on first access, which imports llguidance) provides:

    apply_token_bitmask  llguidance.numpy.apply_token_bitmask_inplace on a copy of numpy
                         logits; llguidance.torch.apply_token_bitmask_inplace on a clone
                         of a tensor (both mask in place)

Each library's arrays go to llguidance's function for that library; a bitmask of the
other library is converted to the logits' library (a copy). Anything else is passed on
as it is: llguidance's own checks (assertions) are what is tested.

`matcher` (see `conformance/specs/matcher.py`) is `LLGuidanceBackend` per vocabulary:
llguidance's ``LLTokenizer`` reads the vocabulary's tokenizer.json itself, with
`EOS_TOKEN` as its end of sentence; a constraint becomes llguidance's grammar with
``LLMatcher.grammar_from_json_schema`` (default options: JSON's whitespace, as the
contract and MaskBench have it), ``grammar_from_regex`` or ``grammar_from("gbnf", ...)``,
checked by building an ``LLMatcher`` (a grammar error raises ValueError with llguidance's
message); each matcher is a ``deep_copy`` of that one. The matcher's calls map onto
llguidance's:

    fill_next_token_bitmask  llguidance.numpy.fill_next_token_bitmask
    accept_token(t)          consume_token(t) if validate_tokens([t]) takes it (for EOS:
                             if is_accepting(), as validate_tokens never takes EOS), else
                             False (a refused consume_token would put the matcher in its
                             error state for good, which the contract does not have)
    rollback(n)              LLMatcher.rollback(n)
    is_terminated()          whether the last accepted token is the EOS: llguidance has
                             no such state (is_stopped() is already True once the value
                             is closed, before EOS), so the adapter keeps the list

The other ops modules and `tokenize` have no counterpart (CONFORMANCE_MISSING).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .. import bpe_corpus, contract, matcher_corpus
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    f"{m}.*": "llguidance is a structured-output library: it has no such op"
    for m in contract.modules()
    if m != "structured"
} | {"tokenize.*": "llguidance has no tokenizer of its own (it reads HF tokenizers)"}

VERSION: str | None = None


def _llguidance() -> Any:
    """The llguidance module, or an ImportError that says what to install."""
    global VERSION
    try:
        from importlib.metadata import version

        import llguidance
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.llguidance needs llguidance: pip install llguidance"
        ) from exc
    VERSION = f"llguidance {version('llguidance')}"
    return llguidance


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    _llguidance()
    if isinstance(logits, np.ndarray):
        from llguidance.numpy import apply_token_bitmask_inplace

        out = np.array(logits, copy=True)
        if hasattr(bitmask, "numpy"):
            bitmask = bitmask.numpy()
    else:
        import torch
        from llguidance.torch import apply_token_bitmask_inplace

        out = logits.clone() if isinstance(logits, torch.Tensor) else logits
        if isinstance(bitmask, np.ndarray):
            bitmask = torch.from_numpy(np.array(bitmask, copy=True))
    apply_token_bitmask_inplace(out, bitmask)
    return out


# --- matcher --------------------------------------------------------------------------------


class LLGuidanceBackend:
    """llguidance's compilers for one vocabulary (`matcher` contract's `TokenBackend`).

    Args:
        vocabulary: one of `matcher_corpus.MATCHER_VOCABULARIES`.
        json_options: llguidance's JsonCompileOptions (None: its defaults).
    """

    def __init__(self, vocabulary: str, json_options: dict | None = None) -> None:
        llguidance = _llguidance()
        self.eos_token_id = matcher_corpus.eos_token_id(vocabulary)
        self.tokenizer = llguidance.LLTokenizer(
            bpe_corpus.tokenizer_json(vocabulary).read_text(encoding="utf-8"),
            n_vocab=matcher_corpus.vocab_size(vocabulary),
            eos_token=self.eos_token_id,
        )
        self.json_options = json_options

    def json_schema(self, schema: Any) -> CompiledGrammar:
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(
            schema, overrides=self.json_options
        )
        return CompiledGrammar(self, grammar)

    def regex(self, pattern: str) -> CompiledGrammar:
        return CompiledGrammar(self, _llguidance().LLMatcher.grammar_from_regex(pattern))

    def grammar(self, gbnf: str) -> CompiledGrammar:
        return CompiledGrammar(self, _llguidance().grammar_from("gbnf", gbnf))


class CompiledGrammar:
    """An llguidance grammar with a matcher at its start (ValueError if it has an error)."""

    def __init__(self, backend: LLGuidanceBackend, grammar: str) -> None:
        self.eos_token_id = backend.eos_token_id
        self.start = _llguidance().LLMatcher(backend.tokenizer, grammar, log_level=0)
        if self.start.is_error():
            raise ValueError(f"llguidance refuses the grammar: {self.start.get_error()}")

    def matcher(self) -> Matcher:
        return Matcher(self.start.deep_copy(), self.eos_token_id)


class Matcher:
    """An ``LLMatcher`` behind the `matcher` contract's calls (module docstring)."""

    def __init__(self, matcher: Any, eos_token_id: int) -> None:
        self.matcher, self.eos_token_id = matcher, eos_token_id
        self.accepted: list[int] = []

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, bitmask, index)

    def accept_token(self, token_id: int) -> bool:
        if token_id == self.eos_token_id:
            takes = self.matcher.is_accepting()
        else:
            takes = self.matcher.validate_tokens([token_id]) == 1
        if not takes:
            return False
        self.matcher.consume_token(token_id)
        self.accepted.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return bool(self.accepted) and self.accepted[-1] == self.eos_token_id

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)
        del self.accepted[len(self.accepted) - num_tokens :]


@functools.cache
def _backend(vocabulary: str) -> LLGuidanceBackend:
    return LLGuidanceBackend(vocabulary)


def json_schema(schema: Any, vocabulary: str) -> CompiledGrammar:
    return _backend(vocabulary).json_schema(schema)


def regex(pattern: str, vocabulary: str) -> CompiledGrammar:
    return _backend(vocabulary).regex(pattern)


def grammar(gbnf: str, vocabulary: str) -> CompiledGrammar:
    return _backend(vocabulary).grammar(gbnf)


# `llguidance.structured` and `llguidance.matcher`: the functions above, named like the
# reference's op and the matcher spec's compilers.
__getattr__ = lazy_namespaces(__name__, globals(), ("structured", "matcher"), _llguidance)
