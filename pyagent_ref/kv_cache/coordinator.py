"""The coordinator: one single-type manager per KV cache group, one shared pool.

For a hybrid model (say full attention plus sliding window layers) a prefix hit must be
valid for every group at once. Each group's `find_longest_cache_hit` returns the longest
hit it can serve up to a bound, so the coordinator lowers the bound group by group until
no group lowers it further: the result is the longest hit valid for all groups.

A state group (`MambaSpec`) takes its slots from a pool of its own (`state_pool`, of
`KVCacheConfig.num_state_slots`): `blocks_needed` counts the shared pool's blocks and
`slots_needed` the state pool's slots.
"""

from __future__ import annotations

from collections.abc import Sequence

from .block import KVCacheBlock
from .block_pool import BlockPool
from .single_type import ContentOf, OffloadLookup, SingleTypeManager, cdiv, make_manager
from .specs import KVCacheConfig, MambaSpec

GroupBlocks = tuple[list[KVCacheBlock], ...]


class KVCacheCoordinator:
    """Routes request-level block operations to every group's manager."""

    def __init__(self, config: KVCacheConfig, pool: BlockPool) -> None:
        self.config = config
        self.pool = pool
        self.block_size = config.block_size
        self.state_pool = None
        if config.num_state_slots:
            self.state_pool = BlockPool(config.num_state_slots, enable_caching=False)
        self.managers: list[SingleTypeManager] = [
            make_manager(
                group.spec, self.state_pool if isinstance(group.spec, MambaSpec) else pool, gid
            )
            for gid, group in enumerate(config.groups)
        ]
        # Only window-like attention ever skips blocks; the rest need no call per step.
        self._skipping = [m for m in self.managers if m.skips_blocks]

    def find_longest_cache_hit(
        self,
        hashes: Sequence[bytes],
        max_blocks: int,
        content_of: ContentOf,
        offloaded: OffloadLookup | None = None,
    ) -> tuple[GroupBlocks, int]:
        """(blocks per group, hit length in blocks) of the longest hit valid for all
        groups; with `offloaded`, blocks the offload tiers hold count as cached and stand
        in the hit as the placeholders it returns."""
        caching = [m for m in self.managers if m.caches_prefix]
        bound = min(max_blocks, len(hashes)) if caching else 0
        while True:
            hits = {
                id(m): m.find_longest_cache_hit(hashes, bound, content_of, offloaded)
                for m in caching
            }
            new_bound = min((len(h) for h in hits.values()), default=0)
            if new_bound == bound:
                return tuple(hits.get(id(m), [])[:bound] for m in self.managers), bound
            bound = new_bound

    def blocks_needed(
        self,
        request_id: str,
        num_tokens: int,
        num_encoder_tokens: int,
        new_computed: GroupBlocks | None,
    ) -> int:
        """Free blocks that admitting `new_computed` and growing to `num_tokens` consumes:
        new blocks, plus computed-hit blocks that are free now (touching takes them)."""
        total = 0
        for i, manager in enumerate(self.managers):
            if manager.uses_state_pool:
                continue
            tokens = manager.tokens_to_hold(num_tokens, num_encoder_tokens)
            have = len(manager.req_to_blocks.get(request_id, ()))
            if new_computed:
                hit = new_computed[i]
                have += len(hit)
                total += sum(1 for b in hit if b.ref_cnt == 0 and not b.is_null)
            total += max(0, -(-tokens // self.block_size) - have)
        return total

    def slots_needed(self, request_id: str) -> int:
        """Free state slots that allocating for the request consumes: 1 when the model has
        state layers and the request holds no slot yet, else 0."""
        return sum(m.slots_needed(request_id) for m in self.managers if m.uses_state_pool)

    def add_computed_blocks(self, request_id: str, new_computed: GroupBlocks) -> None:
        for manager, hit in zip(self.managers, new_computed, strict=True):
            self.pool.touch(hit)
            manager.add_computed_blocks(request_id, hit)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self._skipping:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def allocate(self, request_id: str, num_tokens: int, num_encoder_tokens: int) -> GroupBlocks:
        return tuple(
            m.allocate(request_id, m.tokens_to_hold(num_tokens, num_encoder_tokens))
            for m in self.managers
        )

    def cache_blocks(
        self, request_id: str, num_full: int, hashes: Sequence[bytes], content_of: ContentOf
    ) -> None:
        for manager in self.managers:
            manager.cache_blocks(request_id, num_full, hashes, content_of)

    def uncache_blocks(self, request_id: str, first_block: int) -> None:
        for manager in self.managers:
            manager.uncache_blocks(request_id, first_block)

    def free_tail(self, request_id: str, num_tokens: int, num_encoder_tokens: int) -> tuple:
        """Per group, free the blocks past those `num_tokens` tokens need; returns how
        many blocks each group keeps."""
        return tuple(
            m.free_tail(
                request_id, cdiv(m.tokens_to_hold(num_tokens, num_encoder_tokens), m.block_size)
            )
            for m in self.managers
        )

    def free(self, request_id: str) -> None:
        for manager in self.managers:
            manager.free(request_id)

    def get_blocks(self, request_id: str) -> GroupBlocks:
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.managers)
