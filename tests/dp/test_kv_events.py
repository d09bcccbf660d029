"""KV events over ZeroMQ: vLLM's wire format (decoded here with vLLM's documented
schema, independently of ours), the sequence numbers, replay, and an engine that
publishes its prefix cache's changes with vLLM-compatible block hashes."""

from __future__ import annotations

import hashlib
import time

import pytest

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")
pytest.importorskip("torch")

from pyagent_ref.dp.kv_events import (  # noqa: E402
    KVEventPublisher,
    KVEventSubscriber,
    external_hash,
    to_wire,
)
from pyagent_ref.kv_cache import events as kv  # noqa: E402

ROOT = bytes(32)
H1, H2 = hashlib.sha256(b"1").digest(), hashlib.sha256(b"2").digest()


# vLLM's schema (vllm/distributed/kv_events.py), as its documentation gives it
class VBlockStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class VBlockRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class VAllBlocksCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class VKVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[VBlockStored | VBlockRemoved | VAllBlocksCleared]
    data_parallel_rank: int | None = None


EVENTS = [
    kv.BlockStored((H1, H2), ROOT, (1, 2, 3, 4), 2),
    kv.BlockStored((H2,), H1, (3, 4), 2, medium="cpu", lora_id=3),
    kv.BlockRemoved((H1,)),
    kv.AllBlocksCleared(),
]


def test_to_wire_uses_vllms_hashes_parents_and_media():
    stored, child, removed, cleared = to_wire(EVENTS, root=ROOT)
    low64 = int.from_bytes(H1[-8:], "big")
    assert stored.block_hashes[0] == low64 == external_hash(H1)
    assert stored.parent_block_hash is None  # the root is no block
    assert child.parent_block_hash == low64 and child.medium == "CPU"
    assert (stored.lora_id, child.lora_id) == (None, 3)
    assert stored.medium == removed.medium == "GPU"
    assert type(cleared).__name__ == "AllBlocksCleared"
    assert to_wire(EVENTS[:1], root=ROOT, int_hashes=False)[0].block_hashes == [H1, H2]
    with pytest.raises(TypeError, match="events"):
        to_wire(["BlockStored"])


def test_publisher_frames_decode_with_vllms_schema_and_replay():
    publisher = KVEventPublisher(
        "tcp://127.0.0.1:0", root=ROOT, replay_endpoint="tcp://127.0.0.1:0", topic="kv"
    )
    assert not publisher.endpoint.endswith(":0")
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(publisher.endpoint)
    replay = context.socket(zmq.DEALER)
    replay.connect(publisher.replay_endpoint)
    try:
        deadline = time.monotonic() + 10
        got = []
        while not got and time.monotonic() < deadline:  # a SUB joins asynchronously
            publisher.publish(EVENTS[:2])
            if sub.poll(100):
                got.append(sub.recv_multipart())
        assert got, "no batch arrived in 10 s"
        topic, seq, payload = got[0]
        assert topic == b"kv" and len(seq) == 8
        batch = msgspec.msgpack.decode(payload, type=VKVEventBatch)
        assert [type(e) for e in batch.events] == [VBlockStored, VBlockStored]
        assert batch.events[0].token_ids == [1, 2, 3, 4] and batch.events[0].block_size == 2
        assert publisher.publish([]) is None  # nothing to say, nothing sent
        last = publisher.publish(EVENTS[2:])
        replay.send_multipart([b"", last.to_bytes(8, "big")])
        assert replay.poll(5000)
        frames = replay.recv_multipart()
        assert int.from_bytes(frames[1], "big") == last
        decoded = msgspec.msgpack.decode(frames[2], type=VKVEventBatch).events
        assert [type(e) for e in decoded] == [VBlockRemoved, VAllBlocksCleared]
        assert replay.poll(5000)
        assert replay.recv_multipart()[1] == (-1).to_bytes(8, "big", signed=True)
    finally:
        sub.close(linger=0)
        replay.close(linger=0)
        context.term()
        publisher.close()
        publisher.close()  # idempotent


def test_an_engine_publishes_its_blocks_under_vllm_hashes(tiny_llm_dir, monkeypatch):
    from pyagent_ref.engine.llm import LLM
    from pyagent_ref.sample.params import SamplingParams
    from tests.kv_cache.test_vllm_hashing import vllm_chain

    monkeypatch.setenv("PYTHONHASHSEED", "3")
    llm = LLM(
        tiny_llm_dir[1],
        block_size=4,
        num_kv_blocks=64,
        prefix_caching_hash_algo="sha256_cbor",
        kv_events_endpoint="tcp://127.0.0.1:0",
    )
    subscriber = KVEventSubscriber(llm.core.kv_events.endpoint)
    try:
        params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        deadline, stored, tried = time.monotonic() + 20, [], {}
        while not stored and time.monotonic() < deadline:  # a SUB joins asynchronously
            prompt = [len(tried) + 1, *range(1, 10)]  # a new prompt: a cached one stores nothing
            tried[tuple(prompt[:8])] = prompt
            llm.generate([prompt], params)
            stored = [
                e
                for _, batch in subscriber.receive(200)
                for e in batch.events
                if type(e).__name__ == "BlockStored" and e.parent_block_hash is None
            ]
        assert stored, "no BlockStored event"
        for event in stored:  # a late batch may be an earlier prompt's: found by its tokens
            prompt = tried[tuple(event.token_ids[:8])]
            want = [external_hash(h) for h in vllm_chain(prompt, 4, "3")]
            assert event.block_hashes[:2] == want  # the prompt's two full blocks
    finally:
        subscriber.close()
        llm.core.kv_events.close()


def test_a_bad_endpoint_is_refused():
    from pyagent_ref.engine.core import EngineConfig

    with pytest.raises(ValueError, match="kv_events_endpoint"):
        EngineConfig(kv_events_endpoint="localhost:5557")
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        EngineConfig(prefix_caching_hash_algo="md5")
