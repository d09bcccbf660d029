"""LRU and ARC policies on their own, and ARC against LRU on a scan-polluted trace."""

from __future__ import annotations

import pytest

from pyagent_ref.kv_cache import ARCPolicy, KeyList, LRUPolicy, make_policy


def test_lru_pops_in_release_order():
    lru = LRUPolicy(KeyList)
    for k in "abc":
        lru.push(k, k)
    lru.take("b")
    assert [lru.pop(), lru.pop()] == ["a", "c"]
    with pytest.raises(IndexError):
        lru.pop()


def test_arc_evicts_once_used_entries_before_reused_ones():
    arc = ARCPolicy(4, KeyList, lambda k: k)
    arc.push("hot", "hot", frequent=True)
    arc.push("scan1", "scan1")
    arc.push("scan2", "scan2")
    assert [arc.pop(), arc.pop(), arc.pop()] == ["scan1", "scan2", "hot"]


def test_arc_ghost_hits_adapt_the_target():
    arc = ARCPolicy(4, KeyList, lambda k: k)
    arc.push("a", "a")
    arc.pop()  # "a" goes to the B1 ghost list
    assert arc.readmit("a") and arc.p == 1.0
    arc.push("b", "b", frequent=True)
    arc.pop()  # B2 ghost
    assert arc.readmit("b") and arc.p == 0.0
    assert not arc.readmit("never-seen")


def test_arc_ghost_lists_are_bounded():
    arc = ARCPolicy(2, KeyList, lambda k: k)
    for k in range(10):
        arc.push(k, k)
        arc.pop()
    assert not arc.readmit(0) and arc.readmit(9)


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="'mru'"):
        make_policy("mru", 4, KeyList, lambda k: k)
