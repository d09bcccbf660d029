"""The Hugging Face `tokenizers` library behind the `tokenize` spec's API (see
`conformance/specs/tokenize.py`).

    python -m conformance conformance.adapters.hf_tokenizers tokenize

``tokenize.embedded()`` and ``tokenize.llama3()`` (built on first access, which imports
tokenizers) load the vocabulary's tokenizer.json with ``Tokenizer.from_file`` and map
the spec's calls onto the library's:

    encode(text, allowed_special=..., disallowed_special=...)
        Tokenizer.encode(text, add_special_tokens=False).ids. The library has no per-call
        special sets: it matches every special token (allowed_special "all", or a set of
        all of them) or, with Tokenizer.encode_special_tokens = True, none (an empty
        set); any other set raises NotImplementedError. disallowed_special is ignored:
        the library has no such check.
    decode(ids)
        Tokenizer.decode(ids, skip_special_tokens=False).

``cl100k_base`` is published as tiktoken ranks, which the library does not read (the
ops modules have no counterpart either): both are declared in CONFORMANCE_MISSING.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from .. import bpe_corpus, contract
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    "tokenize.cl100k_base": (
        "tokenizers reads tokenizer.json, and cl100k_base is published as tiktoken ranks "
        "without a merge list"
    ),
    **{f"{m}.*": "tokenizers is a tokenizer library: it has no ops" for m in contract.modules()},
}

VERSION: str | None = None


def _tokenizers() -> Any:
    """The tokenizers module, or an ImportError that says what to install."""
    global VERSION
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.hf_tokenizers needs tokenizers: pip install tokenizers"
        ) from exc
    VERSION = f"tokenizers {tokenizers.__version__}"
    return tokenizers


class Encoding:
    """A tokenizer.json loaded twice: matching special tokens, and with special tokens
    encoded as text (``encode_special_tokens``)."""

    def __init__(self, vocabulary: str) -> None:
        path = str(bpe_corpus.tokenizer_json(vocabulary))
        self.matching = _tokenizers().Tokenizer.from_file(path)
        self.as_text = _tokenizers().Tokenizer.from_file(path)
        self.as_text.encode_special_tokens = True
        added = self.matching.get_added_tokens_decoder().values()
        self.special_tokens = frozenset(token.content for token in added if token.special)

    def encode(
        self,
        text: str,
        *,
        allowed_special: AbstractSet[str] | str,
        disallowed_special: AbstractSet[str] | str,
    ) -> list[int]:
        allowed = self.special_tokens if allowed_special == "all" else set(allowed_special)
        if allowed == self.special_tokens:
            tokenizer = self.matching
        elif not allowed:
            tokenizer = self.as_text
        else:
            raise NotImplementedError(
                "tokenizers matches every special token or none (encode_special_tokens)"
            )
        return tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.matching.decode(ids, skip_special_tokens=False)


@functools.cache
def embedded() -> Encoding:
    return Encoding("embedded")


@functools.cache
def llama3() -> Encoding:
    return Encoding("llama3")


# `hf_tokenizers.tokenize`: the loaders above, named like the spec's vocabularies.
__getattr__ = lazy_namespaces(__name__, globals(), ("tokenize",), _tokenizers)
