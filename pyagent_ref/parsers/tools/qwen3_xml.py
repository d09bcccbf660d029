"""Qwen3-Coder XML tool calls: a function element with one element per parameter.

::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

gives one call with arguments ``{"city": "Paris", "days": 3}`` when the request's tools say
``days`` is an integer. Values are raw text (one newline after ``<parameter=...>`` and one
before ``</parameter>`` are dropped), typed by the parameter's JSON schema: ``string`` keeps
the text; ``integer``, ``number``, ``boolean`` and ``null`` convert it when it is such a
literal; ``object`` and ``array`` read it as JSON (or a Python literal). A parameter the
schema does not type, or every parameter when no tools are given, stays a string.

Streaming sends each parameter once its ``</parameter>`` has arrived.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from .._scan import Malformed, expect, held_back, skip_ws
from .base import Group, PartialCall, ToolParser

_NAME = re.compile(r"[^>\n<]*")
_INTEGER = re.compile(r"-?\d+")


def _typed(value: str, schema: Any) -> Any:
    """``value`` converted to the JSON type ``schema`` asks for, else unchanged."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):  # ["integer", "null"]: the first that fits
        for k in kind:
            if k == "string":
                return value
            if (typed := _typed(value, {"type": k})) is not value:
                return typed
        return value
    text = value.strip()
    if kind == "integer" and _INTEGER.fullmatch(text):
        return int(text)
    if kind == "number":
        if _INTEGER.fullmatch(text):
            return int(text)
        try:
            number = float(text)
        except ValueError:
            return value
        return number if number == number and abs(number) != float("inf") else value
    if kind == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if kind == "null" and text in ("null", "None"):
        return None
    if kind in ("object", "array"):
        wanted = dict if kind == "object" else list
        for read in (json.loads, ast.literal_eval):
            try:
                parsed = read(text)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(parsed, wanted):
                return parsed
    return value


def _json(typed: Any, value: str) -> str:
    try:
        return json.dumps(typed, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):  # a Python literal JSON cannot hold: keep the text
        return json.dumps(value, ensure_ascii=False)


class Qwen3XmlToolParser(ToolParser):
    name = "qwen3_xml"
    start_markers = ("<tool_call>",)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        close = text.find("</tool_call>", after)
        stop = close if close >= 0 else len(text) - held_back(text[after:], ("</tool_call>",))
        body = text[:stop]
        j = expect(body, skip_ws(body, after), "<function=")
        if j is None:
            return self._open(close, final, [])
        name_end = _NAME.match(body, j).end()
        if name_end == len(body):
            return self._open(close, final, [])
        name = body[j:name_end]
        if not name.strip() or body[name_end] != ">":
            raise Malformed("expected <function=name>")
        schema = self.tool_schemas.get(name, {}).get("properties")
        schema = schema if isinstance(schema, dict) else {}
        members: list[str] = []
        j = name_end + 1
        while True:
            j = skip_ws(body, j)
            if body.startswith("</function>", j):
                call = PartialCall(after, name, "{" + ", ".join(members) + "}")
                if skip_ws(body, j + len("</function>")) != len(body):
                    raise Malformed("text after </function>")
                if close >= 0 or final:
                    return Group([call], close + len("</tool_call>") if close >= 0 else len(text))
                return Group([call], None)
            call = PartialCall(after, name, "{" + ", ".join(members))
            if not body.startswith("<parameter=", j):
                if not any(m.startswith(body[j:]) for m in ("<parameter=", "</function>")):
                    raise Malformed("expected <parameter=name> or </function>")
                return self._open(close, final, [call])
            j += len("<parameter=")
            key_end = _NAME.match(body, j).end()
            value_end = body.find("</parameter>", key_end)
            if value_end < 0:
                if key_end < len(body) and body[key_end] != ">":
                    raise Malformed("expected <parameter=name>")
                return self._open(close, final, [call])
            if key_end == j or body[key_end] != ">":
                raise Malformed("expected <parameter=name>")
            value = body[key_end + 1 : value_end]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            key = json.dumps(body[j:key_end], ensure_ascii=False)
            members.append(f"{key}: {_json(_typed(value, schema.get(body[j:key_end])), value)}")
            j = value_end + len("</parameter>")

    @staticmethod
    def _open(close: int, final: bool, calls: list[PartialCall]) -> Group:
        """The text ran out inside the call: in progress, or malformed if it is complete."""
        if close >= 0 or final:
            raise Malformed("the call is not complete")
        return Group(calls, None)
