"""Speculative decoding on the embedded model: decode speed with and without each proposer.

    python benchmarks/bench_spec_decode.py [--quick] [--ops auto|ref|accel] [--batch 1]
        [--threads N] [--only SETTING ...]

Two greedy workloads, each request decoding `--max-tokens` tokens (ignore_eos):
- repetitive: the prompt is a function of this repository's own source followed by its
  first lines again, so that continuing it means copying (code rewriting, the case
  prompt lookup is for);
- plain: short code openings (`bench_engine`'s), whose continuations rarely repeat
  the prompt.
For each workload and each setting (no speculation; n-gram with k = 2, 4, 6 drafts;
suffix decoding with k = 4, 8, and k = 8 without its global tree; the embedded draft
model, `default_draft_model_path()`, with k = 2, 3, 4; the embedded model's Medusa heads
with trees of k = 1, 2, 3 levels, 4 / 10 / 14 nodes), the median over
`--repeats` runs of output tokens / second, the ratio to no speculation, the acceptance
rate, per-position acceptance and the mean tokens emitted per verifying step. Greedy
outputs are checked to be the same token for token. The settings of a workload take turns,
one pass over the prompts each, so that a change in the machine's load hits all alike.
Suffix decoding's global tree learns the outputs of the warm-up and of earlier repeats,
which decode the same prompts again: its figures are those of a workload that repeats
itself (the case the global tree is for); "no-cache" shows the request's own tree alone.
On a shared machine, use --threads 1: torch's multi-threaded matrix products (the k + 1
rows of a verifying step) wait for busy cores, while a decode's single row does not, which
slows speculation alone by up to 20x there. Where other processes load the machine,
--cpu-time (with RAYON_NUM_THREADS=1) counts this process's CPU seconds instead, which
their load does not change.
Targets (issue 14): n-gram >= 1.8x on the repetitive workload at batch 1 on CPU; no
proposer slower than 0.9x on the plain one.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch
from _timing import machine_line

from pyagent_ref.engine.llm import LLM
from pyagent_ref.model import default_draft_model_path
from pyagent_ref.ops import sampling, spec_decode
from pyagent_ref.sample.params import SamplingParams

PLAIN = ["import os\n", "def main():\n", "class Parser:\n", "for i in range(", "# Copyright"]


def repetitive_prompts(n: int) -> list[str]:
    """n prompts: a function's source, a blank line, then its first two lines again."""
    sources = [
        inspect.getsource(f)
        for f in (
            sampling.apply_top_k,
            sampling.apply_min_p,
            spec_decode.verify_greedy,
            sampling.log_softmax,
            sampling.apply_temperature,
        )
    ]
    prompts = []
    for i in range(n):
        source = sources[i % len(sources)]
        head = "".join(source.splitlines(keepends=True)[:2])
        prompts.append(source + "\n\n" + head)
    return prompts


def timed_pass(llm: LLM, prompts: list[str], params: SamplingParams, batch: int, clock):
    """(output tokens per second of `clock`, token ids per prompt) of one pass over the
    prompts, `batch` at a time; the engine's stats count this pass alone."""
    llm.core.stats.reset()
    outputs, tokens, t0 = [], 0, clock()
    for start in range(0, len(prompts), batch):
        done = llm.generate(prompts[start : start + batch], params)
        outputs += [o.outputs[0].token_ids for o in done]
        tokens += sum(len(o.outputs[0].token_ids) for o in done)
    return tokens / (clock() - t0), outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts and tokens")
    parser.add_argument("--ops", default="auto")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="run only the settings whose name starts with one of these (and 'none')",
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="rates per CPU second of this process (time.process_time) instead of per "
        "wall-clock second: what a busy machine's other processes do not change; with "
        "--threads 1 and RAYON_NUM_THREADS=1, the wall-clock rate of a quiet machine",
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    num_prompts, max_tokens = (2, 32) if args.quick else (5, args.max_tokens)
    repeats = 1 if args.quick else args.repeats
    try:
        from pyagent_accel import _native

        simd = _native.SIMD
    except ImportError:
        simd = "absent"
    print(machine_line(torch, simd))
    per = "CPU second" if args.cpu_time else "second"
    print(f"ops {args.ops}, batch {args.batch}, {max_tokens} tokens per request, greedy, tok/{per}")
    workloads = {
        "repetitive": repetitive_prompts(num_prompts),
        "plain": (PLAIN * num_prompts)[:num_prompts],
    }
    settings = {
        "none": None,
        **{
            f"ngram k={k}": {"num_speculative_tokens": k, "prompt_lookup_max": 3} for k in (2, 4, 6)
        },
        **{  # a match of one token is weak evidence: ask for two
            f"ngram k={k} min=2": {
                "num_speculative_tokens": k,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            }
            for k in (4, 6)
        },
        **{f"suffix k={k}": {"method": "suffix", "num_speculative_tokens": k} for k in (4, 8)},
        "suffix k=8 no-cache": {
            "method": "suffix",
            "num_speculative_tokens": 8,
            "suffix_decoding_max_cached_requests": 0,
        },
        **{
            f"draft k={k}": {
                "method": "draft_model",
                "model": str(default_draft_model_path()),
                "num_speculative_tokens": k,
            }
            for k in (2, 3, 4)
        },
        # draft trees from the embedded model's Medusa heads (MEDUSA_TREE, k levels), all
        # of the tree's nodes or those whose path probability is at least p
        **{
            f"medusa k={k}" + (f" p={p}" if p else ""): {
                "method": "medusa",
                "num_speculative_tokens": k,
                "medusa_min_path_prob": p,
            }
            for k in (1, 2, 3)
            for p in (0.0, 0.05, 0.2)
        },
    }
    if args.only:
        settings = {
            name: spec
            for name, spec in settings.items()
            if name == "none" or name.startswith(tuple(args.only))
        }
    header = f"{'workload':11} {'setting':19} {'tok/s':>8} {'ratio':>6} {'accept':>7}"
    print(header + "  mean emitted  per-position acceptance")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for name, prompts in workloads.items():
        llms = {s: LLM(None, ops=args.ops, speculative_config=spec) for s, spec in settings.items()}
        for llm in llms.values():
            llm.generate(prompts[: args.batch], params)  # warm-up
        rates: dict[str, list[float]] = {setting: [] for setting in llms}
        outputs = {}
        for _ in range(repeats):  # round robin: a change of load hits every setting alike
            for setting, llm in llms.items():
                rate, outputs[setting] = timed_pass(llm, prompts, params, args.batch, clock)
                rates[setting].append(rate)
        base_rate = statistics.median(rates["none"])
        for setting, llm in llms.items():
            rate, stats = statistics.median(rates[setting]), llm.core.stats.spec
            same = "" if outputs[setting] == outputs["none"] else "  OUTPUTS DIFFER"
            per_position = " ".join(f"{r:.2f}" for r in stats.acceptance_rate_per_position)
            print(
                f"{name:11} {setting:19} {rate:8.1f} {rate / base_rate:5.2f}x "
                f"{stats.acceptance_rate:7.2f} {stats.mean_accepted_length:13.2f}  "
                f"{per_position}{same}"
            )


if __name__ == "__main__":
    main()
