"""Byte-level BPE tokenization, written out as the algorithm it is.

This module is a readable specification of what `tokenizers` (for a Hugging Face
``tokenizer.json`` of the GPT-2, Llama 3 and Qwen2 families) and `tiktoken` compute, with
identical ids. ``encode(text)`` is four steps, each one function below:

1. `split_added_tokens`: cut the text at added tokens (``<|endoftext|>``, chat markers,
   ...), which become their ids directly. Special ones are cut only where allowed
   (`resolve_special_sets`); a disallowed one in the text is an error.
2. `normalize`: Unicode normal forms on the text between them (Qwen2: NFC; most: none).
3. `pre_tokenize`: an optional leading space, then regex splits into pieces (words,
   numbers, punctuation runs, whitespace runs); merges never cross a piece boundary.
4. `bpe_merge`: each piece as UTF-8 bytes, one part per byte; repeatedly merge the
   adjacent pair of parts with the lowest merge rank; each final part is a token.

``decode(ids)`` concatenates the bytes of the tokens and decodes UTF-8, each maximal
invalid sequence becoming one U+FFFD.

Byte fallback is built in: every one of the 256 single bytes is a token, so no text is
ever unknown (`BytePairEncoding` checks this). Byte-level vocabularies store token bytes
as printable characters (`byte_level_alphabet`: ``" "`` is ``"Ġ"``); tiktoken rank files
store raw bytes; here every token is its bytes.

`BytePairEncoding` holds the data of the steps and runs them; it loads a ``tokenizer.json``
(`BytePairEncoding.from_tokenizer_json`, which names what it does not support with
`UnsupportedTokenizerError`) or tiktoken ranks (`BytePairEncoding.from_tiktoken`).
`BPETokenizer` puts it behind the engine's `Tokenizer` protocol. docs/tokenization.md
works through an example.

Complexity: `bpe_merge` rescans all pairs after each merge, O(n^2) dictionary look-ups for
a piece of n bytes; pieces are short (words), and repeated pieces are served from a cache.
Normal forms are those of Python's `unicodedata`, whose Unicode version can be newer than
the tables of the `tokenizers` library (NFKC differs on characters assigned from 12.1 on).
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import regex

from .._files import read_json_object
from ._base import (
    SPECIAL_TOKEN_NAMES,
    TokenizerBase,
    check_flag,
    check_max_length,
    check_text,
    check_token_ids,
    normalize_chat_templates,
    tokens_of_ids,
)
from .chat import load_chat_templates

__all__ = [
    "GPT2_PATTERN",
    "AddedToken",
    "BPETokenizer",
    "BytePairEncoding",
    "UnsupportedTokenizerError",
    "bpe_merge",
    "byte_level_alphabet",
    "byte_level_bytes",
    "byte_level_decoding",
    "byte_level_spelling",
    "check_no_disallowed",
    "merges_from_ranks",
    "normalize",
    "pre_tokenize",
    "resolve_special_sets",
    "split_added_tokens",
    "split_isolated",
]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The pre-tokenization regex of GPT-2, applied by a ``ByteLevel`` pre-tokenizer with
``use_regex``."""

NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
"""The normalizers supported: Unicode normal forms (`unicodedata.normalize`)."""

Segment = str | int
"""A part of the input after `split_added_tokens`: text still to encode, or a token id."""

SpecialSet = AbstractSet[str] | Literal["all"]


class UnsupportedTokenizerError(ValueError):
    """A valid tokenizer that uses a feature this reference does not implement.

    The message names the feature. `load_tokenizer(..., backend="auto")` falls back to the
    `tokenizers` library on this error, and only on it.
    """


# ------------------------------------------------------------------------------ the steps


@functools.cache
def byte_level_alphabet() -> tuple[str, ...]:
    """The printable character that stands for each byte in byte-level vocabularies.

    ``alphabet[b]`` is ``chr(b)`` for the 188 bytes that are printable Latin-1 characters
    (``!`` to ``~``, ``¡`` to ``¬``, ``®`` to ``ÿ``); the other 68 bytes (controls, space,
    DEL, NBSP, soft hyphen), in increasing order, get ``chr(256)``, ``chr(257)``, ...
    So ``alphabet[0x20] == "Ġ"`` and ``alphabet[0x0A] == "Ċ"``.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    unprintable = [b for b in range(256) if b not in printable]
    return tuple(chr(b) if b in printable else chr(256 + unprintable.index(b)) for b in range(256))


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """The inverse of `byte_level_alphabet`."""
    return {char: b for b, char in enumerate(byte_level_alphabet())}


def byte_level_bytes(token: str) -> bytes | None:
    """The bytes a byte-level token string spells, or None if a character of ``token`` is
    not in `byte_level_alphabet`."""
    byte_of = _byte_of_char()
    if not all(char in byte_of for char in token):
        return None
    return bytes(byte_of[char] for char in token)


def byte_level_decoding(token: str) -> bytes:
    """What the ``ByteLevel`` decoder writes for a token string: the bytes it spells if
    every character is in `byte_level_alphabet`, else its UTF-8 (``"é x"``: a space is
    not in the alphabet)."""
    spelled = byte_level_bytes(token)
    return token.encode("utf-8") if spelled is None else spelled


def byte_level_spelling(token: bytes) -> str:
    """``token`` spelled in `byte_level_alphabet` (as ``tokenizer.json`` writes it)."""
    alphabet = byte_level_alphabet()
    return "".join(alphabet[b] for b in token)


def resolve_special_sets(
    special: AbstractSet[str], allowed: SpecialSet, disallowed: SpecialSet
) -> tuple[frozenset[str], frozenset[str]]:
    """The special tokens to encode as their ids, and those whose presence is an error.

    ``"all"`` means every token of ``special``; ``disallowed="all"`` means every special
    token not allowed. A special token in neither set is encoded as ordinary text.
    (tiktoken's defaults: nothing allowed, everything else disallowed.)

    Raises:
        TypeError: a set that is neither ``"all"`` nor a set of str.
        ValueError: a token in either set that is not a special token.
    """
    resolved = []
    for name, value in (("allowed_special", allowed), ("disallowed_special", disallowed)):
        if value == "all":
            resolved.append(frozenset(special))
            continue
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise TypeError(f"{name} must be 'all' or a set of str, got {value!r}")
        unknown = sorted(set(value) - special)
        if unknown:
            raise ValueError(f"{name} names {unknown}, which are not special tokens")
        resolved.append(frozenset(value))
    allowed_set, disallowed_set = resolved
    if disallowed == "all":
        disallowed_set = disallowed_set - allowed_set
    return allowed_set, disallowed_set


def check_no_disallowed(text: str, disallowed: AbstractSet[str]) -> None:
    """Raise ValueError if a disallowed special token occurs anywhere in ``text``."""
    for token in sorted(disallowed):
        at = text.find(token)
        if at >= 0:
            raise ValueError(
                f"text contains the special token {token!r} at index {at}, which is "
                f"disallowed: pass it in allowed_special to encode it as its id, or leave it "
                f"out of disallowed_special to encode it as ordinary text"
            )


def split_added_tokens(segments: Sequence[Segment], tokens: Mapping[str, int]) -> list[Segment]:
    """Cut every text segment at each occurrence of the added ``tokens`` (text -> id).

    Scanning left to right, the leftmost occurrence wins and, of several starting there,
    the longest. Each occurrence becomes its id; empty text between occurrences is
    dropped; segments that are already ids pass through.

    >>> split_added_tokens(["a<s>b<s>"], {"<s>": 1})
    ['a', 1, 'b', 1]
    """
    if not tokens:
        return [s for s in segments if s != ""]
    longest_first = sorted(tokens, key=len, reverse=True)
    finder = regex.compile("|".join(regex.escape(t) for t in longest_first))
    out: list[Segment] = []
    for segment in segments:
        if isinstance(segment, int):
            out.append(segment)
            continue
        start = 0
        for match in finder.finditer(segment):
            out.append(segment[start : match.start()])
            out.append(tokens[match.group()])
            start = match.end()
        out.append(segment[start:])
    return [s for s in out if s != ""]


def normalize(text: str, forms: Sequence[str]) -> str:
    """``text`` put through each Unicode normal form of ``forms`` in turn."""
    for form in forms:
        text = unicodedata.normalize(form, text)
    return text


def split_isolated(text: str, pattern: regex.Pattern[str]) -> list[str]:
    """``text`` cut into the matches of ``pattern`` and the non-empty gaps between them,
    in order (the ``Isolated`` behaviour of a ``Split`` pre-tokenizer). Joining the result
    gives ``text`` back."""
    pieces, start = [], 0
    for match in pattern.finditer(text):
        pieces += [text[start : match.start()], match.group()]
        start = match.end()
    pieces.append(text[start:])
    return [p for p in pieces if p]


def pre_tokenize(
    text: str, patterns: Sequence[regex.Pattern[str]], add_prefix_space: bool = False
) -> list[str]:
    """The pieces of ``text`` that BPE merges independently.

    With ``add_prefix_space`` a space is put before ``text`` unless it starts with one (so
    a first word is spelled like any other). Then each pattern in turn splits every piece
    (`split_isolated`). Published patterns match every character, so no gaps occur.

    >>> pre_tokenize("Hello world!", [regex.compile(GPT2_PATTERN)])
    ['Hello', ' world', '!']
    """
    if add_prefix_space and not text.startswith(" "):
        text = " " + text
    pieces = [text]
    for pattern in patterns:
        pieces = [part for piece in pieces for part in split_isolated(piece, pattern)]
    return pieces


def bpe_merge(piece: bytes, merges: Mapping[tuple[bytes, bytes], int]) -> list[bytes]:
    """The tokens (as bytes) of one piece: start from single bytes and repeatedly merge the
    adjacent pair with the lowest rank in ``merges`` (the leftmost such pair on a tie),
    until no adjacent pair has a rank.

    O(n^2) look-ups for n bytes: up to n - 1 merges, each after a scan of all pairs.

    >>> bpe_merge(b"aaab", {(b"a", b"a"): 0, (b"aa", b"b"): 1, (b"a", b"b"): 2})
    [b'aa', b'ab']
    """
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        ranked = [
            (rank, i)
            for i, pair in enumerate(zip(parts, parts[1:], strict=False))
            if (rank := merges.get(pair)) is not None
        ]
        if not ranked:
            break
        _, i = min(ranked)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts


def merges_from_ranks(ranks: Mapping[bytes, int]) -> dict[tuple[bytes, bytes], int]:
    """tiktoken's merge rule as a list of merges: two adjacent tokens merge if their
    concatenation is a token, with that token's rank.

    So every split ``(t[:k], t[k:])`` of a token ``t`` whose halves are both tokens is a
    merge of rank ``ranks[t]``. Parts are always tokens while merging, so `bpe_merge` with
    this table merges exactly the pairs tiktoken merges, in the same order.
    """
    merges = {}
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in ranks and right in ranks:
                merges[(left, right)] = rank
    return merges


def _check_utf8(text: str) -> None:
    """ValueError naming the first lone surrogate of ``text`` if it has one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text contains the lone surrogate U+{ord(text[exc.start]):04X} at index "
            f"{exc.start}, which UTF-8 cannot encode"
        ) from exc


# ------------------------------------------------------------------------------ the encoding


@dataclass(frozen=True)
class AddedToken:
    """A token matched in the text as a whole, before any splitting.

    Attributes:
        content: its text.
        id: its id.
        special: special tokens obey ``allowed_special`` / ``disallowed_special`` and are
            dropped by ``skip_special_tokens``; other added tokens are always matched.
        normalized: matched, normalized itself, in the normalized text (after step 2)
            instead of the raw text.
        decoded: the bytes ``decode`` writes for it (None: ``content`` in UTF-8).
    """

    content: str
    id: int
    special: bool = True
    normalized: bool = False
    decoded: bytes | None = None

    @property
    def decoded_bytes(self) -> bytes:
        """What ``decode`` writes for this token."""
        return self.content.encode("utf-8") if self.decoded is None else self.decoded


class BytePairEncoding:
    """A byte-level BPE: the data of the four steps, and `encode` / `decode`.

    Build one with `from_tokenizer_json` or `from_tiktoken`, or from the data directly.

    Args:
        vocab: token bytes -> id, for the tokens BPE produces. Every single byte must be
            one (byte fallback).
        merges: pairs of tokens -> rank; lower ranks merge first. The merged token must be
            in ``vocab``.
        patterns: pre-tokenization regexes (``regex`` syntax), applied in turn.
        added_tokens: tokens matched as a whole (`AddedToken`).
        normal_forms: Unicode normal forms applied to the text between added tokens.
        add_prefix_space: put a space before each text segment that lacks one.
        ignore_merges: a piece that is a token as a whole becomes that token without
            merging (tiktoken's rule; Llama 3's ``ignore_merges``).
        template: the ids ``add_special_tokens=True`` puts before and after the text.

    Raises:
        ValueError: inconsistent data (the message names the argument and the value).
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
        missing = [b for b in range(256) if bytes([b]) not in vocab]
        if missing:
            raise ValueError(
                f"vocab must hold all 256 single bytes (byte fallback); missing "
                f"{', '.join(f'0x{b:02X}' for b in missing[:8])}"
                f"{' ...' if len(missing) > 8 else ''}"
            )
        for (left, right), rank in merges.items():
            if left + right not in vocab:
                raise ValueError(f"merges: {left!r} + {right!r} (rank {rank}) is not in vocab")
        for form in normal_forms:
            if form not in NORMAL_FORMS:
                raise ValueError(f"normal_forms: {form!r} is not one of {NORMAL_FORMS}")
        self.vocab = dict(vocab)
        self.merges = dict(merges)
        self.patterns = tuple(_compile(p) for p in patterns)
        self.added_tokens = {t.content: t for t in added_tokens}
        self.normal_forms = tuple(normal_forms)
        self.add_prefix_space = add_prefix_space
        self.ignore_merges = ignore_merges
        self.template = (tuple(template[0]), tuple(template[1]))
        self._bytes_of_id = self._id_table()
        self.vocab_size = max(self._bytes_of_id) + 1
        self.special_tokens = frozenset(t.content for t in added_tokens if t.special)
        self._piece_cache: dict[bytes, tuple[int, ...]] = {}

    def _id_table(self) -> dict[int, bytes]:
        """id -> bytes written by decode; ValueError if two tokens share an id."""
        table: dict[int, bytes] = {}
        for token, token_id in self.vocab.items():
            if token_id in table:
                raise ValueError(f"vocab: id {token_id} is used twice ({token!r})")
            table[token_id] = token
        for added in self.added_tokens.values():
            # an added token may re-state a vocab token (GPT-2's <|endoftext|>)
            table[added.id] = added.decoded_bytes
        for token_id in table:
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ValueError(f"token ids must be ints >= 0, got {token_id!r}")
        return table

    # ---------------------------------------------------------------- encode

    def encode(
        self,
        text: str,
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
        add_special_tokens: bool = False,
    ) -> list[int]:
        """The token ids of ``text`` (steps 1-4 of the module docstring).

        ``allowed_special`` / ``disallowed_special`` as in tiktoken (`resolve_special_sets`):
        by default a special token in ``text`` is an error. The `tokenizers` library
        behaves as ``allowed_special="all"``. ``add_special_tokens`` wraps the ids in
        ``template`` (a BOS for Llama 3).

        Raises:
            TypeError: ``text`` is not a str.
            ValueError: ``text`` holds a disallowed special token or a lone surrogate.
        """
        check_text(text)
        check_flag(add_special_tokens, "add_special_tokens")
        _check_utf8(text)
        allowed, disallowed = resolve_special_sets(
            self.special_tokens, allowed_special, disallowed_special
        )
        check_no_disallowed(text, disallowed)
        segments = self._split_and_normalize(text, allowed)
        ids = [i for s in segments for i in ([s] if isinstance(s, int) else self._encode_text(s))]
        if add_special_tokens:
            before, after = self.template
            ids = [*before, *ids, *after]
        return ids

    def encode_batch(
        self,
        texts: Iterable[str],
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
        add_special_tokens: bool = False,
    ) -> list[list[int]]:
        """`encode` of each text, in order (the error is that of the first text with one).

        Raises:
            TypeError: ``texts`` is a str or not iterable; as `encode` otherwise.
            ValueError: as `encode`.
        """
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TypeError(f"texts must be an iterable of str, got {type(texts).__name__}")
        return [
            self.encode(
                text,
                allowed_special=allowed_special,
                disallowed_special=disallowed_special,
                add_special_tokens=add_special_tokens,
            )
            for text in texts
        ]

    def _split_and_normalize(self, text: str, allowed: AbstractSet[str]) -> list[Segment]:
        """Steps 1 and 2: added tokens matched on the raw text, normalization of the text
        between them, then the ``normalized`` added tokens, themselves normalized."""
        matched = [t for t in self.added_tokens.values() if not t.special or t.content in allowed]
        raw = {t.content: t.id for t in matched if not t.normalized}
        in_normalized = {self.added_token_text(t): t.id for t in matched if t.normalized}
        segments = split_added_tokens([text], raw)
        segments = [s if isinstance(s, int) else normalize(s, self.normal_forms) for s in segments]
        return split_added_tokens(segments, in_normalized)

    def added_token_text(self, token: AddedToken) -> str:
        """The text ``token`` matches: its content, normalized if ``token.normalized``."""
        return normalize(token.content, self.normal_forms) if token.normalized else token.content

    def _encode_text(self, text: str) -> list[int]:
        """Steps 3 and 4 on text that holds no added token."""
        pieces = pre_tokenize(text, self.patterns, self.add_prefix_space)
        return [i for piece in pieces for i in self._encode_piece(piece.encode("utf-8"))]

    def _encode_piece(self, piece: bytes) -> tuple[int, ...]:
        """The ids of one piece: the piece itself if it is a token and ``ignore_merges``,
        else the tokens of `bpe_merge`. Results are cached (they depend on the piece only)."""
        ids = self._piece_cache.get(piece)
        if ids is None:
            if self.ignore_merges and piece in self.vocab:
                ids = (self.vocab[piece],)
            else:
                ids = tuple(self.vocab[part] for part in bpe_merge(piece, self.merges))
            if len(self._piece_cache) >= 100_000:
                self._piece_cache.clear()
            self._piece_cache[piece] = ids
        return ids

    # ---------------------------------------------------------------- decode

    def token_bytes(self, ids: Iterable[int]) -> list[bytes]:
        """The bytes of each id.

        Raises:
            TypeError: a non-int id.
            ValueError: an id outside ``range(vocab_size)`` or of no token (named with its
                position).
        """
        return tokens_of_ids(ids, self.vocab_size, self._bytes_of_id.get)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: their bytes joined and decoded as UTF-8, each maximal invalid
        or incomplete sequence replaced by one U+FFFD. Same errors as `token_bytes`."""
        return b"".join(self.token_bytes(ids)).decode("utf-8", errors="replace")

    # ---------------------------------------------------------------- loading

    @classmethod
    def from_tiktoken(
        cls, ranks: Mapping[bytes, int], pattern: str, special_tokens: Mapping[str, int]
    ) -> BytePairEncoding:
        """The encoding tiktoken builds from mergeable ranks (token bytes -> rank = id), a
        pattern and special tokens (text -> id), as in ``tiktoken.Encoding(...)``.

        tiktoken merges by `merges_from_ranks` and takes a piece that is a token as is
        (``ignore_merges``).
        """
        added = [AddedToken(text, token_id) for text, token_id in special_tokens.items()]
        return cls(
            ranks, merges_from_ranks(ranks), [pattern], added_tokens=added, ignore_merges=True
        )

    @classmethod
    def from_tokenizer_json(cls, source: str | Path | Mapping[str, Any]) -> BytePairEncoding:
        """The encoding of a Hugging Face ``tokenizer.json`` (a path, or the parsed object).

        Supported: a ``BPE`` model over a byte-level vocabulary; pre-tokenizer ``ByteLevel``
        or a ``Sequence`` of ``Split`` (``Isolated``) steps ending in ``ByteLevel``;
        normalizer none, a Unicode normal form or a ``Sequence`` of them; post-processor
        none, ``ByteLevel``, ``TemplateProcessing`` or a ``Sequence`` of them; decoder
        ``ByteLevel``. Padding and truncation are ignored. How added tokens decode follows
        the ``ByteLevel`` decoder: a token whose characters are all in
        `byte_level_alphabet` decodes to the bytes they spell, any other to its UTF-8.

        Raises:
            UnsupportedTokenizerError: anything else (the message names it).
            ValueError: a file that is not a valid tokenizer.json.
        """
        where = "tokenizer.json"
        if isinstance(source, (str, Path)):
            where = str(source)
            data: Mapping[str, Any] = read_json_object(source)
        else:
            data = source
        try:
            return _from_tokenizer_json(data)
        except UnsupportedTokenizerError as exc:
            raise UnsupportedTokenizerError(f"{where}: {exc}") from exc
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"{where} is not a valid tokenizer.json: {exc!r}") from exc


def _compile(pattern: str) -> regex.Pattern[str]:
    """``pattern`` compiled; ValueError naming it if it is not a valid regex."""
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regex: {exc}") from exc


# ------------------------------------------------------------------------------ tokenizer.json


def _from_tokenizer_json(data: Mapping[str, Any]) -> BytePairEncoding:
    """`BytePairEncoding.from_tokenizer_json` on the parsed object, unlabelled errors."""
    model = data["model"]
    _require(model.get("type") == "BPE", f"model type {model.get('type')!r} (only BPE)")
    _require(not model.get("dropout"), f"BPE dropout {model.get('dropout')!r}")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        _require(not model.get(key), f"BPE {key} {model.get(key)!r}")
    normal_forms = _normal_forms(data.get("normalizer"))
    added = [_added_token(entry, normal_forms) for entry in data.get("added_tokens") or []]
    added_ids = {t.id for t in added}
    vocab: dict[bytes, int] = {}
    for spelling, token_id in model["vocab"].items():
        token = byte_level_bytes(spelling)
        if token is None and token_id not in added_ids:
            raise UnsupportedTokenizerError(
                f"vocab token {spelling!r} is not spelled in the byte-level alphabet"
            )
        if token is not None:
            vocab[token] = token_id
    _require(
        all(bytes([b]) in vocab for b in range(256)),
        "a vocab without all 256 single bytes (the library drops or unks the others)",
    )
    merges = {}
    for rank, merge in enumerate(model["merges"]):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        merges[(byte_level_bytes(left), byte_level_bytes(right))] = rank
    _require(None not in {p for pair in merges for p in pair}, "a merge outside the alphabet")
    patterns, add_prefix_space = _pre_tokenizer(data.get("pre_tokenizer"))
    decoder = data.get("decoder") or {}
    _require(decoder.get("type") == "ByteLevel", f"decoder {decoder.get('type')!r}")
    return BytePairEncoding(
        vocab,
        merges,
        patterns,
        added_tokens=added,
        normal_forms=normal_forms,
        add_prefix_space=add_prefix_space,
        ignore_merges=bool(model.get("ignore_merges", False)),
        template=_template(data.get("post_processor")),
    )


def _require(condition: bool, feature: str) -> None:
    """UnsupportedTokenizerError naming ``feature`` unless ``condition``."""
    if not condition:
        raise UnsupportedTokenizerError(f"unsupported: {feature}")


def _added_token(entry: Mapping[str, Any], normal_forms: Sequence[str]) -> AddedToken:
    """One ``added_tokens`` entry; lstrip / rstrip / single_word are not supported.

    It decodes as the ``ByteLevel`` decoder reads its text (`byte_level_decoding`); the
    text of a ``normalized`` token is its normalized content."""
    for flag in ("lstrip", "rstrip", "single_word"):
        _require(not entry.get(flag), f"added token {entry['content']!r} with {flag}")
    content = entry["content"]
    _require(isinstance(content, str) and content != "", f"added token content {content!r}")
    normalized = bool(entry.get("normalized", False))
    return AddedToken(
        content=content,
        id=int(entry["id"]),
        special=bool(entry.get("special", False)),
        normalized=normalized,
        decoded=byte_level_decoding(normalize(content, normal_forms) if normalized else content),
    )


def _pre_tokenizer(spec: Mapping[str, Any] | None) -> tuple[list[str], bool]:
    """(patterns, add_prefix_space) of a ``ByteLevel`` pre-tokenizer, alone or last in a
    ``Sequence`` after ``Split`` steps."""
    _require(spec is not None, "no pre_tokenizer (not byte-level)")
    steps = spec["pretokenizers"] if spec["type"] == "Sequence" else [spec]
    *splits, last = steps
    _require(last["type"] == "ByteLevel", f"pre_tokenizer ending in {last['type']!r}")
    patterns = [_split_pattern(step) for step in splits]
    add_prefix_space = bool(last.get("add_prefix_space", False))
    _require(not (splits and add_prefix_space), "ByteLevel add_prefix_space after a Split")
    if last.get("use_regex", True):
        patterns.append(GPT2_PATTERN)
    return patterns, add_prefix_space


def _split_pattern(step: Mapping[str, Any]) -> str:
    """The regex of a ``Split`` pre-tokenizer step (a ``String`` pattern is literal)."""
    _require(step["type"] == "Split", f"pre_tokenizer step {step['type']!r}")
    _require(step.get("behavior") == "Isolated", f"Split behavior {step.get('behavior')!r}")
    _require(not step.get("invert", False), "Split invert")
    pattern = step["pattern"]
    return pattern["Regex"] if "Regex" in pattern else regex.escape(pattern["String"])


def _normal_forms(spec: Mapping[str, Any] | None) -> list[str]:
    """The Unicode normal forms of a normalizer (none, one, or a ``Sequence``)."""
    if spec is None:
        return []
    steps = spec["normalizers"] if spec["type"] == "Sequence" else [spec]
    for step in steps:
        _require(step["type"] in NORMAL_FORMS, f"normalizer {step['type']!r}")
    return [step["type"] for step in steps]


def _template(spec: Mapping[str, Any] | None) -> tuple[list[int], list[int]]:
    """The ids a post-processor puts before and after a single sequence."""
    if spec is None:
        return [], []
    steps = spec["processors"] if spec["type"] == "Sequence" else [spec]
    before: list[int] = []
    after: list[int] = []
    for step in steps:
        if step["type"] == "ByteLevel":  # changes offsets only
            continue
        _require(step["type"] == "TemplateProcessing", f"post_processor {step['type']!r}")
        seen_text = False
        for item in step["single"]:
            if "Sequence" in item:
                seen_text = True
                continue
            ids = step["special_tokens"][item["SpecialToken"]["id"]]["ids"]
            (after if seen_text else before).extend(ids)
    return before, after


# ------------------------------------------------------------------------------ the Tokenizer


class BPETokenizer(TokenizerBase):
    """A `BytePairEncoding` behind the engine's `Tokenizer` protocol.

    Token strings are spelled as in ``tokenizer.json`` (`byte_level_spelling`; an added
    token is its text), so ``decode`` equals ``convert_tokens_to_string`` of
    ``convert_ids_to_tokens`` and both equal what `HFTokenizer` returns for the same
    checkpoint. ``encode`` turns special-token text into special ids, as `HFTokenizer`
    does.

    Args:
        encoding: the encoding.
        special_tokens: named special tokens (``bos_token``, ``eos_token``, ...; see
            `HFTokenizer`) -> their text, which must be added tokens of ``encoding``.
        chat_templates: one template source, or sources by name.
        model_max_length: the configured context length, or None.

    Raises:
        TypeError: a wrong argument type.
        UnsupportedTokenizerError: a named token that is not an added token.
        ValueError: an unknown special-token name.
    """

    def __init__(
        self,
        encoding: BytePairEncoding,
        *,
        special_tokens: Mapping[str, str | None] | None = None,
        chat_templates: str | Mapping[str, str] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        if not isinstance(encoding, BytePairEncoding):
            raise TypeError(f"encoding must be a BytePairEncoding, got {type(encoding).__name__}")
        self._enc = encoding
        self.special_tokens_map: dict[str, str] = {}
        for name, text in (special_tokens or {}).items():
            if name not in SPECIAL_TOKEN_NAMES:
                raise ValueError(
                    f"special_tokens: unknown name {name!r}, expected one of {SPECIAL_TOKEN_NAMES}"
                )
            if text is None:
                continue
            if text not in encoding.added_tokens:
                raise UnsupportedTokenizerError(
                    f"special_tokens[{name!r}] = {text!r} is not an added token of the encoding"
                )
            self.special_tokens_map[name] = text
        self.chat_templates = normalize_chat_templates(chat_templates)
        self.model_max_length = check_max_length(model_max_length)
        self._special_ids = frozenset(t.id for t in encoding.added_tokens.values() if t.special)
        self._added_by_text = {
            encoding.added_token_text(t): t for t in encoding.added_tokens.values()
        }
        self._spelling = {i: byte_level_spelling(b) for b, i in encoding.vocab.items()}
        self._spelling.update({t.id: text for text, t in self._added_by_text.items()})

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, encoding_class: type[BytePairEncoding] | None = None
    ) -> BPETokenizer:
        """Load ``tokenizer.json`` and, if present, ``tokenizer_config.json`` and the chat
        templates (see `chat.load_chat_templates`) of a checkpoint directory.
        ``encoding_class`` builds the encoding: `BytePairEncoding` by default, or a
        drop-in subclass (pyagent_accel's Rust twin).

        Raises:
            FileNotFoundError: no directory, or no tokenizer.json in it.
            UnsupportedTokenizerError: a tokenizer this reference does not implement, or a
                special token of tokenizer_config.json that tokenizer.json does not list
                (the `tokenizers` library would add it).
            ValueError: a malformed file (the message names it).
        """
        root = Path(model_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"model_dir {str(model_dir)!r} is not a directory")
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"model_dir {str(model_dir)!r} has no tokenizer.json")
        encoding = (encoding_class or BytePairEncoding).from_tokenizer_json(tokenizer_file)
        config_file = root / "tokenizer_config.json"
        config = read_json_object(config_file) if config_file.is_file() else {}
        named = {name: _token_text(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens"))
        extra = list(extra.values()) if isinstance(extra, Mapping) else extra or []
        for text in [*named.values(), *map(_token_text, extra)]:
            if text is not None and text not in encoding.added_tokens:
                raise UnsupportedTokenizerError(
                    f"{config_file}: special token {text!r} is not in tokenizer.json's added_tokens"
                )
        max_length = config.get("model_max_length")
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, (int, float)):
                raise ValueError(
                    f"{config_file}: model_max_length must be a number, got {max_length!r}"
                )
            max_length = None if max_length >= 1e29 else int(max_length)  # 1e30: no limit
        return cls(
            encoding,
            special_tokens=named,
            chat_templates=load_chat_templates(root, config),
            model_max_length=max_length,
        )

    @property
    def encoding(self) -> BytePairEncoding:
        """The underlying `BytePairEncoding`."""
        return self._enc

    @property
    def vocab_size(self) -> int:
        return self._enc.vocab_size

    def _named_id(self, name: str) -> int | None:
        text = self.special_tokens_map.get(name)
        return None if text is None else self._enc.added_tokens[text].id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._enc.encode(text, allowed_special="all", add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        check_flag(skip_special_tokens, "skip_special_tokens")
        ids = check_token_ids(ids, self.vocab_size)
        chunks = self._enc.token_bytes(ids)
        if skip_special_tokens:
            chunks = [c for i, c in zip(ids, chunks, strict=True) if i not in self._special_ids]
        return b"".join(chunks).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return tokens_of_ids(ids, self.vocab_size, self._spelling.get)

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        chunks = []
        for token in self._check_tokens(tokens):
            added = self._added_by_text.get(token)
            chunks.append(byte_level_decoding(token) if added is None else added.decoded_bytes)
        return b"".join(chunks).decode("utf-8", errors="replace")


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` stores it (None, str, or an object
    with ``content``) -> its text."""
    if isinstance(value, Mapping):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"tokenizer_config.json: a special token must be a str, got {value!r}")
    return value
