"""IBM Granite 3.x: a JSON array of calls after ``<|tool_call|>``.

::

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}},
                  {"name": "get_time", "arguments": {"zone": "CET"}}]

gives two calls and no content. Text before the marker is content; the array ends at its
closing bracket, and text after it is content too.
"""

from __future__ import annotations

from .base import Group, ToolParser, json_call_list


class GraniteToolParser(ToolParser):
    name = "granite"
    start_markers = ("<|tool_call|>",)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        return json_call_list(text, after, final)
