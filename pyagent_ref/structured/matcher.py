"""The token-level matcher: which tokens may come next, given the grammar and the output so far.

A `GrammarMatcher` follows one request's output. It owns a byte-level parser (an
`EarleyParser`, or anything with its `push` / `pop` / `is_accepting` / `num_bytes` /
`copy` contract) that has read the bytes of the tokens accepted so far, and a `TokenTrie`
of the vocabulary. At each decoding step:

1. `fill_next_token_bitmask` writes the set of allowed next tokens into a row of the
   shared int32 bitmask (`ops.structured.apply_token_bitmask` applies it to the logits).
   It walks the trie in preorder, pushing each node's byte into the parser on the way
   down and popping on the way back; a byte the parser refuses prunes the node's whole
   subtree, so a prefix shared by many tokens is checked once. A token is allowed when
   the parser took all its bytes. EOS is allowed where the bytes so far are a sentence.
2. `accept_token` feeds the sampled token's bytes to the parser (or, for EOS, ends the
   output); `rollback` undoes tokens (rejected speculative drafts).

A token is allowed exactly when the grammar has a sentence that starts with the bytes
accepted so far followed by the token's bytes (the parser's contract: it refuses
precisely the bytes after which no sentence can follow).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from array_api_compat import device

from ..ops._arrays import check_token_bitmask
from .vocab import TokenTrie

__all__ = ["MAX_JUMP_FORWARD_BYTES", "GrammarMatcher", "pack_token_ids"]

MAX_JUMP_FORWARD_BYTES = 4096
"""The most bytes `find_jump_forward_bytes` returns (a grammar may force an endless run)."""


class GrammarMatcher:
    """Allowed next tokens, token acceptance and rollback for one output.

    Args:
        parser: a fresh byte-level parser of the grammar (it is owned and advanced by the
            matcher from now on).
        trie: the `TokenTrie` of the vocabulary (shared by every matcher of it).
        eos_token_ids: the ids that end the output; each is allowed exactly where the
            bytes so far are a whole sentence. Their trie bytes, if any, are not used.
    Raises:
        ValueError: an EOS id outside ``range(trie.vocab_size)``.
    """

    def __init__(self, parser: Any, trie: TokenTrie, eos_token_ids: Iterable[int]) -> None:
        self.trie = trie
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        for token_id in self.eos_token_ids:
            if not 0 <= token_id < trie.vocab_size:
                raise ValueError(
                    f"eos_token_ids holds {token_id}, outside the vocab of {trie.vocab_size}"
                )
        self._parser = parser
        self._lengths: list[int] = []  # bytes of each accepted token (EOS: 0)
        self._terminated = False

    # ---------------------------------------------------------------- the state

    def is_terminated(self) -> bool:
        """Whether an EOS token was accepted: the output is complete, no token is allowed."""
        return self._terminated

    def num_accepted_tokens(self) -> int:
        """How many tokens `accept_token` took and `rollback` did not undo."""
        return len(self._lengths)

    def copy(self) -> GrammarMatcher:
        """An independent matcher in the same state (e.g. to try draft tokens)."""
        clone = object.__new__(GrammarMatcher)
        clone.trie, clone.eos_token_ids = self.trie, self.eos_token_ids
        clone._parser = self._parser.copy()
        clone._lengths = list(self._lengths)
        clone._terminated = self._terminated
        return clone

    # ---------------------------------------------------------------- advancing

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False, and no change, if the grammar does not allow it.

        An EOS token is accepted where the bytes so far are a sentence, and terminates
        the matcher; after that every token is refused. A special token (no bytes) that
        is not an EOS is always refused.

        Raises:
            ValueError: a token id outside ``range(vocab_size)``.
        """
        if not 0 <= token_id < self.trie.vocab_size:
            raise ValueError(f"token_id must be in [0, {self.trie.vocab_size}), got {token_id}")
        if self._terminated:
            return False
        if token_id in self.eos_token_ids:
            if not self._parser.is_accepting():
                return False
            self._terminated = True
            self._lengths.append(0)
            return True
        spelled = self.trie.token_bytes[token_id]
        if not spelled:
            return False
        for pushed, byte in enumerate(spelled):
            if not self._parser.push(byte):
                self._parser.pop(pushed)
                return False
        self._lengths.append(len(spelled))
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (an undone EOS un-terminates).

        Raises:
            ValueError: `num_tokens` negative or more than the tokens accepted.
        """
        if not 0 <= num_tokens <= len(self._lengths):
            raise ValueError(
                f"num_tokens must be in [0, {len(self._lengths)}] (tokens accepted), "
                f"got {num_tokens}"
            )
        for _ in range(num_tokens):
            length = self._lengths.pop()
            if self._terminated:  # the last accepted token was the EOS
                self._terminated = False
            else:
                self._parser.pop(length)

    # ---------------------------------------------------------------- next tokens

    def allowed_tokens(self) -> list[int]:
        """The ids allowed next, in increasing order (none once terminated)."""
        if self._terminated:
            return []
        trie, parser = self.trie, self._parser
        allowed: list[int] = []
        base = parser.num_bytes()
        node = 1  # node 0 is the root: the empty prefix, already in the parser
        while node < len(trie):
            # the parser holds the prefix of node's parent: undo the bytes below it
            extra = parser.num_bytes() - base - (trie.depth[node] - 1)
            if extra:
                parser.pop(extra)
            if parser.push(trie.byte[node]):
                allowed.extend(trie.tokens[node])
                node += 1  # down to the first child, or on to the next subtree
            else:
                node = trie.subtree_end[node]  # no token starting so can follow
        parser.pop(parser.num_bytes() - base)
        if parser.is_accepting():
            allowed.extend(self.eos_token_ids)
        return sorted(set(allowed))

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        """Write the allowed next tokens into row `index` of `bitmask`, in place.

        The layout is `ops.structured`'s: bit ``i % 32`` of word ``i // 32`` set iff token
        i is allowed (`allowed_tokens`); the row's bits past the vocabulary are cleared.

        Args:
            bitmask: int32 numpy array or torch tensor of shape (batch, words), words >=
                ceil(vocab_size / 32).
            index: the row to write, in ``range(batch)``.
        Raises:
            TypeError, ValueError: a bitmask of another dtype or shape, or a bad index.
        """
        xp = check_token_bitmask(bitmask)
        batch, words = bitmask.shape
        need = -(-self.trie.vocab_size // 32)
        if words < need:
            raise ValueError(
                f"bitmask must have at least {need} words per row for a vocab of "
                f"{self.trie.vocab_size}, got shape {tuple(bitmask.shape)}"
            )
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < batch:
            raise ValueError(f"index must be an int in [0, {batch}), got {index!r}")
        row = pack_token_ids(self.allowed_tokens(), words)
        bitmask[index, :] = xp.asarray(row, device=device(bitmask))

    def find_jump_forward_bytes(self) -> bytes:
        """The bytes the grammar forces next: the longest run of bytes, each the only one the
        parser takes, stopping where the bytes so far are a sentence (the output could end
        there) or after `MAX_JUMP_FORWARD_BYTES`. Empty once terminated. The matcher is
        left unchanged; an engine may tokenize the bytes and accept them without sampling.
        """
        if self._terminated:
            return b""
        parser, forced = self._parser, bytearray()
        while len(forced) < MAX_JUMP_FORWARD_BYTES and not parser.is_accepting():
            options = _viable_bytes(parser)
            if len(options) != 1:
                break
            parser.push(options[0])
            forced.append(options[0])
        parser.pop(len(forced))
        return bytes(forced)


def _viable_bytes(parser: Any) -> list[int]:
    """The bytes the parser would take next (it is left unchanged)."""
    found = []
    for byte in range(256):
        if parser.push(byte):
            parser.pop(1)
            found.append(byte)
    return found


def pack_token_ids(token_ids: Iterable[int], words: int) -> np.ndarray:
    """The (words,) int32 bitmask row that allows exactly `token_ids` (each < 32 * words)."""
    ids = np.fromiter(token_ids, dtype=np.int64)
    row = np.zeros(words, np.uint32)
    np.bitwise_or.at(row, ids >> 5, (np.uint32(1) << (ids & 31).astype(np.uint32)))
    return row.view(np.int32)
