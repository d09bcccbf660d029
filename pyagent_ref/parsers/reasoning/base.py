"""The machinery every reasoning parser shares (the same scheme as the tool parsers').

A format writes ``parse(text, final) -> (reasoning, content)``. `ReasoningParser.extract`
is ``parse(text, final=True)``; `ReasoningParser.stream` parses the whole text so far with
``final=False`` and emits the new ends of ``reasoning`` and ``content``. ``parse`` is
monotone (with ``final=False`` both strings only grow as the text grows, and both are
prefixes of the ``final=True`` result), so the deltas never take anything back and their
concatenation is exactly ``extract(text)``. A parser never raises on model text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .._types import DeltaMessage, ExtractedReasoning, Reparser

__all__ = ["ReasoningParser"]


class ReasoningParser(Reparser):
    """Splits a model's text into reasoning and content (see the module docstring).

    One instance serves one request (`stream` keeps the text seen so far).

    Args:
        chat_template_kwargs: the request's ``chat_template_kwargs`` (a format whose
            template switches thinking on or off, like Qwen 3's ``enable_thinking``, reads
            its switch here; the others ignore it).

    Raises:
        TypeError: ``chat_template_kwargs`` is not a dict or None, or a switch the format
            reads is not a bool.
    """

    name: ClassVar[str] = ""

    def __init__(self, chat_template_kwargs: Mapping[str, Any] | None = None):
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise TypeError(
                f"chat_template_kwargs must be a dict or None, got {chat_template_kwargs!r}"
            )
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._text = ""
        self._sent = ("", "")

    def flag(self, key: str, default: bool) -> bool:
        """The bool ``chat_template_kwargs[key]``, or ``default`` when it is absent."""
        value = self.chat_template_kwargs.get(key, default)
        if not isinstance(value, bool):
            raise TypeError(f"chat_template_kwargs[{key!r}] must be a bool, got {value!r}")
        return value

    def parse(self, text: str, final: bool) -> tuple[str, str]:
        """``(reasoning, content)`` of ``text`` (monotone when ``final`` is False)."""
        raise NotImplementedError

    def extract(self, text: str) -> ExtractedReasoning:
        """Reasoning and content of a complete text ("" becomes None). Never raises on it."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        reasoning, content = self.parse(text, final=True)
        return ExtractedReasoning(reasoning or None, content or None)

    def _emit(self, parsed: tuple[str, str]) -> DeltaMessage | None:
        (reasoning, content), (sent_reasoning, sent_content) = parsed, self._sent
        out = DeltaMessage()
        # Both always extend what was sent, for a monotone parse; never take anything back.
        if reasoning.startswith(sent_reasoning) and reasoning != sent_reasoning:
            out.reasoning_content = reasoning[len(sent_reasoning) :]
            sent_reasoning = reasoning
        if content.startswith(sent_content) and content != sent_content:
            out.content = content[len(sent_content) :]
            sent_content = content
        self._sent = (sent_reasoning, sent_content)
        return out if out else None
