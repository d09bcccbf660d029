"""xgrammar behind the `ops.structured` signature and the `matcher` contract.

    python -m conformance conformance.adapters.xgrammar structured matcher

`structured` (built on first access, which imports xgrammar) provides:

    apply_token_bitmask  xgrammar.apply_token_bitmask_inplace(logits, bitmask) on a copy
                         of the logits (xgrammar masks in place), vocab_size left to its
                         default, backend "auto" (its C++ kernel for CPU tensors)

xgrammar takes torch tensors only: numpy arguments go in as tensors and the result comes
back as numpy; anything else is passed on as it is. It validates nothing here: what
xgrammar accepts or rejects is what is tested.

The logits are handed over as a C-contiguous copy followed by SPARE unused elements.
xgrammar 0.2.8's CPU kernel writes -inf for the clear bits of a row's last word even past
the vocabulary: into the next row's first tokens (which shows, see the registered
divergences) and, after the last row, past the end of the tensor, which corrupted the
heap and aborted the process in a direct test (vocab 40, two rows); the spare elements
take those writes. The bitmask is passed as it is (a numpy one as a tensor sharing its
memory), strides included.

`matcher` (see `conformance/specs/matcher.py`) is `XGrammarBackend` per vocabulary: a
``TokenizerInfo`` of the vocabulary's token bytes (``VocabType.RAW``; special tokens as
empty strings, which xgrammar takes for special tokens and never allows; `EOS_TOKEN` as
the stop token) and a single-threaded ``GrammarCompiler`` without cache. A constraint is
compiled by ``compile_json_schema`` (by default ``any_whitespace=True, strict_mode=False``:
JSON's whitespace and JSON Schema's own rules for unlisted properties and items, the
closest to the contract; MaskBench ran xgrammar's defaults, ``any_whitespace=False,
strict_mode=True``), ``compile_regex`` or ``compile_grammar``; a matcher is a
``GrammarMatcher`` of it, whose ``fill_next_token_bitmask`` (a numpy bitmask as a tensor
sharing its memory), ``accept_token``, ``is_terminated`` and ``rollback`` are the
contract's calls.

The vocabulary is given as bytes because ``TokenizerInfo.from_huggingface`` on a
tokenizer.json alone finds no special tokens and takes ``<|eos|>`` and its kin for text
(allowed inside JSON strings).
The other ops modules and `tokenize` have no counterpart (CONFORMANCE_MISSING).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from .. import contract, matcher_corpus
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    f"{m}.*": "xgrammar is a structured-output library: it has no such op"
    for m in contract.modules()
    if m != "structured"
} | {"tokenize.*": "xgrammar has no tokenizer of its own (it reads HF tokenizers)"}

VERSION: str | None = None


def _xgrammar() -> Any:
    """The xgrammar module, or an ImportError that says what to install."""
    global VERSION
    try:
        from importlib.metadata import version

        import xgrammar
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.xgrammar needs xgrammar and torch: pip install xgrammar"
        ) from exc
    VERSION = f"xgrammar {version('xgrammar')}"
    return xgrammar


SPARE = 64
"""Elements after the last row of the logits copy: room for the kernel's overrun."""


def _tensor(x: Any) -> Any:
    """A numpy array as a tensor (sharing its memory); a tensor or anything else as it is."""
    import torch

    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _padded_copy(x: Any) -> Any:
    """A C-contiguous copy of tensor `x` followed by SPARE unused elements in memory."""
    import torch

    buffer = torch.empty(x.numel() + SPARE, dtype=x.dtype)
    out = buffer[: x.numel()].view(x.shape)
    out.copy_(x)
    return out


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    import torch

    out = _tensor(logits)
    if isinstance(out, torch.Tensor):
        out = _padded_copy(out)
    _xgrammar().apply_token_bitmask_inplace(out, _tensor(bitmask))
    return out.numpy() if isinstance(logits, np.ndarray) else out


# --- matcher --------------------------------------------------------------------------------


class XGrammarBackend:
    """xgrammar's compilers for one vocabulary (`matcher` contract's `TokenBackend`).

    Args:
        vocabulary: one of `matcher_corpus.MATCHER_VOCABULARIES`.
        any_whitespace, strict_mode: ``compile_json_schema``'s options.
    """

    def __init__(
        self, vocabulary: str, *, any_whitespace: bool = True, strict_mode: bool = False
    ) -> None:
        xgrammar = _xgrammar()
        spelled = [token or b"" for token in matcher_corpus.token_bytes(vocabulary)]
        info = xgrammar.TokenizerInfo(
            spelled,
            xgrammar.VocabType.RAW,
            vocab_size=len(spelled),
            stop_token_ids=[matcher_corpus.eos_token_id(vocabulary)],
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.json_options = {"any_whitespace": any_whitespace, "strict_mode": strict_mode}

    def json_schema(self, schema: Any) -> CompiledGrammar:
        text = json.dumps(schema)
        return CompiledGrammar(self.compiler.compile_json_schema(text, **self.json_options))

    def regex(self, pattern: str) -> CompiledGrammar:
        return CompiledGrammar(self.compiler.compile_regex(pattern))

    def grammar(self, gbnf: str) -> CompiledGrammar:
        return CompiledGrammar(self.compiler.compile_grammar(gbnf))


class CompiledGrammar:
    """An xgrammar ``CompiledGrammar``: makes matchers."""

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled

    def matcher(self) -> Matcher:
        return Matcher(_xgrammar().GrammarMatcher(self.compiled))


class Matcher:
    """An xgrammar ``GrammarMatcher`` behind the `matcher` contract's calls."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        self.matcher.fill_next_token_bitmask(_tensor(bitmask), index)

    def accept_token(self, token_id: int) -> bool:
        return self.matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.matcher.rollback(num_tokens)


@functools.cache
def _backend(vocabulary: str) -> XGrammarBackend:
    return XGrammarBackend(vocabulary)


def json_schema(schema: Any, vocabulary: str) -> CompiledGrammar:
    return _backend(vocabulary).json_schema(schema)


def regex(pattern: str, vocabulary: str) -> CompiledGrammar:
    return _backend(vocabulary).regex(pattern)


def grammar(gbnf: str, vocabulary: str) -> CompiledGrammar:
    return _backend(vocabulary).grammar(gbnf)


# `xgrammar.structured` and `xgrammar.matcher`: the functions above, named like the
# reference's op and the matcher spec's compilers.
__getattr__ = lazy_namespaces(__name__, globals(), ("structured", "matcher"), _xgrammar)
