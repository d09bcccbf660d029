"""Throughput: our engine (continuous batching, paged KV) vs HF transformers `generate`.

    python benchmarks/bench_engine.py [--model DIR] [--quick]

1. Prefill and decode tokens/s for one request at a time, ours vs HF generate (greedy),
   median of 5 runs after a warm-up.
2. 64 requests with varied prompt and output lengths: our engine with continuous
   batching, against HF generate with static batches of 8 (each batch decodes until
   its longest request is done, the usual cost of static batching), both timed after
   an untimed pass of the same requests, and against HF transformers' own continuous
   batching (`generate_batch`), where the installed version has it. Ratios printed.

`--ops ref|accel|auto` picks our ops (default auto: the Rust twins on CPU).

    python benchmarks/bench_engine.py --kv-cache-dtype fp8 [--quick]

instead compares our engine with its float KV cache ("auto") and with this one, at one
KV memory budget (room for 8 of the workload's longest requests in the float cache): the
blocks it holds, how many such requests fit at once, the most that ran at once, and
tokens/s over the 64-request workload (greedy, EOS off), with the share of requests
whose tokens equal the float cache's.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from _timing import median_seconds

from pyagent_ref.engine.llm import LLM
from pyagent_ref.model import default_model_path
from pyagent_ref.sample.params import SamplingParams

SNIPPETS = [
    "import os\n",
    "def main():\n",
    "class Parser:\n",
    "for i in range(",
    "if __name__ == ",
    "    return ",
    "# Copyright",
    "def __init__(self",
    "try:\n    import ",
    "with open(",
]


def workload(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """n (prompt, max_tokens) pairs: prompts of 1-6 snippets, outputs of 8-64 tokens."""
    rng = random.Random(seed)
    return [
        ("".join(rng.choices(SNIPPETS, k=rng.randint(1, 6))), rng.randint(8, 64)) for _ in range(n)
    ]


def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    model.generation_config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    return model


def single_request(llm: LLM, hf, prompt_ids: list[int], new_tokens: int, repeats: int) -> dict:
    """Prefill = prompt tokens / time to the first token; decode = the other new tokens /
    the rest of the time. Median of `repeats` runs after a warm-up, greedy."""

    def ours(n: int) -> None:
        llm.generate([prompt_ids], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))

    ids = torch.tensor([prompt_ids])

    def theirs(n: int) -> None:
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    out = {}
    for name, run in (("ours", ours), ("hf", theirs)):
        first = median_seconds(lambda run=run: run(1), repeats)
        whole = median_seconds(lambda run=run: run(new_tokens), repeats)
        out[f"{name}_prefill"] = len(prompt_ids) / first
        out[f"{name}_decode"] = (new_tokens - 1) / (whole - first)
    return out


def many_requests(llm: LLM, hf, jobs: list[tuple[str, int]], batch: int = 8) -> dict:
    """Seconds each engine takes for `jobs` (greedy, exactly max_tokens each), and the
    number of tokens generated: ours, HF `generate` in static batches of `batch`, and HF's
    own continuous batching (`generate_batch`'s manager) where transformers has it.

    Ours and HF static are each timed on a second pass of the jobs: the first, untimed,
    pays the one-time costs (the first touch of the KV cache's pages, the thread pool's
    start, the allocator's growth, kernels' first calls at these batch shapes) on both
    sides alike."""
    tok = llm.tokenizer
    encoded = [tok.encode(p) for p, _ in jobs]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in jobs]
    pad = hf.generation_config.pad_token_id or 0

    def ours() -> list:
        return llm.generate([{"prompt_token_ids": e} for e in encoded], params)

    def hf_static() -> None:
        with torch.inference_mode():
            for i in range(0, len(jobs), batch):
                chunk, ids = jobs[i : i + batch], encoded[i : i + batch]
                width = max(len(e) for e in ids)
                longest = max(m for _, m in chunk)
                mask = [[0] * (width - len(e)) + [1] * len(e) for e in ids]
                hf.generate(
                    torch.tensor([[pad] * (width - len(e)) + e for e in ids]),
                    attention_mask=torch.tensor(mask),
                    max_new_tokens=longest,
                    min_new_tokens=longest,
                    do_sample=False,
                )

    ours()
    hf_static()
    t0 = time.perf_counter()
    outs = ours()
    times = {"ours": time.perf_counter() - t0}
    useful = sum(len(o.outputs[0].token_ids) for o in outs)
    t0 = time.perf_counter()
    hf_static()
    times["hf_static"] = time.perf_counter() - t0
    if hasattr(hf, "continuous_batching_context_manager"):
        times["hf_continuous"] = hf_continuous_batching(hf, encoded, [m for _, m in jobs], pad)
    return times | {"tokens": useful}


def hf_continuous_batching(
    hf,
    prompts: list[list[int]],
    max_tokens: list[int],
    pad: int,
    num_blocks: int = 256,
    max_batch_tokens: int = 2048,
    max_requests: int = 64,
) -> float:
    """Seconds HF transformers' continuous batching takes for the requests (greedy, EOS
    off), its KV cache sized like ours (by default 256 blocks of 16, 2048 tokens and 64
    requests per step)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=pad)
    cache = ContinuousBatchingConfig(
        num_blocks=num_blocks,
        page_size=16,
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_requests,
    )
    t0 = time.perf_counter()
    with hf.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cache, block=True, warmup=False
    ) as manager:
        pending = {
            manager.add_request(p, max_new_tokens=m)
            for p, m in zip(prompts, max_tokens, strict=True)
        }
        while pending:
            result = manager.get_result(timeout=60)
            if result is None:
                raise RuntimeError("HF continuous batching returned no result within 60 s")
            if result.is_finished():
                pending.discard(result.request_id)
    return time.perf_counter() - t0


def kv_cache_dtypes(model_dir, ops: str, kv_cache_dtype: str, jobs) -> None:
    """Section 3 (`--kv-cache-dtype`): the float KV cache vs `kv_cache_dtype` at one
    memory budget."""
    engine = dict(ops=ops, max_num_seqs=64, max_num_batched_tokens=2048, block_size=16)
    probe = LLM(model_dir, num_kv_blocks=2, **engine)
    encoded = [probe.tokenizer.encode(p) for p, _ in jobs]
    longest = max(len(e) + m for e, (_, m) in zip(encoded, jobs, strict=True))
    per_request = -(-longest // 16)
    memory = probe.core.kv.config.bytes_per_block * (8 * per_request + 1)
    print(f"3. KV cache dtype, {memory / 2**20:.1f} MiB of KV, {len(jobs)} requests")
    print(f"   {'dtype':>9} {'blocks':>7} {'fit':>5} {'peak':>5} {'tok/s':>8} {'same':>6}")
    reference = None
    for dtype in ("auto", kv_cache_dtype):
        llm = LLM(model_dir, kv_cache_memory_bytes=memory, kv_cache_dtype=dtype, **engine)
        blocks = llm.core.kv.config.num_blocks
        peak, step = 0, llm.core.step

        def counted(step=step, scheduler=llm.core.scheduler):  # most requests in one step
            nonlocal peak
            out = step()
            peak = max(peak, len(scheduler.running))
            return out

        llm.core.step = counted
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in jobs]
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": e} for e in encoded], params)
        seconds = time.perf_counter() - t0
        tokens = [o.outputs[0].token_ids for o in outs]
        reference = reference or tokens
        same = sum(a == b for a, b in zip(tokens, reference, strict=True)) / len(tokens)
        fit = (blocks - 1) // per_request
        rate = sum(map(len, tokens)) / seconds
        print(f"   {dtype:>9} {blocks:>7} {fit:>5} {peak:>5} {rate:>8.1f} {same:>6.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ops", default="auto")
    parser.add_argument("--kv-cache-dtype", default=None, choices=("fp8", "fp8_e4m3", "fp8_e5m2"))
    args = parser.parse_args()
    model_dir = args.model or default_model_path()
    torch.set_num_threads(2)
    if args.kv_cache_dtype:
        kv_cache_dtypes(
            model_dir, args.ops, args.kv_cache_dtype, workload(16 if args.quick else 64)
        )
        return
    llm = LLM(model_dir, ops=args.ops, max_num_seqs=64, max_num_batched_tokens=2048)
    hf = hf_model(model_dir)
    prompt = llm.tokenizer.encode("".join(SNIPPETS) * 2)[:128]
    repeats = 2 if args.quick else 5
    r = single_request(llm, hf, prompt, 16 if args.quick else 64, repeats)
    print(f"1. one request, {len(prompt)}-token prompt (tokens/s, median of {repeats})")
    print(f"   {'':>8} {'ours':>9} {'HF':>9} {'ours/HF':>8}")
    for phase in ("prefill", "decode"):
        ours, theirs = r[f"ours_{phase}"], r[f"hf_{phase}"]
        print(f"   {phase:>8} {ours:>9.1f} {theirs:>9.1f} {ours / theirs:>8.2f}")
    print("   target: decode ours/HF >= 1.2")
    jobs = workload(16 if args.quick else 64)
    t = many_requests(llm, hf, jobs)
    useful = t["tokens"]
    print(f"\n2. {len(jobs)} requests, varied lengths, {useful} generated tokens")
    print(f"   ours (continuous batching): {t['ours']:.2f} s = {useful / t['ours']:.1f} tok/s")
    print(
        f"   HF generate, static batches of 8: {t['hf_static']:.2f} s = "
        f"{useful / t['hf_static']:.1f} tok/s; ours / HF: {t['hf_static'] / t['ours']:.2f}x "
        "(target >= 5x)"
    )
    if "hf_continuous" in t:
        print(
            f"   HF continuous batching (generate_batch): {t['hf_continuous']:.2f} s = "
            f"{useful / t['hf_continuous']:.1f} tok/s; ours / HF: "
            f"{t['hf_continuous'] / t['ours']:.2f}x"
        )


if __name__ == "__main__":
    main()
