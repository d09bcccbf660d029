"""A prefill or decode instance: an `EngineCore` in a process of its own, driven by the
proxy (`disagg.proxy`) over two ipc:// sockets, its KV moved by a `KVConnector`.

    prefill: Prefill(request) ─► queued for one token, batched with the other prompts
             by the scheduler ─► when its step ends: read its full blocks' KV
             ─► connector.send (acknowledged) ─► Prefilled(request_id, blocks)
    decode:  connector.receive ─► the blocks into the KV offload tier (CPU), under the
             keys the prefix cache looks them up by;
             Decode(request, transfer_id) ─► once its blocks are in (or `wait_s` passed:
             then it computes them itself) ─► the engine steps; Tokens(...) per step

On the decode side, the request's prefix lookup finds the transferred blocks in the
offload tier and brings them into the device prefix cache (`KVCacheManager` onboarding),
so the decode instance computes only the prompt's last, partial block and the tokens it
generates. The same code serves both roles; messages are msgspec (MessagePack) structs.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import msgspec
import zmq

from ..engine.core import EngineConfig, EngineCore
from ..engine.core_proc import _codec
from ..sched.request import Request
from .connector import KVBlock, make_connector


class Prefill(msgspec.Struct, tag=True):
    request: Request


class Decode(msgspec.Struct, tag=True):
    request: Request
    transfer_id: str | None


class Stats(msgspec.Struct, tag=True):
    pass


class Shutdown(msgspec.Struct, tag=True):
    pass


class Ready(msgspec.Struct, tag=True):
    layout: dict[str, str]
    kv_endpoint: str


class StartupFailed(msgspec.Struct, tag=True):
    error: str


class Prefilled(msgspec.Struct, tag=True):
    request_id: str
    num_blocks: int


class Tokens(msgspec.Struct, tag=True):
    request_id: str
    token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None


class StatsReply(msgspec.Struct, tag=True):
    num_blocks: int
    num_free_blocks: int
    onboarded_blocks: int
    scheduled_tokens: int
    steps: int  # the steps run (prefill: fewer than prompts when they were batched)


TO_INSTANCE = Prefill | Decode | Stats | Shutdown
FROM_INSTANCE = Ready | StartupFailed | Prefilled | Tokens | StatsReply


def layout(core: EngineCore) -> dict[str, str]:
    """What must agree between a prefill and a decode instance for KV to move.

    Raises:
        ValueError: calculate_kv_scales (each instance would compute its own scales).
    """
    config = core.config
    if config.calculate_kv_scales:
        raise ValueError(
            "calculate_kv_scales: the prefill and decode instances would each compute their "
            "own fp8 KV scales; load them from the checkpoint instead"
        )
    return {
        "architecture": str(core.limits.architecture),
        "vocab_size": str(core.limits.vocab_size),
        "dtype": config.dtype,
        "kv_cache_dtype": config.kv_cache_dtype,
        "kv_scales": repr(core.kv_scales),
        "block_size": str(config.block_size),
        "prefix_caching_hash_algo": config.prefix_caching_hash_algo,
        "kv_cache_groups": repr(core.kv.config.groups),
    }


def run_instance(
    role: str, config: EngineConfig, inbox: str, outbox: str, kv: tuple, parent_pid: int
) -> None:
    """The instance process's entry point; kv = (connector kind, endpoint, timeout_s)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    encoder, decoder = _codec(TO_INSTANCE)
    context = zmq.Context()
    from_proxy, to_proxy = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    from_proxy.connect(inbox)
    to_proxy.connect(outbox)
    connector = None
    try:
        core = EngineCore.from_config(config)
        if len(core.kv.config.groups) != 1:
            raise ValueError(
                f"P/D transfers one KV cache group; this model has {len(core.kv.config.groups)}"
            )
        kind, endpoint, timeout_s = kv
        connector = make_connector(
            kind, endpoint, "producer" if role == "prefill" else "consumer", timeout_s
        )
        to_proxy.send(encoder.encode(Ready(layout(core), connector.endpoint)))
        Instance(role, core, connector, from_proxy, to_proxy, encoder, decoder).run(parent_pid)
    except Exception as exc:
        to_proxy.send(encoder.encode(StartupFailed(f"{type(exc).__name__}: {exc}")))
    finally:
        if connector is not None:
            connector.close()
        from_proxy.close(linger=0)
        to_proxy.close(linger=2000)
        context.term()


class Instance:
    """The loop of one instance (see the module docstring)."""

    def __init__(self, role, core, connector, inbox, outbox, encoder, decoder, wait_s=10.0):
        self.role, self.core, self.connector = role, core, connector
        self.inbox, self.outbox, self.encoder, self.decoder = inbox, outbox, encoder, decoder
        self.wait_s = wait_s
        self.arrived: set[str] = set()  # transfers stored, not yet claimed by a request
        self.waiting: list[tuple[Decode, float]] = []  # decodes waiting for their blocks
        self.prefilling: dict[str, Request] = {}  # prefill: queued prompts, by id

    def send(self, message) -> None:
        self.outbox.send(self.encoder.encode(message))

    def run(self, parent_pid: int) -> None:
        core = self.core
        while os.getppid() == parent_pid:
            busy = core.has_unfinished_requests() or self.waiting
            if self.role == "decode":
                for transfer_id, blocks in self.connector.receive(0):
                    self.store(blocks)
                    self.arrived.add(transfer_id)
            while self.inbox.poll(0 if busy else 50):
                message = self.decoder.decode(self.inbox.recv())
                if isinstance(message, Shutdown):
                    return
                self.handle(message)
            self.admit_decodes()
            if not core.has_unfinished_requests():
                continue
            outputs = core.step().outputs
            if self.role == "prefill":
                for out in outputs:
                    if out.finish_reason is not None and out.req_id in self.prefilling:
                        self.transfer(self.prefilling.pop(out.req_id))
            else:
                for out in outputs:
                    self.send(Tokens(out.req_id, list(out.new_token_ids), out.finish_reason))

    def handle(self, message) -> None:
        if isinstance(message, Prefill):
            self.start_prefill(message.request)
        elif isinstance(message, Decode):
            self.waiting.append((message, time.monotonic() + self.wait_s))
        elif isinstance(message, Stats):
            kv = self.core.kv
            self.send(
                StatsReply(
                    kv.pool.num_blocks,
                    kv.pool.num_free_blocks,
                    kv.metrics().onboarded_blocks,
                    self.core.stats.scheduled_tokens,
                    self.core.stats.steps,
                )
            )

    def admit_decodes(self) -> None:
        """Add the waiting decodes whose blocks arrived (or whose wait ran out)."""
        now, still = time.monotonic(), []
        for message, deadline in self.waiting:
            tid = message.transfer_id
            if tid is None or tid in self.arrived or now >= deadline:
                self.arrived.discard(tid)
                try:
                    self.core.add_request(message.request)
                except Exception as exc:
                    rid = message.request.request_id
                    self.send(Tokens(rid, [], "error", f"{type(exc).__name__}: {exc}"))
            else:
                still.append((message, deadline))
        self.waiting = still

    def store(self, blocks: list[KVBlock]) -> None:
        """Transferred blocks into the offload tier, keyed as the prefix cache finds them."""
        offloader = self.core.kv.offloader
        keys = [offloader.key(b.group_id, b.content) for b in blocks]
        plan = offloader.tiers.prepare_store(keys)
        if plan is None:
            return  # every entry is pinned: the decode computes these blocks itself
        data = dict(zip(keys, (b.data for b in blocks), strict=True))
        for key in plan.to_store:
            offloader.tiers.store(key, data[key])
        offloader.tiers.complete_store(plan.to_store)

    def start_prefill(self, request: Request) -> None:
        """Queue the prompt for one token; the scheduler batches it with the others."""
        rid = request.request_id
        one = dataclasses.replace(
            request,
            max_tokens=1,
            sampling_params=dataclasses.replace(request.sampling_params, max_tokens=1),
        )
        try:
            self.core.add_request(one)
        except Exception as exc:
            self.send(Tokens(rid, [], "error", f"prefill failed: {type(exc).__name__}: {exc}"))
            return
        self.prefilling[rid] = one

    def transfer(self, one: Request) -> None:
        """A prompt's step ended: send its full blocks (still in the prefix cache) to
        the decode side, or say why it failed."""
        core, rid = self.core, one.request_id
        try:
            if one.error is not None:
                raise RuntimeError(one.error)
            blocks = []
            for i, block_hash in enumerate(
                one.block_hashes[: one.num_prompt_tokens // core.config.block_size]
            ):
                content = core.kv.hasher.content(one, i)
                block = core.kv.pool.get_cached_block(block_hash, content)
                if block is None:
                    break
                blocks.append(KVBlock(0, content, core.runner.read_block(0, block.block_id)))
            self.connector.send(rid, blocks)
            self.send(Prefilled(rid, len(blocks)))
        except Exception as exc:  # a failed step or a TransferError: the request ends
            self.send(Tokens(rid, [], "error", f"prefill failed: {type(exc).__name__}: {exc}"))
