"""Expert-parallel load balancing on a skewed synthetic routing trace.

    python benchmarks/bench_eplb.py [--quick]

A DeepSeek-V3-shaped MoE (256 routed experts in 8 groups, each token to its 8 best
experts within its 4 best groups: `ops.moe.route_grouped_topk` with sigmoid scores) is
fed router logits log(popularity[e]) + Gumbel noise, popularity a Zipf law (exponent
1.2) over a random order of the experts, drifting a little every step. The experts live
on 32 ranks (4 nodes of 8) with 9 slots each: 288 physical experts, 32 of them
redundant replicas. The loads of a first window of steps (`ExpertLoadWindow`) decide
the placement (`rebalance_experts`, global and hierarchical by node); the next window
measures it. Printed per placement: the mean over layers of each rank's max / mean
tokens, and the worst layer, for the window it was built from and for the next one;
"none" is the placement without EPLB (8 experts per rank, in order, no replicas).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # pyagent_ref from the checkout

from pyagent_ref.model.eplb import (  # noqa: E402
    ExpertLoadWindow,
    ExpertPlacement,
    rebalance_experts,
)
from pyagent_ref.ops import moe  # noqa: E402

EXPERTS, TOP_K, GROUPS, TOPK_GROUPS = 256, 8, 8, 4
RANKS, NODES, SLOTS = 32, 4, 288


def trace(layers: int, steps: int, tokens: int, rng: np.random.Generator):
    """Per step, per layer: the experts each token is routed to, (tokens, TOP_K)."""
    base = np.log(1.0 / np.arange(1, EXPERTS + 1) ** 1.2)
    popularity = np.stack([base[rng.permutation(EXPERTS)] for _ in range(layers)])
    for _ in range(steps):
        popularity = popularity + rng.normal(0, 0.02, popularity.shape)  # slow drift
        step = []
        for layer in range(layers):
            logits = popularity[layer] + rng.gumbel(size=(tokens, EXPERTS))
            _, ids = moe.route_grouped_topk(logits.astype(np.float32), TOP_K, GROUPS, TOPK_GROUPS)
            step.append(ids)
        yield step


def window_load(steps, layers: int) -> np.ndarray:
    window = ExpertLoadWindow(layers, EXPERTS, len(steps))
    for i, step in enumerate(steps):
        if i:
            window.advance()
        for layer, ids in enumerate(step):
            window.record(layer, ids)
    return window.load()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer layers, steps and tokens")
    args = parser.parse_args()
    layers, steps, tokens = (2, 4, 256) if args.quick else (8, 20, 2048)
    print(
        f"{EXPERTS} experts in {GROUPS} groups, top-{TOP_K} within {TOPK_GROUPS} groups; "
        f"{RANKS} ranks on {NODES} nodes, {SLOTS} slots; {layers} layers, "
        f"windows of {steps} steps x {tokens} tokens; load average {os.getloadavg()[0]:.2f}\n"
    )
    rng = np.random.default_rng(0)
    run = list(trace(layers, 2 * steps, tokens, rng))
    built, later = window_load(run[:steps], layers), window_load(run[steps:], layers)
    placements = {"none": ExpertPlacement.identity(layers, EXPERTS, RANKS)}
    for name, groups, nodes in (("global", 1, 1), ("hierarchical", GROUPS, NODES)):
        t0 = time.perf_counter()
        placements[name] = rebalance_experts(built, SLOTS, RANKS, groups, nodes)
        placements[name + " ms"] = (time.perf_counter() - t0) * 1e3
    header = (
        f"{'placement':<13} {'built-on mean':>14} {'worst':>7} {'next-window mean':>17} "
        f"{'worst':>7} {'ms':>8}"
    )
    print(header)
    print("-" * len(header))
    for name in ("none", "global", "hierarchical"):
        p = placements[name]
        now, nxt = p.imbalance(built), p.imbalance(later)
        ms = placements.get(name + " ms")
        print(
            f"{name:<13} {now.mean():>14.3f} {now.max():>7.3f} {nxt.mean():>17.3f} "
            f"{nxt.max():>7.3f} {'-' if ms is None else f'{ms:.1f}':>8}"
        )
    print("\nmax / mean tokens per rank (1.000 is perfect balance)")
    for name in ("global", "hierarchical"):  # the answer checked: rebalancing helps here
        gain = placements[name].imbalance(built).max() < placements["none"].imbalance(built).min()
        assert gain, f"{name} placement is not better balanced than none on its own window"


if __name__ == "__main__":
    main()
