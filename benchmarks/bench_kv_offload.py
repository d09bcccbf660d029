"""Prefix-cache hit rate with KV offload, on a workload whose prefixes exceed the cache.

    python benchmarks/bench_kv_offload.py [--quick] [--ops ref|accel|auto]

Requests cycle through a set of long shared prefixes (a system prompt per tenant, a few
documents asked about in turn), each with its own question; the prefixes together take
more blocks than the device KV cache has, so LRU evicts every prefix before its next
use. The same engine (a small random Llama on the CPU) serves the same requests three
times, measured side by side: without offload, with a CPU tier (`kv_offload=
{"cpu_blocks": ...}`), and with a tiny CPU tier over a disk tier. Prints the
prefix-cache hit rate, the tokens the model computed (prefill and decode), the blocks
brought back from the tiers, wall time, and whether every greedy output is identical.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

from pyagent_ref.engine.core import EngineConfig, EngineCore
from pyagent_ref.model.config import ModelConfig
from pyagent_ref.model.llama import LlamaForCausalLM
from pyagent_ref.sample.params import SamplingParams
from pyagent_ref.sched import Request

BLOCK = 16


def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
    )
    return LlamaForCausalLM(config).eval()


def workload(num_prefixes: int, prefix_tokens: int, rounds: int) -> list[list[int]]:
    rng = random.Random(0)
    prefixes = [[rng.randrange(1024) for _ in range(prefix_tokens)] for _ in range(num_prefixes)]
    return [
        prefixes[i % num_prefixes] + [rng.randrange(1024) for _ in range(BLOCK)]
        for i in range(rounds * num_prefixes)
    ]


def serve(net, prompts: list[list[int]], num_blocks: int, max_tokens: int, offload) -> dict:
    config = EngineConfig(
        block_size=BLOCK,
        num_kv_blocks=num_blocks,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        ops=serve.ops,
        kv_offload=offload,
    )
    core = EngineCore(net, config)
    requests = [
        Request(
            str(i),
            p,
            sampling_params=SamplingParams(temperature=0, max_tokens=max_tokens),
            max_tokens=max_tokens,
        )
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    for r in requests:
        core.add_request(r)
    while core.has_unfinished_requests():
        core.step()
    metrics = core.kv.metrics()
    return {
        "seconds": time.perf_counter() - start,
        "hit_rate": metrics.hit_rate,
        "computed": core.stats.scheduled_tokens,
        "onboarded": metrics.onboarded_blocks,
        "tokens": [r.output_token_ids for r in requests],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    parser.add_argument("--ops", default="auto", choices=["ref", "accel", "auto"])
    args = parser.parse_args()
    serve.ops = args.ops
    num_prefixes, prefix_tokens, rounds = (4, 256, 2) if args.quick else (8, 512, 4)
    num_blocks, max_tokens = (48, 4) if args.quick else (128, 8)
    prompts = workload(num_prefixes, prefix_tokens, rounds)
    prefix_blocks = num_prefixes * prefix_tokens // BLOCK
    print(
        f"{len(prompts)} requests: {num_prefixes} prefixes of {prefix_tokens} tokens "
        f"({prefix_blocks} blocks) + {BLOCK} own tokens each, {max_tokens} generated; "
        f"device KV cache {num_blocks - 1} blocks of {BLOCK}"
    )
    net = model()
    with tempfile.TemporaryDirectory() as disk:
        runs = {
            "no offload": None,
            f"cpu {2 * prefix_blocks} blocks": {"cpu_blocks": 2 * prefix_blocks},
            f"cpu 8 + disk {2 * prefix_blocks}": {
                "cpu_blocks": 8,
                "disk_dir": disk,
                "disk_blocks": 2 * prefix_blocks,
            },
        }
        results = {name: serve(net, prompts, num_blocks, max_tokens, o) for name, o in runs.items()}
    print(f"{'kv_offload':<22} {'hit rate':>8} {'computed tokens':>15} {'onboarded':>9} {'s':>6}")
    base = results["no offload"]
    for name, r in results.items():
        print(
            f"{name:<22} {r['hit_rate']:>8.1%} {r['computed']:>15} {r['onboarded']:>9} "
            f"{r['seconds']:>6.2f}  (computed x{r['computed'] / base['computed']:.2f})"
        )
    same = all(r["tokens"] == base["tokens"] for r in results.values())
    print(f"greedy outputs identical with and without offload: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
