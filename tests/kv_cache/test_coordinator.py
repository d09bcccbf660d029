"""Hybrid models: every group's blocks, and a prefix hit valid for all of them."""

from __future__ import annotations

import pytest

import pyagent_ref.ops
from pyagent_ref.kv_cache import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    MLASpec,
    SlidingWindowSpec,
)
from pyagent_ref.kv_cache.events import BlockRemoved
from pyagent_ref.sched import Request

from .helpers import BLOCK, admit, full_config


def config(num_blocks, *specs):
    return KVCacheConfig(num_blocks=num_blocks, groups=tuple(KVCacheGroup(s) for s in specs))


def test_sliding_window_frees_blocks_that_left_the_window():
    kv = KVCacheManager(
        config(32, SlidingWindowSpec(BLOCK, 1, 8, sliding_window=6)), ops=pyagent_ref.ops
    )
    a = Request("a", list(range(16)))
    admit(kv, a)
    a.append_output_token_ids(1)
    kv.allocate_slots(a, 1)
    # computed 16: the next token (16) reads tokens 11..16, blocks 2..4; blocks 0, 1 freed
    table = kv.get_block_ids(a)[0]
    assert table[:2] == [0, 0] and 0 not in table[2:]
    assert kv.pool.num_free_blocks == 31 - 3


def _decode_then_pollute(kv, filler_blocks=3, finish=False):
    """Request a (16 tokens) decodes one token, so its early sliding-window blocks
    leave the window and are freed first; optionally a finishes; then an unrelated
    request takes the clean blocks and evicts the oldest cached ones."""
    a = Request("a", list(range(16)))
    admit(kv, a)
    a.append_output_token_ids(1000)
    assert kv.allocate_slots(a, 1) is not None
    if finish:
        kv.free(a)
    admit(kv, Request("filler", [7000 + i for i in range(filler_blocks * BLOCK)]))
    return a


def test_sliding_window_hit_needs_only_the_window():
    sw = SlidingWindowSpec(BLOCK, 1, 8, sliding_window=5)  # the window spans 1 block
    kv = KVCacheManager(config(8, sw), ops=pyagent_ref.ops)
    a = _decode_then_pollute(kv)
    # block 2 of a was evicted by the filler; blocks 0, 1 are cached, block 3 is in use
    b = Request("b", a.all_token_ids)
    computed, hit = kv.get_computed_blocks(b)
    assert hit == 16
    assert [blk.is_null for blk in computed.blocks[0]] == [True, True, True, False]


def test_hybrid_hit_is_valid_for_every_group():
    full = FullAttentionSpec(BLOCK, 1, 8)
    sw = SlidingWindowSpec(BLOCK, 1, 8, sliding_window=5)
    kv = KVCacheManager(config(64, full, sw), ops=pyagent_ref.ops)
    a = Request("a", list(range(17)))
    admit(kv, a)
    computed, hit = kv.get_computed_blocks(Request("b", list(range(17))))
    assert hit == 16 and computed.num_blocks == 4
    assert [len(g) for g in computed.blocks] == [4, 4]


def test_hybrid_hit_is_the_longest_valid_for_all_groups():
    full = FullAttentionSpec(BLOCK, 1, 8)
    sw = SlidingWindowSpec(BLOCK, 1, 8, sliding_window=5)
    kv = KVCacheManager(config(15, full, sw), ops=pyagent_ref.ops)
    # eviction order after a finishes: sw blocks 2, 1, 0 (left the window first), then
    # full blocks 3, 2, 1, 0, sw block 3; the filler's 10 blocks evict the first four
    a = _decode_then_pollute(kv, filler_blocks=5, finish=True)
    b = Request("b", a.all_token_ids)
    computed, hit = kv.get_computed_blocks(b)

    def alone(group: int) -> int:
        manager = kv.coordinator.managers[group]
        return len(
            manager.find_longest_cache_hit(b.block_hashes, 4, lambda i: kv.hasher.content(b, i))
        )

    # full attention alone: blocks 0-2; sliding window alone: block 3 suffices; but a hit
    # of n blocks needs sliding-window block n - 1, and blocks 0-2 of that group are gone
    assert (alone(0), alone(1)) == (3, 4)
    assert hit == 0 and computed.blocks == ([], [])


def test_chunked_local_attention_skips_earlier_chunks():
    spec = ChunkedLocalAttentionSpec(BLOCK, 1, 8, attention_chunk_size=8)
    kv = KVCacheManager(config(32, spec), ops=pyagent_ref.ops)
    a = Request("a", list(range(20)))
    admit(kv, a)
    a.append_output_token_ids(5)
    kv.allocate_slots(a, 1)
    # computed 20 tokens: token 20 is in chunk [16, 24): blocks 0..3 are not needed
    assert kv.get_block_ids(a)[0][:4] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="multiple of block_size"):
        ChunkedLocalAttentionSpec(BLOCK, 1, 8, attention_chunk_size=6)


def test_a_failed_step_uncaches_its_blocks_in_every_group():
    """The blocks cached for the tokens of a failed step (8 to 15) leave the cache of
    every group and never reach on_evict; those of the step before stay hits."""
    specs = (
        FullAttentionSpec(BLOCK, 1, 8),
        SlidingWindowSpec(BLOCK, 1, 8, sliding_window=5),
        ChunkedLocalAttentionSpec(BLOCK, 1, 8, attention_chunk_size=8),
    )
    kv = KVCacheManager(config(64, *specs), ops=pyagent_ref.ops, enable_events=True)
    evicted = []
    kv.pool.on_evict = lambda block: evicted.append(block.block_hash)
    a = Request("a", list(range(21)))
    for _ in range(2):  # two prefill chunks of 8 tokens
        assert kv.allocate_slots(a, 8) is not None
        a.num_computed_tokens += 8
    kv.take_events()
    kv.uncache_blocks(a, 8)
    kv.free(a)
    failed = tuple(a.block_hashes[2:4])
    assert kv.take_events() == [BlockRemoved(failed)] * len(specs)
    assert kv.get_computed_blocks(Request("b", list(range(21))))[1] == 8
    kv.pool.get_new_blocks(kv.pool.num_free_blocks)  # evicts every cached block
    assert evicted and not set(evicted) & set(failed)


def test_mla_caches_like_full_attention_with_a_smaller_page():
    mla = MLASpec(BLOCK, 1, 576, dtype_bytes=2)
    assert mla.page_size_bytes == BLOCK * 576 * 2
    assert FullAttentionSpec(BLOCK, 1, 576).page_size_bytes == 2 * mla.page_size_bytes
    kv = KVCacheManager(config(16, mla), ops=pyagent_ref.ops)
    admit(kv, Request("a", list(range(9))))
    assert kv.get_computed_blocks(Request("b", list(range(9))))[1] == 8
    with pytest.raises(ValueError, match="num_kv_heads"):
        MLASpec(BLOCK, 4, 576)


def test_cross_attention_holds_encoder_blocks_and_never_caches():
    kv = KVCacheManager(full_config(32, CrossAttentionSpec(BLOCK, 1, 8)), ops=pyagent_ref.ops)
    a = Request("a", list(range(5)), num_encoder_tokens=10)
    admit(kv, a)
    self_blocks, cross_blocks = kv.get_block_ids(a)
    assert len(self_blocks) == 2 and len(cross_blocks) == 3
    computed, hit = kv.get_computed_blocks(Request("b", list(range(5)), num_encoder_tokens=10))
    assert hit == 4 and computed.blocks[1] == []


def test_groups_must_share_a_block_size():
    with pytest.raises(ValueError, match="block_size"):
        config(8, FullAttentionSpec(4, 1, 8), FullAttentionSpec(8, 1, 8))


def test_from_memory_counts_every_layer():
    group = KVCacheGroup(FullAttentionSpec(16, 8, 128, 2), layer_names=("l0", "l1"))
    cfg = KVCacheConfig.from_memory(2**30, (group,))
    assert cfg.num_blocks == 2**30 // (2 * 2 * 16 * 8 * 128 * 2)


def test_max_tokens_per_request_counts_only_the_window_of_sliding_groups():
    """Window 6, blocks of 4: a step of 4 new tokens after c computed ones needs
    tokens c - 5 .. c + 3, at most 3 blocks; a step of 8, at most 4."""
    sw = SlidingWindowSpec(BLOCK, 1, 8, sliding_window=6)
    kv = KVCacheManager(config(4, sw), ops=pyagent_ref.ops)  # 3 usable blocks
    assert kv.max_tokens_per_request() == 12  # in one step: every block at once
    assert kv.max_tokens_per_request(4, limit=1000) == 1000
    assert kv.max_tokens_per_request(8, limit=1000) == 12
    a = Request("a", list(range(400)))
    while a.num_computed_tokens < a.num_tokens:  # 4 tokens a step: never short of blocks
        assert kv.allocate_slots(a, 4) is not None
        a.num_computed_tokens += 4
    hybrid = KVCacheManager(config(12, FullAttentionSpec(BLOCK, 1, 8), sw), ops=pyagent_ref.ops)
    assert hybrid.max_tokens_per_request(4, limit=1000) == (11 - 3) * BLOCK
