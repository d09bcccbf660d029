"""EncoderCacheManager: reference counts, eviction of unreferenced entries oldest first,
and the room it reports."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyagent_ref.multimodal import EncoderCacheManager


def test_entries_are_shared_counted_and_evicted_oldest_first():
    cache = EncoderCacheManager(10)
    cache.allocate("r1", "a", 4)
    cache.reference("r2", "a")
    cache.reference("r2", "a")  # a request's second use is not another hit
    assert (cache.misses, cache.hits, cache.used) == (1, 1, 4)
    cache.allocate("r1", "b", 6)
    assert not cache.can_allocate(1)  # everything referenced
    cache.release("r1", "a")
    assert not cache.can_allocate(1)  # r2 still holds a
    cache.release_all("r2")
    cache.release_all("r1")
    assert cache.can_allocate(10) and not cache.can_allocate(11)
    assert not cache.can_allocate(7, keep={"a"})  # a is about to be used: b alone frees 6
    cache.allocate("r3", "c", 5)  # evicts a (released first), then b
    assert cache.take_evicted() == ["a", "b"] and cache.take_evicted() == []
    assert set(cache.sizes) == {"c"}


def test_errors():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        EncoderCacheManager(0)
    cache = EncoderCacheManager(4)
    cache.allocate("r", "a", 4)
    with pytest.raises(ValueError, match="cannot allocate"):
        cache.allocate("r", "b", 1)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("rst"), st.sampled_from("abcd"), st.booleans())))
def test_never_over_capacity_and_referenced_entries_stay(ops):
    """Whatever the sequence of uses and releases, the cache holds at most its capacity
    and never evicts an entry some request references."""
    cache = EncoderCacheManager(6)
    for rid, h, use in ops:
        size = "abcd".index(h) + 1
        if use and cache.has(h):
            cache.reference(rid, h)
        elif use and cache.can_allocate(size):
            cache.allocate(rid, h, size)
        elif not use:
            cache.release(rid, h)
        assert cache.used <= cache.capacity
        for held in cache.held.values():
            assert held <= set(cache.sizes)


def test_discard_drops_a_referenced_entry_and_reports_it():
    cache = EncoderCacheManager(8)
    cache.allocate("r1", "a", 4)
    cache.reference("r2", "a")
    cache.discard("a")
    cache.discard("a")  # no longer cached: no effect
    assert not cache.sizes and not cache.held and cache.take_evicted() == ["a"]
    cache.release_all("r1")  # its reference went with the entry
