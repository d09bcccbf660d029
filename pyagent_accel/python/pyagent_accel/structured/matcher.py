"""The token-level matcher in Rust: `pyagent_ref.structured.matcher.GrammarMatcher`'s twin.

Same methods, results and exceptions as the reference (its docstrings are the
contract). A mask is computed in Rust with the GIL released (see ``src/grammar/walk.rs``
for how) and written straight into a row of the bitmask: an int32 numpy array or torch
CPU tensor (a tensor on another device is a TypeError, never copied silently).

Differences from the reference: the matcher takes a *copy* of the parser's state (the
reference advances the parser object it is given), and only this package's
`EarleyParser` and `TokenTrie` are accepted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import _native
from ..ops import _common as _c
from .earley import EarleyParser
from .vocab import TokenTrie

__all__ = ["MAX_JUMP_FORWARD_BYTES", "GrammarMatcher"]

MAX_JUMP_FORWARD_BYTES = 4096
"""The most bytes `find_jump_forward_bytes` returns (a grammar may force an endless run)."""


class GrammarMatcher:
    """Allowed next tokens, token acceptance and rollback for one output.

    Args:
        parser: an `EarleyParser` of the grammar (its current state is copied).
        trie: the `TokenTrie` of the vocabulary (shared by every matcher of it).
        eos_token_ids: the ids that end the output; each is allowed exactly where the
            bytes so far are a whole sentence.
    Raises:
        TypeError: a parser or trie of another kind.
        ValueError: an EOS id outside ``range(trie.vocab_size)``.
    """

    def __init__(self, parser: EarleyParser, trie: TokenTrie, eos_token_ids: Iterable[int]) -> None:
        if not isinstance(parser, EarleyParser):
            raise TypeError(
                "parser must be a pyagent_accel.structured.EarleyParser, "
                f"got {type(parser).__name__}"
            )
        if not isinstance(trie, TokenTrie):
            raise TypeError(
                f"trie must be a pyagent_accel.structured.TokenTrie, got {type(trie).__name__}"
            )
        self.trie = trie
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self._core = _native.MatcherCore(parser._core, trie._core, list(self.eos_token_ids))

    def is_terminated(self) -> bool:
        """Whether an EOS token was accepted: the output is complete, no token is allowed."""
        return self._core.is_terminated()

    def num_accepted_tokens(self) -> int:
        """How many tokens `accept_token` took and `rollback` did not undo."""
        return self._core.num_accepted_tokens()

    def copy(self) -> GrammarMatcher:
        """An independent matcher in the same state."""
        clone = object.__new__(GrammarMatcher)
        clone.trie, clone.eos_token_ids = self.trie, self.eos_token_ids
        clone._core = self._core.copy()
        return clone

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False, and no change, if the grammar does not allow it.

        Raises:
            ValueError: a token id outside ``range(vocab_size)``.
        """
        return self._core.accept_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (an undone EOS un-terminates).

        Raises:
            ValueError: `num_tokens` negative or more than the tokens accepted.
        """
        self._core.rollback(num_tokens)

    def allowed_tokens(self) -> list[int]:
        """The ids allowed next, in increasing order (none once terminated)."""
        return self._core.allowed_tokens()

    def fill_next_token_bitmask(self, bitmask: Any, index: int = 0) -> None:
        """Write the allowed next tokens into row `index` of `bitmask`, in place.

        Args:
            bitmask: int32 numpy array or torch CPU tensor of shape (batch, words),
                words >= ceil(vocab_size / 32).
            index: the row to write, in ``range(batch)``.
        Raises:
            TypeError: another dtype or array library, or a tensor not on the CPU.
            ValueError: a bitmask of another shape, or a bad index.
        """
        torch_in = _c.bitmask_library(bitmask)
        batch, words = bitmask.shape
        need = -(-self.trie.vocab_size // 32)
        if words < need:
            raise ValueError(
                f"bitmask must have at least {need} words per row for a vocab of "
                f"{self.trie.vocab_size}, got shape {tuple(bitmask.shape)}"
            )
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < batch:
            raise ValueError(f"index must be an int in [0, {batch}), got {index!r}")
        if torch_in:
            _c.check_cpu(bitmask, "bitmask")
            bitmask = _c.tensor_to_numpy(bitmask)
        self._core.fill_next_token_bitmask(bitmask, index)

    def find_jump_forward_bytes(self) -> bytes:
        """The bytes the grammar forces next (the reference's contract); the matcher is
        left unchanged."""
        return self._core.find_jump_forward_bytes()
