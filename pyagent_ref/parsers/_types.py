"""What the parsers return: plain dataclasses in the shape of the OpenAI chat API.

Non-streaming, a tool parser returns `ExtractedToolCalls` (``content`` and a list of
`ToolCall`) and a reasoning parser returns `ExtractedReasoning` (``reasoning`` and
``content``). Streaming, both return `DeltaMessage` objects whose `to_openai` is the
``delta`` of one ``chat.completion.chunk``:

    {"content": "Let me check. "}
    {"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\\"city\\": "}}]}
    {"tool_calls": [{"index": 0, "function": {"arguments": "\\"Paris\\"}"}}]}

OpenAI's rules, which `DeltaToolCall.to_openai` follows: ``id``, ``type`` and ``name`` come
once, in the first delta of a call; later deltas of the call carry only its ``index`` and an
``arguments`` fragment; the fragments concatenated are the call's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "DeltaMessage",
    "DeltaToolCall",
    "ExtractedReasoning",
    "ExtractedToolCalls",
    "ToolCall",
]


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made.

    Attributes:
        id: the call's id (``call_`` and 24 letters and digits by default; 9 letters and
            digits for Mistral; the id the model wrote, where the format has one).
        name: the function's name.
        arguments: the arguments, the JSON text of an object (OpenAI sends a string too).
    """

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """``{"id", "type": "function", "function": {"name", "arguments"}}``."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ExtractedToolCalls:
    """The whole of a model's text, split into content and tool calls.

    Attributes:
        content: the text outside the calls, or None when there is none.
        tool_calls: the calls, in the order the model wrote them.
    """

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)


@dataclass
class ExtractedReasoning:
    """The whole of a model's text, split into reasoning and the answer.

    Attributes:
        reasoning: the model's thinking (``reasoning_content`` in the API), or None.
        content: the answer, or None when there is none (the text ended while thinking).
    """

    reasoning: str | None
    content: str | None


@dataclass
class DeltaToolCall:
    """One call's part of a streamed delta.

    ``id`` and ``name`` are set in the call's first delta only; ``arguments`` is the next
    fragment of the arguments ("" in a first delta that has none yet, as OpenAI sends it).
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        if self.arguments is not None:
            function["arguments"] = self.arguments
        if function:
            out["function"] = function
        return out


@dataclass
class DeltaMessage:
    """What one step of streaming adds: content, reasoning and tool-call fragments."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning_content or self.tool_calls)

    def to_openai(self) -> dict[str, Any]:
        """The ``delta`` object of a chat completion chunk (only the keys that are set)."""
        out: dict[str, Any] = {}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.content:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return out


def find_parser(kind: str, parsers: Mapping[str, T], aliases: Mapping[str, str], name: str) -> T:
    """The parser of a registry called ``name`` or one of its ``aliases``.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: no parser has that name (the message lists the names there are).
    """
    if not isinstance(name, str):
        raise TypeError(f"{kind} parser name must be a str, got {name!r}")
    parser = parsers.get(aliases.get(name, name))
    if parser is None:
        known = sorted(parsers) + sorted(aliases)
        raise ValueError(f"unknown {kind} parser {name!r}; known: {', '.join(known)}")
    return parser


class Reparser:
    """Streaming by re-parsing, shared by the tool and the reasoning parsers.

    Each delta re-parses all the text so far (``parse(text, final)``, which must be
    monotone: what it returns for a prefix is a prefix of what it returns for the whole)
    and ``_emit`` sends what is new since the last delta. A subclass sets ``self._text =
    ""`` and defines both; the deltas then concatenate to the non-streaming result.
    """

    _text: str

    def parse(self, text: str, final: bool) -> Any:
        raise NotImplementedError

    def _emit(self, parsed: Any) -> DeltaMessage | None:
        raise NotImplementedError

    def stream(self, delta: str) -> DeltaMessage | None:
        """Feed the next piece of text; the delta to send, or None when there is nothing yet."""
        if not isinstance(delta, str):
            raise TypeError(f"delta must be a str, got {type(delta).__name__}")
        self._text += delta
        return self._emit(self.parse(self._text, final=False))

    def finish(self) -> DeltaMessage | None:
        """The text is complete: the last delta (what was held back), or None."""
        return self._emit(self.parse(self._text, final=True))
