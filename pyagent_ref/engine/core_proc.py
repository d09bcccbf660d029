"""The engine core in its own process: `AsyncLLM(engine_process=True)`, `pyagent serve`.

    frontend process                                      core process (spawned)
    AsyncLLM ── EngineCoreClient ── AddRequest, Abort, Call ──►  CoreServer.run:
       ▲             │ reader thread ◄── Step, Reply ──────────  EngineCore steps while
       └─ step() ◄───┘                                           requests are unfinished

With the engine core in the server's process, the HTTP path (FastAPI, pydantic, SSE,
detokenization) and the engine's Python scheduling take turns on one GIL. Here the core
steps on its own, back to back, and sends each step's `EngineCoreOutputs` as it goes;
the frontend detokenizes and streams them meanwhile (vLLM's architecture; the code is
ours). Messages are msgspec-encoded (MessagePack) over two pyzmq PUSH/PULL sockets on
ipc:// paths in a private temporary directory.

What crosses, and what is mirrored in the frontend:

* A request crosses whole, but for its grammar matcher (a parser's live state, not
  data): the core process builds it again from ``sampling_params.structured_outputs``
  with its own tokenizer (a constraint new to that process is compiled there once, on
  the step loop; the frontend compiled it too, so that a bad one is a 400 at admission).
  Images are preprocessed in the frontend; their pixel values cross with the request
  (torch tensors as MessagePack extension objects) and are encoded in the core.
* The frontend keeps each request it sent until the core says it finished: its output
  tokens and, at the end, the core's timestamps (`RequestTimes`, on the same monotonic
  clock), so `RequestMetrics` read the same as with an engine in the process.
* Every message carries `CoreState` (queue lengths, KV cache metrics, `EngineStats`),
  mirrored under `EngineCore`'s names (``client.scheduler.running``, ``client.kv.metrics()``,
  ``client.stats``), so /metrics reads the client as it reads an `EngineCore`. Admission
  checks run in the frontend against the core's `Limits`, sent at startup.
* An abort ends a request in the frontend at once (`_Frontend._end`); the core confirms
  it in a later message, and outputs of that id that were already on their way are
  dropped until then (so an id reused at once never receives its predecessor's tokens).

Failures: an exception in a step fails the core's requests with finish_reason "error"
(as `AsyncLLM` does in-process). If the core process dies, `step` raises
`EngineDeadError`, which ends every request in flight with "error", and every later
request is refused with it (the server answers 503). The core process ignores SIGINT (a
Ctrl-C reaches the whole process group; the frontend decides when to stop), exits on
`Shutdown` or when its parent is gone. It is not a daemon, so that it may start processes
of its own (the ranks of `distributed_executor_backend="mp"`); a finalizer stops it when
the frontend's interpreter exits without `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._processes import passive_openmp
from ..kv_cache.events import KVCacheMetrics
from ..lora import LoRARequest
from ..observe.logs import configure_logging_from_env
from ..sample.logits_processor import load_logits_processors
from ..sched.outputs import EngineCoreOutput, EngineCoreOutputs, EngineStats
from ..sched.request import Request, RequestStatus, RequestTimes
from ..sched.scheduler import SchedulerConfig
from .admission import Limits
from .core import EngineConfig, EngineCore

try:
    import msgspec
    import zmq
except ImportError as exc:  # pragma: no cover - the serve and tests extras install them
    raise ImportError(
        f"the engine core process needs msgspec and pyzmq ({exc}): "
        "pip install 'pyagent[serve]', or run the engine in the process (engine_process=False)"
    ) from exc

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 200  # an idle core process checks this often that its frontend still runs
_STARTUP_TIMEOUT_S = 600.0


class EngineDeadError(RuntimeError):
    """The engine core process is gone: nothing more can be generated."""


# --- messages -------------------------------------------------------------------------


class AddRequest(msgspec.Struct, tag=True):
    request: Request  # without its grammar matcher: the core process builds its own


class Abort(msgspec.Struct, tag=True):
    request_ids: list[str]
    status: RequestStatus
    error: str | None


class Call(msgspec.Struct, tag=True):
    """Run ``EngineCore.<method>(*args)`` between steps and send back a `Reply`."""

    call_id: int
    method: str
    args: tuple = ()


class Shutdown(msgspec.Struct, tag=True):
    pass


class CoreState(msgspec.Struct):
    """What the frontend mirrors of the core, sent with every message."""

    running: list[str]
    waiting: list[str]
    kv: KVCacheMetrics
    stats: EngineStats


class Ready(msgspec.Struct, tag=True):
    limits: Limits
    scheduler_config: SchedulerConfig
    state: CoreState


class StartupFailed(msgspec.Struct, tag=True):
    error_type: str
    message: str


class Step(msgspec.Struct, tag=True):
    """Outputs of one step (or none, sent while idle to confirm aborts); ``aborted``: the
    ids whose aborts the core carried out before this step, once per abort; ``times``:
    the timestamps of the requests that drew their first token or finished in it (the
    others' new tokens are stamped ``now``, the end of the step)."""

    outputs: list[EngineCoreOutput]
    times: dict[str, RequestTimes]
    now: float
    aborted: list[str]
    state: CoreState


class Reply(msgspec.Struct, tag=True):
    call_id: int
    state: CoreState
    result: Any = None
    error_type: str | None = None
    error: str | None = None


_TO_CORE = AddRequest | Abort | Call | Shutdown
_FROM_CORE = Ready | StartupFailed | Step | Reply
_ERRORS = {e.__name__: e for e in (ValueError, TypeError, RuntimeError, FileNotFoundError)}
_CALLS = frozenset(
    {
        "sleep",
        "wake_up",
        "stop_accepting",
        "reset_prefix_cache",
        "add_lora",
        "remove_lora",
        "pin_lora",
        "list_loras",
        "start_profile",
        "stop_profile",
    }
)
# the argument types of calls whose arguments are not plain values (decoded as such)
_CALL_ARGS = {"add_lora": (LoRARequest,)}


_TENSOR_EXT = 1  # the MessagePack extension type of a torch tensor


def _enc_hook(obj: Any) -> Any:
    """numpy arrays (the logprobs' top ids and values) as (dtype, shape, bytes); numpy
    scalars as Python numbers; torch tensors (an image's pixel values, in a field typed
    Any) as an extension object holding ([dtype, shape], raw bytes), so they decode as
    tensors wherever they sit."""
    if isinstance(obj, np.ndarray):
        return (obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        header = msgspec.msgpack.encode((str(t.dtype).removeprefix("torch."), list(t.shape)))
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        return msgspec.msgpack.Ext(_TENSOR_EXT, len(header).to_bytes(4, "little") + header + raw)
    raise NotImplementedError(f"cannot send a {type(obj).__name__} to the engine core")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is np.ndarray:
        dtype, shape, data = obj
        return np.frombuffer(data, dtype).reshape(shape)
    raise NotImplementedError(f"cannot decode a {kind}")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != _TENSOR_EXT:
        raise NotImplementedError(f"cannot decode MessagePack extension type {code}")
    size = int.from_bytes(data[:4], "little")
    dtype, shape = msgspec.msgpack.decode(data[4 : 4 + size])
    payload = bytearray(data[4 + size :])
    raw = (
        torch.frombuffer(payload, dtype=torch.uint8)
        if payload
        else torch.empty(0, dtype=torch.uint8)
    )
    return raw.view(getattr(torch, dtype)).reshape(shape)


def _codec(incoming) -> tuple[msgspec.msgpack.Encoder, msgspec.msgpack.Decoder]:
    return msgspec.msgpack.Encoder(enc_hook=_enc_hook), msgspec.msgpack.Decoder(
        incoming, dec_hook=_dec_hook, ext_hook=_ext_hook
    )


# --- the core process -------------------------------------------------------------------


def run_engine_core(config: EngineConfig, inbox: str, outbox: str, parent_pid: int) -> None:
    """The core process's entry point: build the engine, report, serve until shut down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging_from_env()  # log as the frontend does (`pyagent serve --log-format`)
    context = zmq.Context()
    server = CoreServer(context, inbox, outbox, parent_pid)
    try:
        server.core = EngineCore.from_config(config)
        server.config = config
    except Exception as exc:
        logger.exception("the engine core could not start")
        server.send(StartupFailed(type(exc).__name__, str(exc)))
    else:
        core = server.core
        server.send(Ready(core.limits, core.scheduler_config, server.state()))
        server.run()
    finally:
        server.close()
        context.term()


class CoreServer:
    """The loop of the core process: messages in, steps out."""

    def __init__(self, context, inbox: str, outbox: str, parent_pid: int) -> None:
        self.inbox = context.socket(zmq.PULL)
        self.inbox.connect(inbox)
        self.outbox = context.socket(zmq.PUSH)
        self.outbox.connect(outbox)
        self.encoder, self.decoder = _codec(_TO_CORE)
        self.parent_pid = parent_pid
        self.core: EngineCore | None = None
        self.config: EngineConfig | None = None
        self.structured = None  # built at the first request with structured outputs
        self.news: list[EngineCoreOutput] = []  # requests that failed to be added
        self.aborted: list[str] = []

    def run(self) -> None:
        """Take every waiting message, then step once if there is anything to run and
        send its outputs; idle, wait for a message, checking now and then that the
        frontend is still there."""
        core = self.core
        while os.getppid() == self.parent_pid:
            while self.inbox.poll(0 if self.busy() else _IDLE_POLL_MS):
                message = self.decoder.decode(self.inbox.recv())
                if isinstance(message, Shutdown):
                    if self.news or self.aborted:
                        self.send_step([], {})  # the frontend's mirror ends up to date
                    return
                self.handle(message)
            if core.has_unfinished_requests():
                self.step()
            elif self.busy():
                self.send_step([], {})  # aborts done, or failed adds, while idle
        logger.warning("the frontend process is gone; the engine core stops")

    def busy(self) -> bool:
        return bool(self.core.has_unfinished_requests() or self.news or self.aborted)

    def handle(self, message) -> None:
        core = self.core
        if isinstance(message, AddRequest):
            request = message.request
            try:
                if request.sampling_params.structured_outputs is not None:
                    request.grammar = self.matcher(request)
                core.add_request(request)
            except Exception as exc:
                error = f"the engine core could not add it: {type(exc).__name__}: {exc}"
                self.news.append(
                    EngineCoreOutput(request.request_id, (), finish_reason="error", error=error)
                )
        elif isinstance(message, Abort):
            core.abort_requests(message.request_ids, message.status, message.error)
            self.aborted += message.request_ids
        elif isinstance(message, Call):
            try:
                if message.method not in _CALLS:
                    raise ValueError(f"the engine core has no call {message.method!r}")
                kinds = _CALL_ARGS.get(message.method, ())
                args = [
                    msgspec.convert(a, kinds[i]) if i < len(kinds) else a
                    for i, a in enumerate(message.args)
                ]
                result = getattr(core, message.method)(*args)
                reply = Reply(message.call_id, self.state(), result)
            except Exception as exc:
                reply = Reply(message.call_id, self.state(), None, type(exc).__name__, str(exc))
            self.send(reply)

    def step(self) -> None:
        """Step and send the outputs. An exception out of the step (an engine bug) fails
        every request in the core with finish_reason "error", as in-process."""
        core = self.core
        requests = dict(core.scheduler.requests)  # finished ones leave it in the step
        try:
            outputs = core.step().outputs
        except Exception as exc:
            logger.exception("an engine step failed; ending the requests in flight")
            error = f"the engine failed: {type(exc).__name__}: {exc}"
            outputs = core.abort_requests(
                core.unfinished_request_ids(), RequestStatus.FINISHED_ERROR, error
            )
        self.send_step(outputs, requests)

    def send_step(self, outputs: list[EngineCoreOutput], requests: dict[str, Request]) -> None:
        outputs = self.news + outputs
        # (a request's first tokens are all its output tokens)
        times = {
            o.req_id: requests[o.req_id].times
            for o in outputs
            if o.req_id in requests
            and (
                o.finish_reason is not None
                or len(o.new_token_ids) == requests[o.req_id].num_output_tokens
            )
        }
        self.send(Step(outputs, times, time.monotonic(), self.aborted, self.state()))
        self.news, self.aborted = [], []

    def state(self) -> CoreState:
        scheduler = self.core.scheduler
        return CoreState(
            [r.request_id for r in scheduler.running],
            [r.request_id for r in scheduler.waiting],
            self.core.kv.metrics(),
            self.core.stats,
        )

    def matcher(self, request: Request):
        """A grammar matcher for a request with structured outputs, as the frontend
        would have built it (`_Frontend._validate`)."""
        if self.structured is None:
            from ..model import default_model_path
            from ..tokenize import load_tokenizer
            from .llm import _bpe_encoding_class, _structured_backend
            from .structured import StructuredOutputs

            config = self.config
            tokenizer = load_tokenizer(
                Path(config.model or default_model_path()),
                config.tokenizer_backend,
                _bpe_encoding_class(config.ops),
            )
            self.structured = StructuredOutputs(tokenizer, _structured_backend(config.ops))
        params = request.sampling_params
        grammar = self.structured.grammar(params.structured_outputs)
        end_ids = [t for t in (request.eos_token_id, *params.stop_token_ids) if t is not None]
        return self.structured.matcher(grammar, end_ids)

    def send(self, message) -> None:
        self.outbox.send(self.encoder.encode(message))

    def close(self) -> None:
        frontend_there = os.getppid() == self.parent_pid
        self.inbox.close(linger=0)
        self.outbox.close(linger=5000 if frontend_there else 0)  # the last messages go out


# --- the client, in the frontend's process ---------------------------------------------


class _SchedulerMirror:
    def __init__(self, client: EngineCoreClient, config: SchedulerConfig) -> None:
        self._client = client
        self.config = config

    @property
    def running(self) -> list[str]:
        return self._client._state.running

    @property
    def waiting(self) -> list[str]:
        return self._client._state.waiting


class _PoolMirror:
    def __init__(self, client: EngineCoreClient) -> None:
        self._client = client

    @property
    def num_blocks(self) -> int:
        return self._client._state.kv.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._client._state.kv.num_free_blocks


class _KVMirror:
    def __init__(self, client: EngineCoreClient) -> None:
        self._client = client
        self.pool = _PoolMirror(client)

    def metrics(self) -> KVCacheMetrics:
        return self._client._state.kv


_DEAD = object()  # put in the step queue when the core process is gone


class EngineCoreClient:
    """What `_Frontend` and `AsyncLLM` use of an `EngineCore`, with the core in a spawned
    process. `step` returns what the core stepped since the last call (it waits for at
    least one step); `close` shuts the process down. See the module's docstring."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.logits_processor_classes = load_logits_processors(config.logits_processors)
        self.accepting = True
        self.asleep = False
        self.failure: str | None = None  # why the core process is gone, if it is
        self._requests: dict[str, Request] = {}  # sent, and not known to have finished
        self._aborting: dict[str, int] = {}  # id -> aborts the core has not confirmed
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._calls: dict[int, Future] = {}
        self._call_ids = itertools.count()
        self._send_lock = threading.Lock()
        self._closing = False
        self._encoder, self._decoder = _codec(_FROM_CORE)
        self._dir = tempfile.mkdtemp(prefix="pyagent-core-")
        self._context = zmq.Context()
        self._to_core = self._context.socket(zmq.PUSH)
        self._from_core = self._context.socket(zmq.PULL)
        inbox, outbox = f"ipc://{self._dir}/inbox", f"ipc://{self._dir}/outbox"
        self._to_core.bind(inbox)
        self._from_core.bind(outbox)
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(
            target=run_engine_core,
            args=(config, inbox, outbox, os.getpid()),
            name="pyagent-engine-core",
        )
        with passive_openmp():
            self.process.start()
        # runs at interpreter exit (before multiprocessing joins its non-daemon children)
        self._stopped = threading.Event()  # set by the finalizer: the exit is asked for
        self._finalizer = weakref.finalize(self, _stop_core_process, self.process, self._stopped)
        try:
            ready = self._wait_ready()
        except BaseException:
            self._stop_process()
            self._release()
            raise
        self.limits = ready.limits
        self.max_model_len = ready.limits.max_model_len
        self.scheduler_config = ready.scheduler_config
        self._state = ready.state
        self.scheduler = _SchedulerMirror(self, ready.scheduler_config)
        self.kv = _KVMirror(self)
        self._reader = threading.Thread(target=self._read, name="pyagent-core-reader", daemon=True)
        self._reader.start()

    def _wait_ready(self) -> Ready:
        poller = zmq.Poller()
        poller.register(self._from_core, zmq.POLLIN)
        poller.register(self.process.sentinel, zmq.POLLIN)
        events = dict(poller.poll(_STARTUP_TIMEOUT_S * 1000))
        if self._from_core in events:
            message = self._decoder.decode(self._from_core.recv())
            if isinstance(message, StartupFailed):
                raise _ERRORS.get(message.error_type, RuntimeError)(message.message)
            return message
        if self.process.sentinel in events:
            self.process.join()
            raise EngineDeadError(
                f"the engine core process exited while starting (exit code "
                f"{self.process.exitcode}); its log says why"
            )
        raise EngineDeadError(f"the engine core did not start in {_STARTUP_TIMEOUT_S:g} s")

    # --- what the frontend calls -------------------------------------------------------

    @property
    def stats(self) -> EngineStats:
        return self._state.stats

    def check_request(self, request: Request) -> None:
        """`EngineCore.check_request`, on the core's limits and state mirrored here."""
        if self.failure is not None:
            raise EngineDeadError(self.failure)
        EngineCore.check_request(self, request)  # type: ignore[arg-type]

    def add_request(self, request: Request) -> None:
        self.check_request(request)
        self._send(AddRequest(dataclasses.replace(request, grammar=None)))
        self._requests[request.request_id] = request

    def abort_requests(
        self, request_ids, status: RequestStatus = RequestStatus.FINISHED_ABORTED, error=None
    ) -> list[EngineCoreOutput]:
        """Abort in the core the requests it still runs. Returns no outputs: the
        frontend ends each request itself (`_Frontend._end`)."""
        ids, now = [], time.monotonic()
        for rid in request_ids:
            request = self._requests.pop(rid, None)
            if request is not None:
                request.times.finished = now
                self._aborting[rid] = self._aborting.get(rid, 0) + 1
                ids.append(rid)
        if ids and self.failure is None:
            with contextlib.suppress(EngineDeadError):  # then nothing is left to abort
                self._send(Abort(ids, status, error))
        return []

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def step(self) -> EngineCoreOutputs:
        """The outputs of every step the core sent since the last call, waiting for one.
        Raises EngineDeadError once the core process is gone."""
        messages = [self._steps.get()]
        while not self._steps.empty():
            messages.append(self._steps.get())
        outputs = []
        for message in messages:
            if message is _DEAD:
                self._steps.put(_DEAD)
                raise EngineDeadError(self.failure)
            outputs += self._take(message)
        return EngineCoreOutputs(outputs, messages[-1].state.stats.last)

    async def step_async(self) -> EngineCoreOutputs:
        """`step` for an event loop: the reader thread wakes the loop when a step
        arrives, so no worker thread waits on the queue (one thread handoff per step
        fewer than ``asyncio.to_thread(step)``, on the server's busy GIL)."""
        loop = asyncio.get_running_loop()
        while self._steps.empty():
            waiter = loop.create_future()
            self._waiter = (loop, waiter)
            if self._steps.empty():  # else the reader put one after the check above
                await waiter
            self._waiter = None
        return self.step()

    def _wake(self) -> None:
        """After a put on the step queue (reader thread): wake `step_async`'s loop."""
        waiter = self._waiter
        if waiter is not None:
            loop, future = waiter
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(_set_done, future)

    def _take(self, step: Step) -> list[EngineCoreOutput]:
        """The outputs of one step meant for the requests sent from here; their mirror
        follows them (tokens, and the core's timestamps at the end)."""
        for rid in step.aborted:
            left = self._aborting.pop(rid) - 1
            if left:
                self._aborting[rid] = left
        outputs = []
        for out in step.outputs:
            request = self._requests.get(out.req_id)
            if request is None or out.req_id in self._aborting:
                continue  # ended here already; its abort is on its way to the core
            request.output_token_ids.extend(out.new_token_ids)
            if out.req_id in step.times:
                request.times = step.times[out.req_id]
            else:
                request.times.token_times += [step.now] * len(out.new_token_ids)
            if out.finish_reason is not None:
                del self._requests[out.req_id]
            outputs.append(out)
        return outputs

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """`EngineCore.add_lora` in the core process (its error is raised here)."""
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {lora_request!r}")
        return self._call("add_lora", lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._call("remove_lora", lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self._call("pin_lora", lora_id)

    def list_loras(self) -> list[int]:
        return self._call("list_loras")

    def sleep(self) -> None:
        if self.has_unfinished_requests():
            raise RuntimeError("cannot sleep with unfinished requests; abort or drain them first")
        self._call("sleep")
        self.asleep = True

    def wake_up(self) -> None:
        self._call("wake_up")
        self.asleep = False

    def stop_accepting(self) -> None:
        self.accepting = False
        if self.failure is None and not self._closing:
            self._call("stop_accepting")

    def start_profile(self) -> None:
        """torch.profiler in the core process (`EngineCore.start_profile`)."""
        self._call("start_profile")

    def stop_profile(self) -> str:
        """Stop it there; the trace's path (written by the core process)."""
        return self._call("stop_profile")

    def call(self, method: str, *args) -> Any:
        """Run ``EngineCore.<method>(*args)`` in the core process between two steps
        (one of `_CALLS`) and return its result; its exception is raised here."""
        return self._call(method, *args)

    def close(self, timeout: float = 30.0) -> None:
        """Shut the core process down (it stops at once, whatever it runs) and wait
        for it; nothing is left behind."""
        if self._closing:
            return
        self._closing = True
        if self.failure is None:
            self._send(Shutdown())
        self.process.join(timeout)
        self._stop_process()
        self._reader.join(timeout)
        self._release()

    # --- plumbing ----------------------------------------------------------------------

    def _call(self, method: str, *args) -> Any:
        if self.failure is not None:
            raise EngineDeadError(self.failure)
        if self._closing:
            raise RuntimeError("the engine core's process was shut down")
        future: Future = Future()
        call_id = next(self._call_ids)
        self._calls[call_id] = future
        self._send(Call(call_id, method, args))
        reply = future.result()
        if reply.error is not None:
            raise _ERRORS.get(reply.error_type, RuntimeError)(reply.error)
        return reply.result

    def _send(self, message) -> None:
        """Send, or raise EngineDeadError if the core process is gone (a send to it
        would wait forever)."""
        data = self._encoder.encode(message)
        with self._send_lock:
            while True:
                if self.failure is not None:
                    raise EngineDeadError(self.failure)
                try:
                    self._to_core.send(data, zmq.NOBLOCK)
                    return
                except zmq.Again:
                    self._to_core.poll(100, zmq.POLLOUT)

    def _read(self) -> None:
        """The reader thread: every message from the core updates the mirrored state;
        steps are queued for `step`, replies go to their calls. When the process ends
        (unasked), everything waiting learns it."""
        poller = zmq.Poller()
        poller.register(self._from_core, zmq.POLLIN)
        poller.register(self.process.sentinel, zmq.POLLIN)
        while True:
            events = dict(poller.poll())
            if self._from_core in events:
                try:
                    message = self._decoder.decode(self._from_core.recv())
                except Exception as exc:  # a bug: fail loudly rather than hang
                    self._fail(f"a message from the engine core could not be read: {exc!r}")
                    self.process.kill()
                    return
                self._state = message.state
                if isinstance(message, Reply):
                    self._calls.pop(message.call_id).set_result(message)
                else:
                    self._steps.put(message)
                    self._wake()
                continue
            if not (self._closing or self._stopped.is_set()):
                self.process.join()
                self._fail(
                    f"the engine core process died (exit code {self.process.exitcode}); "
                    "restart the engine"
                )
            return

    def _fail(self, failure: str) -> None:
        logger.error("%s", failure)
        self.failure = failure
        self._steps.put(_DEAD)
        self._wake()
        for call_id in list(self._calls):
            self._calls.pop(call_id).set_exception(EngineDeadError(failure))

    def _release(self) -> None:
        """The sockets and their directory."""
        self._to_core.close(linger=0)
        self._from_core.close(linger=0)
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _stop_process(self) -> None:
        self._finalizer()


def _set_done(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _stop_core_process(process: multiprocessing.Process, stopped: threading.Event) -> None:
    """Stop the core process: SIGTERM, then SIGKILL after 10 s (its ranks, if any, exit
    when its end of their pipes closes)."""
    stopped.set()
    if process.is_alive():
        process.terminate()
        process.join(10)
    if process.is_alive():
        process.kill()
        process.join()
