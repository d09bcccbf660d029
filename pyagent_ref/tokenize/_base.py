"""What both tokenizer backends share: argument checks, special-token names, chat templates."""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .chat import render_chat_template, select_chat_template
from .protocol import Message

T = TypeVar("T")

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens a chat template sees (as transformers names them)."""


def check_token_ids(ids: Iterable[int], vocab_size: int, name: str = "ids") -> list[int]:
    """``ids`` as a list of Python ints, each in ``range(vocab_size)``.

    Raises:
        TypeError: ``ids`` is a str/bytes or not iterable, or an element is not an integer
            (bools are rejected).
        ValueError: an element is outside ``range(vocab_size)``.
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(ids).__name__}")
    out = []
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not hasattr(type(token), "__index__"):
            raise TypeError(f"{name}[{i}] must be an int, got {token!r}")
        value = operator.index(token)
        if not 0 <= value < vocab_size:
            raise ValueError(
                f"{name}[{i}] = {value} is outside the vocabulary range [0, {vocab_size})"
            )
        out.append(value)
    return out


def tokens_of_ids(
    ids: Iterable[int], vocab_size: int, lookup: Callable[[int], T | None]
) -> list[T]:
    """``lookup(id)`` for each of ``ids`` (checked by `check_token_ids`).

    Raises:
        ValueError: an id of no token (``lookup`` gave None), named with its position.
    """
    out = []
    for i, token_id in enumerate(check_token_ids(ids, vocab_size)):
        token = lookup(token_id)
        if token is None:
            raise ValueError(f"ids[{i}] = {token_id} is not the id of any token")
        out.append(token)
    return out


def check_text(text: str, name: str = "text") -> str:
    """``text`` itself if it is a str; TypeError otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def check_flag(value: bool, name: str) -> bool:
    """``value`` itself if it is a bool; TypeError otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_max_length(value: int | None) -> int | None:
    """``model_max_length``: None or a positive int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"model_max_length must be an int or None, got {value!r}")
    if value <= 0:
        raise ValueError(f"model_max_length must be positive, got {value}")
    return value


def normalize_chat_templates(value: str | Mapping[str, str] | None) -> dict[str, str]:
    """Chat templates given to a constructor: one source (the default) or sources by name."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, Mapping):
        for name, source in value.items():
            if not isinstance(name, str) or not isinstance(source, str):
                raise TypeError(
                    f"chat_templates must map str names to str sources, got {name!r}: "
                    f"{type(source).__name__}"
                )
        return dict(value)
    raise TypeError(
        f"chat_templates must be a str, a dict of str or None, got {type(value).__name__}"
    )


class TokenizerBase(ABC):
    """What the backends share: named special ids, argument checks, chat templates.

    A subclass sets ``chat_templates`` (name -> source), ``special_tokens_map`` (named
    special token -> its text) and ``_special_ids``, and implements ``vocab_size``,
    ``_named_id`` and ``encode``.
    """

    chat_templates: dict[str, str]
    special_tokens_map: dict[str, str]
    _special_ids: frozenset[int]

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Ids are in [0, vocab_size) (see `Tokenizer.vocab_size`)."""

    @abstractmethod
    def _named_id(self, name: str) -> int | None:
        """The id of the special token ``special_tokens_map[name]``, or None."""

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (see `Tokenizer.encode`)."""

    @property
    def bos_token_id(self) -> int | None:
        return self._named_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._named_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._named_id("pad_token")

    @property
    def all_special_ids(self) -> frozenset[int]:
        return self._special_ids

    @staticmethod
    def _check_tokens(tokens: Sequence[str]) -> list[str]:
        """``tokens`` as a list, after checking it is a sequence of str (not one str)."""
        if isinstance(tokens, str):
            raise TypeError("tokens must be a list of token strings, got a str")
        tokens = list(tokens)
        for i, token in enumerate(tokens):
            if not isinstance(token, str):
                raise TypeError(f"tokens[{i}] must be a str, got {token!r}")
        return tokens

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.vocab_size}, "
            f"special_tokens={self.special_tokens_map}, templates={sorted(self.chat_templates)})"
        )

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render ``messages`` with a chat template; the prompt text, or its ids if ``tokenize``.

        ``chat_template`` names one of ``chat_templates`` or is a template source; None
        picks ``"tool_use"`` when tools are given and that template exists, else
        ``"default"``. Rendering is `chat.render_chat_template` with this tokenizer's
        special tokens; ``tokenize=True`` encodes the text with ``add_special_tokens=False``
        (the template writes BOS itself).

        Raises:
            ValueError: no template to use; see `chat.render_chat_template` for the rest.
        """
        check_flag(tokenize, "tokenize")
        source = select_chat_template(
            self.chat_templates, chat_template, has_tools=tools is not None
        )
        text = render_chat_template(
            source,
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens_map,
            **kwargs,
        )
        if tokenize:
            return self.encode(text, add_special_tokens=False)
        return text
