"""Decode attention side by side: the two reference paths and torch's fused SDPA.

    python benchmarks/bench_attention.py            # realistic decode batches
    python benchmarks/bench_attention.py --quick    # smoke run (seconds)

One decode step of one layer (32 query heads, 8 KV heads, head_size 128, block_size 16,
float32, torch CPU), for batches of requests with contexts drawn up to a maximum. On the
same inputs it times:

- `paged_attention`, the general op (groups requests on the host);
- `paged_decode_attention` with the block-table columns the longest sequence uses (what
  the eager runner passes) and with the whole static table (what a CUDA graph of a
  4096-token max_model_len reads);
- torch's `scaled_dot_product_attention` on keys and values already laid out densely per
  request (padded to the longest context, masked): the same attention without paging,
  the third-party kernel a dense implementation would call;
- the attention backends' `paged_attention` (`pyagent_ref.attention_backends`): `sdpa`
  (SDPA request by request over its gathered blocks) and `flex` (FlexAttention over the
  cache in place, eager).

It prints the median of each and the ratios to `paged_attention` and to SDPA. `pyagent_accel`
has no twin of these ops (see docs/conformance.md), so there is no accel column. This is a
measurement, not a test: it never fails on a ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

from _timing import median_seconds  # noqa: E402

from pyagent_ref.attention_backends import flex, sdpa  # noqa: E402
from pyagent_ref.ops import attention  # noqa: E402

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 32, 8, 128, 16
STATIC_BLOCKS = 4096 // BLOCK


def median_ms(fn, repeats: int) -> float:
    return median_seconds(fn, repeats) * 1e3


def batch(n: int, max_ctx: int, gen: torch.Generator):
    """Queries, a shuffled paged cache, tables and lengths for n decodes, and the same
    keys/values laid out densely (n, kv_heads, longest, d) with a validity mask."""
    lens = torch.randint(1, max_ctx + 1, (n,), generator=gen)
    used = (lens + BLOCK - 1) // BLOCK
    num_blocks = int(used.sum()) + 1
    ids = torch.randperm(num_blocks - 1, generator=gen) + 1
    kc = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE, generator=gen)
    vc = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE, generator=gen)
    table = torch.zeros(n, STATIC_BLOCKS, dtype=torch.int64)
    at = 0
    for r, u in enumerate(used.tolist()):
        table[r, :u] = ids[at : at + u]
        at += u
    longest = int(lens.max())
    pos = torch.arange(longest)
    rows = table[:, : (longest + BLOCK - 1) // BLOCK]
    slots = rows[:, pos // BLOCK] * BLOCK + pos % BLOCK  # (n, longest)
    flat_k, flat_v = kc.reshape(-1, KV_HEADS, HEAD_SIZE), vc.reshape(-1, KV_HEADS, HEAD_SIZE)
    dense_k = flat_k[slots].permute(0, 2, 1, 3).contiguous()
    dense_v = flat_v[slots].permute(0, 2, 1, 3).contiguous()
    mask = (pos[None, :] < lens[:, None])[:, None, None, :]  # (n, 1, 1, longest)
    q = torch.randn(n, HEADS, HEAD_SIZE, generator=gen)
    return q, kc, vc, table, lens, dense_k, dense_v, mask


def measure(n: int, max_ctx: int, gen: torch.Generator, repeats: int) -> dict[str, float]:
    """Median ms of the six ways on one batch, after checking that they agree (a
    benchmark of wrong answers would be worthless)."""
    q, kc, vc, table, lens, dk, dv, mask = batch(n, max_ctx, gen)
    width = (int(lens.max()) + BLOCK - 1) // BLOCK
    qsl = torch.arange(n + 1)
    scale = HEAD_SIZE**-0.5
    ways = {
        "paged": lambda: attention.paged_attention(q, kc, vc, table, qsl, lens, scale),
        "decode": lambda: attention.paged_decode_attention(
            q, kc, vc, table[:, :width], lens, scale
        ),
        "static": lambda: attention.paged_decode_attention(q, kc, vc, table, lens, scale),
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
            q[:, :, None, :], dk, dv, attn_mask=mask, scale=scale, enable_gqa=True
        )[:, :, 0, :],
        "be:sdpa": lambda: sdpa.paged_attention(q, kc, vc, table, qsl, lens, scale),
        "be:flex": lambda: flex.paged_attention(q, kc, vc, table, qsl, lens, scale),
    }
    want = ways["paged"]()
    for name in ("decode", "static", "sdpa", "be:sdpa", "be:flex"):
        torch.testing.assert_close(ways[name](), want, rtol=1e-4, atol=1e-4, msg=name)
    return {name: median_ms(fn, repeats) for name, fn in ways.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [(1, 256), (4, 256)] if args.quick else [(1, 512), (16, 512), (16, 2048), (64, 1024)]
    repeats = 3 if args.quick else 15
    gen = torch.Generator().manual_seed(0)
    print(
        f"one layer's decode attention, {HEADS} q / {KV_HEADS} kv heads x {HEAD_SIZE}, block "
        f"{BLOCK}, float32, torch {torch.__version__}, {args.threads} threads (median ms)"
    )
    head = f"{'batch':>5} {'max ctx':>7} {'paged':>8} {'decode':>8} {'static':>8} {'sdpa':>8}"
    head += f" {'be:sdpa':>8} {'be:flex':>8}"
    print(f"{head}   decode/paged  static/paged  decode/sdpa  paged/be:sdpa  paged/be:flex")
    with torch.inference_mode():
        for n, max_ctx in shapes:
            ms = measure(n, max_ctx, gen, repeats)
            print(
                f"{n:>5} {max_ctx:>7} {ms['paged']:>8.2f} {ms['decode']:>8.2f} "
                f"{ms['static']:>8.2f} {ms['sdpa']:>8.2f} {ms['be:sdpa']:>8.2f} "
                f"{ms['be:flex']:>8.2f}   {ms['decode'] / ms['paged']:>12.2f} "
                f"{ms['static'] / ms['paged']:>13.2f} {ms['decode'] / ms['sdpa']:>12.2f} "
                f"{ms['paged'] / ms['be:sdpa']:>14.2f} {ms['paged'] / ms['be:flex']:>14.2f}"
            )


if __name__ == "__main__":
    main()
