"""The router: round robin, power of two choices, prefix-cache affinity with a load
bound, and the prefix index kept from KV events."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from pyagent_ref.dp.kv_events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402
from pyagent_ref.dp.router import PrefixIndex, ReplicaLoad, Router  # noqa: E402

IDLE = ReplicaLoad(0)


def test_round_robin_takes_replicas_in_turn():
    router = Router(3, "round_robin")
    assert [router.route([], [IDLE] * 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


@given(st.lists(st.integers(0, 9), min_size=2, max_size=2), st.integers(0, 2**32))
def test_two_choices_of_two_replicas_take_the_less_loaded(queues, seed):
    router = Router(2, "p2c", seed=seed)
    loads = [ReplicaLoad(q) for q in queues]
    choice = router.route([], loads)
    assert loads[choice].score == min(q.score for q in loads)


def test_two_choices_never_take_the_most_loaded_of_three():
    router = Router(3, "p2c", seed=1)
    loads = [ReplicaLoad(0), ReplicaLoad(5), ReplicaLoad(9)]
    assert 2 not in {router.route([], loads) for _ in range(50)}


def test_kv_usage_breaks_ties_between_equal_queues():
    router = Router(2, "p2c")
    assert router.route([], [ReplicaLoad(1, 0.9), ReplicaLoad(1, 0.1)]) == 1


def test_prefix_goes_to_the_longest_cached_prefix_within_the_slack():
    router = Router(3, "prefix", slack=2)
    router.index.apply(1, [BlockStored([10, 11], None, [0] * 8, 4, None, "GPU")])
    router.index.apply(2, [BlockStored([10], None, [0] * 4, 4, None, "GPU")])
    loads = [ReplicaLoad(0), ReplicaLoad(2), ReplicaLoad(0)]
    assert router.route([10, 11, 12], loads) == 1
    # replica 1 is now too busy: the prefix does not outweigh the queue
    busy = [ReplicaLoad(0), ReplicaLoad(3), ReplicaLoad(0)]
    assert router.route([10, 11, 99], busy) != 1


def test_prefix_without_any_hit_balances_and_notes_its_choice():
    router = Router(2, "prefix")
    first = router.route([1, 2], [ReplicaLoad(0), ReplicaLoad(0)])
    # the burst's next request follows before any event arrived
    assert router.route([1, 2, 3], [ReplicaLoad(1), ReplicaLoad(1)]) == first


def test_index_follows_stored_removed_and_cleared():
    index = PrefixIndex(1)
    index.apply(0, [BlockStored([1, 2, 3], None, [0] * 12, 4, None, "GPU")])
    assert index.matched_blocks(0, [1, 2, 3, 4]) == 3
    index.apply(0, [BlockRemoved([2], "GPU")])
    assert index.matched_blocks(0, [1, 2, 3]) == 1  # a chain stops at its first miss
    index.apply(0, [AllBlocksCleared()])
    assert index.matched_blocks(0, [1]) == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_replicas"):
        Router(0)
    with pytest.raises(TypeError, match="num_replicas"):
        Router(2.0)
    with pytest.raises(ValueError, match="policy"):
        Router(2, "least_loaded")
    with pytest.raises(ValueError, match="slack"):
        Router(2, slack=-1)
    with pytest.raises(ValueError, match="loads"):
        Router(2).route([], [IDLE])
