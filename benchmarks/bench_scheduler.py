"""Scheduler + KV cache bookkeeping per step at 256 running decode requests.

    python benchmarks/bench_scheduler.py [--quick]

Times Scheduler.schedule() + update_from_output() (block allocation, prefix-cache
hashing of completed blocks, stop checks) with the model replaced by a constant
sampled token, so the figure is the engine's own overhead per step. Hashing runs on
the reference ops and on pyagent_accel, side by side.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import pyagent_ref.ops
from pyagent_ref.kv_cache import FullAttentionSpec, KVCacheConfig, KVCacheGroup, KVCacheManager
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.sched import Request
from pyagent_ref.sched.outputs import ModelRunnerOutput
from pyagent_ref.sched.scheduler import Scheduler, SchedulerConfig


def run(ops_name: str, num_running: int, steps: int) -> list[float]:
    ops = pyagent_ref.ops.load(ops_name)
    kv_config = KVCacheConfig(num_running * 80 + 1, (KVCacheGroup(FullAttentionSpec(16, 8, 128)),))
    kv = KVCacheManager(kv_config, ops=ops)
    config = SchedulerConfig(
        max_num_batched_tokens=1 << 20, max_num_seqs=num_running, max_model_len=4096
    )
    scheduler = Scheduler(config, kv)
    rng = random.Random(0)
    for i in range(num_running):
        prompt = [rng.randrange(32000) for _ in range(rng.randrange(300, 700))]
        params = SamplingParams(max_tokens=10_000, ignore_eos=True)
        scheduler.add_request(Request(str(i), prompt, sampling_params=params, max_tokens=10_000))
    first = scheduler.schedule()  # the prefill step admits everyone
    scheduler.update_from_output(
        first, ModelRunnerOutput({rid: [1] for rid in first.num_scheduled_tokens})
    )
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        sched = scheduler.schedule()
        out = ModelRunnerOutput({rid: [step % 32000] for rid in sched.num_scheduled_tokens})
        scheduler.update_from_output(sched, out)
        times.append((time.perf_counter() - t0) * 1e3)
        assert len(sched.num_scheduled_tokens) == num_running
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    steps = 40 if args.quick else 200
    print(f"scheduler + KV bookkeeping per decode step, 256 running requests, {steps} steps")
    print(f"  {'hashing ops':>12} {'mean ms':>9} {'median ms':>10} {'p90 ms':>8} {'max ms':>8}")
    for name in ("ref", "accel"):
        try:
            times = run(name, 256, steps)
        except ImportError:
            print(f"  {name:>12} (not installed)")
            continue
        times.sort()
        print(
            f"  {name:>12} {statistics.mean(times):>9.3f} {statistics.median(times):>10.3f} "
            f"{times[int(0.9 * len(times))]:>8.3f} {times[-1]:>8.3f}"
        )
    print("  target: under 1 ms per step")


if __name__ == "__main__":
    main()
