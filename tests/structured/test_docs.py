"""The sessions of docs/structured.md run against the code."""

from __future__ import annotations

import doctest
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "structured.md"


def test_structured_page_examples_run():
    result = doctest.testfile(str(PAGE), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
