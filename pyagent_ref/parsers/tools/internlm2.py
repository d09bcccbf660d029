"""InternLM2 / InternLM2.5: a JSON call between ``<|action_start|><|plugin|>`` and
``<|action_end|>``.

The call object names its arguments ``parameters``::

    I will look it up.<|action_start|><|plugin|>
    {"name": "get_weather", "parameters": {"city": "Paris"}}<|action_end|>

gives the content ``"I will look it up."`` and one call with arguments
``{"city": "Paris"}``. (``arguments`` is accepted too.) The markers are special tokens:
decode with ``skip_special_tokens=False``.
"""

from __future__ import annotations

from .base import Group, ToolParser, marked_json_call


class InternLM2ToolParser(ToolParser):
    name = "internlm2"
    start_markers = ("<|action_start|><|plugin|>",)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        return marked_json_call(text, after, "<|action_end|>", final, ("parameters", "arguments"))
