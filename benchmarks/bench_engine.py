"""Throughput: our engine (continuous batching, paged KV) vs HF transformers `generate`.

    python benchmarks/bench_engine.py [--model DIR] [--quick]

1. Prefill and decode tokens/s for one request at a time, ours vs HF generate (greedy),
   median of 5 runs after a warm-up.
2. 64 requests with varied prompt and output lengths: our engine with continuous
   batching, against HF generate with static batches of 8 (each batch decodes until
   its longest request is done, the usual cost of static batching). Ratio printed.
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


def many_requests(
    llm: LLM, hf, jobs: list[tuple[str, int]], batch: int = 8
) -> tuple[float, float, int]:
    tok = llm.tokenizer
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m in jobs]
    t0 = time.perf_counter()
    outs = llm.generate([p for p, _ in jobs], params)
    ours = time.perf_counter() - t0
    useful = sum(len(o.outputs[0].token_ids) for o in outs)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(jobs), batch):
            chunk = jobs[i : i + batch]
            encoded = [tok.encode(p) for p, _ in chunk]
            width = max(len(e) for e in encoded)
            pad = hf.generation_config.pad_token_id or 0
            ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
            mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
            longest = max(m for _, m in chunk)
            hf.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
            )
    theirs = time.perf_counter() - t0
    return ours, theirs, useful


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ops", default="auto")
    args = parser.parse_args()
    model_dir = args.model or default_model_path()
    torch.set_num_threads(2)
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
    jobs = workload(16 if args.quick else 64)
    ours, theirs, useful = many_requests(llm, hf, jobs)
    print(f"\n2. {len(jobs)} requests, varied lengths, {useful} generated tokens")
    print(f"   ours (continuous batching): {ours:.2f} s = {useful / ours:.1f} tok/s")
    print(f"   HF generate, static batches of 8: {theirs:.2f} s = {useful / theirs:.1f} tok/s")
    print(f"   throughput ours / HF: {theirs / ours:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
