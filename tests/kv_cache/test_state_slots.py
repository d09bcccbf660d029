"""State groups (`MambaSpec`): one slot per request from a pool of their own, for its
whole life, freed with it; no prefix caching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyagent_ref.ops
from pyagent_ref.kv_cache import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    MambaSpec,
    group_layers,
)
from pyagent_ref.sched import Request

from .helpers import BLOCK

STATE = MambaSpec(BLOCK, 1000)
FULL = FullAttentionSpec(BLOCK, 2, 8)


def hybrid(num_blocks: int, num_slots: int) -> KVCacheManager:
    groups = (KVCacheGroup(STATE, ("layers.0",)), KVCacheGroup(FULL, ("layers.1",)))
    return KVCacheManager(
        KVCacheConfig(num_blocks, groups, num_slots), ops=pyagent_ref.ops, enable_caching=False
    )


def test_a_request_holds_one_slot_however_long_it_grows():
    kv = hybrid(32, 3)
    r = Request("a", list(range(10)))
    assert kv.allocate_slots(r, 10) is not None
    r.num_computed_tokens = 10
    for _ in range(7):  # decode steps cross block boundaries: blocks grow, the slot stays
        r.append_output_token_ids(1)
        assert kv.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
    slots, blocks = kv.get_block_ids(r)
    assert len(slots) == 1 and slots[0] != 0
    assert len(blocks) == 5  # 17 tokens in blocks of 4
    assert kv.coordinator.state_pool.num_free_blocks == 3 - 2  # null slot + this one


def test_no_free_slot_fails_the_allocation_and_allocates_nothing():
    kv = hybrid(32, 2)  # the null slot and one more
    a, b = Request("a", [1, 2, 3]), Request("b", [4, 5, 6])
    assert kv.allocate_slots(a, 3) is not None
    free_blocks = kv.pool.num_free_blocks
    assert kv.allocate_slots(b, 3) is None
    assert kv.pool.num_free_blocks == free_blocks
    assert kv.get_block_ids(b) == ([], [])


def test_freeing_gives_the_slot_back_for_the_next_request():
    kv = hybrid(32, 2)
    a, b = Request("a", [1, 2, 3]), Request("b", [4, 5, 6])
    kv.allocate_slots(a, 3)
    (slot,) = kv.get_block_ids(a)[0]
    kv.free(a)  # finished, aborted or preempted
    assert kv.get_block_ids(a) == ([], [])
    assert kv.allocate_slots(b, 3) is not None
    assert kv.get_block_ids(b)[0] == [slot]  # the only slot there is


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=30))
def test_slots_are_never_shared_and_all_come_back(ops):
    """Admitting and freeing requests in any order: live requests hold distinct non-null
    slots, and once all are freed the pool is whole again."""
    kv, live = hybrid(64, 4), {}
    for rid, admit in ops:
        name = str(rid)
        if admit and name not in live:
            r = Request(name, [1, 2, 3, 4, 5])
            if kv.allocate_slots(r, 5) is not None:
                live[name] = r
            else:
                assert len(live) == 3
        elif not admit and name in live:
            kv.free(live.pop(name))
        slots = [kv.get_block_ids(r)[0][0] for r in live.values()]
        assert 0 not in slots and len(set(slots)) == len(slots)
    for r in live.values():
        kv.free(r)
    assert kv.coordinator.state_pool.num_free_blocks == 3


def test_prefix_caching_is_refused_with_a_state_group():
    groups = (KVCacheGroup(STATE, ("layers.0",)), KVCacheGroup(FULL, ("layers.1",)))
    with pytest.raises(ValueError, match="enable_caching must be False .* state group"):
        KVCacheManager(KVCacheConfig(8, groups, 3), ops=pyagent_ref.ops, enable_caching=True)


def test_state_layers_form_one_group_and_take_no_blocks():
    layers = {f"layers.{i}": STATE if i % 4 else FULL for i in range(8)}
    groups = group_layers(layers)
    # the state layers do not shrink the groups of the others (2 full layers: one group)
    assert [(g.spec, len(g.layer_names)) for g in groups] == [(FULL, 2), (STATE, 6)]
    config = KVCacheConfig(10, groups, 5)
    assert config.block_groups == (groups[0],)
    assert config.bytes_per_block == 2 * FULL.page_size_bytes
    assert config.state_bytes == 5 * 6 * 1000
    memory = config.state_bytes + 7 * config.bytes_per_block + 1
    fitted = KVCacheConfig.from_memory(memory, groups, 5)
    assert fitted.num_blocks == 7
    with pytest.raises(ValueError, match="the 5 state slots take 30000 bytes"):
        KVCacheConfig.from_memory(100, groups, 5)


@pytest.mark.parametrize("slots", [0, 1])
def test_a_state_group_needs_two_slots(slots):
    with pytest.raises(ValueError, match="num_state_slots must be >= 2"):
        KVCacheConfig(8, (KVCacheGroup(STATE),), slots)
    with pytest.raises(ValueError, match="num_state_slots must be >= 2 .* and 0 without one"):
        KVCacheConfig(8, (KVCacheGroup(FULL),), 3)
