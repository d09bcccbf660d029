"""The examples of docs/parsers.md run against the code."""

from __future__ import annotations

import doctest
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "parsers.md"


def test_parsers_page_examples_run():
    result = doctest.testfile(str(PAGE), module_relative=False)
    assert result.attempted > 0 and result.failed == 0


def test_module_examples_run():
    import pyagent_ref.parsers.reasoning as reasoning
    import pyagent_ref.parsers.tools as tools

    for module in (tools, reasoning):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
