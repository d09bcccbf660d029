"""Drive `pyagent serve` like `vllm bench serve`, and compare with AsyncLLM directly.

    python benchmarks/bench_serve.py --num-prompts 128 --max-concurrency 64
    python benchmarks/bench_serve.py --request-rate 20 --api completions
    python benchmarks/bench_serve.py --url http://127.0.0.1:8000 --model NAME   # a running server

Requests arrive as a Poisson process at --request-rate (inf: all at once), at most
--max-concurrency in flight, each streaming --max-tokens tokens (ignore_eos, so every
run generates the same number). Reported: request throughput, output tokens/s, TTFT,
TPOT (per output token after the first) and ITL (between streamed chunks), p50 / p99,
and the chunks with text per request (fewer than tokens where deltas were coalesced).

Without --url the same workload runs three ways, side by side, and the ratios are printed:

    AsyncLLM       a `ServingEngine` (AsyncLLM, engine core in a worker thread) in this
                   process, no HTTP: the reference;
    HTTP thread    `pyagent serve --no-engine-process`: the engine core steps in a worker
                   thread of the server's process (one GIL for HTTP and engine);
    HTTP process   `pyagent serve --engine-process`: the engine core in its own process.

Each server runs in a subprocess on 127.0.0.1 (the load generator does not share its
GIL). The machine's load average is printed before and after: on a shared machine,
compare only figures taken together. On Linux each run also prints where the CPU went,
in CPU-seconds (user + system, from /proc): the load generator (this process's HTTP
client), the server's process and the engine core's process (the server's children);
for AsyncLLM, this process's event loop thread (the consumers, detokenization) and its
other threads (the engine steps).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

PROMPT_WORDS = "def class import return yield lambda async await with open read write".split()


@dataclass
class Result:
    ttft: float
    e2e: float
    tokens: int
    itl: list[float] = field(default_factory=list)


def _prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(PROMPT_WORDS, k=rng.randint(8, 24))) for _ in range(n)]


async def _arrivals(n: int, rate: float, seed: int):
    rng = random.Random(seed + 1)
    for i in range(n):
        yield i
        if rate != float("inf"):
            await asyncio.sleep(rng.expovariate(rate))


async def _drive(one, args) -> tuple[list[Result], float]:
    """Run the workload through ``one(i) -> Result``; returns the results and seconds."""
    limit = asyncio.Semaphore(args.max_concurrency)

    async def bounded(i):
        async with limit:
            return await one(i)

    start = time.perf_counter()
    tasks = [
        asyncio.create_task(bounded(i))
        async for i in _arrivals(args.num_prompts, args.request_rate, args.seed)
    ]
    results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


def _request(args, prompt: str, i: int) -> tuple[str, dict]:
    """The path and JSON body of request ``i``."""
    body = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.api == "chat":
        return "/v1/chat/completions", body | {"messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", body | {"prompt": prompt}


class _Events:
    """A stream's server-sent events as they come: when each text chunk arrived, and
    the completion tokens of the usage chunk."""

    def __init__(self) -> None:
        self.start, self.times, self.tokens = time.perf_counter(), [], 0

    def line(self, line: str) -> None:
        if not line.startswith("data: ") or line.startswith("data: [DONE]"):
            return
        event = json.loads(line[6:])
        if event.get("usage"):
            self.tokens = event["usage"]["completion_tokens"]
        for choice in event["choices"]:
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text:
                self.times.append(time.perf_counter())

    def result(self) -> Result:
        times = self.times
        return Result(
            times[0] - self.start,
            time.perf_counter() - self.start,
            self.tokens,
            [b - a for a, b in zip(times, times[1:], strict=False)],
        )


async def _httpx_one(http: httpx.AsyncClient, args, prompt: str, i: int) -> Result:
    path, body = _request(args, prompt, i)
    events = _Events()
    async with http.stream("POST", args.url + path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            events.line(line)
    return events.result()


async def _aiohttp_one(session, args, prompt: str, i: int) -> Result:
    path, body = _request(args, prompt, i)
    events = _Events()
    async with session.post(args.url + path, json=body) as r:
        r.raise_for_status()
        async for line in r.content:  # one line at a time, newline included
            events.line(line.decode())
    return events.result()


@contextlib.asynccontextmanager
async def _client(args):
    """``one(prompt, i) -> Result`` over a pool of connections of the --client library."""
    if args.client == "httpx":
        limits = httpx.Limits(max_connections=args.max_concurrency + 8)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            yield lambda prompt, i: _httpx_one(http, args, prompt, i)
        return
    import aiohttp

    connector = aiohttp.TCPConnector(limit=args.max_concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        yield lambda prompt, i: _aiohttp_one(session, args, prompt, i)


async def run_http(args, prompts, server: int | None = None) -> tuple[list[Result], float, CPU]:
    """The workload over HTTP; ``server``: the server's pid (its CPU and its children's
    are counted, with this process's: the client)."""
    async with _client(args) as one:
        await one("warm up", 0)
        parts = {"client": lambda: _cpu_seconds(os.getpid())}
        if server is not None:
            children = _children(server)
            parts["server"] = lambda: _cpu_seconds(server)
            parts["engine process"] = lambda: sum(_cpu_seconds(c) for c in children)
        cpu = CPU(**parts)
        return *await _drive(lambda i: one(prompts[i], i), args), cpu


async def run_direct(args, prompts) -> tuple[list[Result], float, CPU]:
    """The same workload on AsyncLLM in this process (what the server runs on)."""
    from pyagent_ref.sample.params import SamplingParams
    from pyagent_ref.server import ServingEngine

    engine = ServingEngine(**_engine_kwargs(args))
    tokenizer = engine.tokenizer

    async def one(i: int) -> Result:
        params = SamplingParams(
            max_tokens=args.max_tokens, ignore_eos=True, temperature=0.8, seed=i
        )
        if args.api == "chat":
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompts[i]}], tokenize=True
            )
        else:
            prompt = prompts[i]
        start = time.perf_counter()
        times, tokens = [], 0
        async for out in engine.generate(prompt, params):
            tokens += len(out.outputs[0].token_ids)
            if out.outputs[0].text:
                times.append(time.perf_counter())
        end = time.perf_counter()
        return Result(
            times[0] - start,
            end - start,
            tokens,
            [b - a for a, b in zip(times, times[1:], strict=False)],
        )

    async for _ in engine.generate("warm up", SamplingParams(max_tokens=2)):
        pass
    pid, loop_thread = os.getpid(), threading.get_native_id()
    cpu = CPU(
        **{
            "event loop": lambda: _cpu_seconds(pid, loop_thread),
            "engine threads": lambda: _cpu_seconds(pid) - _cpu_seconds(pid, loop_thread),
        }
    )
    try:
        return *await _drive(one, args), cpu
    finally:
        await engine.shutdown()


def _engine_kwargs(args) -> dict:
    return {"max_num_seqs": args.max_num_seqs, "num_kv_blocks": args.num_kv_blocks}


def _cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU-seconds of a process (or one of its threads) from /proc; 0.0
    where there is no /proc (the breakdown is then all zeros)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc; none elsewhere)."""
    out = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError), open(task) as f:
            out += [int(c) for c in f.read().split()]
    return out


class CPU:
    """CPU-seconds spent by named parts over a run: ``parts`` maps a name to a function
    returning that part's cumulative CPU-seconds."""

    def __init__(self, **parts) -> None:
        self.parts = parts
        self.start = {name: f() for name, f in parts.items()}

    def report(self, seconds: float) -> None:
        spent = {name: f() - self.start[name] for name, f in self.parts.items()}
        total = sum(spent.values())
        print(
            "             CPU-s "
            + " | ".join(f"{name} {s:5.2f}" for name, s in spent.items())
            + f" | total {total:5.2f} in {seconds:5.2f} s wall ({total / seconds:.2f} cores)"
        )


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3 if values else float("nan")


def report(name: str, results: list[Result], seconds: float, cpu: CPU | None = None) -> float:
    tokens = sum(r.tokens for r in results)
    tpot = [(r.e2e - r.ttft) / (r.tokens - 1) for r in results if r.tokens > 1]
    itl = [g for r in results for g in r.itl]
    ttft = [r.ttft for r in results]
    print(
        f"{name:<12} {len(results)} requests in {seconds:6.2f} s: "
        f"{len(results) / seconds:6.2f} req/s, "
        f"{tokens / seconds:8.1f} output tok/s\n"
        f"             TTFT p50 {_pct(ttft, 0.5):7.1f} ms p99 {_pct(ttft, 0.99):7.1f} ms | "
        f"TPOT p50 {_pct(tpot, 0.5):6.1f} ms p99 {_pct(tpot, 0.99):6.1f} ms | "
        f"ITL p50 {_pct(itl, 0.5):6.1f} ms p99 {_pct(itl, 0.99):6.1f} ms | "
        f"{(len(itl) + len(results)) / len(results):.1f} chunks/request"
    )
    if cpu is not None:
        cpu.report(seconds)
    return tokens / seconds


def _start_server(args, engine_process: bool) -> subprocess.Popen:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args.url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "pyagent_ref.cli", "serve", "--port", str(port),
        "--served-model-name", args.model, "--log-level", "warning",
        "--max-num-seqs", str(args.max_num_seqs), "--num-kv-blocks", str(args.num_kv_blocks),
        "--engine-process" if engine_process else "--no-engine-process",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(args.url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError("the server did not start")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default=None, help="a running server (default: start one here)")
    p.add_argument("--model", default="pyagent-default")
    p.add_argument("--api", choices=["chat", "completions"], default="chat")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--num-kv-blocks", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--client",
        choices=["aiohttp", "httpx"],
        default="aiohttp",
        help="the load generator's HTTP library (vllm bench serve's: aiohttp)",
    )
    p.add_argument("--no-direct", action="store_true", help="skip the AsyncLLM comparison")
    p.add_argument(
        "--modes",
        nargs="+",
        choices=["thread", "process"],
        default=["thread", "process"],
        help="where the server's engine core runs: its worker thread, its own process",
    )
    p.add_argument("--quick", action="store_true", help="a small run (8 prompts, 8 tokens)")
    args = p.parse_args()
    if args.quick:
        args.num_prompts, args.max_tokens, args.max_concurrency = 8, 8, 8
    prompts = _prompts(args.num_prompts, args.seed)
    print(
        f"{args.num_prompts} {args.api} requests, {args.max_tokens} tokens each, rate "
        f"{args.request_rate}/s, concurrency {args.max_concurrency}; cpus {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if args.url is not None:
        report("HTTP", *asyncio.run(run_http(args, prompts)))
        return 0
    direct = None
    if not args.no_direct:
        direct = report("AsyncLLM", *asyncio.run(run_direct(args, prompts)))
    http = {}
    for mode in args.modes:
        proc = _start_server(args, engine_process=mode == "process")
        try:
            http[mode] = report(f"HTTP {mode}", *asyncio.run(run_http(args, prompts, proc.pid)))
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for mode, value in http.items():
        if direct:
            print(
                f"HTTP {mode} / AsyncLLM output throughput: {value / direct:.3f} "
                f"({1 - value / direct:+.1%} lost)"
            )
    if len(http) == 2:
        print(f"HTTP process / HTTP thread: {http['process'] / http['thread']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
