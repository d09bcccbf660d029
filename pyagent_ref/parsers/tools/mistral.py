"""Mistral: calls after ``[TOOL_CALLS]``, in the format of the tokenizer's version.

Before tokenizer v11 (Mistral 7B v0.3, Mixtral 8x22B, Nemo): one JSON array of calls::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]

From v11 on (Mistral Small 3.1+, Magistral, Devstral): one ``[TOOL_CALLS]`` per call, the
name, then ``[ARGS]`` and the arguments object; v13 may put ``[CALL_ID]`` and the call's id
before ``[ARGS]``::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}
    [TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}

Both give calls with Mistral's 9-character ids (letters and digits; the model's own id where
it wrote one). Text before the first marker is content. The markers are special tokens:
decode with ``skip_special_tokens=False``.
"""

from __future__ import annotations

import re

from .._scan import Malformed, json_call, skip_ws, value_end
from .base import Group, PartialCall, ToolParser, json_call_list

_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


def _cut_short(rest: str, *markers: str) -> bool:
    """Whether ``rest`` is a proper prefix of one of ``markers`` (the text ran out)."""
    return any(len(rest) < len(m) and m.startswith(rest) for m in markers)


class MistralToolParser(ToolParser):
    name = "mistral"
    start_markers = ("[TOOL_CALLS]",)
    id_prefix = ""
    id_length = 9

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        j = skip_ws(text, after)
        if j == len(text) and not final:
            return Group([], None)
        if text.startswith("[", j) and not text.startswith("[ARGS]", j):
            return json_call_list(text, after, final)  # before v11
        if text.startswith("{", j):  # a single object instead of a list
            name, arguments, end = json_call(text, j)
            return Group([PartialCall(after, name, arguments)], end)
        # v11+: name [CALL_ID] id [ARGS] {arguments}
        name_end = _NAME.match(text, after).end()
        name, call_id, j = text[after:name_end], None, name_end
        if _cut_short(text[j:], "[ARGS]", "[CALL_ID]"):
            if final:
                raise Malformed("truncated before [ARGS]")
            return Group([], None)
        if text.startswith("[CALL_ID]", j):
            id_end = _NAME.match(text, j + 9).end()
            if _cut_short(text[id_end:], "[ARGS]"):
                if final:
                    raise Malformed("truncated before [ARGS]")
                return Group([], None)
            call_id, j = text[j + 9 : id_end], id_end
        if not name or not text.startswith("[ARGS]", j):
            raise Malformed("expected a name and [ARGS]")
        j = skip_ws(text, j + len("[ARGS]"))
        if j < len(text) and text[j] != "{":
            raise Malformed("the arguments must be an object")
        end = value_end(text, j)
        arguments = text[j : len(text) if end is None else end]
        return Group([PartialCall(after, name, arguments, call_id or None)], end)
