r"""Byte-level BPE in Rust: a drop-in `pyagent_ref.tokenize.bpe.BytePairEncoding`.

`BytePairEncoding` here is a subclass of the reference's: the constructors
(`from_tokenizer_json`, `from_tiktoken`, the data directly), the validation, the
special-token rules and every error are the reference's own code; `encode`,
`encode_batch` and `decode` run in Rust (`pyagent_accel._native.BpeCore`) and give the
same ids and text. `encode_batch` encodes its texts in parallel with the GIL released.

What runs where, per call of `encode`:

- Python (the reference's functions): the type checks, the lone-surrogate check,
  `resolve_special_sets`; the disallowed-special check is done in Rust and, when it
  finds one, the reference's `check_no_disallowed` raises its error.
- Rust: step 1 (added tokens, leftmost-longest with Aho-Corasick), step 3 (the
  pre-tokenization patterns, with fancy-regex, the engine tiktoken uses) and step 4 (the
  byte-pair merge with a heap, O(n log n) per piece instead of O(n^2)).
- Step 2 (normal forms) stays Python's `unicodedata`, whose tables the reference
  specifies: an encoding with ``normal_forms`` (Qwen2) runs steps 1 and 2 in Python and
  steps 3 and 4 in Rust.

Differences from the reference: the patterns run on fancy-regex, not Python's ``regex``.
The published patterns (GPT-2, cl100k_base, Llama 3, Qwen2) mean the same in both (the
tests check it); syntax that only Python's ``regex`` has (``\X``, ``(?r)``, ``(?V1)``)
raises `UnsupportedTokenizerError` when the encoding is built, but syntax that both read
differently (fuzzy matching ``{e<=1}``, ``--`` in a class) would encode differently, and
so may a pattern that can match the empty string. fancy-regex's backtracking limit, if a
text ever reaches it, raises RuntimeError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pyagent_ref.tokenize import bpe as _ref
from pyagent_ref.tokenize._base import check_flag, check_text, check_token_ids
from pyagent_ref.tokenize.bpe import (
    GPT2_PATTERN,
    AddedToken,
    Segment,
    SpecialSet,
    UnsupportedTokenizerError,
)

from .. import _native

__all__ = ["GPT2_PATTERN", "AddedToken", "BytePairEncoding", "UnsupportedTokenizerError"]

_MAX_SPLITTERS = 64
"""How many (allowed, disallowed) special-token sets an encoding keeps compiled."""


class BytePairEncoding(_ref.BytePairEncoding):
    """`pyagent_ref.tokenize.bpe.BytePairEncoding`, encoding and decoding in Rust.

    Same arguments, attributes, results and errors as the reference; see its docstring.
    """

    def __init__(
        self,
        vocab: Mapping[bytes, int],
        merges: Mapping[tuple[bytes, bytes], int],
        patterns: Sequence[str],
        *,
        added_tokens: Sequence[AddedToken] = (),
        normal_forms: Sequence[str] = (),
        add_prefix_space: bool = False,
        ignore_merges: bool = False,
        template: tuple[Sequence[int], Sequence[int]] = ((), ()),
    ) -> None:
        super().__init__(
            vocab,
            merges,
            patterns,
            added_tokens=added_tokens,
            normal_forms=normal_forms,
            add_prefix_space=add_prefix_space,
            ignore_merges=ignore_merges,
            template=template,
        )
        self._build_core()

    def _build_core(self) -> None:
        """Hand the validated data to Rust once."""
        try:
            self._core = _native.BpeCore(
                self.vocab,
                [(left, right, rank) for (left, right), rank in self.merges.items()],
                [pattern.pattern for pattern in self.patterns],
                self.add_prefix_space,
                self.ignore_merges,
                list(self._bytes_of_id.items()),
            )
        except ValueError as exc:  # a pattern fancy-regex does not support
            raise UnsupportedTokenizerError(f"unsupported by pyagent_accel: {exc}") from exc
        self._splitters: dict[tuple[frozenset[str], frozenset[str]], Any] = {}
        self._no_added_tokens = _native.AddedTokenSplitter([], [])

    @classmethod
    def from_tokenizer_json(cls, source: str | Path | Mapping[str, Any]) -> BytePairEncoding:
        """The reference's `from_tokenizer_json` (same support and errors), in Rust."""
        encoding = _ref.BytePairEncoding.from_tokenizer_json(source)
        accelerated = cls.__new__(cls)
        accelerated.__dict__.update(vars(encoding))
        accelerated._build_core()
        return accelerated

    # ---------------------------------------------------------------- encode

    def encode(
        self,
        text: str,
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
        add_special_tokens: bool = False,
    ) -> list[int]:
        """The reference's `encode`: same ids, same errors."""
        return self.encode_batch(
            [text],
            allowed_special=allowed_special,
            disallowed_special=disallowed_special,
            add_special_tokens=add_special_tokens,
        )[0]

    def encode_batch(
        self,
        texts: Iterable[str],
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
        add_special_tokens: bool = False,
    ) -> list[list[int]]:
        """The reference's `encode_batch`; the texts are encoded in parallel."""
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TypeError(f"texts must be an iterable of str, got {type(texts).__name__}")
        texts = list(texts)
        checked = [
            self._check(text, allowed_special, disallowed_special, add_special_tokens)
            for text in texts
        ]
        if not texts:
            return []
        if self.normal_forms:
            segments = [
                self._split_and_normalize(t, allowed)
                for t, (allowed, _) in zip(texts, checked, strict=True)
            ]
            batch = self._encode_segments(segments)
        else:
            batch = self._core.encode_batch(texts, checked[0][1])
        if add_special_tokens:
            before, after = self.template
            batch = [[*before, *ids, *after] for ids in batch]
        return batch

    def _check(
        self,
        text: str,
        allowed_special: SpecialSet,
        disallowed_special: SpecialSet,
        add_special_tokens: bool,
    ) -> tuple[frozenset[str], Any]:
        """The reference's checks of one `encode` call, in its order; the allowed special
        tokens and the splitter that cuts the text at the added tokens they select."""
        check_text(text)
        check_flag(add_special_tokens, "add_special_tokens")
        _ref._check_utf8(text)
        allowed, disallowed = _ref.resolve_special_sets(
            self.special_tokens, allowed_special, disallowed_special
        )
        splitter = self._splitter(allowed, disallowed)
        if splitter.meets_disallowed(text):
            _ref.check_no_disallowed(text, disallowed)  # raises the reference's error
        return allowed, splitter

    def _splitter(self, allowed: AbstractSet[str], disallowed: frozenset[str]) -> Any:
        """The native splitter of `_split_and_normalize` for these sets (compiled once):
        the raw added tokens, then the ``normalized`` ones; and the disallowed ones."""
        key = (frozenset(allowed), disallowed)
        splitter = self._splitters.get(key)
        if splitter is None:
            matched = [
                t for t in self.added_tokens.values() if not t.special or t.content in allowed
            ]
            passes = [
                [(t.content, t.id) for t in matched if not t.normalized],
                [(self.added_token_text(t), t.id) for t in matched if t.normalized],
            ]
            if len(self._splitters) >= _MAX_SPLITTERS:
                self._splitters.clear()
            splitter = _native.AddedTokenSplitter(passes, sorted(disallowed))
            self._splitters[key] = splitter
        return splitter

    def _encode_segments(self, batch: list[list[Segment]]) -> list[list[int]]:
        """Steps 3 and 4 on the text segments of each list, in one native batch; the ids
        of added tokens pass through."""
        pieces = [s for segments in batch for s in segments if isinstance(s, str)]
        encoded = iter(self._core.encode_batch(pieces, self._no_added_tokens))
        return [
            [i for s in segments for i in ([s] if isinstance(s, int) else next(encoded))]
            for segments in batch
        ]

    # ---------------------------------------------------------------- decode

    def decode(self, ids: Iterable[int]) -> str:
        """The reference's `decode`: same text, same errors."""
        checked = check_token_ids(ids, self.vocab_size)
        text = self._core.decode(checked)
        # None: an id of no token, for which the reference's decode raises its error
        return super().decode(checked) if text is None else text
