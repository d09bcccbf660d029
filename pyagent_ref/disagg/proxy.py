"""`DisaggProxy`: disaggregated prefill/decode behind one `generate`.

    DisaggProxy.generate(prompt) ─► prefill instance: the prompt's KV, one token
                                        │ KVConnector (zmq: tcp://127.0.0.1, or shm)
                                        ▼
                                    decode instance: the blocks into its prefix cache,
                                    then the request, from the first token on ─► tokens

The proxy starts both instances (`disagg.instance`, spawned processes of one model),
checks at start that their KV layouts agree (a mismatch is a ValueError naming the
field and both values), routes every request through both, and streams the decode
instance's tokens. The decode instance generates every output token itself (the
prefill's one token is only what running the prompt costs), so greedy outputs equal
a colocated engine's.

Failures end requests, never hang them: every wait is bounded (`timeout_s`) and checks
that the instance it waits on is alive. A decode instance that dies fails the request
in flight with finish_reason "error", and the prefill instance's transfer times out
(its blocks stay in its prefix cache, free). `close` stops both processes.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from .._processes import passive_openmp
from ..engine.core import EngineConfig
from ..engine.core_proc import _codec
from ..sample.params import SamplingParams
from ..sched.request import Request
from .connector import CONNECTORS
from .instance import (
    FROM_INSTANCE,
    Decode,
    Prefill,
    Ready,
    Shutdown,
    StartupFailed,
    Stats,
    StatsReply,
    Tokens,
    run_instance,
)

_DEAD = object()  # what a waiter gets once its instance's process is gone
_LAYOUT_FIELDS = ("model", "dtype", "kv_cache_dtype", "block_size", "prefix_caching_hash_algo")


def check_layouts(prefill: dict, decode: dict) -> None:
    """Raise ValueError naming the first field whose value differs between the sides
    (the configs before start, the loaded models' KV layouts after)."""
    for name, value in prefill.items():
        other = decode.get(name)
        if other != value:
            raise ValueError(
                f"the prefill and decode instances' KV layouts differ: {name} is "
                f"{value!r} on the prefill side and {other!r} on the decode side"
            )


@dataclass
class DisaggOutput:
    """One request's result: its tokens, why it ended, and when its tokens came."""

    request_id: str
    token_ids: list[int]
    finish_reason: str
    error: str | None = None
    transferred_blocks: int = 0
    ttft: float | None = None  # seconds from generate() to the first token
    itl: list[float] = field(default_factory=list)  # gaps between token messages


class _InstanceHandle:
    """One spawned instance, its two sockets, and a reader thread that sorts its
    messages by request id (requests go through concurrently); control replies (Ready,
    StartupFailed, StatsReply) go to `control`. When the process dies, every waiter
    gets `_DEAD`."""

    def __init__(self, role, config, kv, directory: str, timeout_s: float) -> None:
        self.role, self.timeout_s = role, timeout_s
        self.encoder, self.decoder = _codec(FROM_INSTANCE)
        self.context = zmq.Context()
        self.to, self.back = self.context.socket(zmq.PUSH), self.context.socket(zmq.PULL)
        inbox, outbox = f"ipc://{directory}/{role}-in", f"ipc://{directory}/{role}-out"
        self.to.bind(inbox)
        self.back.bind(outbox)
        self._send_lock, self._queues_lock = threading.Lock(), threading.Lock()
        self.control: queue.SimpleQueue = queue.SimpleQueue()
        self._queues: dict[str, queue.SimpleQueue] = {}
        self._stop = threading.Event()
        self.dead: str | None = None
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(
            target=run_instance,
            args=(role, config, inbox, outbox, kv, os.getpid()),
            name=f"pyagent-{role}",
            daemon=True,
        )
        with passive_openmp():
            self.process.start()
        self._reader = threading.Thread(target=self._read, name=f"pyagent-{role}-reader")
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if self.back.poll(100):
                message = self.decoder.decode(self.back.recv())
                rid = getattr(message, "request_id", None)
                self.queue(rid).put(message) if rid is not None else self.control.put(message)
            elif not self.process.is_alive():
                self.dead = f"the {self.role} instance died (exit code {self.process.exitcode})"
                with self._queues_lock:
                    for q in [self.control, *self._queues.values()]:
                        q.put(_DEAD)
                return

    def queue(self, request_id: str) -> queue.SimpleQueue:
        with self._queues_lock:
            q = self._queues.get(request_id)
            if q is None:
                q = self._queues[request_id] = queue.SimpleQueue()
                if self.dead is not None:
                    q.put(_DEAD)
            return q

    def forget(self, request_id: str) -> None:
        with self._queues_lock:
            self._queues.pop(request_id, None)

    def send(self, message) -> None:
        with self._send_lock:
            self.to.send(self.encoder.encode(message))

    def receive(self, q: queue.SimpleQueue) -> Any:
        """The next message of `q`; RuntimeError if the process died or nothing came."""
        try:
            message = q.get(timeout=self.timeout_s)
        except queue.Empty:
            raise RuntimeError(
                f"the {self.role} instance sent nothing in {self.timeout_s:g} s"
            ) from None
        if message is _DEAD:
            raise RuntimeError(self.dead)
        return message

    def close(self) -> None:
        if self.process.is_alive():
            self.send(Shutdown())
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._stop.set()
        self._reader.join(5)
        self.to.close(linger=0)
        self.back.close(linger=0)
        self.context.term()


class DisaggProxy:
    """A prefill and a decode instance of one model (see the module docstring).

    Args:
        model: as `EngineConfig.model`.
        connector: "zmq" (KV in ZeroMQ frames over tcp://127.0.0.1) or "shm" (shared
            memory, the socket over ipc://).
        prefill_args, decode_args: `EngineConfig` fields for one side only (e.g. a
            different num_kv_blocks); they must not change the KV layout.
        timeout_s: the bound on every wait of the proxy (start, a reply, a step's tokens).
        transfer_timeout_s: how long the prefill instance waits for the decode
            instance to acknowledge a transfer before failing the request.
        engine_args: `EngineConfig` fields for both. The decode instance gets a CPU
            offload tier (`kv_offload`) as large as its KV cache to receive blocks in,
            unless decode_args sets one.
    Raises:
        ValueError: an unknown connector, a bad engine argument, or instances whose KV
            layouts differ (the field and both values are named); nothing is left running.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        connector: str = "zmq",
        prefill_args: dict | None = None,
        decode_args: dict | None = None,
        timeout_s: float = 60.0,
        transfer_timeout_s: float = 10.0,
        **engine_args: Any,
    ) -> None:
        if connector not in CONNECTORS:
            raise ValueError(f"connector must be one of {CONNECTORS}, got {connector!r}")
        prefill = EngineConfig(model=model, **(engine_args | (prefill_args or {})))
        decode = EngineConfig(model=model, **(engine_args | (decode_args or {})))
        check_layouts(
            {name: getattr(prefill, name) for name in _LAYOUT_FIELDS},
            {name: getattr(decode, name) for name in _LAYOUT_FIELDS},
        )
        if decode.kv_offload is None:
            blocks = decode.num_kv_blocks or 1024
            decode = dataclasses.replace(decode, kv_offload={"cpu_blocks": blocks})
        self.timeout_s = timeout_s
        self._ids = itertools.count()
        self._dir = tempfile.mkdtemp(prefix="pyagent-pd-")
        kv_endpoint = "tcp://127.0.0.1:0" if connector == "zmq" else f"ipc://{self._dir}/kv"
        transfer_s = transfer_timeout_s
        self.instances: list[_InstanceHandle] = []
        try:
            self.decode = self._start("decode", decode, (connector, kv_endpoint, transfer_s))
            self.prefill = self._start(
                "prefill", prefill, (connector, self.decode.ready.kv_endpoint, transfer_s)
            )
            check_layouts(self.prefill.ready.layout, self.decode.ready.layout)
        except BaseException:
            self.close()
            raise

    def _start(self, role: str, config: EngineConfig, kv: tuple) -> _InstanceHandle:
        handle = _InstanceHandle(role, config, kv, self._dir, self.timeout_s)
        self.instances.append(handle)
        message = handle.receive(handle.control)
        if isinstance(message, StartupFailed):
            raise ValueError(f"the {role} instance did not start: {message.error}")
        assert isinstance(message, Ready)
        handle.ready = message
        return handle

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> DisaggOutput:
        """Prefill on one instance, decode on the other; the tokens, or an error."""
        params = SamplingParams() if params is None else params
        rid = request_id or f"pd-{next(self._ids)}"
        request = Request(
            rid, list(prompt_token_ids), sampling_params=params, max_tokens=params.max_tokens
        )
        start = time.monotonic()
        from_prefill, from_decode = self.prefill.queue(rid), self.decode.queue(rid)
        try:
            self.prefill.send(Prefill(request))
            reply = self.prefill.receive(from_prefill)
            if isinstance(reply, Tokens):  # the prefill failed
                return DisaggOutput(rid, [], "error", reply.error)
            self.decode.send(Decode(request, rid))
            out = DisaggOutput(rid, [], "", transferred_blocks=reply.num_blocks)
            last = None
            while not out.finish_reason:
                message = self.decode.receive(from_decode)
                now = time.monotonic()
                if message.token_ids:
                    if last is None:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                out.token_ids += message.token_ids
                out.finish_reason, out.error = message.finish_reason or "", message.error
            return out
        except RuntimeError as exc:  # an instance died or went silent
            return DisaggOutput(rid, [], "error", str(exc))
        finally:
            self.prefill.forget(rid)
            self.decode.forget(rid)

    def stats(self, role: str) -> StatsReply:
        """The block counts and work of one instance ("prefill" or "decode")."""
        handle = self.prefill if role == "prefill" else self.decode
        handle.send(Stats())
        while True:
            message = handle.receive(handle.control)
            if isinstance(message, StatsReply):
                return message

    def close(self) -> None:
        """Stop both instances and remove the sockets' directory (idempotent)."""
        for handle in self.instances:
            handle.close()
        self.instances = []
        shutil.rmtree(self._dir, ignore_errors=True)
