"""The KV cache manager: the scheduler's one interface to blocks and the prefix cache.

Per step, for each request the scheduler wants to run:
    computed, num_computed = manager.get_computed_blocks(request)   # new requests only
    new = manager.allocate_slots(request, num_new_tokens,
                                 new_computed_blocks=computed)      # None: preempt someone
    ... run the model ...
    manager.uncache_blocks(request, num_computed_before_the_step)   # the forward failed
    manager.free(request)                                           # finished or preempted
The manager never changes `request.num_computed_tokens`: the scheduler does, after a
successful allocation, by the `num_computed` it used.

A model with state-space layers (a `MambaSpec` group) keeps one state slot per request
beside its blocks; allocation fails (None) when either runs out. Such a cache has no
prefix caching: a slot holds the state after the last token only.

With KV offload (`enable_offload`), a cached block the pool evicts is stored in the
offload tiers, and `get_computed_blocks` counts blocks the tiers hold as cached: it
brings them back into the device prefix cache (a fresh block each, its KV copied in)
before returning the hit, so the rest of the flow is unchanged.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from types import ModuleType

from .block import KVCacheBlock
from .block_pool import BlockPool
from .coordinator import GroupBlocks, KVCacheCoordinator
from .events import KVCacheEvent, KVCacheMetrics
from .offload import BlockOffloader, OffloadedBlock
from .protocol import KVRequest
from .request_hashing import RequestBlockHasher
from .single_type import ContentOf
from .specs import KVCacheConfig


@dataclass(frozen=True)
class KVCacheBlocks:
    """Blocks per KV cache group (the same length in every prefix-caching group)."""

    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks[0]) if self.blocks else 0


class KVCacheManager:
    """Block allocation and prefix caching for all running requests.

    Args:
        config: the number of blocks and the KV cache groups.
        ops: the ops namespace whose `hashing` computes block hashes
            (`pyagent_ref.ops.load("ref" | "accel" | "auto")`).
        enable_caching: reuse KV across requests through the prefix cache.
        eviction: "lru" or "arc" (see `BlockPool`).
        hash_algorithm: "sha256", "xxh3_128" or "sha256_cbor" (vLLM's, `vllm_hashing`).
        enable_events: record `KVCacheEvent`s for `take_events`.
    Raises:
        ValueError: enable_caching with a state group (`MambaSpec`): its slots hold no
            state at block boundaries, so no prefix hit could be resumed.
    """

    def __init__(
        self,
        config: KVCacheConfig,
        ops: ModuleType,
        enable_caching: bool = True,
        eviction: str = "lru",
        hash_algorithm: str = "sha256",
        enable_events: bool = False,
        clock=time.monotonic,
    ) -> None:
        if enable_caching and config.num_state_slots:
            raise ValueError(
                "enable_caching must be False for a KV cache with a state group (MambaSpec): "
                "a state slot holds the state after a request's last token only, none at "
                "block boundaries, so a prefix hit could not be resumed"
            )
        self.config = config
        self.block_size = config.block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(config.num_blocks, enable_caching, eviction, enable_events, clock)
        self.coordinator = KVCacheCoordinator(config, self.pool)
        self.hasher = RequestBlockHasher(self.block_size, ops, hash_algorithm)
        self._empty = KVCacheBlocks(tuple([] for _ in config.groups))
        self._num_cached: dict[str, int] = {}  # full blocks already offered to the cache
        # the one manager of a single full-attention-like group, for the decode fast path
        only = self.coordinator.managers
        simple = len(only) == 1 and only[0].caches_prefix and not only[0].skips_blocks
        self._single = only[0] if simple else None
        self.offloader: BlockOffloader | None = None

    def enable_offload(self, offloader: BlockOffloader) -> None:
        """From now on, store evicted cached blocks in `offloader`'s tiers and count the
        blocks they hold as prefix-cache hits.

        Raises:
            ValueError: prefix caching is disabled (offload is keyed by block content).
        """
        if not self.enable_caching:
            raise ValueError("KV offload needs prefix caching: enable_caching must be True")
        self.offloader = offloader
        self.pool.on_evict = offloader.store

    @property
    def usage(self) -> float:
        return self.pool.usage

    def max_tokens_per_request(
        self, max_step_tokens: int | None = None, limit: int | None = None
    ) -> int:
        """The most tokens, up to `limit`, one request can reach in an otherwise empty
        cache (the null block is never handed out), growing by steps of at most
        `max_step_tokens` tokens (None: in one step). The step matters to window-like
        groups, which hold only the blocks of their window and of the step's tokens.
        `limit` defaults to the tokens of every usable block, which bounds full attention.
        """
        usable = self.pool.num_blocks - 1
        managers = self.coordinator.managers
        return (
            bisect.bisect_right(
                range((usable * self.block_size if limit is None else limit) + 1),
                usable,
                key=lambda n: sum(m.max_blocks_held(n, max_step_tokens or n) for m in managers),
            )
            - 1
        )

    def get_computed_blocks(
        self, request: KVRequest, use_cache: bool = True
    ) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of `request`, as (blocks, number of tokens); none
        with use_cache=False (a request that must compute every token itself).

        Only full blocks count, and never all of the request's tokens: the last token
        is always computed, because its logits are what the step needs. Every hit is
        verified against the stored tokens, parent hash and extra keys
        (`BlockPool.get_cached_block`), so a hash collision is a miss.
        """
        if not (self.enable_caching and use_cache):
            return self._empty, 0
        self.hasher.update(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        content_of = partial(self.hasher.content, request)
        hashes = request.block_hashes
        offloaded = self.offloader.lookup if self.offloader else None
        hit, num_blocks = self.coordinator.find_longest_cache_hit(
            hashes, max_blocks, content_of, offloaded
        )
        if any(isinstance(b, OffloadedBlock) for blocks in hit for b in blocks):
            self._onboard(hit, hashes, content_of)
            hit, num_blocks = self.coordinator.find_longest_cache_hit(
                hashes, max_blocks, content_of
            )
        stats = self.pool.stats
        stats.requests += 1
        stats.queries += request.num_tokens
        stats.hits += num_blocks * self.block_size
        return KVCacheBlocks(hit), num_blocks * self.block_size

    def _onboard(self, hit: GroupBlocks, hashes: Sequence[bytes], content_of: ContentOf) -> None:
        """Bring the offloaded blocks of a candidate hit back into the device prefix
        cache: a new block each, its KV loaded, cached under its hash, then freed like
        any cached block. The hit's device blocks are held meanwhile, so the evictions
        this causes cannot take them. A group stops at its first block that cannot come
        back (no free block, or a lost copy); the caller looks the hit up again."""
        assert self.offloader is not None
        pool = self.pool
        held = [b for blocks in hit for b in blocks if isinstance(b, KVCacheBlock)]
        pool.touch(held)
        for group_id, blocks in enumerate(hit):
            for i, offloaded in enumerate(blocks):
                if not isinstance(offloaded, OffloadedBlock):
                    continue
                if not pool.num_free_blocks:
                    break
                block = pool.get_new_blocks(1)[0]
                held.append(block)
                if not self.offloader.load(offloaded, group_id, block.block_id):
                    break
                pool.cache_full_blocks(
                    [block], [hashes[i]], [content_of(i)], self.block_size, group_id
                )
                pool.stats.onboarded_blocks += 1
        pool.free_blocks(reversed(held))

    def allocate_slots(
        self,
        request: KVRequest,
        num_new_tokens: int,
        num_lookahead_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
    ) -> KVCacheBlocks | None:
        """Make room for `num_new_tokens` more tokens (+ lookahead slots for drafts).

        The request will then hold blocks for request.num_computed_tokens + the tokens
        of `new_computed_blocks` + num_new_tokens + num_lookahead_tokens tokens. Full
        blocks among the first num_computed + new tokens enter the prefix cache
        (lookahead slots never do). Returns the newly allocated blocks, or None — with
        nothing allocated — when the pool has too few free blocks (or, for a request
        without its state slot yet, the state pool has none free).

        Raises:
            ValueError: a negative count, or computed blocks for a request that
                already holds blocks.
        """
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(
                f"num_new_tokens and num_lookahead_tokens must be >= 0, "
                f"got {num_new_tokens} and {num_lookahead_tokens}"
            )
        rid = request.request_id
        if new_computed_blocks is None and self._single is not None:
            # Fast path of a decode step: the last block still has room, nothing new to
            # cache. Same result as the general path below, without its bookkeeping.
            held = len(self._single.req_to_blocks.get(rid, ()))
            num_tokens = request.num_computed_tokens + num_new_tokens
            if (
                num_tokens + num_lookahead_tokens <= held * self.block_size
                and num_tokens // self.block_size <= self._num_cached.get(rid, 0)
            ):
                return self._empty
        hit = new_computed_blocks.blocks if new_computed_blocks else None
        hit_tokens = new_computed_blocks.num_blocks * self.block_size if hit else 0
        if hit_tokens and any(self.coordinator.get_blocks(rid)):
            raise ValueError(
                f"request {rid!r} already holds blocks; computed blocks are for new requests"
            )
        computed = request.num_computed_tokens + hit_tokens
        total = computed + num_new_tokens + num_lookahead_tokens
        coordinator = self.coordinator
        coordinator.remove_skipped_blocks(rid, request.num_computed_tokens)
        needed = coordinator.blocks_needed(rid, total, request.num_encoder_tokens, hit)
        if needed > self.pool.num_free_blocks:
            return None
        slots = coordinator.slots_needed(rid)
        if slots and slots > coordinator.state_pool.num_free_blocks:
            return None
        if hit_tokens:
            coordinator.add_computed_blocks(rid, hit)
        # A decode step mostly fits in the last block: no allocation, nothing to cache.
        grow = needed or slots
        new = coordinator.allocate(rid, total, request.num_encoder_tokens) if grow else None
        if self.enable_caching:
            num_full = min(computed + num_new_tokens, request.num_tokens) // self.block_size
            if num_full > self._num_cached.get(rid, 0):
                self.hasher.update(request)
                content_of = partial(self.hasher.content, request)
                coordinator.cache_blocks(rid, num_full, request.block_hashes, content_of)
                self._num_cached[rid] = num_full
        return KVCacheBlocks(new) if new else self._empty

    def uncache_blocks(self, request: KVRequest, from_token: int) -> None:
        """Take out of the prefix cache, in every group, the request's blocks holding a
        token at position `from_token` or later: the step that was to compute those
        tokens failed, so their KV was never written (blocks enter the cache when
        allocated, before the forward pass). They are never a hit again and never
        offloaded; blocks before, cached by earlier steps or prefix hits, stay cached.

        Call it before `free`, with the request's num_computed_tokens from before the
        failed step, for every request of that step: a request of the same step may
        hold, by a prefix hit, blocks another one cached, and each one takes out the
        blocks it cached.
        """
        rid, first_block = request.request_id, from_token // self.block_size
        self.coordinator.uncache_blocks(rid, first_block)
        if self._num_cached.get(rid, 0) > first_block:
            self._num_cached[rid] = first_block

    def free_tail(self, request: KVRequest, num_tokens: int) -> tuple[int, ...] | None:
        """Speculative decoding's rollback: release the request's blocks past those its
        first `num_tokens` tokens need (blocks that held only slots of rejected drafts;
        they never entered the prefix cache, which takes only known tokens). Returns,
        per group, how many blocks the request keeps, or None if none was freed."""
        before = [len(ids) for ids in self.coordinator.get_blocks(request.request_id)]
        kept = self.coordinator.free_tail(
            request.request_id, num_tokens, request.num_encoder_tokens
        )
        return kept if list(kept) != before else None

    def free(self, request: KVRequest) -> None:
        """Release every block of the request (finished, aborted or preempted)."""
        self.coordinator.free(request.request_id)
        self._num_cached.pop(request.request_id, None)

    def get_blocks(self, request: KVRequest) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request.request_id))

    def get_block_ids(self, request: KVRequest) -> tuple[list[int], ...]:
        return self.get_blocks(request).get_block_ids()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, offloaded ones too; only possible when no block is
        in use. Returns whether it happened."""
        if not self.pool.reset_prefix_cache():
            return False
        if self.offloader is not None:
            self.offloader.tiers.clear()
        return True

    def take_events(self) -> list[KVCacheEvent]:
        return self.pool.take_events()

    def metrics(self) -> KVCacheMetrics:
        s = self.pool.stats
        return KVCacheMetrics(
            num_blocks=self.pool.num_blocks,
            num_free_blocks=self.pool.num_free_blocks,
            usage=self.pool.usage,
            requests=s.requests,
            queries=s.queries,
            hits=s.hits,
            hit_rate=s.hit_rate,
            evictions=s.evictions,
            collisions=s.collisions,
            mean_residency_s=s.residency.mean,
            max_residency_s=s.residency.max,
            onboarded_blocks=s.onboarded_blocks,
        )
