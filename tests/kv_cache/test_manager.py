"""KVCacheManager: prefix hits, allocation, freeing, keys, statistics."""

from __future__ import annotations

import pytest

import pyagent_ref.ops
from pyagent_ref.kv_cache import KVCacheManager
from pyagent_ref.lora import LoRARequest
from pyagent_ref.sched import MultiModalFeature, Request

from .helpers import BLOCK, admit, full_config

LORA = LoRARequest("l", 3, "/adapters/l")


def test_hit_is_the_longest_cached_full_block_prefix():
    kv = KVCacheManager(full_config(16), ops=pyagent_ref.ops)
    a = Request("a", list(range(14)))
    assert admit(kv, a) == 0
    b = Request("b", list(range(9)) + [99] * 5)
    assert admit(kv, b) == 2 * BLOCK  # tokens 0..7 match, block 2 differs
    assert kv.get_block_ids(b)[0][:2] == kv.get_block_ids(a)[0][:2]


def test_hit_never_covers_the_whole_prompt():
    kv = KVCacheManager(full_config(16), ops=pyagent_ref.ops)
    admit(kv, Request("a", list(range(8))))
    _, hit = kv.get_computed_blocks(Request("b", list(range(8))))
    assert hit == BLOCK  # 8 tokens are cached, but the last token must be computed
    _, hit = kv.get_computed_blocks(Request("c", list(range(9))))
    assert hit == 2 * BLOCK


@pytest.mark.parametrize(
    "variant",
    [
        dict(lora_request=LoRARequest("adapter", 1, "/adapters/a")),
        dict(cache_salt="tenant-2"),
        dict(mm_features=(MultiModalFeature("img-b", 2, 3),)),
    ],
)
def test_extra_keys_separate_caches(variant):
    kv = KVCacheManager(full_config(16), ops=pyagent_ref.ops)
    admit(kv, Request("a", list(range(13)), mm_features=(MultiModalFeature("img-a", 2, 3),)))
    base = Request("b", list(range(13)), mm_features=(MultiModalFeature("img-a", 2, 3),))
    _, same = kv.get_computed_blocks(base)
    assert same == 3 * BLOCK
    fields = dict(mm_features=(MultiModalFeature("img-a", 2, 3),)) | variant
    _, other = kv.get_computed_blocks(Request("c", list(range(13)), **fields))
    assert other == 0


def test_multimodal_key_only_on_overlapping_blocks():
    kv = KVCacheManager(full_config(16), ops=pyagent_ref.ops)
    admit(kv, Request("a", list(range(13)), mm_features=(MultiModalFeature("img-a", 5, 2),)))
    # the image spans tokens 5-6 (block 1): block 0 is shared, blocks from 1 on are not
    _, hit = kv.get_computed_blocks(
        Request("b", list(range(13)), mm_features=(MultiModalFeature("img-b", 5, 2),))
    )
    assert hit == BLOCK


def test_allocation_fails_cleanly_when_the_pool_is_short():
    kv = KVCacheManager(full_config(4), ops=pyagent_ref.ops)  # 3 usable blocks
    a = Request("a", list(range(12)))
    admit(kv, a)
    b = Request("b", [7] * 5)
    computed, _ = kv.get_computed_blocks(b)
    assert kv.allocate_slots(b, 5, new_computed_blocks=computed) is None
    assert kv.get_block_ids(b) == ([],) and kv.pool.num_free_blocks == 0
    kv.free(a)
    assert kv.allocate_slots(b, 5, new_computed_blocks=computed) is not None


def test_decode_grows_one_block_at_a_time_and_caches_full_blocks():
    kv = KVCacheManager(full_config(8), ops=pyagent_ref.ops)
    a = Request("a", list(range(4)))
    admit(kv, a)
    assert len(kv.get_block_ids(a)[0]) == 1
    for step in range(5):
        a.append_output_token_ids(100 + step)
        assert kv.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    assert len(kv.get_block_ids(a)[0]) == 3  # 9 tokens
    assert kv.pool.num_cached_blocks() == 2  # two full blocks


def test_lookahead_slots_are_allocated_but_not_cached():
    kv = KVCacheManager(full_config(8), ops=pyagent_ref.ops)
    a = Request("a", list(range(4)))
    computed, _ = kv.get_computed_blocks(a)
    new = kv.allocate_slots(a, 4, num_lookahead_tokens=5, new_computed_blocks=computed)
    assert new.num_blocks == 3 and kv.pool.num_cached_blocks() == 1


def test_free_restores_the_pool_and_keeps_the_cache():
    kv = KVCacheManager(full_config(8), ops=pyagent_ref.ops)
    a = Request("a", list(range(10)))
    admit(kv, a)
    kv.free(a)
    assert kv.pool.num_free_blocks == 7 and kv.usage == 0.0
    _, hit = kv.get_computed_blocks(Request("b", list(range(10))))
    assert hit == 2 * BLOCK


def test_statistics():
    kv = KVCacheManager(full_config(16), ops=pyagent_ref.ops)
    admit(kv, Request("a", list(range(8))))
    admit(kv, Request("b", list(range(12))))
    m = kv.metrics()
    assert (m.requests, m.queries, m.hits) == (2, 20, 8) and m.hit_rate == pytest.approx(0.4)


def test_negative_counts_are_rejected():
    kv = KVCacheManager(full_config(8), ops=pyagent_ref.ops)
    with pytest.raises(ValueError, match="num_new_tokens"):
        kv.allocate_slots(Request("a", [1]), -1)


def test_computed_blocks_only_for_new_requests():
    kv = KVCacheManager(full_config(8), ops=pyagent_ref.ops)
    admit(kv, Request("a", list(range(9))))
    b = Request("b", list(range(9)))
    computed, _ = kv.get_computed_blocks(b)
    kv.allocate_slots(b, 1, new_computed_blocks=computed)
    with pytest.raises(ValueError, match="already holds blocks"):
        kv.allocate_slots(b, 1, new_computed_blocks=computed)


def test_accelerated_hashing_gives_the_same_hits():
    accel = pytest.importorskip("pyagent_accel.ops")
    ref_kv, acc_kv = (
        KVCacheManager(full_config(16), ops=pyagent_ref.ops),
        KVCacheManager(full_config(16), ops=accel),
    )
    for kv in (ref_kv, acc_kv):
        admit(kv, Request("a", list(range(13)), cache_salt="s", lora_request=LORA))
    r1 = Request("b", list(range(13)), cache_salt="s", lora_request=LORA)
    r2 = Request("b", list(range(13)), cache_salt="s", lora_request=LORA)
    assert ref_kv.get_computed_blocks(r1)[1] == acc_kv.get_computed_blocks(r2)[1] == 12
    assert r1.block_hashes == r2.block_hashes


def test_stored_events_carry_the_adapter_id():
    """vLLM's BlockStored has a lora_id: the adapter the blocks were computed with."""
    kv = KVCacheManager(full_config(16), ops=pyagent_ref.ops, enable_events=True)
    admit(kv, Request("a", list(range(9)), lora_request=LORA))
    admit(kv, Request("b", [7] * 9))
    stored = [e for e in kv.take_events() if type(e).__name__ == "BlockStored"]
    assert [e.lora_id for e in stored] == [LORA.lora_int_id, None]
