"""The vocabulary's token trie in Rust: `pyagent_ref.structured.vocab.TokenTrie`'s twin.

The trie is built once per vocabulary and shared, read-only, by every matcher of it,
in any thread; it also keeps the cache of mask slices (the part of a mask that depends
only on the lexemes in progress), so matchers of one vocabulary share that work.
Nodes are numbered as the reference's (the same preorder layout); the per-node arrays
(``byte``, ``depth``, ``subtree_end``, ``tokens``) stay in Rust, `prefix` and `children`
read them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .. import _native

__all__ = ["TokenTrie"]


class TokenTrie:
    """The tokens of a vocabulary in a trie over their bytes (the reference's layout).

    Args:
        token_bytes: id -> the token's bytes, or None (a special token, or no token),
            as `pyagent_ref.structured.vocab.token_bytes` returns.
    Raises:
        TypeError: an entry that is neither bytes nor None.
    Attributes:
        token_bytes: the list the trie was built from.
        vocab_size: its length.
    """

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.token_bytes = list(token_bytes)
        self.vocab_size = len(self.token_bytes)
        self._core = _native.TokenTrieCore(self.token_bytes)

    def __len__(self) -> int:
        """The number of nodes, the root included."""
        return len(self._core)

    def prefix(self, node: int) -> bytes:
        """The bytes from the root to `node` (nodes are numbered as the reference's)."""
        return self._core.prefix(node)

    def children(self, node: int) -> Iterator[int]:
        """The children of `node`, in increasing byte order."""
        return iter(self._core.children(node))
