"""Tool-call parsers: a model's text in, OpenAI ``tool_calls`` out, streaming or not.

Each format is one module with one class; all share the machinery of `base.ToolParser`
(``extract`` for a whole text, ``stream``/``finish`` for deltas). Pick one by the name the
server's ``--tool-call-parser NAME`` gives, or let `detect_tool_parser` find it from the
model's chat template:

    >>> from pyagent_ref.parsers.tools import get_tool_parser
    >>> parser = get_tool_parser("hermes")(seed=0)
    >>> out = parser.extract('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    >>> out.tool_calls[0].name, out.tool_calls[0].arguments
    ('f', '{"x": 1}')
"""

from __future__ import annotations

from .._types import find_parser
from .base import ToolParser, check_tools
from .deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from .gpt_oss import GptOssToolParser
from .granite import GraniteToolParser
from .hermes import HermesToolParser
from .internlm2 import InternLM2ToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser
from .pythonic import PythonicToolParser
from .qwen3_xml import Qwen3XmlToolParser

__all__ = [
    "TOOL_PARSERS",
    "TOOL_PARSER_ALIASES",
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "GptOssToolParser",
    "GraniteToolParser",
    "HermesToolParser",
    "InternLM2ToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "PythonicToolParser",
    "Qwen3XmlToolParser",
    "ToolParser",
    "check_tools",
    "detect_tool_parser",
    "get_tool_parser",
]

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls
    for cls in (
        HermesToolParser,
        Llama3JsonToolParser,
        PythonicToolParser,
        MistralToolParser,
        Qwen3XmlToolParser,
        DeepSeekV3ToolParser,
        DeepSeekV31ToolParser,
        GraniteToolParser,
        InternLM2ToolParser,
        GptOssToolParser,
    )
}
"""Every tool parser, by the name ``--tool-call-parser`` takes."""

TOOL_PARSER_ALIASES = {
    "qwen3_coder": "qwen3_xml",
    "llama4_pythonic": "pythonic",
    "internlm": "internlm2",
    "openai": "gpt_oss",
}
"""Other names for the same parsers (the names vLLM uses, where they differ)."""


def get_tool_parser(name: str) -> type[ToolParser]:
    """The tool parser class called ``name`` (or one of `TOOL_PARSER_ALIASES`).

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: no parser has that name (the message lists the names there are).
    """
    return find_parser("tool", TOOL_PARSERS, TOOL_PARSER_ALIASES, name)


# (what the template contains, the parser), most specific first.
_TEMPLATE_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>",), "gpt_oss"),
    (("<｜tool▁call▁begin｜>", "```json"), "deepseek_v3"),
    (("<｜tool▁call▁begin｜>",), "deepseek_v31"),
    (("<function=", "<parameter="), "qwen3_xml"),
    (("<tool_call>",), "hermes"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|tool_call|>",), "granite"),
    (("<|action_start|>",), "internlm2"),
    (("<|python_start|>",), "pythonic"),
    (("[func_name1(",), "pythonic"),
    (("<|python_tag|>",), "llama3_json"),
    (('"parameters": dictionary of argument name',), "llama3_json"),
)


def detect_tool_parser(chat_template: str) -> str | None:
    """The tool parser for a model, from the markers its chat template writes.

    A template that renders tool calls writes the same markers the model generates
    (``<tool_call>``, ``[TOOL_CALLS]``, ``<｜tool▁call▁begin｜>``, ...), so the template
    tells the format. Returns None when no known marker is there.

    Raises:
        TypeError: ``chat_template`` is not a str.
    """
    if not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be a str, got {type(chat_template).__name__}")
    for markers, name in _TEMPLATE_MARKERS:
        if all(marker in chat_template for marker in markers):
            return name
    return None
