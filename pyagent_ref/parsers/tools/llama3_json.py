"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole answer is one or more call objects.

The model answers with ``{"name": ..., "parameters": {...}}`` (``arguments`` is accepted
too), possibly after ``<|python_tag|>``, several separated by ``;``::

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}
    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

Only an answer that *starts* with ``{`` (after whitespace), or the text after a
``<|python_tag|>``, is read as calls; anything that is not a call object stays content (an
answer that is JSON for the user, say). Text after the last call is content.
"""

from __future__ import annotations

from .._scan import Malformed, json_call, skip_ws
from .base import Group, PartialCall, ToolParser


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    start_markers = ("<|python_tag|>",)

    def find_start(self, text: str, pos: int) -> tuple[int, int] | None:
        if pos == 0 and (i := skip_ws(text, 0)) < len(text) and text[i] == "{":
            return i, i
        return super().find_start(text, pos)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        calls: list[PartialCall] = []
        j = skip_ws(text, after)
        while True:
            if j == len(text):
                if final and not calls:
                    raise Malformed("no call after the marker")
                return Group(calls, len(text) if final else None)
            name, arguments, end = json_call(text, j)
            calls.append(PartialCall(j, name, arguments))
            if end is None:
                return Group(calls, None)
            k = skip_ws(text, end)
            if k == len(text) and not final:
                return Group(calls, None)  # a ";" and another call may follow
            if not text.startswith(";", k):
                return Group(calls, end)  # the rest is content
            j = skip_ws(text, k + 1)
