"""A state machine over random request streams, with the pool's invariants after every step.

Requests share prefixes drawn from a few "documents", so prefix hits, shared blocks
and evictions all happen. The model keeps, independently of the pool, the token
prefix behind every block hash (from the event stream), and predicts each hit.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import pyagent_ref.ops
from pyagent_ref.kv_cache import BlockRemoved, BlockStored, KVCacheManager
from pyagent_ref.kv_cache.events import AllBlocksCleared
from pyagent_ref.sched import Request

from .helpers import BLOCK, full_config

NUM_BLOCKS = 24
DOCUMENTS = [[d * 100 + i for i in range(40)] for d in range(3)]


class KVCacheMachine(RuleBasedStateMachine):
    eviction = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(
            full_config(NUM_BLOCKS), eviction=self.eviction, enable_events=True, ops=pyagent_ref.ops
        )
        self.running: dict[str, Request] = {}
        self.prefix_of_hash: dict[bytes, tuple[int, ...]] = {}
        self.cached_prefixes: set[tuple[int, ...]] = set()
        self.counter = 0

    def _sync_events(self) -> None:
        for event in self.kv.take_events():
            if isinstance(event, BlockStored):
                self.cached_prefixes.update(self.prefix_of_hash[h] for h in event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.cached_prefixes.difference_update(
                    self.prefix_of_hash[h] for h in event.block_hashes
                )
            elif isinstance(event, AllBlocksCleared):
                self.cached_prefixes.clear()

    def _learn_hashes(self, request: Request) -> None:
        self.kv.hasher.update(request)
        tokens = request.all_token_ids
        for i, h in enumerate(request.block_hashes):
            self.prefix_of_hash[h] = tuple(tokens[: (i + 1) * BLOCK])

    @rule(
        doc=st.integers(0, 2),
        shared=st.integers(1, 40),
        tail=st.lists(st.integers(0, 50), max_size=12),
    )
    def add_request(self, doc, shared, tail):
        self.counter += 1
        request = Request(f"r{self.counter}", DOCUMENTS[doc][:shared] + tail)
        self._learn_hashes(request)
        computed, hit = self.kv.get_computed_blocks(request)
        tokens = request.all_token_ids
        expected = 0
        while (expected + 1) * BLOCK <= len(tokens) - 1 and tuple(
            tokens[: (expected + 1) * BLOCK]
        ) in self.cached_prefixes:
            expected += 1
        assert hit == expected * BLOCK, (hit, expected)
        for i, block in enumerate(computed.blocks[0]):  # a hit hands out the right KV
            assert block.content.token_ids == tuple(tokens[i * BLOCK : (i + 1) * BLOCK])
        new = self.kv.allocate_slots(request, len(tokens) - hit, new_computed_blocks=computed)
        if new is not None:
            request.num_computed_tokens = len(tokens)
            self.running[request.request_id] = request
        self._sync_events()

    @precondition(lambda self: self.running)
    @rule(data=st.data(), n=st.integers(1, 6))
    def extend(self, data, n):
        request = self.running[data.draw(st.sampled_from(sorted(self.running)))]
        request.append_output_token_ids([7] * n)
        self._learn_hashes(request)
        if self.kv.allocate_slots(request, n) is None:
            self._preempt(request)
        else:
            request.num_computed_tokens += n
        self._sync_events()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data):
        request = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
        self.kv.free(request)
        self._sync_events()

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data):
        self._preempt(self.running[data.draw(st.sampled_from(sorted(self.running)))])
        self._sync_events()

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.num_computed_tokens = 0
        del self.running[request.request_id]

    @rule()
    def free_everything(self):
        for request in self.running.values():
            self.kv.free(request)
        self.running.clear()
        pool = self.kv.pool
        assert pool.num_free_blocks == NUM_BLOCKS - 1 and pool.usage == 0.0
        assert all(b.ref_cnt == 0 for b in pool.blocks)
        assert self.kv.reset_prefix_cache()
        self._sync_events()
        assert not self.cached_prefixes and pool.num_cached_blocks() == 0

    @invariant()
    def reference_counts_match_owners(self):
        owners: Counter[int] = Counter()
        for request in self.running.values():
            for block_id in self.kv.get_block_ids(request)[0]:
                owners[block_id] += 1
        for block in self.kv.pool.blocks[1:]:
            assert block.ref_cnt >= 0
            assert block.ref_cnt == owners[block.block_id], block
            if owners[block.block_id] > 1:  # only prefix-cache hits are shared
                assert block.block_hash is not None

    @invariant()
    def free_plus_used_is_total(self):
        pool = self.kv.pool
        used = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
        assert pool.num_free_blocks + used == NUM_BLOCKS - 1

    @invariant()
    def running_requests_hold_their_tokens(self):
        for request in self.running.values():
            assert len(self.kv.get_block_ids(request)[0]) * BLOCK >= request.num_computed_tokens

    @invariant()
    def model_and_pool_agree_on_the_cache(self):
        assert len(self.cached_prefixes) == self.kv.pool.num_cached_blocks()


class ARCKVCacheMachine(KVCacheMachine):
    eviction = "arc"


TestKVCacheLRU = KVCacheMachine.TestCase
TestKVCacheARC = ARCKVCacheMachine.TestCase
