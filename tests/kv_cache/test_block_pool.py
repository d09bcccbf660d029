"""Block list, block pool and eviction order, pinned down case by case."""

from __future__ import annotations

import pytest

from pyagent_ref.kv_cache import BlockContent, BlockList, BlockPool, KVCacheBlock
from pyagent_ref.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored


def ids(blocks):
    return [b.block_id for b in blocks]


def content(i: int) -> BlockContent:
    return BlockContent(parent_hash=b"p", token_ids=(i,), extra_keys=())


def test_block_list_removes_from_the_middle_in_place():
    blocks = [KVCacheBlock(i) for i in range(5)]
    lst = BlockList(blocks)
    lst.remove(blocks[2])
    lst.appendleft(blocks[2])
    assert ids(lst) == [2, 0, 1, 3, 4] and len(lst) == 5
    assert lst.popleft() is blocks[2] and blocks[2] not in lst


def test_block_list_refuses_double_membership():
    a = KVCacheBlock(0)
    first, second = BlockList([a]), BlockList()
    with pytest.raises(ValueError, match="already in a list"):
        second.append(a)
    with pytest.raises(ValueError, match="not in this list"):
        second.remove(a)
    assert len(first) == 1


def test_null_block_is_reserved():
    pool = BlockPool(4)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.num_free_blocks == 3
    assert 0 not in ids(pool.get_new_blocks(3))
    with pytest.raises(ValueError, match="cannot get 1 blocks"):
        pool.get_new_blocks(1)


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, True])
def test_pool_size_is_validated(bad):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(bad)


def test_eviction_order_is_clean_first_then_least_recently_freed():
    pool = BlockPool(8)
    a = pool.get_new_blocks(3)  # a request's blocks, head first
    b = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, [b"a0", b"a1", b"a2"], [content(i) for i in range(3)], 4)
    pool.cache_full_blocks(b, [b"b0", b"b1"], [content(i) for i in range(2)], 4)
    pool.free_blocks(reversed(a))  # tail first, as KVCacheManager.free does
    pool.free_blocks(reversed(b))
    # two never-used clean blocks, then a's tail .. head, then b's tail .. head
    assert ids(pool.free_block_order()) == [6, 7, 3, 2, 1, 5, 4]
    got = pool.get_new_blocks(4)
    assert ids(got) == [6, 7, 3, 2]
    # lazy eviction: only the two cached blocks handed out lost their content
    assert pool.stats.evictions == 2
    assert pool.get_cached_block(b"a0", content(0)) is a[0]
    assert pool.get_cached_block(b"a2", content(2)) is None


def test_touch_pulls_a_free_cached_block_back():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"x", b"y"], [content(0), content(1)], 4)
    pool.free_blocks(blocks)
    hit = pool.get_cached_block(b"x", content(0))
    pool.touch([hit])
    assert hit.ref_cnt == 1 and hit not in pool.free_block_order()
    assert pool.num_free_blocks == 2


def test_a_hash_collision_is_a_miss():
    pool = BlockPool(3)
    [block] = pool.get_new_blocks(1)
    pool.cache_full_blocks([block], [b"h"], [content(1)], 4)
    assert pool.get_cached_block(b"h", content(2)) is None
    assert pool.stats.collisions == 1


def test_duplicate_hash_keeps_the_first_copy():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [b"h"], [content(0)], 4)
    pool.cache_full_blocks([b], [b"h"], [content(0)], 4)
    assert pool.get_cached_block(b"h", content(0)) is a and b.block_hash is None


def test_groups_do_not_share_cache_entries():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [b"h"], [content(0)], 4, group_id=0)
    pool.cache_full_blocks([b], [b"h"], [content(0)], 4, group_id=1)
    assert pool.get_cached_block(b"h", content(0), 1) is b


def test_freeing_a_free_block_is_an_error():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(1)
    pool.free_blocks(blocks)
    with pytest.raises(ValueError, match="already free"):
        pool.free_blocks(blocks)


def test_events_and_reset():
    pool = BlockPool(4, enable_events=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"x", b"y"], [content(0), content(1)], 1)
    assert not pool.reset_prefix_cache()  # blocks in use
    pool.free_blocks(blocks)
    pool.get_new_blocks(3)  # one clean block, then evicts x and y
    events = pool.take_events()
    assert events[0] == BlockStored((b"x", b"y"), b"p", (0, 1), 1)
    assert events[1:] == [BlockRemoved((b"x",)), BlockRemoved((b"y",))]
    assert pool.take_events() == []
    fresh = BlockPool(4, enable_events=True)
    assert fresh.reset_prefix_cache() and fresh.take_events() == [AllBlocksCleared()]


def test_uncached_blocks_are_no_hit_and_are_freed_clean_without_on_evict():
    pool = BlockPool(4, enable_events=True)
    evicted = []
    pool.on_evict = evicted.append
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"x", b"y"], [content(0), content(1)], 1)
    pool.uncache([pool.null_block, blocks[1]])
    assert pool.get_cached_block(b"x", content(0)) is blocks[0]
    assert pool.get_cached_block(b"y", content(1)) is None and blocks[1].block_hash is None
    assert pool.take_events()[1:] == [BlockRemoved((b"y",))]
    pool.free_blocks(blocks)
    assert ids(pool.free_block_order()) == [3, 2, 1]  # block 2 is clean: handed out first
    with pytest.raises(ValueError, match="is free"):
        pool.uncache(blocks[:1])
    pool.get_new_blocks(3)
    assert evicted == blocks[:1]


def test_caching_disabled_caches_nothing():
    pool = BlockPool(3, enable_caching=False)
    [block] = pool.get_new_blocks(1)
    pool.cache_full_blocks([block], [b"h"], [content(0)], 4)
    assert pool.num_cached_blocks() == 0


def test_residency_is_measured_with_the_clock():
    now = [0.0]
    pool = BlockPool(2, clock=lambda: now[0])
    [block] = pool.get_new_blocks(1)
    pool.cache_full_blocks([block], [b"h"], [content(0)], 4)
    pool.free_blocks([block])
    now[0] = 5.0
    pool.get_new_blocks(1)
    assert pool.stats.residency.count == 1 and pool.stats.residency.mean == 5.0
