"""Side-by-side timings of pyagent_ref.ops and pyagent_accel.ops (sampling, structured,
hashing, layers, rope, attention, moe, lora, pooling, ssm and quant).

    python benchmarks/bench_ops.py            # full grid (a few minutes)
    python benchmarks/bench_ops.py --quick    # smoke run for CI (seconds)

For every sampling op and shape it times, in one run and on the same inputs: the
reference on numpy arrays, the reference on torch CPU tensors, and pyagent_accel (on
numpy arrays; torch CPU input is a zero-copy view of the same memory). It prints the
median wall time of each and the ratios ref_numpy / accel and ref_torch / accel.
`apply_token_bitmask` (`bench_structured`) is timed the same way on float32 logits and
a mask whose words are a mix of all-allowed, none-allowed and random ones (a grammar
inside a string allows almost everything, between JSON values almost nothing).
Speculative decoding (`bench_spec_decode`) times verify_greedy and rejection_sample
(q from a draft model, and q = None for n-gram drafts) on a batch of requests with 4
(or 16) drafts each, half of them the target's argmax, the same way, and their tree
versions on the same drafts arranged as a binary tree; `bench_propose_ngram` times
prompt lookup (the proposer's settings: 4 tokens, n-grams of 1 to 4) on 1k, 8k and 32k
ids given as a list (what the proposer passes) and as an int64 array: "repetitive" ids
copy passages of earlier ones (the suffix occurs earlier, anywhere), "random" ids over
32000 tokens rarely repeat even a bigram (the whole sequence is scanned).
Hashing compares the reference (pure Python) with accel for token lists and arrays.
Layers and rope (`bench_layers_rope`) time rms_norm, gemma_rms_norm, layer_norm,
silu_and_mul, gelu (erf and tanh forms), gelu_and_mul (tanh, Gemma's), apply_rope and apply_mrope at
three models' shapes, for decode and prefill token counts, in bfloat16 and float32: the
reference on numpy (float32 only: numpy has no bfloat16; its erf is `math.erf` one
element at a time) and on torch CPU tensors, and accel on the same torch tensors.
Attention (`bench_attention_ops`) times reshape_and_cache, a prefill chunk and a decode
batch over the paged cache at two models' shapes, the same way (the write and the decode
also into and over an fp8 (e4m3) cache of uint8 codes), the decode step of
bench_engine's 64-request workload on the embedded model (64 sequences of 20-130
positions, head_size 32), and DeepSeek-V2-Lite's
multi-head latent attention at its real shape (`MLA_MODEL`: 16 heads over one latent of
512 + 64): the latent write `concat_and_cache_mla`, and the absorbed attention of a
prefill chunk and of a decode batch, `paged_attention` / `paged_decode_attention` with
the latent cache as both keys and values. Mixture of experts
(`bench_moe`) times the routers and fused_moe at shapes scaled down from Mixtral 8x7B and
DeepSeek-V2-Lite / V3 (`MOE_MODELS`: the expert counts and top-k of the real models,
hidden and expert sizes divided by 8 so a CPU run takes seconds), for a decode batch and
a prefill chunk, the same way. Batched LoRA (`bench_lora`) times lora_shrink and
lora_expand (in place, with the q/k/v output slices) of a fused qkv projection at a
Llama-3-8B shape divided by 8 (hidden 512, 4 KV heads of 16), 16 adapter slots of rank
16 (B stored rank-major, as the engine's layers keep it), tokens spread over the 16
adapters and none. Pooling (`bench_pooling_ops`) times pool (mean, cls),
normalize, classify and cosine_similarity on the hidden states of a batch of 1 or 64
sentences of ~12 tokens at all-MiniLM-L6-v2's width (384), float32 and bfloat16, the
same way. State-space layers (`bench_ssm`) time causal_conv1d, ssd_scan and
selective_state_update at Mamba-2-370m's shape (`SSM_MODEL`: 32 heads of 64 channels, one
group of 128 state features, a width-4 convolution over 2304 channels, chunks of 256)
and Mamba-1's selective_scan at mamba-370m's (2048 channels, 16 state features), step
by step and by chunks, for one prefill of 512 tokens (64 with --quick) and a decode
batch of 8, float32: the reference on numpy and torch CPU, accel on the same tensors.
Weight-only quantization (`bench_quant`) times dequant_matmul of Qwen3-0.6B's
MLP projections (gate/up 1024 -> 3072, down 3072 -> 1024) with int4 codes in groups of
128 (asymmetric) and int8 per channel (symmetric), for 1 and 64 tokens, float32 and
bfloat16 activations, the same way, with float32 torch `x @ W.T` on the float weight
beside it (the layer unquantized), and quantize (RTN) of the same weights; then
quantize_fp8 and dequant_matmul_fp8 of the same weights as e4m3 codes, per tensor with
dynamic per-tensor activation scales and per channel weight-only.

Inputs are realistic: float32 logits ~ normal(0, 3), k = 50, p = 0.9, min_p = 0.05,
a few hundred prompt/output ids for the penalties, temperature 0.8 for `sample`.
This is a measurement, not a test: it never fails on a ratio.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

from _timing import machine_line, timeit  # noqa: E402

from pyagent_ref.ops import attention as ref_attention  # noqa: E402
from pyagent_ref.ops import gguf as ref_gguf  # noqa: E402
from pyagent_ref.ops import hashing as ref_hashing  # noqa: E402
from pyagent_ref.ops import layers as ref_layers  # noqa: E402
from pyagent_ref.ops import lora as ref_lora  # noqa: E402
from pyagent_ref.ops import moe as ref_moe  # noqa: E402
from pyagent_ref.ops import pooling as ref_pooling  # noqa: E402
from pyagent_ref.ops import quant as ref_quant  # noqa: E402
from pyagent_ref.ops import rope as ref_rope  # noqa: E402
from pyagent_ref.ops import sampling as ref_sampling  # noqa: E402
from pyagent_ref.ops import spec_decode as ref_spec_decode  # noqa: E402
from pyagent_ref.ops import ssm as ref_ssm  # noqa: E402
from pyagent_ref.ops import structured as ref_structured  # noqa: E402

try:
    import torch
except ImportError:  # torch is optional: the torch column is skipped
    torch = None

try:
    import pyagent_accel._native as accel_native
    from pyagent_accel.ops import attention as accel_attention
    from pyagent_accel.ops import gguf as accel_gguf
    from pyagent_accel.ops import hashing as accel_hashing
    from pyagent_accel.ops import layers as accel_layers
    from pyagent_accel.ops import lora as accel_lora
    from pyagent_accel.ops import moe as accel_moe
    from pyagent_accel.ops import pooling as accel_pooling
    from pyagent_accel.ops import quant as accel_quant
    from pyagent_accel.ops import rope as accel_rope
    from pyagent_accel.ops import sampling as accel_sampling
    from pyagent_accel.ops import spec_decode as accel_spec_decode
    from pyagent_accel.ops import structured as accel_structured
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"pyagent_accel is not installed ({exc}); build it with: pip install ./pyagent_accel")


def sampling_cases(batch: int, vocab: int, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    """(op name, args) with numpy inputs; torch inputs are made from them."""
    logits = rng.normal(0.0, 3.0, (batch, vocab)).astype(np.float32)
    n_prompt, n_output = 300, 200
    prompt = rng.integers(0, vocab, (batch, n_prompt))
    output = rng.integers(0, vocab, (batch, n_output))
    output[:, n_output - 20 :] = -1  # some right padding
    logprobs = ref_sampling.log_softmax(logits)
    return [
        ("apply_temperature", (logits, np.full(batch, 0.8, np.float32))),
        ("apply_top_k", (logits, np.full(batch, 50, np.int64))),
        ("apply_top_p", (logits, np.full(batch, 0.9))),
        ("apply_min_p", (logits, np.full(batch, 0.05))),
        (
            "apply_penalties",
            (
                logits,
                prompt,
                output,
                np.full(batch, 1.1, np.float32),
                np.full(batch, 0.2, np.float32),
                np.full(batch, 0.3, np.float32),
            ),
        ),
        (
            "apply_logit_bias",
            (logits, rng.integers(0, vocab, (batch, 20)), rng.normal(0, 2, (batch, 20))),
        ),
        ("apply_typical_p", (logits, np.full(batch, 0.9))),
        ("apply_epsilon_cutoff", (logits, np.full(batch, 3e-4))),
        ("apply_eta_cutoff", (logits, np.full(batch, 3e-4))),
        ("apply_allowed_token_ids", (logits, rng.integers(0, vocab, (batch, 64)))),
        (
            "apply_bad_words",
            (logits, output, rng.integers(0, vocab, (batch, 16, 3))),
        ),
        ("apply_no_repeat_ngram", (logits, np.concatenate([prompt, output], 1), np.full(batch, 3))),
        (
            "apply_dry",
            (
                logits,
                np.concatenate([prompt % 8, output % 8], 1),  # 8 distinct tokens: many repeats
                np.full(batch, 0.8),
                np.full(batch, 1.75),
                np.full(batch, 2),
                np.full(batch, -1),
                np.tile([0, 1], (batch, 1)),
            ),
        ),
        (
            "apply_xtc",
            (
                logits,
                np.full(batch, 0.05),
                np.full(batch, 1.0),
                rng.integers(0, 2**62, batch),
                np.arange(batch),
            ),
        ),
        ("apply_mirostat", (logits, np.full(batch, 6.0))),
        (
            "mirostat_update",
            (
                logits,
                np.argmax(logits, axis=1),
                np.full(batch, 10.0),
                np.full(batch, 5.0),
                np.full(batch, 0.1),
            ),
        ),
        ("log_softmax", (logits,)),
        ("topk_logprobs", (logprobs, 5, rng.integers(0, vocab, batch))),
        ("sample", (logits, np.full(batch, 0.8), rng.integers(0, 2**62, batch), np.arange(batch))),
        ("philox_uniform", (rng.integers(0, 2**62, batch), np.arange(batch), vocab)),
    ]


def to_torch(args: tuple) -> tuple:
    """The numpy arrays of `args` as torch CPU tensors sharing their memory (an array
    passed twice, MLA's latent cache as keys and values, becomes one tensor)."""
    seen: dict[int, Any] = {}
    return tuple(
        seen.setdefault(id(a), torch.from_numpy(a)) if isinstance(a, np.ndarray) else a
        for a in args
    )


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:10.3f}"


def fmt_ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None else f"{num / den:8.1f}x"


def bench_sampling(shapes: list[tuple[int, int]], budget: float, min_reps: int) -> list[dict]:
    rows = []
    header = (
        f"{'op':<18} {'batch':>5} {'vocab':>7} {'ref_numpy ms':>13} {'ref_torch ms':>13} "
        f"{'accel ms':>10} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    for batch, vocab in shapes:
        for name, args in sampling_cases(batch, vocab, rng):
            ref_fn = getattr(ref_sampling, name)
            acc_fn = getattr(accel_sampling, name)
            # same result first: the benchmark compares implementations of one contract
            out_ref, out_acc = ref_fn(*args), acc_fn(*args)
            if name in ("sample", "apply_top_k", "philox_uniform", "apply_penalties", "apply_dry"):
                assert np.array_equal(np.asarray(out_ref), np.asarray(out_acc)), name
            t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
            t_torch = None
            if torch is not None:
                targs = to_torch(args)
                t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 50)
            t_acc = timeit(functools.partial(acc_fn, *args), budget, min_reps, 200)
            rows.append(
                dict(op=name, batch=batch, vocab=vocab, np=t_np, torch=t_torch, accel=t_acc)
            )
            print(
                f"{name:<18} {batch:>5} {vocab:>7} {fmt_ms(t_np):>13} {fmt_ms(t_torch):>13} "
                f"{fmt_ms(t_acc):>10} {fmt_ratio(t_np, t_acc):>9} {fmt_ratio(t_torch, t_acc):>11}",
                flush=True,
            )
    return rows


def bench_structured(shapes: list[tuple[int, int]], budget: float, min_reps: int) -> list[dict]:
    """apply_token_bitmask on float32 logits (batch, vocab), columns as in `bench_sampling`."""
    rows = []
    rng = np.random.default_rng(0)
    for batch, vocab in shapes:
        logits = rng.normal(0.0, 3.0, (batch, vocab)).astype(np.float32)
        words = -(-vocab // 32)
        kind = rng.integers(0, 3, (batch, words))
        random = rng.integers(-(2**31), 2**31, (batch, words)).astype(np.int32)
        mask = np.where(kind == 0, 0, np.where(kind == 1, -1, random)).astype(np.int32)
        args = (logits, mask)
        ref_fn, acc_fn = ref_structured.apply_token_bitmask, accel_structured.apply_token_bitmask
        assert np.array_equal(ref_fn(*args), acc_fn(*args), equal_nan=True)
        t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
        t_torch = None
        if torch is not None:
            t_torch = timeit(functools.partial(ref_fn, *to_torch(args)), budget, min_reps, 50)
        t_acc = timeit(functools.partial(acc_fn, *args), budget, min_reps, 200)
        rows.append(
            dict(
                op="apply_token_bitmask",
                batch=batch,
                vocab=vocab,
                np=t_np,
                torch=t_torch,
                accel=t_acc,
            )
        )
        print(
            f"{'apply_token_bitmask':<18} {batch:>5} {vocab:>7} {fmt_ms(t_np):>13} "
            f"{fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} {fmt_ratio(t_np, t_acc):>9} "
            f"{fmt_ratio(t_torch, t_acc):>11}",
            flush=True,
        )
    return rows


def spec_decode_cases(batch: int, drafts: int, vocab: int, rng: np.random.Generator) -> list:
    """(op, args) for `batch` requests with `drafts` drafts each: float32 logits ~ normal(0,
    3), drafts the target's argmax half the time, q a softmax of nearby logits."""
    rows = batch * (drafts + 1)
    logits = rng.normal(0.0, 3.0, (rows, vocab)).astype(np.float32)
    draft_rows = np.arange(rows).reshape(batch, drafts + 1)[:, :drafts].reshape(-1)
    argmax = np.argmax(logits[draft_rows], axis=1)
    ids = np.where(rng.random(argmax.size) < 0.5, argmax, rng.integers(0, vocab, argmax.size))
    near = logits[draft_rows] + rng.normal(0.0, 1.0, (argmax.size, vocab)).astype(np.float32)
    q = np.exp(near - near.max(axis=1, keepdims=True))
    q /= q.sum(axis=1, keepdims=True)
    counts = np.full(batch, drafts, np.int64)
    scalars = (np.ones(batch), np.arange(batch, dtype=np.int64), np.full(batch, 100, np.int64))
    # the same drafts as a binary tree (draft i's parent is node i // 2), each token the
    # argmax of its parent's row half the time
    parents = np.tile(np.arange(drafts, dtype=np.int64) // 2, batch)
    parent_rows = np.repeat(np.arange(batch) * (drafts + 1), drafts) + parents
    parent_argmax = np.argmax(logits[parent_rows], axis=1)
    tree_ids = np.where(rng.random(argmax.size) < 0.5, parent_argmax, ids)
    return [
        ("verify_greedy", "verify_greedy", (logits, ids, counts)),
        ("rejection_sample", "rejection_sample", (logits, ids, counts, q, *scalars)),
        ("rejection (no q)", "rejection_sample", (logits, ids, counts, None, *scalars)),
        ("verify_tree_greedy", "verify_tree_greedy", (logits, tree_ids, counts, parents)),
        (
            "rejection_tree",
            "rejection_sample_tree",
            (logits, tree_ids, counts, parents, *scalars),
        ),
    ]


def bench_spec_decode(shapes: list[tuple[int, int, int]], budget: float, min_reps: int) -> None:
    """verify_greedy, rejection_sample and their tree versions on (batch, drafts, vocab),
    columns as in `bench_sampling` (the batch column is "requests x drafts")."""
    rng = np.random.default_rng(0)
    for batch, drafts, vocab in shapes:
        for name, op, args in spec_decode_cases(batch, drafts, vocab, rng):
            ref_fn, acc_fn = getattr(ref_spec_decode, op), getattr(accel_spec_decode, op)
            # the same tokens: no decision of these inputs falls in the contract's 1e-9 band
            assert np.array_equal(ref_fn(*args), acc_fn(*args)), name
            t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
            t_torch = None
            if torch is not None:
                t_torch = timeit(functools.partial(ref_fn, *to_torch(args)), budget, min_reps, 50)
            t_acc = timeit(functools.partial(acc_fn, *args), budget, min_reps, 200)
            print(
                f"{name:<18} {f'{batch}x{drafts}':>5} {vocab:>7} {fmt_ms(t_np):>13} "
                f"{fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} {fmt_ratio(t_np, t_acc):>9} "
                f"{fmt_ratio(t_torch, t_acc):>11}",
                flush=True,
            )


def ngram_ids(kind: str, n: int, rng: np.random.Generator) -> list[int]:
    """n token ids: "repetitive" (passages of 1-40 earlier ids copied, a few fresh ids between
    the copies, over 50 tokens) or "random" (uniform over 32000 tokens)."""
    if kind == "random":
        return rng.integers(0, 32000, n).tolist()
    ids = rng.integers(0, 50, 64).tolist()
    while len(ids) < n:
        start = int(rng.integers(0, len(ids)))
        ids += ids[start : start + int(rng.integers(1, 40))]
        ids += rng.integers(0, 50, int(rng.integers(0, 3))).tolist()
    return ids[:n]


def bench_propose_ngram(lengths: list[int], budget: float, min_reps: int) -> None:
    """propose_ngram(ids, 4, 1, 4) on lists and int64 arrays: ref and accel side by side."""
    header = (
        f"{'propose_ngram':<14} {'ids':>10} {'tokens':>7} {'ref list ms':>12} "
        f"{'ref numpy ms':>13} {'accel list ms':>14} {'accel numpy ms':>15} "
        f"{'list ref/accel':>15} {'numpy ref/accel':>16}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    settings = (4, 1, 4)
    for kind in ("repetitive", "random"):
        for n in lengths:
            ids = ngram_ids(kind, n, rng)
            array = np.array(ids, dtype=np.int64)
            ref_fn, acc_fn = ref_spec_decode.propose_ngram, accel_spec_decode.propose_ngram
            want = ref_fn(ids, *settings)
            assert acc_fn(ids, *settings) == want and acc_fn(array, *settings) == want, kind
            times = [
                timeit(functools.partial(fn, x, *settings), budget, min_reps, reps)
                for fn, reps in ((ref_fn, 50), (acc_fn, 2000))
                for x in (ids, array)
            ]
            ref_list, ref_np, acc_list, acc_np = times
            print(
                f"{'':<14} {kind:>10} {n:>7} {fmt_ms(ref_list):>12} {fmt_ms(ref_np):>13} "
                f"{fmt_ms(acc_list):>14} {fmt_ms(acc_np):>15} "
                f"{fmt_ratio(ref_list, acc_list):>15} {fmt_ratio(ref_np, acc_np):>16}",
                flush=True,
            )


def bench_hashing(lengths: list[int], budget: float, min_reps: int) -> list[dict]:
    rows = []
    header = (
        f"{'hash_blocks':<12} {'algorithm':>9} {'tokens':>7} {'ref ms':>10} "
        f"{'accel(list) ms':>15} {'accel(array) ms':>16} "
        f"{'ref/accel(list)':>16} {'ref/accel(array)':>17}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(1)
    for n in lengths:
        arr = rng.integers(0, 128256, n)
        toks = arr.tolist()
        for alg in ("sha256", "xxh3_128"):
            ref_fn = functools.partial(ref_hashing.hash_blocks, toks, 16, None, alg)
            list_fn = functools.partial(accel_hashing.hash_blocks, toks, 16, None, alg)
            arr_fn = functools.partial(accel_hashing.hash_blocks, arr, 16, None, alg)
            assert ref_fn() == list_fn() == arr_fn()
            t_ref = timeit(ref_fn, budget, min_reps, 50)
            t_list = timeit(list_fn, budget, min_reps, 500)
            t_arr = timeit(arr_fn, budget, min_reps, 500)
            rows.append(
                dict(op=f"hash_blocks/{alg}", tokens=n, ref=t_ref, accel=t_list, accel_arr=t_arr)
            )
            print(
                f"{'':<12} {alg:>9} {n:>7} {fmt_ms(t_ref):>10} {fmt_ms(t_list):>15} "
                f"{fmt_ms(t_arr):>16} {fmt_ratio(t_ref, t_list):>16} "
                f"{fmt_ratio(t_ref, t_arr):>17}",
                flush=True,
            )
    return rows


# --- layers and rope ----------------------------------------------------------------------

# name: (hidden, intermediate, query heads, kv heads, head_dim, rope theta)
LAYER_MODELS = {
    "embedded": (256, 688, 8, 2, 32, 10000.0),
    "qwen3-0.6b": (1024, 3072, 16, 8, 128, 1000000.0),
    "gemma-2b": (2048, 16384, 8, 1, 256, 10000.0),
}


def layer_cases(model: str, tokens: int, rng: np.random.Generator) -> list[tuple[str, Any, tuple]]:
    """(label, op name, float32 numpy args) of the layer ops of one forward step's shapes."""
    hidden, inter, heads, kv_heads, head_dim, theta = LAYER_MODELS[model]
    x = rng.normal(0.0, 1.0, (tokens, hidden)).astype(np.float32)
    res = rng.normal(0.0, 1.0, (tokens, hidden)).astype(np.float32)
    weight = rng.normal(1.0, 0.1, hidden).astype(np.float32)
    offset = rng.normal(0.0, 0.1, hidden).astype(np.float32)  # Gemma's weight: 1 + offset
    bias = rng.normal(0.0, 0.1, hidden).astype(np.float32)
    gate_up = rng.normal(0.0, 2.0, (tokens, 2 * inter)).astype(np.float32)
    act = rng.normal(0.0, 2.0, (tokens, inter)).astype(np.float32)  # a GELU MLP's input
    # decode: one token per request at scattered positions; prefill: a chunk of one prompt
    positions = rng.integers(0, 4096, tokens) if tokens <= 64 else np.arange(tokens) + 1000
    q = rng.normal(0.0, 1.0, (tokens, heads, head_dim)).astype(np.float32)
    k = rng.normal(0.0, 1.0, (tokens, kv_heads, head_dim)).astype(np.float32)
    inv_freq, _ = ref_rope.rope_inv_freq(head_dim, theta)
    return [
        ("rms_norm", "rms_norm", (x, weight, 1e-6)),
        ("rms_norm+residual", "rms_norm", (x, weight, 1e-6, res)),
        ("gemma_rms_norm", "gemma_rms_norm", (x, offset, 1e-6)),
        ("layer_norm", "layer_norm", (x, weight, bias, 1e-5)),
        ("silu_and_mul", "silu_and_mul", (gate_up,)),
        ("gelu", "gelu", (act, "none")),
        ("gelu/tanh", "gelu", (act, "tanh")),
        ("gelu_and_mul/tanh", "gelu_and_mul", (gate_up, "tanh")),
        ("apply_rope", "apply_rope", (positions, q, k, inv_freq, 1.0, True)),
        # Qwen2-VL's M-RoPE: three rows, sections in the ratio of (16, 24, 24)
        (
            "apply_mrope",
            "apply_mrope",
            (mrope_rows(positions), q, k, inv_freq, mrope_sections(head_dim), 1.0, True),
        ),
    ]


def mrope_rows(positions: np.ndarray) -> np.ndarray:
    """(temporal, height, width) rows: the positions, and two that differ from them."""
    return np.stack([positions, positions // 2, positions % 97]).astype(np.int64)


def mrope_sections(head_dim: int) -> tuple[int, int, int]:
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return (t, h, half - t - h)


def layer_fn(name: str, accel: bool) -> Any:
    if name in ("apply_rope", "apply_mrope"):
        return getattr(accel_rope if accel else ref_rope, name)
    return getattr(accel_layers if accel else ref_layers, name)


def bench_layers_rope(
    models: list[str], token_counts: list[int], budget: float, min_reps: int
) -> list[dict]:
    """The norms (rms_norm with and without residual), the activations, apply_(m)rope:
    the reference on numpy (float32) and on torch CPU tensors, accel on the same tensors."""
    rows = []
    header = (
        f"{'op':<18} {'model':<11} {'tokens':>6} {'dtype':<8} {'ref_numpy ms':>13} "
        f"{'ref_torch ms':>13} {'accel ms':>10} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(2)
    for model in models:
        for tokens in token_counts:
            for label, name, args in layer_cases(model, tokens, rng):
                for dtype in ("bfloat16", "float32"):
                    ref_fn, acc_fn = layer_fn(name, False), layer_fn(name, True)
                    targs = layer_args(args, dtype)
                    # same results first: the benchmark compares implementations of one contract
                    check_close(acc_fn(*targs), ref_fn(*targs), label)
                    t_np = None
                    if dtype == "float32":
                        t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
                    t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 50)
                    t_acc = timeit(functools.partial(acc_fn, *targs), budget, min_reps, 500)
                    rows.append(
                        dict(
                            op=label,
                            model=model,
                            tokens=tokens,
                            dtype=dtype,
                            np=t_np,
                            torch=t_torch,
                            accel=t_acc,
                        )
                    )
                    print(
                        f"{label:<18} {model:<11} {tokens:>6} {dtype:<8} {fmt_ms(t_np):>13} "
                        f"{fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} "
                        f"{fmt_ratio(t_np, t_acc):>9} {fmt_ratio(t_torch, t_acc):>11}",
                        flush=True,
                    )
    return rows


def layer_args(args: tuple, dtype: str) -> tuple:
    """The torch CPU tensors of a layer case: activations and weights in `dtype`,
    positions int64 and inv_freq float32 as the model keeps them."""
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            t = torch.from_numpy(a)
            is_inv_freq = a.ndim == 1 and len(args) in (6, 7)  # apply_(m)rope
            a = t if not t.is_floating_point() or is_inv_freq else t.to(getattr(torch, dtype))
        out.append(a)
    return tuple(out)


def check_close(got: Any, want: Any, label: str) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, label
        assert torch.allclose(g.float(), w.float(), rtol=1e-2, atol=1e-2), label


def layers_summary(rows: list[dict]) -> None:
    met = [r for r in rows if r["torch"] >= r["accel"]]
    print(f"\ntarget: accel >= ref torch CPU on every layers/rope row: {len(met)}/{len(rows)} met")
    for r in rows:
        if r not in met:
            print(
                f"  NOT met: {r['op']} {r['model']} {r['tokens']} tokens {r['dtype']}: "
                f"{r['torch'] / r['accel']:.2f}x"
            )


# --- attention ---------------------------------------------------------------------------

# (label, query heads, KV heads, head_size); block size 16 throughout
ATTENTION_MODELS = (("embedded", 8, 2, 32), ("Qwen3-0.6B", 16, 8, 128))
BLOCK = 16


def paged_cache(lens: list[int], kv_heads: int, head_size: int, rng: np.random.Generator):
    """float32 (key_cache, value_cache, block_table) holding sequences of `lens` tokens in
    shuffled blocks (block 0 spare)."""
    used = [-(-n // BLOCK) for n in lens]
    ids = rng.permutation(np.arange(1, sum(used) + 1))
    table = np.zeros((len(lens), max(used)), np.int32)
    at = 0
    for r, u in enumerate(used):
        table[r, :u] = ids[at : at + u]
        at += u
    shape = (sum(used) + 1, BLOCK, kv_heads, head_size)
    kc = rng.standard_normal(shape, dtype=np.float32)
    vc = rng.standard_normal(shape, dtype=np.float32)
    return kc, vc, table


def attention_cases(heads: int, kv_heads: int, d: int, quick: bool, rng: np.random.Generator):
    """(row label, op name, float32 numpy args): a prefill chunk's cache write, the chunk's
    attention after 0 and after `cached` tokens, and a decode batch."""
    chunk, cached, n_dec, (lo, hi) = (
        (128, 256, 8, (128, 512))
        if quick
        else (
            512,
            1024,
            64,
            (512, 4096),
        )
    )
    kc, vc, table = paged_cache([chunk + cached], kv_heads, d, rng)
    q = rng.standard_normal((chunk, heads, d), dtype=np.float32)
    k = rng.standard_normal((chunk, kv_heads, d), dtype=np.float32)
    slots = table[0, (cached + np.arange(chunk)) // BLOCK] * BLOCK + np.arange(chunk) % BLOCK
    qsl = np.array([0, chunk], np.int32)
    cases = [
        (f"reshape_and_cache {chunk} tok", "reshape_and_cache", (k, k, kc, vc, slots)),
        (
            f"prefill {chunk} after 0",
            "paged_attention",
            (q, kc, vc, table, qsl, np.array([chunk], np.int32), d**-0.5),
        ),
        (
            f"prefill {chunk} after {cached}",
            "paged_attention",
            (q, kc, vc, table, qsl, np.array([chunk + cached], np.int32), d**-0.5),
        ),
    ]
    codes = [np.zeros(kc.shape, np.uint8) for _ in range(2)]  # an fp8 (e4m3) cache
    fp8 = ("fp8", 2.0**-6, 2.0**-6)
    cases.append((f"fp8 write {chunk} tok", "reshape_and_cache", (k, k, *codes, slots, *fp8)))
    lens = rng.integers(lo, hi + 1, n_dec).tolist()
    kc, vc, table = paged_cache(lens, kv_heads, d, rng)
    q = rng.standard_normal((n_dec, heads, d), dtype=np.float32)
    cases.append(
        (
            f"decode {n_dec} x {lo}-{hi}",
            "paged_decode_attention",
            (q, kc, vc, table, np.array(lens, np.int32), d**-0.5),
        )
    )
    # finite e4m3 codes of either sign (|value| <= 448, times the scale 2^-6)
    codes = [(rng.integers(0, 0x7F, kc.shape) | rng.integers(0, 2, kc.shape) << 7) for _ in "kv"]
    codes = [c.astype(np.uint8) for c in codes]
    lens_ = np.array(lens, np.int32)
    cases.append(
        (
            f"fp8 decode {n_dec} x {lo}-{hi}",
            "paged_decode_attention",
            (q, *codes, table, lens_, d**-0.5, None, None, None, *fp8),
        )
    )
    return cases


def engine_decode_case(heads: int, kv_heads: int, d: int, rng: np.random.Generator):
    """(row label, op name, float32 numpy args) of the decode step of bench_engine's
    64-request workload: 64 sequences of 20-130 positions (about 100 once decoding)."""
    lens = rng.integers(20, 131, 64).tolist()
    kc, vc, table = paged_cache(lens, kv_heads, d, rng)
    q = rng.standard_normal((64, heads, d), dtype=np.float32)
    args = (q, kc, vc, table, np.array(lens, np.int32), d**-0.5)
    return "engine decode 64 x 20-130", "paged_decode_attention", args


# DeepSeek-V2-Lite's MLA: 16 heads, a latent of kv_lora_rank 512 + qk_rope_head_dim 64
MLA_MODEL = ("MLA V2-Lite", 16, 512, 64)


def mla_cases(heads: int, rank: int, rope: int, quick: bool, rng: np.random.Generator):
    """(row label, op name, float32 numpy args) of MLA at its real shape: a prefill chunk's
    latent write (`concat_and_cache_mla`), and the absorbed attention over the latent
    cache (one KV head of rank + rope, the same array as keys and values) for the chunk
    after `cached` tokens and for a decode batch."""
    chunk, cached, n_dec, (lo, hi) = (
        (128, 256, 8, (128, 512)) if quick else (512, 1024, 64, (512, 4096))
    )
    width = rank + rope
    kc, _, table = paged_cache([chunk + cached], 1, width, rng)
    q = rng.standard_normal((chunk, heads, width), dtype=np.float32)
    latent = rng.standard_normal((chunk, width), dtype=np.float32)
    slots = table[0, (cached + np.arange(chunk)) // BLOCK] * BLOCK + np.arange(chunk) % BLOCK
    scale = (128 + rope) ** -0.5
    cases = [
        (
            f"concat_and_cache_mla {chunk}",
            "concat_and_cache_mla",
            (latent[:, :rank], latent[:, rank:], kc.reshape(*kc.shape[:2], width), slots),
        ),
        (
            f"prefill {chunk} after {cached}",
            "paged_attention",
            (
                q,
                kc,
                kc,
                table,
                np.array([0, chunk], np.int32),
                np.array([chunk + cached], np.int32),
                scale,
            ),
        ),
    ]
    lens = rng.integers(lo, hi + 1, n_dec).tolist()
    kc, _, table = paged_cache(lens, 1, width, rng)
    q = rng.standard_normal((n_dec, heads, width), dtype=np.float32)
    cases.append(
        (
            f"decode {n_dec} x {lo}-{hi}",
            "paged_decode_attention",
            (q, kc, kc, table, np.array(lens, np.int32), scale),
        )
    )
    return cases


def bench_attention_ops(quick: bool, budget: float, min_reps: int) -> list[dict]:
    """accel vs the reference on numpy (float32) and on torch CPU, in float32 and bf16."""
    rows = []
    header = (
        f"{'model':<11} {'dtype':<5} {'case':<26} {'ref_numpy ms':>13} {'ref_torch ms':>13} "
        f"{'accel ms':>10} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(2)
    grid = [
        (model, case)
        for model, heads, kv_heads, d in ATTENTION_MODELS
        for case in attention_cases(heads, kv_heads, d, quick, rng)
    ]
    grid += [(ATTENTION_MODELS[0][0], engine_decode_case(*ATTENTION_MODELS[0][1:], rng))]
    grid += [(MLA_MODEL[0], case) for case in mla_cases(*MLA_MODEL[1:], quick, rng)]
    for model, (label, op, args) in grid:
        ref_fn, acc_fn = getattr(ref_attention, op), getattr(accel_attention, op)
        t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 20)
        for dtype in ("fp32", "bf16"):
            targs = to_torch(args) if torch is not None else None
            if dtype == "bf16":
                if torch is None:
                    continue
                halves: dict[int, Any] = {}  # one conversion per tensor (MLA's shared cache)
                targs = tuple(
                    halves.setdefault(id(a), a.to(torch.bfloat16))
                    if isinstance(a, torch.Tensor) and a.is_floating_point()
                    else a
                    for a in targs
                )
            acc_args = args if dtype == "fp32" else targs
            if "cache" not in op:  # the same result first (the writes mutate)
                want = np.asarray(ref_fn(*args), np.float32)
                got = acc_fn(*acc_args)
                got = (
                    got.float().numpy()
                    if torch is not None and isinstance(got, torch.Tensor)
                    else np.asarray(got)
                )
                tol = 1e-4 if dtype == "fp32" else 5e-2
                assert np.allclose(got, want, atol=tol, rtol=tol), (model, label, dtype)
            t_torch = None
            if targs is not None:
                t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 20)
            t_acc = timeit(functools.partial(acc_fn, *acc_args), budget, min_reps, 200)
            rows.append(
                dict(
                    op=op,
                    model=model,
                    dtype=dtype,
                    case=label,
                    np=t_np,
                    torch=t_torch,
                    accel=t_acc,
                )
            )
            print(
                f"{model:<11} {dtype:<5} {label:<26} {fmt_ms(t_np):>13} "
                f"{fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} {fmt_ratio(t_np, t_acc):>9} "
                f"{fmt_ratio(t_torch, t_acc):>11}",
                flush=True,
            )
    print("\ntargets: accel >= ref torch on every row, >= 10x ref numpy (float32) on decode")
    for r in rows:
        ok_t = r["torch"] is None or r["torch"] >= r["accel"]
        ok_np = r["op"] != "paged_decode_attention" or r["np"] / r["accel"] >= 10
        if not (ok_t and ok_np):
            print(f"  NOT met: {r['model']} {r['dtype']} {r['case']}")
    return rows


# --- mixture of experts ---------------------------------------------------------------------

# name: (hidden, expert intermediate, experts, top-k), 1/8 of the real hidden and expert
# sizes (Mixtral 8x7B: 4096, 14336, 8, 2; DeepSeek-V2-Lite: 2048, 1408, 64, 6)
MOE_MODELS = {
    "mixtral/8": (512, 1792, 8, 2),
    "dsv2-lite/8": (256, 176, 64, 6),
}


def moe_cases(tokens: int, rng: np.random.Generator) -> list[tuple[str, str, str, tuple]]:
    """(model, label, op, float32 numpy args): the routers of both models, DeepSeek-V3's
    grouped sigmoid router (256 experts, 8 groups, 4 kept, top-8, a correction bias), and
    fused_moe with the routing of the first."""
    cases = []
    for model, (hidden, inter, experts, k) in MOE_MODELS.items():
        logits = rng.normal(0.0, 1.0, (tokens, experts)).astype(np.float32)
        cases.append((model, "route_topk_softmax", "route_topk_softmax", (logits, k, True)))
        weights, ids = ref_moe.route_topk_softmax(logits, k, True)
        scale = hidden**-0.5
        w_gate_up = rng.normal(0.0, scale, (experts, 2 * inter, hidden)).astype(np.float32)
        w_down = rng.normal(0.0, inter**-0.5, (experts, hidden, inter)).astype(np.float32)
        x = rng.normal(0.0, 1.0, (tokens, hidden)).astype(np.float32)
        cases.append((model, "fused_moe", "fused_moe", (x, w_gate_up, w_down, weights, ids)))
    v3 = rng.normal(0.0, 1.0, (tokens, 256)).astype(np.float32)
    bias = rng.normal(0.0, 0.1, 256).astype(np.float32)
    args = (v3, 8, 8, 4, bias, "sigmoid", 2.5, True)
    cases.insert(0, ("dsv3", "route_grouped_topk", "route_grouped_topk", args))
    return cases


def bench_moe(token_counts: list[int], budget: float, min_reps: int) -> list[dict]:
    """Routers and fused_moe: the reference on numpy (float32) and on torch CPU, accel on
    the same tensors, in float32 and (fused_moe) bfloat16."""
    rows = []
    header = (
        f"{'op':<19} {'model':<12} {'tokens':>6} {'dtype':<8} {'ref_numpy ms':>13} "
        f"{'ref_torch ms':>13} {'accel ms':>10} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(3)
    for tokens in token_counts:
        for model, label, op, args in moe_cases(tokens, rng):
            ref_fn, acc_fn = getattr(ref_moe, op), getattr(accel_moe, op)
            for dtype in ("float32", "bfloat16") if op == "fused_moe" else ("float32",):
                targs = to_torch(args)
                if dtype == "bfloat16":  # activations and experts in bf16, weights float32
                    targs = (*(a.to(torch.bfloat16) for a in targs[:3]), *targs[3:])
                want, got = ref_fn(*targs), acc_fn(*targs)
                if op == "fused_moe":  # the same result first
                    check_close(got, want, label)
                else:
                    assert torch.equal(got[1], want[1]), label
                t_np = None
                if dtype == "float32":
                    t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
                t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 50)
                t_acc = timeit(functools.partial(acc_fn, *targs), budget, min_reps, 500)
                rows.append(dict(op=label, model=model, tokens=tokens, np=t_np, accel=t_acc))
                print(
                    f"{label:<19} {model:<12} {tokens:>6} {dtype:<8} {fmt_ms(t_np):>13} "
                    f"{fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} "
                    f"{fmt_ratio(t_np, t_acc):>9} {fmt_ratio(t_torch, t_acc):>11}",
                    flush=True,
                )
    return rows


# --- lora -----------------------------------------------------------------------------------


def lora_cases(tokens: int, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    """(op, float32 numpy args): a fused qkv projection's shrink and in-place expand, 16
    slots of rank 16, each token one of the 16 adapters or none (-1)."""
    hidden, q, kv, slots, rank = 512, 512, 64, 16, 16
    x = rng.normal(0.0, 1.0, (tokens, hidden)).astype(np.float32)
    lora_a = rng.normal(0.0, hidden**-0.5, (slots, 3 * rank, hidden)).astype(np.float32)
    # B kept rank-major, the view (slots, out, rank) handed to the ops, as LoRALinear does
    lora_b = rng.normal(0.0, rank**-0.5, (slots, rank, q + 2 * kv)).astype(np.float32)
    lora_b = lora_b.transpose(0, 2, 1)
    indices = rng.integers(-1, slots, tokens)
    scaling = np.full(slots, 2.0, np.float32)
    y = ref_lora.lora_shrink(x, lora_a, indices)
    out = rng.normal(0.0, 1.0, (tokens, q + 2 * kv)).astype(np.float32)
    return [
        ("lora_shrink", (x, lora_a, indices)),
        ("lora_expand", (y, lora_b, indices, scaling, out, (q, kv, kv))),
    ]


def bench_lora(token_counts: list[int], budget: float, min_reps: int) -> list[dict]:
    """lora_shrink and lora_expand: the reference on numpy (float32) and on torch CPU,
    accel on the same tensors, in float32 and bfloat16 (x, lora_a, lora_b and out)."""
    rows = []
    header = (
        f"{'op':<12} {'tokens':>6} {'dtype':<8} {'ref_numpy ms':>13} {'ref_torch ms':>13} "
        f"{'accel ms':>10} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(5)
    for tokens in token_counts:
        for op, args in lora_cases(tokens, rng):
            ref_fn, acc_fn = getattr(ref_lora, op), getattr(accel_lora, op)
            for dtype in ("float32", "bfloat16"):
                targs = to_torch(args)
                if dtype == "bfloat16":  # the model's tensors in bf16, y and scaling float32
                    half = (0, 1) if op == "lora_shrink" else (1, 4)
                    targs = tuple(
                        a.to(torch.bfloat16) if i in half else a for i, a in enumerate(targs)
                    )
                if op == "lora_expand":  # the same result first, each on its own out
                    want = ref_fn(*targs[:4], targs[4].clone(), *targs[5:])
                    check_close(acc_fn(*targs[:4], targs[4].clone(), *targs[5:]), want, op)
                else:
                    check_close(acc_fn(*targs), ref_fn(*targs), op)
                t_np = None
                if dtype == "float32":
                    t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
                t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 50)
                t_acc = timeit(functools.partial(acc_fn, *targs), budget, min_reps, 500)
                rows.append(dict(op=op, tokens=tokens, np=t_np, accel=t_acc))
                print(
                    f"{op:<12} {tokens:>6} {dtype:<8} {fmt_ms(t_np):>13} {fmt_ms(t_torch):>13} "
                    f"{fmt_ms(t_acc):>10} {fmt_ratio(t_np, t_acc):>9} "
                    f"{fmt_ratio(t_torch, t_acc):>11}",
                    flush=True,
                )
    return rows


def pooling_cases(batch: int, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    """(op label, float32 numpy args) for a batch of sentences of 8-16 tokens, hidden 384."""
    lens = rng.integers(8, 17, batch)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    hidden = rng.normal(0.0, 1.0, (int(qsl[-1]), 384)).astype(np.float32)
    pooled = ref_pooling.pool(hidden, qsl, "mean")
    logits = rng.normal(0.0, 3.0, (batch, 3)).astype(np.float32)
    return [
        ("pool mean", (hidden, qsl, "mean")),
        ("pool cls", (hidden, qsl, "cls")),
        ("normalize", (pooled,)),
        ("normalize 128", (pooled, 128)),
        ("classify", (logits, "softmax")),
        ("cosine_similarity", (pooled, pooled[::-1].copy())),
    ]


def bench_pooling_ops(batches: list[int], budget: float, min_reps: int) -> list[dict]:
    """The pooling ops: the reference on numpy (float32) and on torch CPU, accel on the
    same tensors, in float32 and bfloat16 (hidden states as a bf16 model leaves them)."""
    rows = []
    header = (
        f"{'op':<19} {'batch':>6} {'dtype':<8} {'ref_numpy ms':>13} {'ref_torch ms':>13} "
        f"{'accel ms':>10} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(5)
    for batch in batches:
        for label, args in pooling_cases(batch, rng):
            op = label.split()[0]
            ref_fn, acc_fn = getattr(ref_pooling, op), getattr(accel_pooling, op)
            for dtype in ("float32", "bfloat16"):
                targs = to_torch(args)
                if dtype == "bfloat16":
                    targs = (targs[0].to(torch.bfloat16), *targs[1:])
                check_close(acc_fn(*targs), ref_fn(*targs), label)  # the same result first
                t_np = None
                if dtype == "float32":
                    t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 50)
                t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 50)
                t_acc = timeit(functools.partial(acc_fn, *targs), budget, min_reps, 500)
                rows.append(dict(op=label, batch=batch, np=t_np, accel=t_acc, torch=t_torch))
                print(
                    f"{label:<19} {batch:>6} {dtype:<8} {fmt_ms(t_np):>13} {fmt_ms(t_torch):>13} "
                    f"{fmt_ms(t_acc):>10} {fmt_ratio(t_np, t_acc):>9} "
                    f"{fmt_ratio(t_torch, t_acc):>11}",
                    flush=True,
                )
    return rows


SSM_MODEL = dict(heads=32, head_dim=64, groups=1, state=128, conv_channels=2304, width=4)
MAMBA1_MODEL = dict(channels=2048, state=16)


def ssm_cases(tokens: int, decode: int, rng: np.random.Generator) -> list[tuple[str, str, tuple]]:
    """(label, op, float32 numpy args): a prefill of `tokens` (one new sequence) and a
    batch of `decode` one-token steps from random states, at SSM_MODEL's shape."""
    m, m1 = SSM_MODEL, MAMBA1_MODEL
    f32 = lambda *shape: rng.normal(0.0, 0.5, shape).astype(np.float32)  # noqa: E731
    qsl, steps = np.array([0, tokens], np.int64), np.arange(decode + 1, dtype=np.int64)
    h, p, g, n = m["heads"], m["head_dim"], m["groups"], m["state"]
    a = -np.exp(f32(h))
    c1, n1 = m1["channels"], m1["state"]
    a1 = -np.exp(f32(c1, n1))
    conv_w, conv_b = f32(m["conv_channels"], m["width"]), f32(m["conv_channels"])

    def conv(rows, seqs):
        return (f32(rows, m["conv_channels"]), conv_w, conv_b, f32(seqs, m["conv_channels"], 3))

    def ssd(rows, seqs):
        return (f32(rows, h, p), f32(rows, h), a, f32(rows, g, n), f32(rows, g, n))

    def mamba1(rows):
        return (f32(rows, c1), f32(rows, c1), a1, f32(rows, n1), f32(rows, n1))

    d, bias = f32(h), f32(h)
    return [
        ("causal_conv1d prefill", "causal_conv1d", (*conv(tokens, 1), qsl, "silu")),
        ("causal_conv1d decode", "causal_conv1d", (*conv(decode, decode), steps, "silu")),
        (
            "ssd_scan prefill",
            "ssd_scan",
            (*ssd(tokens, 1), np.zeros((1, h, p, n), np.float32), qsl, 256, d, bias, True),
        ),
        (
            "ssd_scan decode",
            "ssd_scan",
            (*ssd(decode, decode), f32(decode, h, p, n), steps, 256, d, bias, True),
        ),
        (
            "state_update decode",
            "selective_state_update",
            (f32(decode, h, p, n), *ssd(decode, decode), d, bias, True),
        ),
        (
            "mamba1 scan prefill",
            "selective_scan",
            (*mamba1(tokens), np.zeros((1, c1, n1), np.float32), qsl, None, None, None, True),
        ),
        (
            "mamba1 chunked 64",
            "selective_scan",
            (*mamba1(tokens), np.zeros((1, c1, n1), np.float32), qsl, None, None, None, True, 64),
        ),
    ]


def bench_ssm(tokens: int, decode: int, budget: float, min_reps: int) -> list[dict]:
    """The state-space ops: the reference on numpy and on torch CPU (float32); accel's
    twin where it has one."""
    try:
        from pyagent_accel.ops import ssm as accel_ssm
    except ImportError:
        accel_ssm = None
    rows = []
    header = (
        f"{'op':<22} {'tokens':>6} {'ref_numpy ms':>13} {'ref_torch ms':>13} {'accel ms':>10} "
        f"{'np/torch':>9} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(7)
    for label, op, args in ssm_cases(tokens, decode, rng):
        ref_fn, acc_fn = getattr(ref_ssm, op), getattr(accel_ssm, op, None)
        targs = to_torch(args)
        t_np = timeit(functools.partial(ref_fn, *args), budget, min_reps, 20)
        t_torch = timeit(functools.partial(ref_fn, *targs), budget, min_reps, 20)
        t_acc = None
        if acc_fn is not None:
            check_close(acc_fn(*targs), ref_fn(*targs), label)  # the same results first
            t_acc = timeit(functools.partial(acc_fn, *targs), budget, min_reps, 200)
        rows.append(dict(op=label, np=t_np, torch=t_torch, accel=t_acc))
        n = args[0].shape[0] if op != "selective_state_update" else args[1].shape[0]
        print(
            f"{label:<22} {n:>6} {fmt_ms(t_np):>13} {fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} "
            f"{fmt_ratio(t_np, t_torch):>9} {fmt_ratio(t_np, t_acc):>9} "
            f"{fmt_ratio(t_torch, t_acc):>11}",
            flush=True,
        )


# --- quant ----------------------------------------------------------------------------------

# Qwen3-0.6B's MLP: (label, in_features, out_features)
QUANT_LAYERS = (("gate/up", 1024, 3072), ("down", 3072, 1024))
# (label, bits, group_size, symmetric)
QUANT_FORMATS = (("int4 g128", 4, 128, False), ("int8", 8, None, True))


def bench_quant(token_counts: list[int], budget: float, min_reps: int) -> list[dict]:
    """dequant_matmul: the reference on numpy and on torch CPU, accel on the same tensors,
    x in float32 and bfloat16; `float W` is torch's x @ W.T on the float32 weight (the
    layer unquantized, x in float32). quantize of the weight (float32), per format."""
    rows = []
    header = (
        f"{'op':<14} {'layer':<8} {'format':<10} {'tokens':>6} {'dtype':<8} "
        f"{'ref_numpy ms':>13} {'ref_torch ms':>13} {'accel ms':>10} {'float W ms':>10} "
        f"{'np/accel':>9} {'torch/accel':>11} {'floatW/accel':>12}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(5)

    def row(op, layer, fmt, tokens, dtype, t_np, t_torch, t_acc, t_float=None) -> None:
        rows.append(dict(op=op, layer=layer, fmt=fmt, tokens=tokens, accel=t_acc))
        print(
            f"{op:<14} {layer:<8} {fmt:<10} {tokens:>6} {dtype:<8} {fmt_ms(t_np):>13} "
            f"{fmt_ms(t_torch):>13} {fmt_ms(t_acc):>10} {fmt_ms(t_float):>10} "
            f"{fmt_ratio(t_np, t_acc):>9} {fmt_ratio(t_torch, t_acc):>11} "
            f"{fmt_ratio(t_float, t_acc):>12}",
            flush=True,
        )

    for layer, n, out in QUANT_LAYERS:
        weight = rng.normal(0.0, n**-0.5, (out, n)).astype(np.float32)
        tw = torch.from_numpy(weight)
        for fmt, bits, group, symmetric in QUANT_FORMATS:
            qargs = (weight, bits, group, symmetric)
            got, want = (
                tuple(a for a in f(*to_torch(qargs)) if a is not None)
                for f in (accel_quant.quantize, ref_quant.quantize)
            )
            check_close(got, want, "quantize")
            t_np = timeit(functools.partial(ref_quant.quantize, *qargs), budget, min_reps, 20)
            t_acc = timeit(functools.partial(accel_quant.quantize, *qargs), budget, min_reps, 50)
            row("quantize", layer, fmt, out, "float32", t_np, None, t_acc)
            codes, scales, zeros = ref_quant.quantize(*qargs)
            packed = ref_quant.pack_int32(codes, bits)
            for tokens in token_counts:
                x = rng.normal(0.0, 1.0, (tokens, n)).astype(np.float32)
                args = (x, packed, scales, zeros, bits)
                t_float = timeit(
                    functools.partial(torch.matmul, torch.from_numpy(x), tw.T),
                    budget,
                    min_reps,
                    200,
                )
                for dtype in ("float32", "bfloat16"):
                    targs = to_torch(args)
                    if dtype == "bfloat16":
                        targs = (targs[0].to(torch.bfloat16), *targs[1:])
                    fn = ref_quant.dequant_matmul
                    check_close(accel_quant.dequant_matmul(*targs), fn(*targs), "dequant_matmul")
                    t_np = None
                    if dtype == "float32":
                        t_np = timeit(functools.partial(fn, *args), budget, min_reps, 20)
                    t_torch = timeit(functools.partial(fn, *targs), budget, min_reps, 20)
                    t_acc = timeit(
                        functools.partial(accel_quant.dequant_matmul, *targs), budget, min_reps, 200
                    )
                    shown = t_float if dtype == "float32" else None
                    row("dequant_matmul", layer, fmt, tokens, dtype, t_np, t_torch, t_acc, shown)
        bench_fp8(rng, weight, layer, token_counts, budget, min_reps, row)
    return rows


# (label, per, input_scale): e4m3 weights per tensor with dynamic activations (vLLM's fp8
# checkpoints as tools/quantize.py writes them) and per channel, weight-only
FP8_FORMATS = (("fp8 dyn", "tensor", "dynamic"), ("fp8 ch", "channel", None))


def bench_fp8(rng, weight, layer, token_counts, budget, min_reps, row) -> None:
    """quantize_fp8 and dequant_matmul_fp8 rows of `bench_quant` for one layer's weight."""
    tw = torch.from_numpy(weight)
    for fmt, per, input_scale in FP8_FORMATS:
        qargs = (weight, "e4m3", per)
        got, want = (
            f(*to_torch(qargs)) for f in (accel_quant.quantize_fp8, ref_quant.quantize_fp8)
        )
        check_close(got, want, "quantize_fp8")
        t_np = timeit(functools.partial(ref_quant.quantize_fp8, *qargs), budget, min_reps, 20)
        t_acc = timeit(functools.partial(accel_quant.quantize_fp8, *qargs), budget, min_reps, 50)
        row("quantize_fp8", layer, fmt, weight.shape[0], "float32", t_np, None, t_acc)
        codes, scales = ref_quant.quantize_fp8(*qargs)
        for tokens in token_counts:
            x = rng.normal(0.0, 1.0, (tokens, weight.shape[1])).astype(np.float32)
            t_float = timeit(
                functools.partial(torch.matmul, torch.from_numpy(x), tw.T), budget, min_reps, 200
            )
            for dtype in ("float32", "bfloat16"):
                args = (x, codes, scales, "e4m3", input_scale)
                targs = to_torch(args)
                if dtype == "bfloat16":
                    targs = (targs[0].to(torch.bfloat16), *targs[1:])
                fn, acc = ref_quant.dequant_matmul_fp8, accel_quant.dequant_matmul_fp8
                check_close(acc(*targs), fn(*targs), "dequant_matmul_fp8")
                t_np = None
                if dtype == "float32":
                    t_np = timeit(functools.partial(fn, *args), budget, min_reps, 20)
                t_torch = timeit(functools.partial(fn, *targs), budget, min_reps, 20)
                t_acc = timeit(functools.partial(acc, *targs), budget, min_reps, 200)
                shown = t_float if dtype == "float32" else None
                row("dequant_mm_fp8", layer, fmt, tokens, dtype, t_np, t_torch, t_acc, shown)


GGUF_FORMATS = ("Q8_0", "Q4_0", "Q4_K", "Q6_K")


def bench_gguf(token_counts: list[int], budget: float, min_reps: int) -> list[dict]:
    """ops.gguf at the quant layers' shapes: quantize (ref numpy vs accel), gguf_matmul (the
    reference on torch CPU, which dequantizes the whole weight per call, vs accel's fused
    kernel; `float W` is torch's float32 x @ W.T), x float32."""
    rows = []
    header = (
        f"{'op':<12} {'layer':<8} {'format':<6} {'tokens':>6} {'ref ms':>10} {'accel ms':>10} "
        f"{'float W ms':>10} {'ref/accel':>10} {'floatW/accel':>12}"
    )
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(7)
    for layer, n, out in QUANT_LAYERS:
        weight = rng.normal(0.0, n**-0.5, (out, n)).astype(np.float32)
        tw = torch.from_numpy(weight)
        for fmt in GGUF_FORMATS:
            raw = ref_gguf.quantize(weight, fmt)
            assert np.array_equal(accel_gguf.quantize(weight, fmt), raw), fmt
            t_ref = timeit(functools.partial(ref_gguf.quantize, weight, fmt), budget, min_reps, 5)
            t_acc = timeit(
                functools.partial(accel_gguf.quantize, weight, fmt), budget, min_reps, 20
            )
            rows.append(dict(op="quantize", layer=layer, fmt=fmt, tokens=out, accel=t_acc))
            print(
                f"{'quantize':<12} {layer:<8} {fmt:<6} {out:>6} {fmt_ms(t_ref):>10} "
                f"{fmt_ms(t_acc):>10} {'':>10} {fmt_ratio(t_ref, t_acc):>10}",
                flush=True,
            )
            traw = torch.from_numpy(raw)
            for tokens in token_counts:
                x = torch.from_numpy(rng.normal(0.0, 1.0, (tokens, n)).astype(np.float32))
                want = ref_gguf.gguf_matmul(x, traw, fmt)
                check_close(accel_gguf.gguf_matmul(x, traw, fmt), want, "gguf_matmul")
                t_float = timeit(functools.partial(torch.matmul, x, tw.T), budget, min_reps, 200)
                fns = (ref_gguf.gguf_matmul, accel_gguf.gguf_matmul)
                t_ref, t_acc = (
                    timeit(functools.partial(f, x, traw, fmt), budget, min_reps, 50) for f in fns
                )
                rows.append(
                    dict(op="gguf_matmul", layer=layer, fmt=fmt, tokens=tokens, accel=t_acc)
                )
                print(
                    f"{'gguf_matmul':<12} {layer:<8} {fmt:<6} {tokens:>6} {fmt_ms(t_ref):>10} "
                    f"{fmt_ms(t_acc):>10} {fmt_ms(t_float):>10} {fmt_ratio(t_ref, t_acc):>10} "
                    f"{fmt_ratio(t_float, t_acc):>12}",
                    flush=True,
                )
    return rows


TARGET_OPS = ("apply_top_k", "apply_top_p", "apply_min_p", "apply_penalties", "sample")


def summary(sampling_rows: list[dict], hashing_rows: list[dict]) -> None:
    big = max(((r["batch"], r["vocab"]) for r in sampling_rows), default=None)
    if big is None:
        return
    print(f"\ntargets at {big[0]} x {big[1]}: accel >= 10x ref numpy and faster than ref torch")
    for r in sampling_rows:
        if (r["batch"], r["vocab"]) == big and r["op"] in TARGET_OPS:
            ok_np = r["np"] / r["accel"] >= 10
            ok_t = r["torch"] is None or r["torch"] / r["accel"] > 1
            verdict = "met" if ok_np and ok_t else "NOT met"
            vs_torch = "-" if r["torch"] is None else f"{r['torch'] / r['accel']:.1f}x"
            print(
                f"  {r['op']:<16} {r['np'] / r['accel']:7.1f}x numpy, {vs_torch} torch: {verdict}"
            )
    for r in hashing_rows:
        verdict = "met" if r["ref"] / r["accel"] >= 10 else "NOT met"
        ratio = r["ref"] / r["accel"]
        print(f"  {r['op']:<20} {r['tokens']:>7} tokens: {ratio:7.1f}x pure Python: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced grid for CI smoke runs")
    args = parser.parse_args()
    print(machine_line(torch, accel_native.SIMD) + "\n")
    if args.quick:
        shapes, lengths, budget, min_reps = [(4, 32000)], [1024, 16384], 0.02, 1
        layer_tokens = [64]
    else:
        shapes = [(b, v) for v in (32000, 128256) for b in (1, 8, 64)]
        lengths, budget, min_reps = [1024, 32768, 131072], 0.4, 3
        layer_tokens = [64, 512]
    t0 = time.perf_counter()
    srows = bench_sampling(shapes, budget, min_reps)
    bench_structured(shapes if args.quick else [(1, 128256), (64, 128256)], budget, min_reps)
    spec_shapes = (
        [(8, 4, 32000)]
        if args.quick
        else [(8, 4, 32000), (64, 4, 32000), (8, 16, 32000), (8, 4, 128256)]
    )
    bench_spec_decode(spec_shapes, budget, min_reps)
    print()
    bench_propose_ngram([1024] if args.quick else [1024, 8192, 32768], budget, min_reps)
    print()
    hrows = bench_hashing(lengths, budget, min_reps)
    summary(srows, hrows)
    if torch is not None:
        print()
        layers_summary(bench_layers_rope(list(LAYER_MODELS), layer_tokens, budget, min_reps))
        print()
        bench_moe([8] if args.quick else [8, 128], budget, min_reps)
        print()
        bench_lora([8] if args.quick else [64, 512], budget, min_reps)
        print()
        bench_pooling_ops([64] if args.quick else [1, 64], budget, min_reps)
        print()
        bench_ssm(64 if args.quick else 512, 8, budget, min_reps)
        bench_quant([1] if args.quick else [1, 64], budget, min_reps)
        print()
        bench_gguf([1] if args.quick else [1, 64], budget, min_reps)
    print()
    bench_attention_ops(args.quick, budget, min_reps)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
