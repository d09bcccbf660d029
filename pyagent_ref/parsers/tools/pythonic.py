"""Pythonic tool calls (Llama 3.2's pythonic template, Llama 4): a Python list of calls.

The answer is a Python list of function calls with keyword arguments whose values are
literals, possibly between ``<|python_start|>`` and ``<|python_end|>``::

    [get_weather(city="Paris", unit="celsius"), get_time()]
    <|python_start|>[get_weather(city="Paris")]<|python_end|>

gives two calls with arguments ``{"city": "Paris", "unit": "celsius"}`` and ``{}``. The
list is read with `ast` and each value with `ast.literal_eval` (strings, numbers,
``True``/``False``/``None``, lists, tuples, dicts): nothing is ever executed. Positional
arguments, names and expressions make the text content. Only an answer that starts with
``[`` (after whitespace), or the text after ``<|python_start|>``, is read as calls.

Streaming sends a keyword argument once the comma after it (or the closing parenthesis)
has arrived; the arguments are ``json.dumps`` of the values, key by key.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

from .._scan import Malformed, held_back, skip_ws
from .base import Group, PartialCall, ToolParser

_TOKEN = re.compile(r"""'''|\"\"\"|'|"|[\[\](){},]""")
_STRING_REST = {
    "'''": re.compile(r"(?:[^\\]|\\.)*?'''", re.S),
    '"""': re.compile(r'(?:[^\\]|\\.)*?"""', re.S),
    "'": re.compile(r"(?:[^'\\\n]|\\.)*'", re.S),
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"', re.S),
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_END = "<|python_end|>"
_PARSE_ERRORS = (SyntaxError, ValueError, TypeError, MemoryError, RecursionError)


@dataclass
class _Element:
    start: int  # where the element's text starts (after "[" or ",")
    paren: int | None = None  # its "("
    commas: list[int] = field(default_factory=list)  # the commas between its arguments
    close: int | None = None  # its ")"


def _scan(text: str, i: int) -> tuple[list[_Element], int | None]:
    """The elements of the list that opens at ``text[i]``, and the index after its "]"."""
    elements: list[_Element] = []
    depth, pos = 0, i
    while m := _TOKEN.search(text, pos):
        token, pos = m.group(), m.end()
        if token[0] in "'\"":
            rest = _STRING_REST[token].match(text, pos)
            if rest is None:
                return elements, None  # an open string runs to the end of the text
            pos = rest.end()
        elif token in "([{":
            depth += 1
            if depth == 1:
                elements.append(_Element(pos))
            elif depth == 2:
                if token != "(" or elements[-1].paren is not None:
                    raise Malformed("a list element that is not a call")
                elements[-1].paren = m.start()
        elif token in ")]}":
            depth -= 1
            if depth == 0:
                return elements, pos
            if depth == 1:
                elements[-1].close = m.start()
        elif depth == 1:
            elements.append(_Element(pos))
        elif depth == 2:
            elements[-1].commas.append(m.start())
    return elements, None


def _keywords(source: str) -> dict:
    """The keyword values of the call ``source`` (`Malformed` if it is not one)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            raise Malformed("not a call with keyword arguments only")
        values = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise Malformed("**kwargs in a call")
            values[keyword.arg] = ast.literal_eval(keyword.value)
        return values
    except _PARSE_ERRORS as exc:
        raise Malformed(f"not a literal call: {exc}") from None


def _members(values: dict) -> list[str]:
    try:
        return [
            f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False, allow_nan=False)}"
            for k, v in values.items()
        ]
    except (TypeError, ValueError) as exc:
        raise Malformed(f"a value JSON cannot hold: {exc}") from None


class PythonicToolParser(ToolParser):
    name = "pythonic"
    start_markers = ("<|python_start|>",)

    def find_start(self, text: str, pos: int) -> tuple[int, int] | None:
        if pos == 0 and (i := skip_ws(text, 0)) < len(text) and text[i] == "[":
            return i, i
        return super().find_start(text, pos)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        i = skip_ws(text, after)
        if i == len(text):
            if final:
                raise Malformed("nothing after the marker")
            return Group([], None)
        if text[i] != "[":
            raise Malformed("expected a list of calls")
        elements, end = _scan(text, i)
        calls = []
        for k, element in enumerate(elements):
            if element.paren is None:  # the name is still arriving
                head = text[element.start : len(text) if end is None else end - 1].strip()
                if not head and end is not None and 0 < k == len(elements) - 1:
                    continue  # a trailing comma: [f(), ]
                if (head and not _NAME.fullmatch(head)) or k < len(elements) - 1 or end:
                    raise Malformed("a list element that is not a call")
                calls.append(PartialCall(element.start, None, ""))
                continue
            name = text[element.start : element.paren].strip()
            if not _NAME.fullmatch(name):
                raise Malformed(f"not a function name: {name!r}")
            if element.close is not None:
                values = _keywords(text[element.start : element.close + 1])
                arguments = "{" + ", ".join(_members(values)) + "}"
            else:
                done = text[element.paren + 1 : element.commas[-1]] if element.commas else ""
                values = _keywords(f"{name}({done})")
                arguments = "{" + ", ".join(_members(values))
            calls.append(PartialCall(element.start, name, arguments))
        if end is None:
            return Group(calls, None)
        try:
            body = ast.parse(text[i:end], mode="eval").body
        except _PARSE_ERRORS:
            raise Malformed("not a Python list") from None
        if not isinstance(body, ast.List) or not body.elts:
            raise Malformed("not a non-empty list of calls")
        if not all(isinstance(e, ast.Call) for e in body.elts) or len(body.elts) != len(calls):
            raise Malformed("a list element that is not a call")
        j = skip_ws(text, end)
        if text.startswith(_END, j):  # Llama 4 closes the list with <|python_end|>
            return Group(calls, j + len(_END))
        if not final and j < len(text) and held_back(text[j:], (_END,)) == len(text) - j:
            return Group(calls, None)
        return Group(calls, end)
