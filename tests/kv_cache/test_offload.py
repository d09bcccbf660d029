"""Tiered KV offload with real tensors: CPU memory, then disk files."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pyagent_ref.kv_cache.events import BlockRemoved, BlockStored  # noqa: E402
from pyagent_ref.kv_cache.offload import CPUTier, DiskTier, OffloadManager  # noqa: E402

SHAPE = (2, 4, 3)  # (K/V, tokens, head dim) of one block


def key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def kv(i: int):
    return torch.full(SHAPE, float(i), dtype=torch.bfloat16)


def store(m: OffloadManager, *indices: int) -> None:
    """Offload blocks one at a time, as a request's blocks are evicted."""
    for i in indices:
        plan = m.prepare_store([key(i)])
        assert plan is not None
        for k in plan.to_store:
            m.store(k, kv(i))
        m.complete_store(plan.to_store)


def load_all(m: OffloadManager, *indices: int) -> list[float | None]:
    plan = m.prepare_load([key(i) for i in indices])
    out = []
    for j in range(len(plan.hashes)):
        dst = torch.empty(SHAPE, dtype=torch.bfloat16)
        out.append(float(dst[0, 0, 0]) if m.load(plan, j, dst) else None)
    m.complete_load(plan)
    return out


@pytest.fixture(params=["lru", "arc"])
def manager(request, tmp_path):
    return OffloadManager([CPUTier(2), DiskTier(tmp_path, 3)], policy=request.param)


def test_round_trip_through_both_tiers(manager):
    store(manager, 1, 2, 3, 4)  # 1 and 2 are demoted to disk
    assert manager.lookup([key(i) for i in (1, 2, 3, 4, 5)]) == 4
    assert load_all(manager, 1, 2, 3, 4) == [1.0, 2.0, 3.0, 4.0]


def test_last_tier_drops_its_victims(manager):
    store(manager, *range(1, 7))  # 2 in memory + 3 on disk: the oldest is gone
    assert manager.lookup([key(1)]) == 0
    assert manager.lookup([key(i) for i in range(2, 7)]) == 5


def test_pending_stores_are_invisible_until_completed(manager):
    plan = manager.prepare_store([key(1)])
    manager.store(key(1), kv(1))
    assert manager.lookup([key(1)]) == 0
    manager.complete_store(plan.to_store)
    assert manager.lookup([key(1)]) == 1


def test_a_batch_larger_than_the_first_tier_is_refused(manager):
    assert manager.prepare_store([key(i) for i in range(3)]) is None
    assert manager.lookup([key(0)]) == 0


def test_failed_store_releases_the_reservation(manager):
    plan = manager.prepare_store([key(1), key(2)])
    manager.complete_store(plan.to_store, success=False)
    assert manager.lookup([key(1)]) == 0
    store(manager, 3, 4)  # the room came back


def test_store_needs_a_reservation(manager):
    with pytest.raises(ValueError, match="prepare_store"):
        manager.store(key(9), kv(9))


def test_pinned_blocks_are_not_evicted(tmp_path):
    m = OffloadManager([CPUTier(2)])
    store(m, 1, 2)
    plan = m.prepare_load([key(1), key(2)])
    assert m.prepare_store([key(3)]) is None  # both residents are being read
    m.complete_load(plan)
    assert m.prepare_store([key(3)]) is not None


def test_corrupted_or_missing_disk_files_are_misses(tmp_path):
    m = OffloadManager([CPUTier(1), DiskTier(tmp_path, 4)])
    store(m, 1, 2, 3)  # 1 and 2 on disk
    path = tmp_path / f"{key(1).hex()}.safetensors"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # flip a bit of the tensor data
    path.write_bytes(bytes(raw))
    os.remove(tmp_path / f"{key(2).hex()}.safetensors")
    assert load_all(m, 1) == [None] and load_all(m, 2) == [None]
    assert m.lookup([key(1)]) == 0 and m.lookup([key(2)]) == 0
    assert m.misses == 2
    removed = [e for e in m.take_events() if isinstance(e, BlockRemoved) and e.medium == "disk"]
    assert {e.block_hashes[0] for e in removed} >= {key(1), key(2)}


def test_disk_writes_are_atomic(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 4)
    tier.write(key(1), kv(1))

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        tier.write(key(1), kv(5))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key(1).hex()}.safetensors"]
    assert float(tier.get(key(1))[0, 0, 0]) == 1.0  # the old copy is intact


def test_events_name_the_medium(manager):
    store(manager, 1, 2, 3)
    events = manager.take_events()
    stored = [(e.medium, e.block_hashes) for e in events if isinstance(e, BlockStored)]
    assert ("cpu", (key(1),)) in stored and ("disk", (key(1),)) in stored


def test_capacities_are_validated(tmp_path):
    with pytest.raises(ValueError, match="capacity_blocks"):
        CPUTier(0)
    with pytest.raises(ValueError, match="tiers"):
        OffloadManager([])


def test_read_returns_the_stored_copy_and_drops_a_corrupted_one(tmp_path):
    m = OffloadManager([CPUTier(1), DiskTier(tmp_path, 4)])
    store(m, 1, 2)  # 1 on disk, 2 in memory
    assert float(m.read(key(2))[0, 0, 0]) == 2.0 and float(m.read(key(1))[0, 0, 0]) == 1.0
    assert m.read(key(7)) is None and m.misses == 0  # never stored: not a lost copy
    path = tmp_path / f"{key(1).hex()}.safetensors"
    path.write_bytes(path.read_bytes()[:-8])  # truncated
    assert m.read(key(1)) is None and m.misses == 1
    assert m.lookup([key(1)]) == 0
    store(m, 3, 4)  # the dropped entry's room is usable again


def test_clear_drops_everything_but_not_mid_transfer(manager):
    store(manager, 1, 2, 3)
    plan = manager.prepare_load([key(3)])
    with pytest.raises(RuntimeError, match="in flight"):
        manager.clear()
    manager.complete_load(plan)
    manager.clear()
    assert manager.lookup([key(1)]) == manager.lookup([key(2)]) == manager.lookup([key(3)]) == 0
    store(manager, 4, 5, 6, 7, 8)  # every tier has its full room again
    assert manager.lookup([key(i) for i in range(4, 9)]) == 5


def test_events_can_be_turned_off():
    m = OffloadManager([CPUTier(1)], enable_events=False)
    store(m, 1, 2)
    assert m.take_events() == []
