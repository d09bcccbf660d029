"""Per-group block bookkeeping: one manager per KV cache group, by attention type.

Each manager owns the block lists of its group (request id -> blocks, in token order)
and answers the two questions that differ between attention types:
  - `find_longest_cache_hit`: the longest prefix, in blocks, whose cached blocks give
    this group everything it needs to continue from there;
  - `remove_skipped_blocks`: which blocks a request will never read again (they go
    back to the pool and the null block takes their place in the block table).

A state group (`MambaSpec`) has its own pool of slots: `MambaManager` gives each request
one slot for its whole life and never caches or skips anything.

A lookup may fall back to the KV offload tiers (`offloaded`): a block missing from the
device cache but held there stands in the hit as the `OffloadedBlock` it returns, for
the manager to bring back (`KVCacheManager.get_computed_blocks`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .block import BlockContent, KVCacheBlock
from .block_pool import BlockPool
from .specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

ContentOf = Callable[[int], BlockContent]
# (group id, block content) -> an OffloadedBlock the offload tiers hold, or None
OffloadLookup = Callable[[int, BlockContent], Any]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeManager:
    """Full attention (and MLA, which caches like it): every block stays needed and a
    hit is the longest run of cached blocks from the start."""

    caches_prefix = True
    skips_blocks = False
    uses_state_pool = False  # a state group's slots come from a pool of their own

    def __init__(self, spec: KVCacheSpec, pool: BlockPool, group_id: int) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.pool = pool
        self.group_id = group_id
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached: dict[str, int] = {}  # full blocks of the request already cached

    def cached_block(
        self,
        hashes: Sequence[bytes],
        content_of: ContentOf,
        i: int,
        offloaded: OffloadLookup | None = None,
    ) -> KVCacheBlock | None:
        """The device block caching block i of the request, else what `offloaded`
        finds for it in the offload tiers, else None."""
        content = content_of(i)
        block = self.pool.get_cached_block(hashes[i], content, self.group_id)
        if block is None and offloaded is not None:
            return offloaded(self.group_id, content)
        return block

    def find_longest_cache_hit(
        self,
        hashes: Sequence[bytes],
        max_blocks: int,
        content_of: ContentOf,
        offloaded: OffloadLookup | None = None,
    ) -> list[KVCacheBlock]:
        """Blocks of the longest valid hit of at most `max_blocks` blocks."""
        hit: list[KVCacheBlock] = []
        for i in range(min(max_blocks, len(hashes))):
            block = self.cached_block(hashes, content_of, i, offloaded)
            if block is None:
                break
            hit.append(block)
        return hit

    def tokens_to_hold(self, num_tokens: int, num_encoder_tokens: int) -> int:
        """How many tokens of KV the group keeps for a sequence of `num_tokens` tokens."""
        return num_tokens

    def max_blocks_held(self, num_tokens: int, step_tokens: int) -> int:
        """The most blocks a request (no encoder) holds at once while it grows to
        `num_tokens` tokens by steps of at most `step_tokens` tokens."""
        return cdiv(self.tokens_to_hold(num_tokens, 0), self.block_size)

    def blocks_needed(self, request_id: str, num_tokens: int) -> int:
        """New blocks to hold `num_tokens` tokens, given the blocks the request has."""
        return max(
            0, cdiv(num_tokens, self.block_size) - len(self.req_to_blocks.get(request_id, ()))
        )

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Full attention reads every earlier token: nothing is ever skipped."""

    def add_computed_blocks(self, request_id: str, blocks: Sequence[KVCacheBlock]) -> None:
        """Attach prefix-hit blocks (already touched) to a request that has no blocks yet."""
        self.req_to_blocks.setdefault(request_id, []).extend(blocks)
        self.num_cached[request_id] = len(self.req_to_blocks[request_id])

    def allocate(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        new = self.pool.get_new_blocks(self.blocks_needed(request_id, num_tokens))
        self.req_to_blocks.setdefault(request_id, []).extend(new)
        return new

    def cache_blocks(
        self, request_id: str, num_full: int, hashes: Sequence[bytes], content_of: ContentOf
    ) -> None:
        """Enter the request's first `num_full` blocks (those with hashes) in the cache."""
        blocks = self.req_to_blocks.get(request_id, [])
        start = self.num_cached.get(request_id, 0)
        end = min(num_full, len(hashes), len(blocks))
        if end <= start:
            return
        idx = range(start, end)
        self.pool.cache_full_blocks(
            [blocks[i] for i in idx],
            [hashes[i] for i in idx],
            [content_of(i) for i in idx],
            self.block_size,
            self.group_id,
        )
        self.num_cached[request_id] = end

    def uncache_blocks(self, request_id: str, first_block: int) -> None:
        """Take the request's blocks from `first_block` on out of the prefix cache (their
        KV was never written); they are cached again once full of computed tokens."""
        blocks = self.req_to_blocks.get(request_id, [])
        self.pool.uncache(blocks[first_block:])
        if self.num_cached.get(request_id, 0) > first_block:
            self.num_cached[request_id] = first_block

    def free_tail(self, request_id: str, num_blocks: int) -> int:
        """Release the request's blocks past its first `num_blocks` (never cached: they
        held only slots of rejected drafts), last first; returns how many it keeps."""
        blocks = self.req_to_blocks.get(request_id, [])
        tail = blocks[num_blocks:]
        del blocks[num_blocks:]
        self.pool.free_blocks(reversed(tail))
        return len(blocks)

    def free(self, request_id: str) -> None:
        """Release the request's blocks, last block first (so its head is evicted last)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached.pop(request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def _skip_before(self, request_id: str, first_needed_block: int) -> None:
        """Swap blocks before `first_needed_block` for the null block and free them."""
        blocks = self.req_to_blocks.get(request_id, [])
        freed = []
        for i in range(min(first_needed_block, len(blocks)) - 1, -1, -1):
            if blocks[i].is_null:
                break  # everything before was skipped already
            freed.append(blocks[i])
            blocks[i] = self.pool.null_block
        self.pool.free_blocks(freed)


class SlidingWindowManager(SingleTypeManager):
    """Token t attends to tokens (t - window, t]: only the last window is needed."""

    skips_blocks = True

    spec: SlidingWindowSpec

    def find_longest_cache_hit(
        self,
        hashes: Sequence[bytes],
        max_blocks: int,
        content_of: ContentOf,
        offloaded: OffloadLookup | None = None,
    ) -> list[KVCacheBlock]:
        """A hit of n blocks needs only blocks inside the window of token n * B; earlier
        ones are null. Scans from the longest candidate down to find such a run."""
        max_blocks = min(max_blocks, len(hashes))
        needed = cdiv(self.spec.sliding_window - 1, self.block_size)
        hit = [self.pool.null_block] * max_blocks
        if needed == 0:
            return hit
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            block = self.cached_block(hashes, content_of, i, offloaded)
            if block is None:
                run = 0
                continue
            hit[i] = block
            run += 1
            if run >= needed:
                return hit[: i + run]
        return hit[:run]  # a run reaching block 0 is valid however short

    def max_blocks_held(self, num_tokens: int, step_tokens: int) -> int:
        """Before a step from c computed tokens, the blocks before token c - window + 1
        are freed: the rest hold window - 1 + step tokens, starting anywhere in their
        first block."""
        span = self.spec.sliding_window - 1 + step_tokens + self.block_size - 1
        return min(super().max_blocks_held(num_tokens, step_tokens), cdiv(span, self.block_size))

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        first_needed_token = max(0, num_computed_tokens - self.spec.sliding_window + 1)
        self._skip_before(request_id, first_needed_token // self.block_size)


class ChunkedLocalManager(SingleTypeManager):
    """Tokens attend within chunks of C tokens: blocks of earlier chunks are not needed."""

    skips_blocks = True

    spec: ChunkedLocalAttentionSpec

    def find_longest_cache_hit(
        self,
        hashes: Sequence[bytes],
        max_blocks: int,
        content_of: ContentOf,
        offloaded: OffloadLookup | None = None,
    ) -> list[KVCacheBlock]:
        """A hit of n blocks needs the blocks of the chunk that token n * B falls in,
        from the chunk's start up to block n - 1; earlier chunks are null."""
        per_chunk = self.spec.attention_chunk_size // self.block_size
        for n in range(min(max_blocks, len(hashes)), 0, -1):
            start = (n // per_chunk) * per_chunk
            run = [self.cached_block(hashes, content_of, i, offloaded) for i in range(start, n)]
            if all(b is not None for b in run):
                return [self.pool.null_block] * start + run  # type: ignore[list-item]
        return []

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        chunk = self.spec.attention_chunk_size
        self._skip_before(request_id, (num_computed_tokens // chunk) * chunk // self.block_size)


class CrossAttentionManager(SingleTypeManager):
    """Encoder KV: allocated for the encoder length, never shared, never skipped."""

    caches_prefix = False

    def tokens_to_hold(self, num_tokens: int, num_encoder_tokens: int) -> int:
        return num_encoder_tokens

    def cache_blocks(self, request_id: str, num_full: int, hashes, content_of) -> None:
        """Encoder outputs depend on the whole input, not a token prefix: never cached."""


class MambaManager(SingleTypeManager):
    """A state group: each request holds one slot of the group's own pool (`pool` is the
    state pool, not the blocks' one) from its first allocation until it is freed
    (finished, aborted or preempted), however many tokens it has. Nothing is cached: the
    slot holds the state after the request's last token only (see `MambaSpec`)."""

    caches_prefix = False
    uses_state_pool = True

    def tokens_to_hold(self, num_tokens: int, num_encoder_tokens: int) -> int:
        return 0  # no blocks of the shared pool; `slots_needed` counts the slot

    def max_blocks_held(self, num_tokens: int, step_tokens: int) -> int:
        return 0

    def slots_needed(self, request_id: str) -> int:
        """1 for a request without its slot yet, else 0."""
        return 0 if self.req_to_blocks.get(request_id) else 1

    def allocate(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """The request's slot if it has none yet (a list of it), else nothing."""
        if not self.slots_needed(request_id):
            return []
        return super().allocate(request_id, self.block_size)

    def cache_blocks(self, request_id: str, num_full: int, hashes, content_of) -> None:
        """A slot holds the state after the last token only: never cached."""

    def uncache_blocks(self, request_id: str, first_block: int) -> None:
        """Nothing is ever cached."""

    def free_tail(self, request_id: str, num_blocks: int) -> int:
        """The slot stays: a state has no tail to give back (rolling a state back past
        rejected drafts is not implemented, so speculative decoding is refused for models
        with state layers)."""
        return len(self.req_to_blocks.get(request_id, ()))


def make_manager(spec: KVCacheSpec, pool: BlockPool, group_id: int) -> SingleTypeManager:
    """The manager class for a spec (MLA caches exactly like full attention); a
    `MambaSpec` group's `pool` is the state pool."""
    if isinstance(spec, MambaSpec):
        return MambaManager(spec, pool, group_id)
    for spec_type, cls in (
        (SlidingWindowSpec, SlidingWindowManager),
        (ChunkedLocalAttentionSpec, ChunkedLocalManager),
        (CrossAttentionSpec, CrossAttentionManager),
    ):
        if isinstance(spec, spec_type):
            return cls(spec, pool, group_id)
    return SingleTypeManager(spec, pool, group_id)
