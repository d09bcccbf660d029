"""Step times of the engine on one process and on two ranks, TP=2 and PP=2, on the CPU;
with --part load, the peak memory of a rank loading its share.

    python benchmarks/bench_distributed.py [--quick] [--part steps|load]

A random Llama (hidden 512, 8 layers, 8 query heads over 2 KV heads, vocab 4096) is
saved to a temporary directory and served four ways: one process ("uni"), two
tensor-parallel ranks, two pipeline stages ("mp", gloo). Each runs the same batch: 8
requests of 64-token prompts, then 32 greedy decode steps; printed per configuration:
the median time of a prefill step and of a decode step, and the ratio to one process.
Every configuration must draw the tokens of one process (checked). On a machine of two
cores the two ranks compete for the cores the single process had to itself, and every
step adds the round trips of the collectives and the pipe: the figures show overhead,
not speedup (docs/distributed.md projects the scaling on GPUs).

--part load: a random Llama of about 300 MB in float32 (vocab 16000, hidden 1024, 4
layers, intermediate 2816; --quick: a quarter of the layers and vocabulary) is saved,
and each rank of TP=2 loads it in a fresh process, two ways: the whole model then cut
(`load_model` + `DistributedModel`) and its share alone (`loading.load_share`).
Printed per rank and way: the process's resident memory before loading (Python and
torch), its peak while loading (VmHWM, reset before; it counts the pages of the mapped
checkpoint the rank touched), the difference, the rank's parameters, and the ratio of
the differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

from pyagent_ref.engine.core import EngineConfig, EngineCore  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402
from pyagent_ref.sched import Request  # noqa: E402

MODEL = dict(
    vocab_size=4096,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def save_model(path: str, quick: bool) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    sizes = MODEL | (
        dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4) if quick else {}
    )
    config = transformers.LlamaConfig(
        **sizes, eos_token_id=None, bos_token_id=None, pad_token_id=None
    )
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)


def measure(path: str, reqs: int, prompt: int, decode: int, **sizes) -> tuple[float, float, list]:
    """(median prefill step s, median decode step s, the tokens) of one configuration."""
    config = EngineConfig(
        model=path,
        block_size=16,
        num_kv_blocks=reqs * (prompt + decode) // 16 + 8,
        max_num_batched_tokens=reqs * prompt,
        max_num_seqs=reqs,
        ops="auto",
        **sizes,
    )
    core = EngineCore.from_config(config)
    try:
        requests = [
            Request(
                str(i),
                [(7 * i + j) % 4000 + 1 for j in range(prompt)],
                sampling_params=SamplingParams(temperature=0, max_tokens=decode),
                max_tokens=decode,
            )
            for i in range(reqs)
        ]
        for r in requests:
            core.add_request(r)
        times = []
        while core.has_unfinished_requests():
            t0 = time.perf_counter()
            core.step()
            times.append(time.perf_counter() - t0)
    finally:
        core.shutdown()
    return times[0], statistics.median(times[1:]), [r.output_token_ids for r in requests]


LOAD_MODEL = dict(
    vocab_size=16000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=512,
)


def _memory_mb(field: str) -> float:
    """This process's VmRSS (resident now) or VmHWM (peak resident), MB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def load_rank(path: str, warm: str, rank: int, tp: int, sliced: bool) -> tuple:
    """(resident MB before loading, peak resident MB while loading, MB of the rank's
    parameters) of rank `rank` of
    TP=tp loading its share in this (fresh) process, sliced or whole then cut. The tiny
    model in `warm` is loaded first (the lazy imports, torch's first ops), then the peak
    is reset (Linux's clear_refs 5), so neither it nor the start-up counts."""
    import torch

    from pyagent_ref.distributed.loading import load_share
    from pyagent_ref.distributed.model import DistributedModel
    from pyagent_ref.distributed.parallel import ParallelContext
    from pyagent_ref.model import load_model

    torch.set_num_threads(1)
    ctx = ParallelContext(rank, tp, 0, 1)
    DistributedModel(load_share(warm, ctx, progress=False), ctx, whole=False)
    DistributedModel(load_model(warm, progress=False), ctx)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _memory_mb("VmRSS")
    if sliced:
        model = DistributedModel(load_share(path, ctx, progress=False), ctx, whole=False)
    else:
        model = DistributedModel(load_model(path, progress=False), ctx)
    peak = _memory_mb("VmHWM")
    return before, peak, sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


def bench_load(quick: bool) -> None:
    import multiprocessing

    import torch
    import transformers

    sizes = LOAD_MODEL | (dict(num_hidden_layers=1, vocab_size=4000) if quick else {})
    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as warm:
        torch.manual_seed(0)
        tiny = MODEL | dict(hidden_size=128, num_hidden_layers=1)
        for where, config in [(path, sizes), (warm, tiny)]:
            transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).save_pretrained(where)
        size = sum(f.stat().st_size for f in Path(path).glob("*.safetensors")) / 2**20
        print(f"checkpoint {size:.0f} MB (float32), TP=2")
        print(
            f"{'rank':5} {'way':12} {'before MB':>10} {'peak MB':>8} {'loading MB':>11} "
            f"{'share MB':>9}"
        )
        context = multiprocessing.get_context("spawn")
        for rank in range(2):
            grown = {}
            for sliced in (False, True):
                with context.Pool(1) as pool:
                    before, peak, held = pool.apply(load_rank, (path, warm, rank, 2, sliced))
                way = "share only" if sliced else "whole + cut"
                grown[sliced] = peak - before
                print(
                    f"{rank:<5} {way:12} {before:10.0f} {peak:8.0f} {peak - before:11.0f} "
                    f"{held:9.0f}"
                )
            print(f"rank {rank}: share only / whole + cut = {grown[True] / grown[False]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model and batch")
    parser.add_argument("--part", choices=["steps", "load"], default="steps")
    args = parser.parse_args()
    if args.part == "load":
        print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
        bench_load(args.quick)
        return
    reqs, prompt, decode = (4, 16, 8) if args.quick else (8, 64, 32)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as path:
        save_model(path, args.quick)
        rows = {}
        for name, sizes in [
            ("uni", {}),
            ("tp2", dict(tensor_parallel_size=2)),
            ("pp2", dict(pipeline_parallel_size=2)),
        ]:
            rows[name] = measure(path, reqs, prompt, decode, **sizes)
    _, _, want = rows["uni"]
    print(f"{'config':8} {'prefill ms':>11} {'decode ms':>10} {'prefill x':>10} {'decode x':>9}")
    for name, (prefill, dec, tokens) in rows.items():
        assert tokens == want, f"{name} drew other tokens than one process"
        print(
            f"{name:8} {prefill * 1e3:11.1f} {dec * 1e3:10.1f} "
            f"{prefill / rows['uni'][0]:10.2f} {dec / rows['uni'][1]:9.2f}"
        )


if __name__ == "__main__":
    main()
