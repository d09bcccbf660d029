"""gpt-oss (harmony): the ``analysis`` channel is the reasoning.

::

    <|channel|>analysis<|message|>Simple greeting.<|end|>
    <|start|>assistant<|channel|>final<|message|>Hello!<|return|>

(two lines here; the model writes no newline between messages)

gives the reasoning ``"Simple greeting."`` and the content ``"Hello!"``. The bodies of
``final`` messages and of commentary messages without a recipient (preambles) are content.
A message addressed to a tool stays in the content *as harmony text* (header, body,
terminator), so that the gpt_oss tool parser, run on the content, finds the call; text
outside messages is content as is. See `pyagent_ref.parsers.harmony` for the grammar.
"""

from __future__ import annotations

from .._scan import held_back
from ..harmony import SPECIAL_TOKENS, split_harmony
from .base import ReasoningParser


class GptOssReasoningParser(ReasoningParser):
    name = "gpt_oss"

    def parse(self, text: str, final: bool) -> tuple[str, str]:
        pieces, _ = split_harmony(text, final)
        reasoning: list[str] = []
        content: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                content.append(piece)
            elif piece.recipient is not None:
                raw = text[piece.start : piece.end]
                if not piece.closed and not final:
                    raw = raw[: len(raw) - held_back(raw, SPECIAL_TOKENS)]
                content.append(raw)
            elif piece.channel == "analysis":
                reasoning.append(piece.body)
            else:
                content.append(piece.body)
        return "".join(reasoning), "".join(content)
