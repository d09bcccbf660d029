"""Reasoning parsers: a model's text in, ``reasoning_content`` and ``content`` out.

Pick one by the name the server's ``--reasoning-parser NAME`` gives:

    >>> from pyagent_ref.parsers.reasoning import get_reasoning_parser
    >>> parser = get_reasoning_parser("deepseek_r1")()
    >>> parser.extract("<think>Easy.</think>Hello!")
    ExtractedReasoning(reasoning='Easy.', content='Hello!')
"""

from __future__ import annotations

from .._types import find_parser
from .base import ReasoningParser
from .gpt_oss import GptOssReasoningParser
from .tags import (
    DeepSeekR1ReasoningParser,
    DeepSeekV3ReasoningParser,
    GraniteReasoningParser,
    MistralReasoningParser,
    Qwen3ReasoningParser,
    TagReasoningParser,
)

__all__ = [
    "REASONING_PARSERS",
    "DeepSeekR1ReasoningParser",
    "DeepSeekV3ReasoningParser",
    "GptOssReasoningParser",
    "GraniteReasoningParser",
    "MistralReasoningParser",
    "Qwen3ReasoningParser",
    "ReasoningParser",
    "TagReasoningParser",
    "get_reasoning_parser",
]

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    cls.name: cls
    for cls in (
        DeepSeekR1ReasoningParser,
        DeepSeekV3ReasoningParser,
        Qwen3ReasoningParser,
        GraniteReasoningParser,
        MistralReasoningParser,
        GptOssReasoningParser,
    )
}
"""Every reasoning parser, by the name ``--reasoning-parser`` takes."""


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The reasoning parser class called ``name`` (``openai`` is ``gpt_oss``).

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: no parser has that name (the message lists the names there are).
    """
    return find_parser("reasoning", REASONING_PARSERS, {"openai": "gpt_oss"}, name)
