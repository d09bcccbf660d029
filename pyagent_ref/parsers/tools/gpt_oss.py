"""gpt-oss (harmony): tool calls are commentary messages addressed to ``functions.NAME``.

::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(three lines here; the model writes no newline between them)

gives one call with arguments ``{"city": "Paris"}`` (the message body, as written). The
``final`` channel, commentary without a recipient (a preamble for the user) and plain text
are content; ``analysis`` messages are reasoning, left out here (the gpt_oss reasoning
parser returns them); messages to other recipients (the built-in ``browser`` and
``python`` tools) are left out too. See `pyagent_ref.parsers.harmony` for the grammar.
"""

from __future__ import annotations

import json

from ..harmony import split_harmony
from .base import Parsed, PartialCall, ToolParser


def _is_object(body: str) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    except (ValueError, RecursionError):
        return False


class GptOssToolParser(ToolParser):
    name = "gpt_oss"

    def parse(self, text: str, final: bool) -> Parsed:
        pieces, _ = split_harmony(text, final)
        content: list[str] = []
        calls: list[PartialCall] = []
        for piece in pieces:
            if isinstance(piece, str):
                content.append(piece)
            elif piece.recipient is None:
                if piece.channel != "analysis":
                    content.append(piece.body)
            elif piece.recipient.startswith("functions.") and len(piece.recipient) > 10:
                body = piece.body.strip()
                done = piece.closed or final
                if (done and _is_object(piece.body)) or (not done and body[:1] in ("", "{")):
                    calls.append(PartialCall(piece.start, piece.recipient[10:], piece.body))
                else:  # not a JSON object: the model's text stays visible
                    content.append(piece.body)
        return Parsed("".join(content), calls)
