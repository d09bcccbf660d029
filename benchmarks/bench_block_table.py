"""Side-by-side timings of pyagent_ref.ops.block_table and pyagent_accel.ops.block_table.

    python benchmarks/bench_block_table.py            # realistic batches (about a minute)
    python benchmarks/bench_block_table.py --quick    # smoke run for CI (seconds)

For each batch it times, in one run and on the same inputs, `compute_positions`,
`compute_slot_mapping`, `compute_logits_indices` and the three in sequence ("step", what
a model runner does to prepare one step): the reference on numpy arrays, the reference
on torch CPU tensors, pyagent_accel on the numpy arrays and pyagent_accel on the torch
tensors (zero-copy views of the same memory). It prints the median wall time of each
and the ratios ref_numpy / accel(numpy) and ref_torch / accel(torch): above 1 the
accelerator is faster.

Batches are shaped like a vLLM step with block_size 16 and 256 block-table columns
(4096-token contexts), the dtypes vLLM uses (int32 block table and query_start_loc,
int64 positions), contexts drawn up to the table's capacity, and the batch padded to
the next CUDA-graph size where a runner would pad it. torch runs on one thread by
default (`--torch-threads`): these ops are too small for its thread pool, and on a busy
machine a pool thread that is not scheduled stalls a call for a whole time slice
(milliseconds), which would flatter the accelerator. This is a measurement, not a test:
it never fails on a ratio.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

from _timing import machine_line, timeit  # noqa: E402

from pyagent_ref.ops import block_table as ref  # noqa: E402

try:
    import torch
except ImportError:  # torch is optional: the torch columns are skipped
    torch = None

try:
    import pyagent_accel._native as accel_native
    from pyagent_accel.ops import block_table as accel
except ImportError as exc:  # pragma: no cover - depends on the environment
    sys.exit(f"pyagent_accel is not installed ({exc}); build it with: pip install ./pyagent_accel")

BLOCK_SIZE = 16
MAX_BLOCKS = 256


def make_batch(query_lens: list[int], pad_to: int, rng: np.random.Generator) -> dict[str, Any]:
    """numpy inputs of one step: every request's context fits its row of the block table."""
    lens = np.array(query_lens, np.int64)
    num_reqs = lens.shape[0]
    capacity = MAX_BLOCKS * BLOCK_SIZE
    computed = np.array([rng.integers(0, capacity - n + 1) for n in lens], np.int64)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total = int(qsl[-1])
    num_tokens = max(total, pad_to)
    table = rng.integers(0, 1 << 20, (num_reqs, MAX_BLOCKS)).astype(np.int32)
    positions = ref.compute_positions(qsl, computed, num_tokens)
    return dict(
        qsl=qsl,
        computed=computed,
        num_tokens=num_tokens,
        table=table,
        positions=positions,
    )


def batches(quick: bool) -> list[tuple[str, list[int], int]]:
    """(name, tokens per request, padded length)."""
    if quick:
        return [("decode 256", [1] * 256, 256), ("prefill 8x512", [512] * 8, 4096)]
    return [
        ("decode 1", [1], 1),
        ("decode 32", [1] * 32, 32),
        ("decode 256", [1] * 256, 256),
        ("decode 250 (pad 256)", [1] * 250, 256),
        ("prefill 8x512", [512] * 8, 4096),
        ("prefill 1x2048", [2048], 2048),
        ("mixed 2048: 4x456 + 224 dec", [456] * 4 + [1] * 224, 2048),
        ("mixed 2048: 1x1024 + 8x96 + 256 dec", [1024] + [96] * 8 + [1] * 256, 2048),
    ]


def op_calls(mod: Any, b: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    calls = {
        "compute_positions": functools.partial(
            mod.compute_positions, b["qsl"], b["computed"], b["num_tokens"]
        ),
        "compute_slot_mapping": functools.partial(
            mod.compute_slot_mapping, b["table"], b["qsl"], b["positions"], BLOCK_SIZE
        ),
        "compute_logits_indices": functools.partial(mod.compute_logits_indices, b["qsl"]),
    }

    def step() -> None:
        pos = mod.compute_positions(b["qsl"], b["computed"], b["num_tokens"])
        mod.compute_slot_mapping(b["table"], b["qsl"], pos, BLOCK_SIZE)
        mod.compute_logits_indices(b["qsl"])

    calls["step"] = step
    return calls


def to_torch(b: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in b.items()}


def us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:9.1f}"


def ratio(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None else f"{num / den:7.1f}x"


def check_same(b: dict[str, Any], tb: dict[str, Any] | None) -> None:
    """The benchmark compares implementations of one contract: same results first."""
    for name in ("compute_positions", "compute_slot_mapping", "compute_logits_indices"):
        want = np.asarray(op_calls(ref, b)[name]())
        got = op_calls(accel, b)[name]()
        assert np.array_equal(want, got) and got.dtype == np.int64, name
        if tb is not None:
            got_t = op_calls(accel, tb)[name]()
            assert isinstance(got_t, torch.Tensor) and np.array_equal(want, got_t.numpy()), name


def run(quick: bool) -> list[dict[str, Any]]:
    budget, min_reps, max_reps = (0.02, 3, 200) if quick else (0.25, 10, 20000)
    rng = np.random.default_rng(0)
    header = (
        f"{'batch':<36} {'tokens':>6} {'op':<22} {'ref_numpy us':>12} {'ref_torch us':>12} "
        f"{'accel(np) us':>12} {'accel(pt) us':>12} {'np/accel':>9} {'torch/accel':>11}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for name, lens, pad_to in batches(quick):
        b = make_batch(lens, pad_to, rng)
        tb = to_torch(b) if torch is not None else None
        check_same(b, tb)
        ref_np, acc_np = op_calls(ref, b), op_calls(accel, b)
        ref_pt = op_calls(ref, tb) if tb is not None else None
        acc_pt = op_calls(accel, tb) if tb is not None else None
        for op in ref_np:
            t_np = timeit(ref_np[op], budget, min_reps, max_reps)
            t_pt = None if ref_pt is None else timeit(ref_pt[op], budget, min_reps, max_reps)
            a_np = timeit(acc_np[op], budget, min_reps, max_reps)
            a_pt = None if acc_pt is None else timeit(acc_pt[op], budget, min_reps, max_reps)
            rows.append(dict(batch=name, op=op, np=t_np, torch=t_pt, accel_np=a_np, accel_pt=a_pt))
            print(
                f"{name:<36} {b['num_tokens']:>6} {op:<22} {us(t_np):>12} {us(t_pt):>12} "
                f"{us(a_np):>12} {us(a_pt):>12} {ratio(t_np, a_np):>9} "
                f"{ratio(t_pt, a_pt):>11}",
                flush=True,
            )
    return rows


def summary(rows: list[dict[str, Any]]) -> None:
    slower = [r for r in rows if r["np"] < r["accel_np"]]
    slower += [r for r in rows if r["torch"] is not None and r["torch"] < r["accel_pt"]]
    steps = [r for r in rows if r["op"] == "step"]
    lo = min(r["np"] / r["accel_np"] for r in steps)
    hi = max(r["np"] / r["accel_np"] for r in steps)
    print(f"\nstep (three ops): accel is {lo:.1f}x to {hi:.1f}x faster than ref numpy", end="")
    if steps[0]["torch"] is not None:
        lo_t = min(r["torch"] / r["accel_pt"] for r in steps)
        hi_t = max(r["torch"] / r["accel_pt"] for r in steps)
        print(f", {lo_t:.1f}x to {hi_t:.1f}x faster than ref torch (CPU)")
    else:
        print()
    if slower:
        print("accel SLOWER than the reference in:")
        for r in slower:
            print(f"  {r['batch']} {r['op']}")
    else:
        print("accel is faster than both references for every op and batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two batches, short timings (CI)")
    parser.add_argument(
        "--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)"
    )
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_threads(args.torch_threads)
    print(
        f"{machine_line(torch, accel_native.SIMD)}; "
        f"block_size {BLOCK_SIZE}, {MAX_BLOCKS} block-table columns\n"
    )
    t0 = time.perf_counter()
    rows = run(args.quick)
    summary(rows)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
