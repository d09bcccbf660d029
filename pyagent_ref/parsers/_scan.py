"""Scanning helpers shared by the parsers: markers, literals and JSON, on text that may
still be growing.

Every helper answers for a *prefix* of the model's text: it reports what is certain so
far, returns None where the text ran out before the answer is known, and raises
`Malformed` only when **no continuation** of the text can make it valid. That last rule
is what lets a streaming parser emit early without ever taking anything back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = [
    "Malformed",
    "expect",
    "held_back",
    "json_call",
    "skip_ws",
    "value_end",
]


class Malformed(Exception):
    """The text can no longer become what the format expects (it stays content)."""


def held_back(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker.

    That suffix must not be emitted as content yet: the next characters may complete the
    marker (``"Hello <tool_"`` holds back ``"<tool_"``).
    """
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


_WS = re.compile(r"[ \t\n\r]*")


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i``."""
    return _WS.match(text, i).end()


def expect(text: str, i: int, literal: str) -> int | None:
    """Index after ``literal`` if ``text[i:]`` starts with it; None if ``text`` ends while
    still agreeing with it; `Malformed` otherwise."""
    if text.startswith(literal, i):
        return i + len(literal)
    if literal.startswith(text[i:]):
        return None
    raise Malformed(f"expected {literal!r} at {i}")


# A complete JSON string, or one bracket or quote (the start of an unclosed string).
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|["{}\[\]]', re.S)
_SCALAR = re.compile(r"[^,:\]}\s\[{\"]*")


def _container_end(text: str, i: int) -> int | None:
    stack: list[str] = []
    for m in _TOKEN.finditer(text, i):
        token = m.group()
        if token == '"':  # a string that is not closed yet runs to the end of the text
            return None
        if token[0] == '"':
            continue
        if token in "{[":
            stack.append(token)
        elif not stack or stack.pop() != ("{" if token == "}" else "["):
            raise Malformed(f"unbalanced {token!r} at {m.start()}")
        elif not stack:
            return m.end()
    return None


def value_end(text: str, i: int) -> int | None:
    """End (exclusive) of the JSON value that starts at ``text[i]``.

    Returns None when the text ends before the value does (an open string, object or
    array, or a number or literal that may go on). A value that is complete is checked
    with `json.loads`.

    Raises:
        Malformed: the value is complete and invalid, or its brackets do not match.
    """
    if i >= len(text):
        return None
    first = text[i]
    if first == '"':
        m = _STRING.match(text, i)
        if m is None:
            return None
        end = m.end()
    elif first in "{[":
        end = _container_end(text, i)
        if end is None:
            return None
    else:
        end = _SCALAR.match(text, i).end()
        if end == len(text):
            return None
    try:
        json.loads(text[i:end])
    except (ValueError, RecursionError):  # RecursionError: nested too deep for json
        raise Malformed(f"invalid JSON value at {i}: {text[i:end][:40]!r}") from None
    return end


def json_call(
    text: str, i: int, args_keys: tuple[str, ...] = ("arguments", "parameters")
) -> tuple[str | None, str, int | None]:
    """Scan a call object ``{"name": "f", "arguments": {...}}`` that starts at ``text[i]``.

    The arguments may be under any key of ``args_keys``; they must be an object, a string
    holding the JSON text of one, or null (meaning ``{}``); other keys are ignored.

    Returns:
        ``(name, arguments, end)``: the name once its string is complete (else None); the
        arguments' JSON text so far, a prefix of the final one (the model's own text of
        the object, so it only grows; "" while an argument string or null is incomplete);
        the index after the closing brace, or None while the object is open.

    Raises:
        Malformed: not an object, a complete name that is not a string, arguments of the
            wrong type, or a closed object without a name.
    """
    if text[i] != "{":
        raise Malformed(f"expected an object at {i}")
    members: dict[str, tuple[int, int | None]] = {}
    end = None
    j = skip_ws(text, i + 1)
    if text.startswith("}", j):
        end = j + 1
    while end is None and j < len(text):
        key_end = value_end(text, j) if text[j] == '"' else -1
        if key_end == -1:
            raise Malformed(f"expected a key at {j}")
        if key_end is None:
            break
        key = json.loads(text[j:key_end])
        j = skip_ws(text, key_end)
        if j >= len(text):
            break
        if text[j] != ":":
            raise Malformed(f"expected ':' at {j}")
        j = skip_ws(text, j + 1)
        if j >= len(text):
            members[key] = (j, None)
            break
        vend = value_end(text, j)
        members[key] = (j, vend)
        if vend is None:
            break
        j = skip_ws(text, vend)
        if j < len(text) and text[j] == "}":
            end = j + 1
        elif j < len(text):
            if text[j] != ",":
                raise Malformed(f"expected ',' or '}}' at {j}")
            j = skip_ws(text, j + 1)
    name = None
    if "name" in members and members["name"][1] is not None:
        start, stop = members["name"]
        name = json.loads(text[start:stop])
        if not isinstance(name, str) or not name:
            raise Malformed(f"the name must be a non-empty string, got {name!r}")
    if end is not None and name is None:
        raise Malformed("a call object without a name")
    arguments = "{}" if end is not None else ""
    key = next((k for k in args_keys if k in members), None)
    if key is not None:
        start, stop = members[key]
        if start < len(text) and text[start] == "{":
            arguments = text[start : len(text) if stop is None else stop]
        elif stop is not None:
            value = json.loads(text[start:stop])
            if isinstance(value, str):
                try:
                    parsed = json.loads(value)
                except (ValueError, RecursionError):
                    parsed = None
                if not isinstance(parsed, dict):
                    raise Malformed("string arguments that are not a JSON object")
                arguments = value
            elif value is None:
                arguments = "{}"
            else:
                raise Malformed(f"arguments must be an object, got {value!r}")
        elif start < len(text) and text[start] not in '"n':
            raise Malformed(f"arguments must be an object, at {start}")
        else:
            arguments = ""
    return name, arguments, end
