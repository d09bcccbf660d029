"""Data-parallel routing vs round robin, and disaggregated prefill/decode vs colocated.

    python benchmarks/bench_dp_disagg.py [--quick] [--part dp|pd|all] [--replicas N]
                                         [--ops ref|accel|auto]

Part dp: routing on a shared-prefix workload.

Requests come from groups that share a long prefix (a tenant's system prompt, a
document asked about in turn), each with its own question, arriving a few per tick in
random order. N engine replicas (real `EngineCore`s with a small random Llama on the
CPU, each with its own KV cache, too small to hold every group's prefix) serve them
behind a `dp.router.Router`, whose prefix index is fed by each replica's KV events over
ZeroMQ (ipc://), as `DPAsyncLLM` does. The replicas run in lockstep: every tick, the
arrivals are routed (each replica's load: its requests and KV usage), then each replica
steps once; replicas run in parallel in a real deployment, so a tick lasts as long as
the slowest replica's step, and the times below are on that clock (independent of how
many cores this machine lends the benchmark). Prints, per policy: the prefix-cache hit
rate over all replicas, the tokens the models computed, the queueing delay (arrival to
first scheduled) and TTFT (arrival to first token), mean and p90, and whether every
greedy output equals one engine's.

Part pd: the embedded default model served colocated (one `AsyncLLM` with its engine
core in a process) and disaggregated (`DisaggProxy`: a prefill and a decode process,
KV over the zmq connector and over shared memory), on a mix that disaggregation is for:
chat requests (short prompt, many tokens) decoding while long-document requests
(long prompt, few tokens) arrive. Prints TTFT and ITL (gaps between token messages),
mean and p90, of each kind, measured by the client, and the KV bytes per transferred
block. Wall-clock times: they depend on the machine's load (print `uptime` with them).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time

from bench_kv_offload import BLOCK, model  # the same small random Llama

from pyagent_ref.dp.kv_events import KVEventSubscriber, external_hash
from pyagent_ref.dp.router import ReplicaLoad, Router
from pyagent_ref.engine.core import EngineConfig, EngineCore
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.sched import Request


def workload(groups: int, prefix_tokens: int, per_group: int) -> list[list[int]]:
    rng = random.Random(0)
    prefixes = [[rng.randrange(1024) for _ in range(prefix_tokens)] for _ in range(groups)]
    prompts = [p + [rng.randrange(1024) for _ in range(BLOCK)] for p in prefixes] * per_group
    rng.shuffle(prompts)
    return prompts


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def serve(net, prompts, replicas: int, policy: str, args, tmp: str) -> dict:
    config = dict(
        block_size=BLOCK,
        num_kv_blocks=args.kv_blocks,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        ops=args.ops,
        prefix_caching_hash_algo="sha256_cbor",
    )
    cores, subs = [], []
    for rank in range(replicas):
        endpoint = f"ipc://{tmp}/{policy}-{rank}"
        subs.append(KVEventSubscriber(endpoint))
        cores.append(EngineCore(net, EngineConfig(kv_events_endpoint=endpoint, **config)))
    router = Router(replicas, policy, seed=0)
    hasher = cores[0].kv.hasher
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    requests = [
        Request(str(i), p, sampling_params=params, max_tokens=args.max_tokens)
        for i, p in enumerate(prompts)
    ]
    arrival, queued, first, routed = {}, {}, {}, [0] * replicas
    now, pending = 0.0, list(requests)
    time.sleep(0.2)  # the subscribers join
    while pending or any(c.has_unfinished_requests() for c in cores):
        for rank, sub in enumerate(subs):
            for _, batch in sub.receive(0):
                router.index.apply(rank, batch.events)
        for r in pending[: args.rate]:
            probe = Request("probe", r.prompt_token_ids)
            hasher.update(probe)
            hashes = [external_hash(h) for h in probe.block_hashes]
            loads = [
                ReplicaLoad(len(c.scheduler.waiting) + len(c.scheduler.running), c.kv.usage)
                for c in cores
            ]
            rank = router.route(hashes, loads)
            routed[rank] += 1
            cores[rank].add_request(r)
            arrival[r.request_id] = now
        pending = pending[args.rate :]
        longest = 0.0
        for c in cores:
            if c.has_unfinished_requests():
                start = time.perf_counter()
                c.step()
                longest = max(longest, time.perf_counter() - start)
        for r in requests:
            rid = r.request_id
            if rid in arrival and rid not in queued and r.times.first_scheduled is not None:
                queued[rid] = now  # it was scheduled in the tick that started at `now`
            if rid in arrival and rid not in first and r.output_token_ids:
                first[rid] = now + longest
        now += longest
        time.sleep(0.002)  # let the events of this tick arrive
    hits = sum(c.kv.metrics().hits for c in cores)
    queries = sum(c.kv.metrics().queries for c in cores)
    computed = sum(c.stats.scheduled_tokens for c in cores)
    for c, s in zip(cores, subs, strict=True):
        c.kv_events.close()
        s.close()
    delays = [queued[i] - arrival[i] for i in queued]
    ttfts = [first[i] - arrival[i] for i in first]
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "computed": computed,
        "queue": (sum(delays) / len(delays), pct(delays, 0.9)),
        "ttft": (sum(ttfts) / len(ttfts), pct(ttfts, 0.9)),
        "seconds": now,
        "routed": routed,
        "tokens": [r.output_token_ids for r in requests],
    }


def stream_stats(samples: list[tuple[float | None, list[float]]]) -> str:
    ttfts = [t for t, _ in samples if t is not None]
    itls = [g for _, gaps in samples for g in gaps]
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    return (
        f"TTFT {mean(ttfts) * 1e3:7.1f}/{pct(ttfts, 0.9) * 1e3:<7.1f} ms  "
        f"ITL {mean(itls) * 1e3:6.1f}/{pct(itls, 0.9) * 1e3:<6.1f} ms"
    )


def pd_workload(quick: bool) -> list[tuple[str, list[int], int, float]]:
    """(kind, prompt, max_tokens, submit delay s): chats first, documents arriving."""
    rng = random.Random(1)
    chats, docs, doc_len = (2, 2, 256) if quick else (4, 4, 768)
    out = [("chat", [rng.randrange(1, 200) for _ in range(24)], 48, 0.0) for _ in range(chats)]
    out += [
        ("document", [rng.randrange(1, 200) for _ in range(doc_len)], 4, 0.1 + 0.15 * i)
        for i in range(docs)
    ]
    return out


def run_colocated(work, engine: dict) -> dict:
    import asyncio

    from pyagent_ref.engine.llm import AsyncLLM

    async def main():
        llm = AsyncLLM(None, engine_process=True, **engine)
        await asyncio.sleep(0)

        async def one(kind, prompt, max_tokens, delay):
            await asyncio.sleep(delay)
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            start, last, ttft, gaps, tokens = time.monotonic(), None, None, [], []
            async for delta in llm.generate(prompt, params):
                if delta.outputs[0].token_ids:
                    now = time.monotonic()
                    ttft = ttft if last is not None else now - start
                    gaps += [now - last] if last is not None else []
                    last = now
                    tokens += delta.outputs[0].token_ids
            return kind, (ttft, gaps), tokens

        try:
            return await asyncio.gather(*(one(*w) for w in work))
        finally:
            await llm.shutdown()

    return asyncio.run(main())


def run_disaggregated(work, engine: dict, connector: str) -> tuple[list, int]:
    from concurrent.futures import ThreadPoolExecutor

    from pyagent_ref.disagg.proxy import DisaggProxy

    proxy = DisaggProxy(None, connector, **engine)
    try:

        def one(item):
            kind, prompt, max_tokens, delay = item
            time.sleep(delay)
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            out = proxy.generate(prompt, params)
            if out.finish_reason == "error":
                raise RuntimeError(out.error)
            return kind, (out.ttft, out.itl), out.token_ids

        with ThreadPoolExecutor(len(work)) as pool:
            results = list(pool.map(one, work))
        return results, proxy.stats("decode").onboarded_blocks
    finally:
        proxy.close()


def main_pd(args) -> None:
    from pyagent_ref.model import default_model_path
    from pyagent_ref.model.config import ModelConfig as Config

    engine = dict(block_size=BLOCK, num_kv_blocks=512, max_num_batched_tokens=256, ops=args.ops)
    work = pd_workload(args.quick)
    mcfg = Config.from_pretrained(default_model_path())
    kv_heads, head_dim = mcfg.num_key_value_heads, mcfg.head_dim
    per_block = mcfg.num_hidden_layers * 2 * BLOCK * kv_heads * head_dim * 4
    print(
        f"\nP/D: {sum(k == 'chat' for k, *_ in work)} chats (24-token prompts, 48 tokens) "
        f"decoding while {sum(k == 'document' for k, *_ in work)} documents "
        f"({len(work[-1][1])}-token prompts, 4 tokens) arrive; embedded default model, "
        f"float32; KV per transferred block: {mcfg.num_hidden_layers} layers x K,V x "
        f"{BLOCK} tokens x {kv_heads} heads x {head_dim} x 4 B = {per_block} B"
    )
    runs = {"colocated": (run_colocated(work, engine), None)}
    for connector in ("zmq", "shm"):
        results, onboarded = run_disaggregated(work, engine, connector)
        runs[f"P/D {connector}"] = (results, onboarded)
    base = [tokens for _, _, tokens in runs["colocated"][0]]
    for name, (results, onboarded) in runs.items():
        for kind in ("chat", "document"):
            samples = [s for k, s, _ in results if k == kind]
            print(f"{name:<13} {kind:<9} {stream_stats(samples)}")
        if onboarded is not None:
            print(f"{'':<13} blocks onboarded on the decode side: {onboarded}")
    same = all([t for _, _, t in r] == base for r, _ in runs.values())
    print(f"greedy outputs identical to colocated: {same}")
    if not same:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--part", default="all", choices=["dp", "pd", "all"])
    parser.add_argument("--ops", default="auto", choices=["ref", "accel", "auto"])
    args = parser.parse_args()
    if args.part in ("dp", "all"):
        main_dp(args)
    if args.part in ("pd", "all"):
        main_pd(args)


def main_dp(args) -> None:
    groups, prefix_tokens, per_group = (4, 128, 4) if args.quick else (8, 256, 6)
    args.kv_blocks = (groups * prefix_tokens // BLOCK) // 2 + 24
    args.max_tokens, args.rate = (4, 2) if args.quick else (8, 3)
    prompts = workload(groups, prefix_tokens, per_group)
    print(
        f"{len(prompts)} requests: {groups} groups sharing {prefix_tokens}-token prefixes, "
        f"+{BLOCK} own tokens, {args.max_tokens} generated, {args.rate} arrivals per tick; "
        f"{args.replicas} replicas of {args.kv_blocks - 1} KV blocks of {BLOCK} "
        f"(all prefixes: {groups * prefix_tokens // BLOCK} blocks)"
    )
    net = model()
    tmp = tempfile.mkdtemp(prefix="bench-dp-")
    try:
        one = serve(net, prompts, 1, "round_robin", args, tmp)
        results = {
            p: serve(net, prompts, args.replicas, p, args, tmp)
            for p in ("round_robin", "p2c", "prefix")
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{'policy':<12} {'hit rate':>8} {'computed':>9} {'queue mean/p90 ms':>19} "
        f"{'TTFT mean/p90 ms':>18} {'total s':>8}  requests per replica"
    )
    for name, r in {"1 replica": one, **results}.items():
        q, t = r["queue"], r["ttft"]
        print(
            f"{name:<12} {r['hit_rate']:>8.1%} {r['computed']:>9} "
            f"{q[0] * 1e3:>9.1f}/{q[1] * 1e3:<9.1f} {t[0] * 1e3:>8.1f}/{t[1] * 1e3:<9.1f} "
            f"{r['seconds']:>8.2f}  {r['routed']}"
        )
    same = all(r["tokens"] == one["tokens"] for r in results.values())
    print(f"greedy outputs identical to one replica's: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
