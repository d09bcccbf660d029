"""GGUF block formats: the embedded model's perplexity per format, and the matmul's speed.

    python benchmarks/bench_gguf.py [--part ppl|gemv|all] [--quick]

ppl: the embedded model written as .gguf in F32, Q8_0, Q6_K, Q4_K and Q4_0 (with
`ops.gguf.quantize`, llama.cpp's reference quantizers; its 688-column down projections are
F16 in the quantized files, no whole block fits) and read back through `LLM(model=...)`;
perplexity = exp(mean negative log-likelihood) of the prompt tokens of windows of 256
tokens cut from held-out text: the standard library files the model's training held out
(every 50th, `tools/train_default_model.py`), with the prompt log-probabilities the
engine returns.

gemv: `ops.gguf.gguf_matmul` (the ops namespace of --ops) in Q8_0 and Q4_K against a
float32 torch matmul at Qwen3-0.6B's linear-layer shapes, batch 1 and 64, CPU, one thread,
best of the repeats.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pyagent_ref import ops as ops_pkg
from pyagent_ref.engine.llm import LLM
from pyagent_ref.model import default_model_path
from pyagent_ref.quant.gguf import write_gguf
from pyagent_ref.sample.params import SamplingParams

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("F32", "Q8_0", "Q6_K", "Q4_K", "Q4_0")
WINDOW = 256
SHAPES = {  # Qwen3-0.6B: (out_features, in_features)
    "q_proj": (2048, 1024),
    "k_proj / v_proj": (1024, 1024),
    "o_proj": (1024, 2048),
    "gate / up": (3072, 1024),
    "down_proj": (1024, 3072),
}


def held_out_windows(count: int) -> list[list[int]]:
    """Windows of WINDOW token ids from the held-out stdlib files, in file order."""
    spec = importlib.util.spec_from_file_location("train", ROOT / "tools/train_default_model.py")
    train = importlib.util.module_from_spec(spec)
    sys.modules["train"] = train  # its dataclasses look their module up
    spec.loader.exec_module(train)
    files = train.collect_corpus()
    held = [text for i, (_, text) in enumerate(files) if i % train.VAL_EVERY == 0]
    from pyagent_ref.tokenize import load_tokenizer

    tok = load_tokenizer(default_model_path())
    windows: list[list[int]] = []
    for text in held:
        ids = tok.encode(text)
        windows += [ids[i : i + WINDOW] for i in range(0, len(ids) - WINDOW + 1, WINDOW)]
        if len(windows) >= count:
            break
    return windows[:count]


def perplexity(model: str, windows: list[list[int]]) -> float:
    llm = LLM(model, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": w} for w in windows], params)
    nll, count = 0.0, 0
    for out, ids in zip(outs, windows, strict=True):
        for i in range(1, len(ids)):
            nll -= out.prompt_logprobs[i][ids[i]].logprob
            count += 1
    return math.exp(nll / count)


def bench_ppl(quick: bool) -> None:
    windows = held_out_windows(8 if quick else 32)
    print(f"perplexity on {len(windows)} held-out windows of {WINDOW} tokens")
    print(f"{'format':8} {'file MB':>8} {'perplexity':>11} {'vs F32':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        base = None
        for fmt in FORMATS:
            path = write_gguf(default_model_path(), Path(tmp) / f"m-{fmt}.gguf", fmt)
            ppl = perplexity(str(path), windows)
            base = base or ppl
            size = path.stat().st_size / 1e6
            print(f"{fmt:8} {size:8.2f} {ppl:11.3f} {ppl / base - 1:+8.2%}")
        ppl = perplexity(str(default_model_path()), windows)
        print(f"safetensors float32 model: {ppl:.3f}")


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def bench_gemv(quick: bool, impl: str) -> None:
    torch.set_num_threads(1)
    ops = ops_pkg.load(impl)
    repeats = 2 if quick else 5
    rng = np.random.default_rng(0)
    print(f"gguf_matmul ({impl}) vs float32 torch, ms (best of {repeats}), one thread")
    print(f"{'layer':16} {'batch':>5} {'float32':>8} {'Q8_0':>8} {'Q4_K':>8}")
    for name, (out, inp) in SHAPES.items():
        w = rng.standard_normal((out, inp)).astype(np.float32) * 0.02
        raws = {fmt: torch.from_numpy(ops_pkg.gguf.quantize(w, fmt)) for fmt in ("Q8_0", "Q4_K")}
        wt = torch.from_numpy(w)
        for batch in (1, 64):
            x = torch.randn(batch, inp)
            row = [best_ms(lambda x=x, wt=wt: x @ wt.T, repeats)]
            for fmt, raw in raws.items():
                row.append(
                    best_ms(
                        lambda x=x, raw=raw, fmt=fmt: ops.gguf.gguf_matmul(x, raw, fmt), repeats
                    )
                )
            print(f"{name:16} {batch:5} " + " ".join(f"{v:8.2f}" for v in row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=["ppl", "gemv", "all"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ops", default="auto", choices=["auto", "ref", "accel"])
    args = parser.parse_args()
    if args.part in ("ppl", "all"):
        bench_ppl(args.quick)
    if args.part in ("gemv", "all"):
        bench_gemv(args.quick, args.ops)


if __name__ == "__main__":
    main()
