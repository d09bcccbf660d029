"""Tool-call and reasoning parsers: the model's text, turned into the OpenAI message shape.

* `pyagent_ref.parsers.tools`: ``tool_calls`` out of the text (hermes, llama3_json,
  pythonic, mistral, qwen3_xml, deepseek_v3, deepseek_v31, granite, internlm2, gpt_oss),
  chosen by ``--tool-call-parser NAME`` or detected from the chat template.
* `pyagent_ref.parsers.reasoning`: ``reasoning_content`` out of the text (deepseek_r1,
  deepseek_v3, qwen3, granite, mistral, gpt_oss), chosen by ``--reasoning-parser NAME``.

Every parser works on a whole text (``extract``) and on a stream of text deltas (``stream``
then ``finish``), with one rule that makes both agree: the stream re-parses the text so far
and sends only what is new, and a parse of a prefix never reports anything that a longer
text would contradict. A parser never raises on model text: what it cannot read is content.
When both kinds are used, the reasoning parser goes first and the tool parser reads its
content. See docs/parsers.md.
"""

from __future__ import annotations

import argparse

from ._types import (
    DeltaMessage,
    DeltaToolCall,
    ExtractedReasoning,
    ExtractedToolCalls,
    ToolCall,
)
from .reasoning import REASONING_PARSERS, ReasoningParser, get_reasoning_parser
from .tools import (
    TOOL_PARSER_ALIASES,
    TOOL_PARSERS,
    ToolParser,
    detect_tool_parser,
    get_tool_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "TOOL_PARSER_ALIASES",
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedReasoning",
    "ExtractedToolCalls",
    "ReasoningParser",
    "ToolCall",
    "ToolParser",
    "add_parser_arguments",
    "detect_tool_parser",
    "get_reasoning_parser",
    "get_tool_parser",
]


def add_parser_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--tool-call-parser NAME`` and ``--reasoning-parser NAME`` to a command line."""
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSERS) + sorted(TOOL_PARSER_ALIASES) + ["auto"],
        default=None,
        help="how the model writes tool calls ('auto': detect from the chat template)",
    )
    parser.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSERS) + ["openai"],
        default=None,
        help="how the model marks its reasoning",
    )
