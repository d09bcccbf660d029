"""Reasoning between two tags: DeepSeek R1 and V3.1, Qwen 3, Mistral (Magistral), Granite.

One rule with four settings. The reasoning starts at a *start tag* at the beginning of the
text (whitespace before it is allowed) and ends at the first *end tag*; the content is what
follows the end tag. Both are returned verbatim (the newlines models put after the tags
included). Without an end tag the text ended while thinking: everything is reasoning.

* ``deepseek_r1``: ``<think>`` ... ``</think>``; a text without the start tag begins
  inside the reasoning (*). ``<think>\\nHm.\\n</think>\\n\\nHi`` gives ``"\\nHm.\\n"``
  and ``"\\n\\nHi"``.
* ``qwen3``: the same tags; without the start tag, reasoning (*) if ``enable_thinking`` (the
  default), else content.
* ``deepseek_v3`` (V3.1): the same tags; without the start tag, reasoning (*) if
  ``thinking``, else content (the default).
* ``mistral`` (Magistral): ``[THINK]`` ... ``[/THINK]``; without the start tag, content.
  ``[THINK]Hm.[/THINK]Hi`` gives ``"Hm."`` and ``"Hi"``.
* ``granite`` (3.2): ``Here is my thought process:`` ... ``Here is my response:`` (or
  ``Here's``); without the start tag, content. See below.

(*) The chat template may end the prompt with the start tag (DeepSeek R1, Qwen3-2507
Thinking, V3.1 in thinking mode), so the text begins inside the reasoning. A model that does
not think at all must then not be given this parser, or must have thinking switched off.
With thinking off (``enable_thinking=False``, which makes the Qwen 3 template write an empty
``<think>\\n\\n</think>`` itself), a text that still starts with the start tag is split.

Granite 3.2::

    Here is my thought process:
    The user wants a greeting.
    Here is my response:
    Hello!
"""

from __future__ import annotations

from typing import ClassVar

from .._scan import held_back
from .base import ReasoningParser


class TagReasoningParser(ReasoningParser):
    """Reasoning between a start tag and an end tag (see the module docstring)."""

    start_tags: ClassVar[tuple[str, ...]] = ("<think>",)
    end_tags: ClassVar[tuple[str, ...]] = ("</think>",)

    def starts_thinking(self) -> bool:
        """Whether a text without a start tag begins inside the reasoning."""
        return False

    def parse(self, text: str, final: bool) -> tuple[str, str]:
        stripped = text.lstrip()
        tag = next((t for t in self.start_tags if stripped.startswith(t)), None)
        if tag is not None:
            body = stripped[len(tag) :]
        elif not final and any(t.startswith(stripped) for t in self.start_tags):
            return "", ""  # the start tag may still be arriving
        elif self.starts_thinking():
            body = text
        else:
            return "", text
        ends = [(i, t) for t in self.end_tags if (i := body.find(t)) >= 0]
        if ends:
            i, t = min(ends)
            return body[:i], body[i + len(t) :]
        if not final:
            body = body[: len(body) - held_back(body, self.end_tags)]
        return body, ""


class DeepSeekR1ReasoningParser(TagReasoningParser):
    name = "deepseek_r1"

    def starts_thinking(self) -> bool:
        return True


class Qwen3ReasoningParser(TagReasoningParser):
    name = "qwen3"

    def __init__(self, chat_template_kwargs=None):
        super().__init__(chat_template_kwargs)
        self.thinking = self.flag("enable_thinking", True)

    def starts_thinking(self) -> bool:
        return self.thinking


class DeepSeekV3ReasoningParser(TagReasoningParser):
    name = "deepseek_v3"

    def __init__(self, chat_template_kwargs=None):
        super().__init__(chat_template_kwargs)
        self.thinking = self.flag("thinking", False)

    def starts_thinking(self) -> bool:
        return self.thinking


class MistralReasoningParser(TagReasoningParser):
    name = "mistral"
    start_tags = ("[THINK]",)
    end_tags = ("[/THINK]",)


class GraniteReasoningParser(TagReasoningParser):
    name = "granite"
    start_tags = ("Here is my thought process:", "Here's my thought process:")
    end_tags = ("Here is my response:", "Here's my response:")
