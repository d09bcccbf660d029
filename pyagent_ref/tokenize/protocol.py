"""The tokenizer interface the engine programs against.

Two backends implement it: `HFTokenizer` (a Hugging Face `tokenizer.json`, run by the
`tokenizers` library) and `TiktokenTokenizer` (a `tiktoken` BPE rank file). The engine,
the incremental detokenizer and the chat-template renderer only use what is listed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

Message = Mapping[str, Any]
"""One chat message: at least a ``role``, usually a ``content``, as the OpenAI API sends it."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine needs from a tokenizer.

    Token ids are ints in ``range(vocab_size)``. Every method that takes ids raises
    ``TypeError`` for a non-int id and ``ValueError`` for an id outside the vocabulary,
    naming the position and the value.

    The contract that ties the methods together, and that the incremental detokenizer
    relies on: for any ids,

        decode(ids, skip_special_tokens=s)
            == convert_tokens_to_string(convert_ids_to_tokens(kept))

    where ``kept`` is ``ids`` without the members of ``all_special_ids`` if ``s`` is true,
    and ``ids`` itself otherwise. A token string is the backend's own spelling of a token
    (byte-level BPE uses ``"Ġ"`` for a space; the tiktoken backend spells each byte as the
    Latin-1 character of the same value), so only ``convert_tokens_to_string`` may turn
    token strings into text. Decoding is lossy on invalid UTF-8: each maximal invalid or
    incomplete byte sequence becomes one U+FFFD REPLACEMENT CHARACTER.
    """

    @property
    def vocab_size(self) -> int:
        """One more than the largest token id, special and added tokens included."""
        ...

    @property
    def bos_token_id(self) -> int | None:
        """Id of the beginning-of-sequence token, or None if the tokenizer has none."""
        ...

    @property
    def eos_token_id(self) -> int | None:
        """Id of the end-of-sequence token, or None if the tokenizer has none."""
        ...

    @property
    def pad_token_id(self) -> int | None:
        """Id of the padding token, or None if the tokenizer has none."""
        ...

    @property
    def all_special_ids(self) -> frozenset[int]:
        """Ids that ``skip_special_tokens=True`` removes (BOS, EOS, chat markers, ...)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        Special-token strings inside ``text`` (for instance ``"<|im_start|>"`` written by a
        chat template) become their special ids. ``add_special_tokens`` adds what the
        tokenizer's configuration puts around every sequence (a BOS for Llama-style
        tokenizers, nothing for most chat models); it never changes how ``text`` itself is
        split.
        """
        ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (see the class contract for special tokens and bad UTF-8)."""
        ...

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The backend's token string of each id, one per id, special tokens included."""
        ...

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        """The text that a run of token strings spells (inverse of the backend's spelling)."""
        ...

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
        """Render ``messages`` with the tokenizer's chat template (see `chat.render_chat_template`).

        ``chat_template`` is the name of one of the tokenizer's templates or a template
        source; None picks the tokenizer's default (``"tool_use"`` when tools are given and
        the tokenizer has such a template). With ``tokenize=True`` the rendered text is
        encoded with ``add_special_tokens=False``: the template writes BOS itself.
        """
        ...
