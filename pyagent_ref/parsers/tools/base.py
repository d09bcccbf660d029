"""The machinery every tool-call parser shares: one parse function, two ways to use it.

A format only writes ``parse(text, final)``: the content and the calls of ``text``, where
``final`` says whether the text is complete. Most formats do not even write that: they say
where a group of calls starts (``start_markers``) and write ``parse_group``, which reads
the calls after a marker; `ToolParser.parse` does the rest (content between groups, markers
cut in half at the end of the text, whitespace around calls).

* `ToolParser.extract(text)` (non-streaming) is ``parse(text, final=True)``.
* `ToolParser.stream(delta)` (streaming) appends ``delta`` to the text seen so far,
  parses all of it again with ``final=False`` and emits what is new since the last delta:
  the new end of the content, a call's id and name the first time its name is known, and
  the new end of its arguments. `ToolParser.finish()` does the same with ``final=True``.

This is correct because ``parse(text, final=False)`` is *monotone*: for any text, what it
reports (the content, a call's name, a call's arguments so far) is a prefix of what it
reports for any longer text. So the deltas never need to take anything back, and when the
text is well formed their concatenation is exactly ``extract(text)``. Where the text goes
wrong after a call has started (a call cut off by ``max_tokens``, or broken after its name),
``extract`` returns that call's text as content, while the stream has already sent the call's
first part; the stream then sends the text as content too, so the content still agrees and
only the abandoned call is extra. A parser never raises on model text.

Content rules, the same for every format: the content is the text outside the calls,
verbatim, except that when there is at least one call, text that is only whitespace
(between two calls, or around them) is dropped. While streaming, a tail that may be the
start of a marker (``"<tool_"``) or that is only whitespace is held back until the next
delta settles it.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._scan import Malformed, held_back, json_call, skip_ws
from .._types import DeltaMessage, DeltaToolCall, ExtractedToolCalls, Reparser, ToolCall

__all__ = [
    "Group",
    "Parsed",
    "PartialCall",
    "ToolParser",
    "check_tools",
    "json_call_list",
    "marked_json_call",
]

_ALNUM = string.ascii_letters + string.digits


@dataclass
class PartialCall:
    """A call as far as the text shows it.

    Attributes:
        key: where the call starts in the text; it identifies the call across re-parses.
        name: the function's name, None until the whole name is known.
        arguments: the arguments' JSON text so far, always a prefix of the final one.
        id: the call's id when the format writes one (Mistral's ``[CALL_ID]``), else None.
    """

    key: int
    name: str | None
    arguments: str
    id: str | None = None


@dataclass
class Group:
    """The calls read after one start marker.

    Attributes:
        calls: the calls, complete or (at the end of the text) in progress.
        end: the index just after the group, or None while the group runs to the end of
            the text (a call still open). With ``final=True`` a group that is still open is
            truncated, and its text becomes content.
    """

    calls: list[PartialCall]
    end: int | None


@dataclass
class Parsed:
    """What ``parse`` reports: the content so far and the calls so far."""

    content: str
    calls: list[PartialCall] = field(default_factory=list)


def check_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """The ``parameters`` JSON schema of each tool, by function name.

    ``tools`` is None or the request's ``tools``: a list of
    ``{"type": "function", "function": {"name": str, "parameters": {...}}}``.

    Raises:
        TypeError: ``tools`` is not a list of dicts, or a tool's ``function`` is not a dict
            or its ``parameters`` not a dict (the message names ``tools[i]``).
        ValueError: a tool without a ``function`` or without a string ``name``.
    """
    if tools is None:
        return {}
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise TypeError(f"tools must be a list of dicts or None, got {type(tools).__name__}")
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TypeError(f"tools[{i}] must be a dict, got {type(tool).__name__}: {tool!r}")
        function = tool.get("function")
        if function is None:
            raise ValueError(f"tools[{i}] has no 'function' key; its keys are {list(tool)}")
        if not isinstance(function, Mapping):
            raise TypeError(f"tools[{i}]['function'] must be a dict, got {function!r}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"tools[{i}]['function']['name'] must be a non-empty str, got {name!r}"
            )
        parameters = function.get("parameters")
        parameters = {} if parameters is None else parameters
        if not isinstance(parameters, Mapping):
            raise TypeError(
                f"tools[{i}]['function']['parameters'] must be a dict, got {parameters!r}"
            )
        schemas[name] = dict(parameters)
    return schemas


@dataclass
class _Sent:
    index: int
    name: str
    arguments: str


class ToolParser(Reparser):
    """Turns a model's text into content and OpenAI tool calls (see the module docstring).

    One instance serves one request: `stream` keeps the text seen so far. `extract` does not
    touch that state.

    Args:
        tools: the request's ``tools`` (see `check_tools`); formats whose values are typed
            by the tool's schema (qwen3 xml) use them, the others ignore them.
        seed: makes the generated call ids reproducible (a `random.Random` seeded with it).
        id_factory: a function returning the next call id; overrides ``seed``.

    Raises:
        TypeError, ValueError: ``tools`` of the wrong shape (see `check_tools`), a
            ``seed`` that is not an int, or an ``id_factory`` that is not callable.
    """

    name: ClassVar[str] = ""
    #: Where a group of calls starts (a format may also override `find_start`).
    start_markers: ClassVar[tuple[str, ...]] = ()
    #: Markers dropped from the content (DeepSeek's outer ``<｜tool▁calls▁begin｜>``).
    silent_markers: ClassVar[tuple[str, ...]] = ()
    #: Call ids: ``id_prefix`` then ``id_length`` random letters and digits.
    id_prefix: ClassVar[str] = "call_"
    id_length: ClassVar[int] = 24

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        seed: int | None = None,
        id_factory: Callable[[], str] | None = None,
    ):
        self.tool_schemas = check_tools(tools)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        if id_factory is not None and not callable(id_factory):
            raise TypeError(f"id_factory must be callable, got {id_factory!r}")
        self._rng = random.Random(seed) if seed is not None else random.SystemRandom()
        self._id_factory = id_factory
        self._text = ""
        self._sent_content = ""
        self._sent: dict[int, _Sent] = {}

    # -- what a format writes --------------------------------------------------------

    def find_start(self, text: str, pos: int) -> tuple[int, int] | None:
        """``(start, after)`` of the first start marker at or after ``pos``, or None."""
        found = None
        for marker in self.start_markers:
            i = text.find(marker, pos)
            if i >= 0 and (found is None or i < found[0]):
                found = (i, i + len(marker))
        return found

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        """Read the calls of the group whose marker is ``text[start:after]``.

        Raise `Malformed` when the text after the marker cannot be a group: the marker
        then stays content, and scanning goes on after it.
        """
        raise NotImplementedError

    def parse(self, text: str, final: bool) -> Parsed:
        """The content and the calls of ``text`` (monotone when ``final`` is False)."""
        pieces: list[str | PartialCall] = []
        pos = 0
        open_group = False
        while (found := self.find_start(text, pos)) is not None:
            start, after = found
            try:
                group = self.parse_group(text, start, after, final)
            except Malformed:  # the marker is content; go on after it
                end = max(after, start + 1)
                pieces.append(text[pos:end])
                pos = end
                continue
            if group.end is None:
                if final:  # truncated: the rest of the text is content
                    break
                pieces.append(text[pos:start])
                pieces.extend(group.calls)
                pos, open_group = len(text), True
                break
            pieces.append(text[pos:start])
            pieces.extend(group.calls)
            pos = max(group.end, after)
        tail = text[pos:]
        if not final and not open_group:
            tail = tail[: len(tail) - held_back(tail, self.start_markers + self.silent_markers)]
        pieces.append(tail)
        return self._assemble(pieces, final, open_group)

    def _assemble(self, pieces: list[str | PartialCall], final: bool, open_group: bool) -> Parsed:
        """Join the text pieces into the content (see the module docstring's rules)."""
        calls = [p for p in pieces if isinstance(p, PartialCall)]
        has_calls = bool(calls) or open_group
        texts: list[str] = []
        last_was_text = False
        for piece in pieces:
            if isinstance(piece, str):
                if last_was_text:
                    texts[-1] += piece
                else:
                    texts.append(piece)
                last_was_text = True
            else:
                last_was_text = False
        content = []
        silent = (
            re.compile("|".join(map(re.escape, self.silent_markers)))
            if self.silent_markers
            else None
        )
        for i, piece in enumerate(texts):
            if silent is not None:  # one pass: a removal must not make a new marker
                piece = silent.sub("", piece)
            blank = piece.strip() == ""
            if blank and (has_calls or (not final and i == len(texts) - 1)):
                continue
            content.append(piece)
        return Parsed("".join(content), calls)

    # -- the two ways to use it ------------------------------------------------------

    def new_id(self) -> str:
        """The next call id (from ``id_factory`` if given)."""
        if self._id_factory is not None:
            return str(self._id_factory())
        return self.id_prefix + "".join(self._rng.choice(_ALNUM) for _ in range(self.id_length))

    def extract(self, text: str) -> ExtractedToolCalls:
        """Content and tool calls of a complete text. Never raises on model text."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        parsed = self.parse(text, final=True)
        calls = [
            ToolCall(call.id or self.new_id(), call.name, call.arguments)
            for call in parsed.calls
            if call.name is not None
        ]
        return ExtractedToolCalls(parsed.content or None, calls)

    def _emit(self, parsed: Parsed) -> DeltaMessage | None:
        out = DeltaMessage()
        if parsed.content.startswith(self._sent_content) and parsed.content != self._sent_content:
            out.content = parsed.content[len(self._sent_content) :]
            self._sent_content = parsed.content
        for call in parsed.calls:
            if call.name is None:
                continue
            sent = self._sent.get(call.key)
            if sent is None:
                sent = self._sent[call.key] = _Sent(len(self._sent), call.name, "")
                new_id = call.id or self.new_id()
                out.tool_calls.append(DeltaToolCall(sent.index, new_id, call.name, ""))
            if sent.name != call.name or not call.arguments.startswith(sent.arguments):
                continue  # cannot happen for a monotone parse; never take anything back
            fragment = call.arguments[len(sent.arguments) :]
            if fragment:
                sent.arguments = call.arguments
                if out.tool_calls and out.tool_calls[-1].index == sent.index:
                    out.tool_calls[-1].arguments = fragment
                else:
                    out.tool_calls.append(DeltaToolCall(sent.index, arguments=fragment))
        return out if out else None


def marked_json_call(
    text: str,
    after: int,
    end_marker: str,
    final: bool,
    args_keys: tuple[str, ...] = ("arguments", "parameters"),
) -> Group:
    """The group of a format that writes one JSON call object between two markers
    (hermes' ``<tool_call>...</tool_call>``), starting at ``text[after]``.

    Whitespace around the object is allowed. A missing end marker at the end of a complete
    text is forgiven when the object itself is complete (the end marker may be a special
    token that the detokenizer dropped).
    """
    close = text.find(end_marker, after)
    if close >= 0:
        stop = close
    else:  # the text may end in the first characters of the end marker
        stop = len(text) - held_back(text[after:], (end_marker,))
    body = text[:stop]
    i = skip_ws(body, after)
    if i == len(body):
        if close >= 0 or final:
            raise Malformed("no call between the markers")
        return Group([], None)
    name, arguments, end = json_call(body, i, args_keys)
    if end is not None and skip_ws(body, end) != len(body):
        raise Malformed("text after the call object")
    call = PartialCall(after, name, arguments)
    if close >= 0:
        if end is None:
            raise Malformed("the end marker came inside the call object")
        return Group([call], close + len(end_marker))
    if final and end is not None and stop == len(text):
        return Group([call], len(text))
    return Group([call], None)


def json_call_list(text: str, after: int, final: bool) -> Group:
    """The group of a format that writes a JSON array of call objects after its marker
    (granite's ``<|tool_call|>[...]``, Mistral's ``[TOOL_CALLS][...]``); the group ends
    at the closing bracket."""
    j = skip_ws(text, after)
    if j == len(text):
        if final:
            raise Malformed("nothing after the marker")
        return Group([], None)
    if text[j] != "[":
        raise Malformed("expected a JSON array of calls")
    calls: list[PartialCall] = []
    j = skip_ws(text, j + 1)
    if text.startswith("]", j):
        raise Malformed("an empty list of calls")
    while j < len(text):
        name, arguments, end = json_call(text, j)
        calls.append(PartialCall(j, name, arguments))
        if end is None:
            break
        j = skip_ws(text, end)
        if j == len(text):
            break
        if text[j] == "]":
            return Group(calls, j + 1)
        if text[j] != ",":
            raise Malformed("expected ',' or ']' after a call")
        j = skip_ws(text, j + 1)
    return Group(calls, None)
