"""The block pool: every physical KV block, who holds it, and what it caches.

Life of a block:
    free, clean --get_new_blocks--> in use --cache_full_blocks--> in use, cached
    in use, cached --free_blocks (ref_cnt 0)--> free, cached (still hit-able)
    free, cached --touch (prefix hit)--> in use, cached
    free, cached --get_new_blocks (chosen as victim)--> hash evicted, in use
    in use, cached --uncache (its KV never written)--> in use
Cached content is evicted lazily: only when its block is handed out again.

Which free block is handed out (the eviction order):
    1. blocks holding no cached content, oldest freed first;
    2. otherwise the eviction policy's victim among free cached blocks — LRU (the
       default): least recently freed first; ARC: see `eviction.ARCPolicy`.
`KVCacheManager.free` releases a request's blocks tail first, so when a request ends
its last blocks are evicted before its first ones and shared prefixes live longest.

Block 0 is the null block: it stands for "no block" in block tables (e.g. blocks a
sliding window no longer needs), is never handed out and never freed.

`on_evict`, when set, sees every cached block just before its content is evicted,
while its KV is still intact (nothing writes a block before the step that runs after
it is handed out): the KV offload stores it there (`KVCacheManager.enable_offload`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from .block import BlockContent, BlockList, KVCacheBlock
from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, PrefixCacheStats
from .eviction import make_policy


class BlockPool:
    """A fixed set of `num_blocks` KV blocks (block 0 reserved) with a prefix cache.

    Args:
        num_blocks: total blocks including the null block, >= 2.
        enable_caching: keep full blocks in the prefix cache after they are freed.
        eviction: "lru" or "arc".
        enable_events: record `KVCacheEvent`s, drained by `take_events`.
        clock: time source for residency metrics.
    """

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        eviction: str = "lru",
        enable_events: bool = False,
        clock=time.monotonic,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 2:
            raise ValueError(
                f"num_blocks must be an int >= 2 (one is the null block), got {num_blocks!r}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.is_null = True
        self._clean = BlockList(self.blocks[1:])
        self._policy = make_policy(eviction, num_blocks, BlockList, lambda b: b.cache_key)
        self._cached: dict[tuple[int, bytes], KVCacheBlock] = {}
        self._events: list[KVCacheEvent] | None = [] if enable_events else None
        self._clock = clock
        self.stats = PrefixCacheStats()
        self.on_evict: Callable[[KVCacheBlock], None] | None = None

    # --- queries -----------------------------------------------------------------------

    @property
    def eviction(self) -> str:
        return self._policy.name

    @property
    def num_free_blocks(self) -> int:
        return len(self._clean) + len(self._policy)

    @property
    def usage(self) -> float:
        """Fraction of allocatable blocks in use, in [0, 1]."""
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)

    def free_block_order(self) -> list[KVCacheBlock]:
        """The free blocks in the order `get_new_blocks` would hand them out (LRU)."""
        return [*self._clean, *self._policy]

    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def get_cached_block(
        self, block_hash: bytes, content: BlockContent, group_id: int = 0
    ) -> KVCacheBlock | None:
        """The block caching `block_hash` for `group_id`, if its content equals `content`.

        A hash match whose content differs is a collision: it is counted in
        `stats.collisions` and treated as a miss, so wrong KV is never reused.
        """
        block = self._cached.get((group_id, block_hash))
        if block is None:
            return None
        if block.content != content:
            self.stats.collisions += 1
            return None
        return block

    # --- transitions -------------------------------------------------------------------

    def get_new_blocks(self, num: int) -> list[KVCacheBlock]:
        """Hand out `num` free blocks with ref_cnt 1, evicting cached content if needed.

        Raises:
            ValueError: num is negative or more than `num_free_blocks`.
        """
        if num < 0 or num > self.num_free_blocks:
            raise ValueError(f"cannot get {num} blocks, {self.num_free_blocks} are free")
        out = []
        for _ in range(num):
            block = self._clean.popleft() if self._clean else self._policy.pop()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cached blocks found by a prefix hit (pulling free ones
        out of the free set), and mark them reused."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self._policy.take(block)
            block.ref_cnt += 1
            block.reused = True

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block, in the given order; blocks reaching 0 become
        free in that order (the first one freed is evicted first)."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} is already free")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self._clean.append(block)
                else:
                    self._policy.push(block, block.cache_key, block.reused)

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        hashes: Sequence[bytes],
        contents: Sequence[BlockContent],
        block_size: int,
        group_id: int = 0,
    ) -> None:
        """Enter full, in-use blocks of a group into the prefix cache under their hashes.

        Blocks already cached are skipped. If another block already caches the same
        hash (two requests computed the same prefix at once), this block stays
        uncached and is simply freed later; the first copy keeps serving hits.
        """
        if not self.enable_caching:
            return
        stored: list[bytes] = []
        tokens: list[int] = []
        parent = None
        for block, block_hash, content in zip(blocks, hashes, contents, strict=True):
            key = (group_id, block_hash)
            if block.block_hash is not None or block.is_null or key in self._cached:
                continue
            block.block_hash, block.group_id, block.content = block_hash, group_id, content
            block.reused = self._policy.readmit(key)
            block.cached_at = self._clock()
            self._cached[key] = block
            if not stored:
                parent = content.parent_hash
            stored.append(block_hash)
            tokens.extend(content.token_ids)
        if stored and self._events is not None:
            lora = next((key[1] for key in contents[0].extra_keys if key[0] == "lora"), None)
            event = BlockStored(tuple(stored), parent, tuple(tokens), block_size, lora_id=lora)
            self._events.append(event)

    def uncache(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take in-use blocks out of the prefix cache, for blocks whose KV was never
        written (the step that was to compute it failed).

        Their hashes are forgotten at once: they are never a hit again, and when freed
        they join the blocks holding no cached content, so their eviction does not reach
        `on_evict` (nothing is offloaded). Blocks not cached (the null block too) are
        skipped.

        Raises:
            ValueError: a cached block is free (its content may already have been hit).
        """
        removed = []
        for block in blocks:
            if block.block_hash is None:
                continue
            if block.ref_cnt == 0:
                raise ValueError(f"block {block.block_id} is free; only in-use blocks uncache")
            del self._cached[(block.group_id, block.block_hash)]
            removed.append(block.block_hash)
            block.reset_hash()
        if removed and self._events is not None:
            self._events.append(BlockRemoved(tuple(removed)))

    def reset_prefix_cache(self) -> bool:
        """Forget all cached content. Only possible when no block is in use; returns
        whether it happened."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        for block in list(self._policy):
            self._policy.take(block)
            block.reset_hash()
            self._clean.append(block)
        self._cached.clear()
        if self._events is not None:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """The events recorded since the last call (empty if events are disabled)."""
        if self._events is None:
            return []
        events, self._events = self._events, []
        return events

    def _evict(self, block: KVCacheBlock) -> None:
        assert block.cache_key is not None and block.block_hash is not None
        if self.on_evict is not None:
            self.on_evict(block)
        del self._cached[block.cache_key]
        self.stats.evictions += 1
        self.stats.residency.record(self._clock() - block.cached_at)
        if self._events is not None:
            self._events.append(BlockRemoved((block.block_hash,)))
        block.reset_hash()
