"""The worked examples in the documentation are run against the code."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(
    "page",
    [
        "kv_cache.md",
        "model.md",
        "spec_decode.md",
        "logits_processors.md",
        "lora.md",
        "pooling.md",
        "operating.md",
        "multimodal.md",
        "quantization.md",
    ],
)
def test_doc_examples_run(page):
    result = doctest.testfile(str(DOCS / page), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
