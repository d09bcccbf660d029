"""KV cache blocks and the intrusive doubly linked list that queues free ones.

A block is a fixed-size slab of KV memory (`block_size` token slots in every layer of
its group). The pool never moves blocks: it hands out their ids. A block carries the
links of the one list it may be in, so putting a block in a list, taking it out from
the middle, and popping the oldest are all O(1) without any search — the property the
allocator needs when a prefix hit pulls a free block back into use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockContent:
    """What a cached block holds, kept to verify a hash hit (a collision is a miss).

    The chain makes a block's hash depend on every earlier token, so checking the
    parent hash, this block's tokens and its extra keys verifies the whole prefix.
    """

    parent_hash: bytes
    token_ids: tuple[int, ...]
    extra_keys: tuple[tuple, ...]


@dataclass(eq=False)
class KVCacheBlock:
    """One physical KV block.

    Attributes:
        block_id: index into the KV tensors, 0 <= block_id < num_blocks.
        ref_cnt: the number of live requests whose block table holds this block.
        block_hash: set while the block is in the prefix cache (full and hashed).
        group_id: the KV cache group whose layers the cached content belongs to (the
            prefix cache is keyed by (group_id, block_hash)).
        content: what was hashed, to verify hits; set together with block_hash.
        reused: the cached content was asked for again (a prefix hit, or a hash that
            the eviction policy remembered); ARC keeps such blocks longer.
        cached_at: time the content was cached (for residency metrics).
        is_null: the reserved block 0 that stands for "no block" in block tables.
        prev, next, owner: links of the list the block is in, and that list.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    group_id: int = 0
    content: BlockContent | None = None
    reused: bool = False
    cached_at: float = 0.0
    is_null: bool = False
    prev: KVCacheBlock | None = field(default=None, repr=False)
    next: KVCacheBlock | None = field(default=None, repr=False)
    owner: BlockList | None = field(default=None, repr=False)

    @property
    def cache_key(self) -> tuple[int, bytes] | None:
        return None if self.block_hash is None else (self.group_id, self.block_hash)

    def reset_hash(self) -> None:
        """Forget the cached content (the block is about to be reused)."""
        self.block_hash = None
        self.content = None
        self.reused = False


class BlockList:
    """An intrusive doubly linked list of blocks, oldest at the head.

    `append`, `appendleft`, `popleft` and `remove` are O(1); a block is in at most one
    list at a time (its `prev`/`next` links belong to that list). Sentinel head and
    tail nodes remove every empty-list special case.
    """

    def __init__(self, blocks: list[KVCacheBlock] | tuple[KVCacheBlock, ...] = ()) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: KVCacheBlock) -> bool:
        return block.owner is self

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self._head.next
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next

    def peekleft(self) -> KVCacheBlock:
        """The oldest block, left in place. IndexError when empty."""
        if not self._len:
            raise IndexError("peek from an empty block list")
        assert self._head.next is not None
        return self._head.next

    def popleft(self) -> KVCacheBlock:
        """Remove and return the oldest block. IndexError when empty."""
        block = self.peekleft()
        self.remove(block)
        return block

    def append(self, block: KVCacheBlock) -> None:
        """Insert `block` as the newest."""
        self._link(block, self._tail.prev, self._tail)

    def appendleft(self, block: KVCacheBlock) -> None:
        """Insert `block` as the oldest (it will be popped first)."""
        self._link(block, self._head, self._head.next)

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from this list in O(1). ValueError if it is not in this list."""
        if block.owner is not self:
            raise ValueError(f"block {block.block_id} is not in this list")
        assert block.prev is not None and block.next is not None
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = block.owner = None
        self._len -= 1

    def _link(
        self, block: KVCacheBlock, before: KVCacheBlock | None, after: KVCacheBlock | None
    ) -> None:
        if block.owner is not None:
            raise ValueError(f"block {block.block_id} is already in a list")
        assert before is not None and after is not None
        block.prev, block.next, block.owner = before, after, self
        before.next = after.prev = block
        self._len += 1
