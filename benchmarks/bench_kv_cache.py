"""KV cache bookkeeping: eviction hit rates, allocation throughput, lookup latency.

    python benchmarks/bench_kv_cache.py [--quick]

Prints, measured side by side in one run:
  1. prefix-cache hit rate of LRU and ARC on a scan-polluted trace (a hot shared
     prefix interleaved with one-off long prompts);
  2. allocate + free throughput and get_computed_blocks latency at 100k blocks and 1k
     requests, with block hashing on the reference ops and on pyagent_accel;
  3. the bookkeeping time of one decode step for 256 running requests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import pyagent_ref.ops
from pyagent_ref.kv_cache import FullAttentionSpec, KVCacheConfig, KVCacheGroup, KVCacheManager
from pyagent_ref.sched import Request

BLOCK = 16


def config(num_blocks: int) -> KVCacheConfig:
    return KVCacheConfig(num_blocks, (KVCacheGroup(FullAttentionSpec(BLOCK, 8, 128)),))


def admit(kv: KVCacheManager, request: Request) -> bool:
    computed, hit = kv.get_computed_blocks(request)
    new = kv.allocate_slots(request, request.num_tokens - hit, new_computed_blocks=computed)
    if new is None:
        return False
    request.num_computed_tokens = request.num_tokens
    return True


def scan_polluted_trace(rounds: int, seed: int = 0) -> list[list[int]]:
    """Hot requests share a 32-block prefix; between them, a scan of unique prompts
    larger than the cache's free space flows through once."""
    rng = random.Random(seed)
    hot = [rng.randrange(1, 30000) for _ in range(32 * BLOCK)]
    trace, scan_id = [], 0
    for _ in range(rounds):
        for _ in range(2):
            trace.append(hot + [rng.randrange(30000, 60000) for _ in range(2 * BLOCK)])
        for _ in range(3):
            scan_id += 1
            trace.append([100000 * scan_id + i for i in range(24 * BLOCK)])
    return trace


def hit_rate(eviction: str, trace: list[list[int]], num_blocks: int) -> float:
    kv = KVCacheManager(config(num_blocks), eviction=eviction, ops=pyagent_ref.ops)
    for i, tokens in enumerate(trace):
        request = Request(str(i), tokens)
        assert admit(kv, request)
        kv.free(request)  # one request at a time: each finishes before the next
    return kv.metrics().hit_rate


def bench_eviction(quick: bool) -> None:
    trace = scan_polluted_trace(10 if quick else 40)
    print("1. scan-polluted trace: 32-block hot prefix + 3 x 24-block one-off prompts per round")
    print(f"   {'cache blocks':>12} {'LRU hit rate':>13} {'ARC hit rate':>13} {'ARC / LRU':>10}")
    for num_blocks in (64, 96, 128):
        lru, arc = hit_rate("lru", trace, num_blocks), hit_rate("arc", trace, num_blocks)
        ratio = arc / lru if lru else float("inf")
        print(f"   {num_blocks:>12} {lru:>13.3f} {arc:>13.3f} {ratio:>10.2f}")


def bench_scale(quick: bool) -> None:
    num_requests = 100 if quick else 1000
    blocks_per_request = 100
    num_blocks = num_requests * blocks_per_request + 1
    rng = random.Random(1)
    prefixes = [[rng.randrange(50000) for _ in range(64 * BLOCK)] for _ in range(8)]
    prompts = [
        prefixes[i % 8] + [rng.randrange(50000) for _ in range(36 * BLOCK - 1)]
        for i in range(num_requests)
    ]
    print(f"\n2. {num_blocks - 1} blocks, {num_requests} requests of {blocks_per_request} blocks")
    print(f"   {'hashing ops':>12} {'admit+free req/s':>17} {'lookup median us':>17}")
    rows = {}
    for name in ("ref", "accel"):
        try:
            ops = pyagent_ref.ops.load(name)
        except ImportError:
            print(f"   {name:>12} (not installed)")
            continue
        kv = KVCacheManager(config(num_blocks), ops=ops)
        requests = [Request(str(i), p) for i, p in enumerate(prompts)]
        t0 = time.perf_counter()
        for r in requests:
            assert admit(kv, r)
        for r in requests:
            kv.free(r)
        throughput = num_requests / (time.perf_counter() - t0)
        lookups = []
        for i, p in enumerate(prompts[: min(200, num_requests)]):
            probe = Request(f"probe{i}", p)
            t = time.perf_counter()
            kv.get_computed_blocks(probe)
            lookups.append((time.perf_counter() - t) * 1e6)
        rows[name] = (throughput, statistics.median(lookups))
        print(f"   {name:>12} {throughput:>17.0f} {rows[name][1]:>17.1f}")
    if len(rows) == 2:
        print(
            f"   accel / ref: admit+free {rows['accel'][0] / rows['ref'][0]:.1f}x, "
            f"lookup {rows['ref'][1] / rows['accel'][1]:.1f}x faster"
        )


def bench_decode_step(quick: bool) -> None:
    num_running, steps = 256, 50 if quick else 200
    kv = KVCacheManager(config(256 * 80 + 1), ops=pyagent_ref.ops)
    rng = random.Random(2)
    requests = [
        Request(str(i), [rng.randrange(50000) for _ in range(rng.randrange(400, 600))])
        for i in range(num_running)
    ]
    for r in requests:
        assert admit(kv, r)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        for r in requests:
            r.append_output_token_ids(step)
            assert kv.allocate_slots(r, 1) is not None
            r.num_computed_tokens += 1
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    print(f"\n3. decode step bookkeeping, {num_running} running requests, {steps} steps")
    print(
        f"   mean {statistics.mean(times):.3f} ms, median {statistics.median(times):.3f} ms, "
        f"p90 {times[int(0.9 * len(times))]:.3f} ms, max {times[-1]:.3f} ms (target < 1 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a reduced run for smoke tests")
    args = parser.parse_args()
    bench_eviction(args.quick)
    bench_scale(args.quick)
    bench_decode_step(args.quick)


if __name__ == "__main__":
    main()
