"""Real servers on 127.0.0.1 (uvicorn in a thread, a free port), driven by the openai client.

`server` is the main one: the embedded model, an API key, the hermes tool parser and the
deepseek_v3 reasoning parser (which reads text without ``<think>`` as content unless the
request's chat_template_kwargs say ``thinking``); with PYAGENT_TEST_ENGINE_PROCESS=1 its
engine core runs in a process of its own, as under `pyagent serve`. `small_server` has one
seat and no queue, for the 429, sleep (503) and shutdown (drain) tests; it is stopped by
its test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

import openai  # noqa: E402
import uvicorn  # noqa: E402

from pyagent_ref.server import ServerConfig, ServingEngine, build_app  # noqa: E402

ENGINE_PROCESS = os.environ.get("PYAGENT_TEST_ENGINE_PROCESS") == "1"
API_KEY = "test-key"
MODEL = "tiny"


class ServerThread:
    """uvicorn serving ``app`` from a thread, on a socket bound to a free loopback port."""

    def __init__(self, app) -> None:
        self.app = app
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=30)
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve():
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=[self.sock])

        asyncio.run(serve())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def call(self, coro, timeout: float = 30):
        """Run a coroutine on the server's event loop (the engine lives there)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()
        assert not self.thread.is_alive(), "the test server did not stop"

    @property
    def engine(self) -> ServingEngine:
        return self.app.state.server.engine


def wait_until(predicate, timeout: float = 20, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def kv_all_free(engine: ServingEngine) -> bool:
    pool = engine.core.kv.pool
    return (
        pool.num_free_blocks == pool.num_blocks - 1
        and not engine.core.has_unfinished_requests()
        and not engine.processor.requests
    )


@pytest.fixture(scope="session")
def server():
    engine = ServingEngine(num_kv_blocks=1024, max_num_seqs=64, engine_process=ENGINE_PROCESS)
    config = ServerConfig(
        served_model_name=MODEL,
        api_key=API_KEY,
        tool_call_parser="hermes",
        reasoning_parser="deepseek_v3",
    )
    srv = ServerThread(build_app(engine, config)).start()
    yield srv
    with contextlib.suppress(AssertionError):
        srv.stop()


@pytest.fixture
def client(server):
    with openai.OpenAI(
        base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60
    ) as c:
        yield c


@pytest.fixture
def aclient(server):
    return openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60
    )
