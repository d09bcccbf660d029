"""The harmony format of gpt-oss, read from text: messages, channels and recipients.

gpt-oss answers in *messages*. Each has a header, ``<|message|>``, a body, and a terminator:
``<|end|>`` (more messages follow), ``<|call|>`` (a tool call: the turn stops for the
result) or ``<|return|>`` (the final answer: the turn is over). The prompt ends with
``<|start|>assistant``, so the first message of the text starts at its ``<|channel|>``.
Two turns (one message a line here; the model writes no newline between messages)::

    <|channel|>analysis<|message|>The user wants the weather. Call the tool.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
        <|message|>{"city": "Paris"}<|call|>

    <|channel|>analysis<|message|>Sunny, 24 C. Answer briefly.<|end|>
    <|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>

Channels: ``analysis`` is the model's reasoning, ``final`` the answer, ``commentary`` tool
calls (``to=functions.NAME`` in the header, before or after ``<|channel|>``, with the
arguments as the body) and short preambles for the user (no recipient).

`split_harmony` cuts a text into plain text and `HarmonyMessage` objects; the gpt-oss
reasoning and tool parsers are small functions of that list. The text must keep the special
tokens (decode with ``skip_special_tokens=False``); ``<|call|>`` and ``<|return|>`` are stop
tokens and may be missing at the end of the text, where the end of the text ends the message.

This module reads the grammar itself rather than through the ``openai-harmony`` package:
that package parses token ids, and needs the o200k_base vocabulary, which it downloads on
first use (no network on the machines this project runs on). For text, the grammar above is
all there is to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._scan import held_back

__all__ = ["SPECIAL_TOKENS", "HarmonyMessage", "split_harmony"]

SPECIAL_TOKENS = (
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
)
_HEADER_STARTS = ("<|start|>", "<|channel|>")
_TERMINATORS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]*)")


@dataclass
class HarmonyMessage:
    """One message of the text.

    Attributes:
        start: index of its header in the text; end: index after its terminator (or the
            end of the text so far).
        channel: ``analysis``, ``commentary``, ``final`` (or None without ``<|channel|>``).
        recipient: ``functions.get_weather`` for a tool call, else None.
        body: the text between ``<|message|>`` and the terminator (while streaming, without
            a tail that may be the start of a special token).
        closed: whether its terminator was seen.
    """

    start: int
    end: int
    channel: str | None
    recipient: str | None
    body: str
    closed: bool


def _first(text: str, needles: tuple[str, ...], pos: int) -> tuple[int, str] | None:
    hits = [(i, n) for n in needles if (i := text.find(n, pos)) >= 0]
    return min(hits) if hits else None


def split_harmony(text: str, final: bool) -> tuple[list[str | HarmonyMessage], bool]:
    """Cut ``text`` into plain text and messages, in order.

    With ``final=False`` the text may still grow: a tail that may be the start of a special
    token is left out, and a header without its ``<|message|>`` yet is left out too.

    Returns:
        ``(pieces, held)``: the pieces, and whether a header in progress was left out. With
        ``final=True`` an unfinished header is plain text.
    """
    pieces: list[str | HarmonyMessage] = []
    pos = 0
    while (hit := _first(text, _HEADER_STARTS, pos)) is not None:
        start = hit[0]
        pieces.append(text[pos:start])
        body_at = text.find("<|message|>", start)
        if body_at < 0:
            if final:
                pieces.append(text[start:])
                return pieces, False
            return pieces, True
        header = text[start:body_at]
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        body_at += len("<|message|>")
        stop = _first(text, _TERMINATORS, body_at)
        if stop is None:
            body = text[body_at:]
            if not final:
                body = body[: len(body) - held_back(body, SPECIAL_TOKENS)]
            end, closed = len(text), False
        else:
            body, end, closed = text[body_at : stop[0]], stop[0] + len(stop[1]), True
        pieces.append(
            HarmonyMessage(
                start,
                end,
                channel.group(1) if channel else None,
                recipient.group(1) if recipient else None,
                body,
                closed,
            )
        )
        pos = end
    tail = text[pos:]
    if not final:
        tail = tail[: len(tail) - held_back(tail, SPECIAL_TOKENS)]
    pieces.append(tail)
    return pieces, False
