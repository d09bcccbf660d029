"""Reasoning parsers: a model's text in, ``reasoning_content`` and ``content`` out.

Pick one by the name the server's ``--reasoning-parser NAME`` gives:

    >>> from pyagent_ref.parsers.reasoning import get_reasoning_parser
    >>> parser = get_reasoning_parser("deepseek_r1")()
    >>> parser.extract("<think>Easy.</think>Hello!")
    ExtractedReasoning(reasoning='Easy.', content='Hello!')
"""

from __future__ import annotations

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
    if not isinstance(name, str):
        raise TypeError(f"reasoning parser name must be a str, got {name!r}")
    cls = REASONING_PARSERS.get("gpt_oss" if name == "openai" else name)
    if cls is None:
        raise ValueError(
            f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}"
        )
    return cls
