"""Small builders shared by the KV cache tests."""

from __future__ import annotations

from pyagent_ref.kv_cache import FullAttentionSpec, KVCacheConfig, KVCacheGroup, KVCacheManager
from pyagent_ref.sched import Request

BLOCK = 4


def full_config(num_blocks: int, *extra_specs) -> KVCacheConfig:
    specs = (FullAttentionSpec(BLOCK, 2, 8), *extra_specs)
    return KVCacheConfig(num_blocks=num_blocks, groups=tuple(KVCacheGroup(s) for s in specs))


def admit(manager: KVCacheManager, request: Request) -> int:
    """Schedule a whole new prompt the way the scheduler does; returns tokens hit."""
    computed, num_computed = manager.get_computed_blocks(request)
    new = manager.allocate_slots(
        request, request.num_tokens - num_computed, new_computed_blocks=computed
    )
    assert new is not None, "pool too small for the test"
    request.num_computed_tokens = request.num_tokens
    return num_computed
