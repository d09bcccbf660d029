"""Tool calls the server forces (``tool_choice`` "required" or a named function).

With a forced ``tool_choice`` the model's own call format does not matter: the server
constrains the output by a JSON Schema (structured outputs) and reads it back with one of
these parsers, which share `base.ToolParser`'s streaming machinery.

* ``"required"``: the output is a JSON array of one or more calls, each
  ``{"name": <one of the tools>, "parameters": <that tool's arguments>}``
  (`required_calls_schema`; at most one call when parallel calls are off), read by
  `RequiredToolParser`.
* ``{"type": "function", "function": {"name": F}}``: the whole output is F's arguments
  object (`named_call_schema`), read by `NamedToolParser` as one call of F.
"""

from __future__ import annotations

from typing import Any

from .base import Group, Parsed, PartialCall, ToolParser, json_call_list

__all__ = ["NamedToolParser", "RequiredToolParser", "named_call_schema", "required_calls_schema"]


def required_calls_schema(tool_schemas: dict[str, dict[str, Any]], parallel: bool) -> dict:
    """The JSON Schema of a non-empty array of calls of these tools (name -> parameters)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "parameters": parameters or {"type": "object"}},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, parameters in tool_schemas.items()
    ]
    schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def named_call_schema(tool_schemas: dict[str, dict[str, Any]], name: str) -> dict:
    """The JSON Schema of the arguments of the tool ``name`` (ValueError if there is none)."""
    if name not in tool_schemas:
        raise ValueError(
            f"tool_choice names function {name!r}, which is not among the tools "
            f"{sorted(tool_schemas)}"
        )
    return tool_schemas[name] or {"type": "object"}


class RequiredToolParser(ToolParser):
    """Reads the JSON array of `required_calls_schema` as tool calls."""

    name = "required"

    def find_start(self, text: str, pos: int) -> tuple[int, int] | None:
        return (0, 0) if pos == 0 else None

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        return json_call_list(text, after, final)


class NamedToolParser(ToolParser):
    """Reads the whole text as the arguments of one call of ``function``."""

    name = "named"

    def __init__(self, tools, function: str, **kwargs) -> None:
        super().__init__(tools, **kwargs)
        self.function = function

    def parse(self, text: str, final: bool) -> Parsed:
        return Parsed("", [PartialCall(0, self.function, text)])
