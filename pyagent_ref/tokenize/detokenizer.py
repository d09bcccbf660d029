"""Incremental detokenization: token ids arrive one step at a time, text leaves as deltas.

Decoding each token on its own is wrong: one character can span several tokens (an emoji
is 4 UTF-8 bytes, often 2-4 byte-level tokens), and some decoders treat a token
differently depending on its neighbours (SentencePiece drops the space of the first token
it sees). Decoding the whole output again at every step is right but quadratic. The
prefix-offset / read-offset method decodes a short window instead:

    tokens:   ... | prefix_offset ........ read_offset ........ len(tokens)
                    context (already emitted)   unread (new)

    prefix_text = text(tokens[prefix_offset:read_offset])
    new_text    = text(tokens[prefix_offset:])

If ``new_text`` is longer than ``prefix_text`` and does not end with U+FFFD (the
replacement character a decoder produces for an incomplete UTF-8 sequence), the delta is
``new_text[len(prefix_text):]`` and the window slides: ``prefix_offset = read_offset``,
``read_offset = len(tokens)``. Otherwise nothing is emitted and the tokens wait in the
window until a later token completes the character. See docs/tokenize.md for a worked
example.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from ._base import check_flag
from .protocol import Tokenizer

__all__ = ["IncrementalDetokenizer"]

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Text deltas of one request's generated tokens, never splitting a character.

    The text of a token run is defined by the tokenizer: ``text(tokens)`` is
    ``tokenizer.convert_tokens_to_string(tokens)``, after dropping the members of
    ``tokenizer.all_special_ids`` if ``skip_special_tokens``. If
    ``spaces_between_special_tokens`` and a special token is kept, the run is cut at each
    special token, every piece (a run of ordinary tokens, or one special token) is turned
    into text on its own, and the pieces are joined with one space (the meaning the option
    has in HF transformers' Python tokenizers; vLLM ignores it for fast tokenizers).

    Contract: let ``out`` be the concatenation of every delta returned by `add_tokens`
    and then by `finish`. Then ``out == text(output ids)``: with
    ``spaces_between_special_tokens=False`` (or no kept special token) this is
    ``tokenizer.decode(output_ids, skip_special_tokens)``. Before `finish`, the emitted text
    is always a prefix of that text, and a delta never ends inside a character: a U+FFFD
    appears in a delta only where the full decode has one too (invalid bytes that no later
    token can complete). What is held back is what `finish` returns. This is exact when
    the text of a token run only grows as tokens are appended (byte-level BPE, tiktoken,
    SentencePiece's Metaspace); a decoder that rewrites text across token boundaries
    (WordPiece's cleanup of " .") can differ at window edges, as it does in vLLM.

    Prompt context: with ``prompt_ids``, the last ``context_tokens`` kept prompt tokens
    start the window, so the first generated token is decoded in context (this matters
    for SentencePiece-style decoders, which drop the leading space of the first token of a
    text). The output is then ``text(context + output)[len(text(context)):]``. If the
    context's text ends with U+FFFD (the prompt ends inside a character), the context is
    dropped and the output is ``text(output ids)``.

    Args:
        tokenizer: any `Tokenizer`.
        prompt_ids: the request's prompt, for context only (never part of the output).
        skip_special_tokens: drop special tokens from the text.
        spaces_between_special_tokens: join special tokens and the text around them
            with spaces (see above).
        context_tokens: prompt tokens to keep as context, >= 0 (vLLM uses 5).

    Raises:
        TypeError: a flag is not a bool, or a bad id type.
        ValueError: ``context_tokens < 0`` or a token id outside the vocabulary.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        context_tokens: int = 5,
    ) -> None:
        check_flag(skip_special_tokens, "skip_special_tokens")
        check_flag(spaces_between_special_tokens, "spaces_between_special_tokens")
        if isinstance(context_tokens, bool) or not isinstance(context_tokens, int):
            raise TypeError(f"context_tokens must be an int, got {context_tokens!r}")
        if context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, got {context_tokens}")
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self._special_ids = tokenizer.all_special_ids
        self._tokens: list[str] = []  # token strings in the window's coordinates
        self._is_special: list[bool] = []
        self._output_ids: list[int] = []
        self._emitted: list[str] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._finished = False

        tail: list[int] = []  # the last context_tokens kept prompt ids, scanning from the end
        for token_id in reversed(prompt_ids):
            if len(tail) == context_tokens:
                break
            if not (self._skip and token_id in self._special_ids):
                tail.append(token_id)
        context = self._convert(tail[::-1])
        if context:
            self._append(context)
            if self._text(0, len(self._tokens)).endswith(REPLACEMENT_CHAR):
                self._tokens.clear()
                self._is_special.clear()
            else:
                self._read_offset = len(self._tokens)

    # ------------------------------------------------------------------ helpers

    def _convert(self, ids: Sequence[int]) -> list[tuple[str, bool]]:
        """(token string, is special) of each id that is kept (specials go if skipped)."""
        ids = list(ids)
        tokens = self._tokenizer.convert_ids_to_tokens(ids)  # also validates the ids
        out = []
        for token_id, token in zip(ids, tokens, strict=True):
            special = token_id in self._special_ids
            if not (special and self._skip):
                out.append((token, special))
        return out

    def _append(self, kept: list[tuple[str, bool]]) -> None:
        for token, special in kept:
            self._tokens.append(token)
            self._is_special.append(special)

    def _text(self, start: int, end: int) -> str:
        """``text(tokens[start:end])`` as defined in the class docstring."""
        tokens = self._tokens[start:end]
        to_string = self._tokenizer.convert_tokens_to_string
        if not self._spaces or not any(self._is_special[start:end]):
            return to_string(tokens)
        pieces: list[str] = []
        run: list[str] = []
        for token, special in zip(tokens, self._is_special[start:end], strict=True):
            if not special:
                run.append(token)
                continue
            if run:
                pieces.append(to_string(run))
                run = []
            pieces.append(to_string([token]))
        if run:
            pieces.append(to_string(run))
        return " ".join(pieces)

    # ------------------------------------------------------------------ public API

    def add_tokens(self, ids: Sequence[int]) -> str:
        """Append newly generated token ids; return the text that is now certain.

        Returns "" when the new tokens add no text yet (an incomplete character, a skipped
        special token, a token that decodes to nothing).

        Raises:
            ValueError: a bad id, or the detokenizer was already finished.
        """
        if self._finished:
            raise ValueError("add_tokens called after finish(); make a new detokenizer")
        ids = list(ids)
        kept = self._convert(ids)
        self._output_ids.extend(operator.index(i) for i in ids)
        if not kept:
            return ""
        self._append(kept)
        prefix_text = self._text(self._prefix_offset, self._read_offset)
        new_text = self._text(self._prefix_offset, len(self._tokens))
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        self._emitted.append(delta)
        return delta

    def finish(self) -> str:
        """End the stream: return the text still held back (it may contain U+FFFD).

        After `finish` the concatenated deltas equal the full text of the output ids (see
        the class contract). Further calls to `add_tokens` raise ValueError; calling
        `finish` again returns "".
        """
        if self._finished:
            return ""
        self._finished = True
        prefix_text = self._text(self._prefix_offset, self._read_offset)
        new_text = self._text(self._prefix_offset, len(self._tokens))
        delta = new_text[len(prefix_text) :]
        self._read_offset = len(self._tokens)
        if delta:
            self._emitted.append(delta)
        return delta

    @property
    def output_text(self) -> str:
        """All text emitted so far (the concatenation of the returned deltas)."""
        return "".join(self._emitted)

    @property
    def output_ids(self) -> list[int]:
        """All generated ids passed to `add_tokens`, skipped special tokens included."""
        return list(self._output_ids)

    @property
    def offsets(self) -> tuple[int, int]:
        """``(prefix_offset, read_offset)`` into the window's token list (for inspection)."""
        return self._prefix_offset, self._read_offset

    @property
    def finished(self) -> bool:
        """Whether `finish` was called."""
        return self._finished
