"""DeepSeek V3 and V3.1: calls between full-width special tokens.

DeepSeek V3 (and R1-0528) writes the call type, the name, and the arguments in a JSON
code block::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

DeepSeek V3.1 writes the name and the arguments only (one line, cut in two here)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

Several calls follow each other inside one ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``.
Both give one call per ``<｜tool▁call▁begin｜>``; the outer markers are dropped and the text
before them is content. (The bars are U+FF5C and the word separators U+2581.)
"""

from __future__ import annotations

from .._scan import Malformed, expect, held_back, skip_ws, value_end
from .base import Group, PartialCall, ToolParser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


class DeepSeekV3ToolParser(ToolParser):
    name = "deepseek_v3"
    start_markers = (CALL_BEGIN,)
    silent_markers = (CALLS_BEGIN, CALLS_END)

    def parse_group(self, text: str, start: int, after: int, final: bool) -> Group:
        close = text.find(CALL_END, after)
        stop = close if close >= 0 else len(text) - held_back(text[after:], (CALL_END,))
        body = text[:stop]
        name, j = self.read_name(body, after)
        call = PartialCall(after, name, "")
        if j is not None:
            j = self.before_arguments(body, j)
        if j is not None:
            if j < len(body) and body[j] != "{":
                raise Malformed("the arguments must be an object")
            end = value_end(body, j)
            call.arguments = body[j : len(body) if end is None else end]
            if end is not None and self.after_arguments(body, end) is None:
                end = None
        else:
            end = None
        if end is not None and (close >= 0 or final):
            return Group([call], close + len(CALL_END) if close >= 0 else len(text))
        if close >= 0 or final:
            raise Malformed("the call is not complete")
        return Group([call] if name else [], None)

    def read_name(self, body: str, i: int) -> tuple[str | None, int | None]:
        """``function<｜tool▁sep｜>name\\n``: the name and where the arguments block starts."""
        j = expect(body, i, "function" + SEP)
        if j is None:
            return None, None
        newline = body.find("\n", j)
        if newline < 0:
            return None, None
        if not body[j:newline].strip():
            raise Malformed("an empty function name")
        return body[j:newline].strip(), newline + 1

    def before_arguments(self, body: str, j: int) -> int | None:
        k = expect(body, j, "```json\n")
        return None if k is None else skip_ws(body, k)

    def after_arguments(self, body: str, end: int) -> int | None:
        """Where the call's text ends after the arguments (None: not yet, or `Malformed`)."""
        k = expect(body, skip_ws(body, end), "```")
        if k is not None and skip_ws(body, k) != len(body):
            raise Malformed("text after the arguments block")
        return k


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    name = "deepseek_v31"

    def read_name(self, body: str, i: int) -> tuple[str | None, int | None]:
        """``name<｜tool▁sep｜>``: the name and where the arguments start."""
        sep = body.find(SEP, i)
        if sep < 0:
            if "\n" in body[i:]:
                raise Malformed("a newline in the function name")
            return None, None
        if not body[i:sep].strip() or "\n" in body[i:sep]:
            raise Malformed("an empty function name, or a newline in it")
        return body[i:sep].strip(), sep + len(SEP)

    def before_arguments(self, body: str, j: int) -> int | None:
        return skip_ws(body, j)

    def after_arguments(self, body: str, end: int) -> int | None:
        if skip_ws(body, end) != len(body):
            raise Malformed("text after the arguments")
        return end
