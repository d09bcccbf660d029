"""Hermes (NousResearch Hermes 2/3, Qwen 2.5, Qwen 3): JSON between ``<tool_call>`` tags.

The model writes each call as a JSON object ``{"name": ..., "arguments": {...}}`` between
``<tool_call>`` and ``</tool_call>``, one pair per call, with any text around them::

    Let me check both cities.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Tokyo"}}
    </tool_call>

gives the content ``"Let me check both cities.\\n"`` and two calls whose arguments are
``{"city": "Paris"}`` and ``{"city": "Tokyo"}``, each as the model wrote it.
"""

from __future__ import annotations

from .base import Group, ToolParser, marked_json_call


class HermesToolParser(ToolParser):
    name = "hermes"
    start_markers = ("<tool_call>",)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        return marked_json_call(text, after, "</tool_call>", final)
