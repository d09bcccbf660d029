"""`pyagent serve` as an operator runs it: its own process, JSON logs on stderr (uvicorn's
lines too), an engine core process that gets SIGKILLed (/health turns 503), then
SIGTERM: the server exits and leaves no process behind. And a frontend SIGKILLed while
its core steps: the core notices and exits on its own. Every wait is bounded."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

psutil = pytest.importorskip("psutil")

ARGS = ["serve", "--port", "0", "--log-format", "json", "--served-model-name", "tiny"]
ENGINE = ["--num-kv-blocks", "64", "--max-num-seqs", "4"]


def read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)


def next_json(lines: queue.Queue, predicate, timeout: float, seen: list) -> dict:
    """The next JSON log line that satisfies ``predicate`` (every line read is kept in
    ``seen``: a line that is not JSON fails the test)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no such log line within {timeout} s; got {seen[-5:]}")
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        record = json.loads(line)  # every line is one JSON object
        seen.append(record)
        if predicate(record):
            return record


def test_serve_logs_json_survives_a_dead_core_and_stops_clean():
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "pyagent_ref.cli", *ARGS, *ENGINE]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(server.stderr, lines), daemon=True)
    reader.start()
    seen: list = []
    children = []
    try:
        running = next_json(lines, lambda r: "Uvicorn running on" in r["message"], 180, seen)
        url = re.search(r"http://127\.0\.0\.1:\d+", running["message"]).group(0)
        body = {"prompt": "def main():", "max_tokens": 4, "ignore_eos": True}
        r = httpx.post(url + "/v1/completions", json=body, headers={"X-Request-Id": "e2e-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "e2e-1"
        rid = r.json()["id"]
        done = next_json(lines, lambda r: r.get("request_id") == f"{rid}-0", 30, seen)
        assert done["finish_reasons"] == ["length"] and done["level"] == "INFO"
        access = next_json(lines, lambda r: r["logger"] == "uvicorn.access", 30, seen)
        assert access["request_id"] == "e2e-1" and "/v1/completions" in access["message"]

        children = psutil.Process(server.pid).children(recursive=True)
        (core,) = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        core.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").status_code != 503:
            assert time.monotonic() < deadline, "/health did not turn 503"
            time.sleep(0.1)
        died = next_json(lines, lambda r: "the engine core process died" in r["message"], 30, seen)
        assert died["level"] == "ERROR"
        server.send_signal(signal.SIGTERM)
        # uvicorn drains, then raises the signal it caught again: a graceful stop exits
        # by SIGTERM after its last line
        assert server.wait(60) in (0, -signal.SIGTERM)
        next_json(lines, lambda r: "Finished server process" in r["message"], 10, seen)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
        reader.join(10)
    deadline = time.monotonic() + 20
    while any(c.is_running() for c in children):  # nothing left running, not even a zombie
        assert time.monotonic() < deadline, [c for c in children if c.is_running()]
        time.sleep(0.1)


ORPHAN = """
import asyncio, os, signal
from pyagent_ref.engine.llm import AsyncLLM
from pyagent_ref.sample.params import SamplingParams

async def main():
    llm = AsyncLLM(engine_process=True, num_kv_blocks=128, max_num_seqs=4)
    stream = llm.generate("x", SamplingParams(max_tokens=1000, ignore_eos=True))
    await stream.__anext__()  # the core is busy stepping
    print(llm.core.process.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the frontend dies without a word

asyncio.run(main())
"""


def test_a_core_whose_frontend_is_killed_exits_on_its_own():
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    frontend = subprocess.Popen(
        [sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        out, _ = frontend.communicate(timeout=180)
    finally:
        if frontend.poll() is None:
            frontend.kill()
            frontend.wait(30)
    assert frontend.returncode == -signal.SIGKILL
    core_pid = int(out.split()[-1])
    deadline = time.monotonic() + 30
    while True:  # gone, or a zombie left for init to reap: it runs no more
        try:
            if psutil.Process(core_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < deadline, "the orphaned engine core still runs"
        time.sleep(0.1)
