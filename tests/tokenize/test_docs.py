"""The worked examples of docs/tokenize.md run against the code."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tokenize.md"


def test_tokenize_page_examples_run():
    pytest.importorskip("tiktoken")
    result = doctest.testfile(str(PAGE), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
