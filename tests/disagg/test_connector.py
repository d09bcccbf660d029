"""KV connectors without engines: blocks arrive intact (content and KV), a transfer
nobody acknowledges fails in bounded time, and shared memory is never left behind."""

from __future__ import annotations

import glob
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from pyagent_ref.disagg.connector import (  # noqa: E402
    KVBlock,
    TransferError,
    make_connector,
)
from pyagent_ref.kv_cache.block import BlockContent  # noqa: E402


def blocks() -> list[KVBlock]:
    torch.manual_seed(0)
    return [
        KVBlock(0, BlockContent(bytes(32), (1, 2, 3, 4), ()), torch.randn(2, 2, 4, 2, 8)),
        KVBlock(
            0,
            BlockContent(b"\x01" * 32, (5, 6, 7, 8), (("lora", 3), "salt", ("img", -2))),
            torch.randn(2, 2, 4, 2, 8).to(torch.bfloat16),
        ),
    ]


def leftover_segments() -> list[str]:
    return glob.glob("/dev/shm/pyagent-kv-*")


@pytest.mark.parametrize("kind", ["zmq", "shm"])
def test_blocks_arrive_intact_and_are_acknowledged(kind, tmp_path):
    endpoint = "tcp://127.0.0.1:0" if kind == "zmq" else f"ipc://{tmp_path}/kv"
    consumer = make_connector(kind, endpoint, "consumer")
    producer = make_connector(kind, consumer.endpoint, "producer", timeout_s=10)
    received = []
    thread = threading.Thread(target=lambda: received.extend(consumer.receive(10_000)))
    try:
        thread.start()
        sent = blocks()
        producer.send("t1", sent)  # returns once acknowledged
        thread.join(10)
        assert [tid for tid, _ in received] == ["t1"]
        got = received[0][1]
        for a, b in zip(sent, got, strict=True):
            assert (a.group_id, a.content) == (b.group_id, b.content)
            assert a.data.dtype == b.data.dtype and torch.equal(a.data, b.data)
    finally:
        producer.close()
        consumer.close()
    assert not leftover_segments()


@pytest.mark.parametrize("kind", ["zmq", "shm"])
def test_an_unacknowledged_transfer_fails_in_time_and_frees_its_segment(kind, tmp_path):
    endpoint = "tcp://127.0.0.1:1" if kind == "zmq" else f"ipc://{tmp_path}/nobody"
    producer = make_connector(kind, endpoint, "producer", timeout_s=0.3)
    try:
        with pytest.raises(TransferError, match="no acknowledgement"):
            producer.send("t", blocks())
    finally:
        producer.close()
    assert not leftover_segments()


def test_bad_connector_and_role_are_refused():
    with pytest.raises(ValueError, match="connector"):
        make_connector("rdma", "tcp://127.0.0.1:0", "producer")
    with pytest.raises(ValueError, match="role"):
        make_connector("zmq", "tcp://127.0.0.1:0", "both")
