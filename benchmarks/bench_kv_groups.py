"""KV memory of sliding-window models: KV cache groups from layer_types vs full-attention KV.

    python benchmarks/bench_kv_groups.py [--quick] [--budget-gib G] [--step TOKENS]

For real model shapes (Mistral 7B: every layer slides; Gemma 2 9B: sliding and full
layers alternate; Gemma 3 12B: 5 sliding layers per full one) and a fixed KV memory
budget, builds the engine's KV cache exactly as `EngineCore` does (`kv_cache_groups`,
`KVCacheConfig.from_memory`, `KVCacheManager`) in both layouts:

  full    every layer keeps full-attention KV (disable_hybrid_kv_cache_manager=True,
          the engine's layout before groups followed layer_types);
  groups  sliding-window layers in their own groups, freeing what leaves the window.

Then it admits requests of `context` tokens — chunked prefill by `--step` tokens, then
one decode step — one after another until the cache is full, and prints side by side:
blocks in the pool, the KV a request holds while decoding (blocks and MiB), and how
many such requests fit at once. No model runs: these are the scheduler's block counts.
"""

from __future__ import annotations

import argparse

import pyagent_ref.ops
from pyagent_ref.engine.core import kv_cache_groups
from pyagent_ref.kv_cache import KVCacheConfig, KVCacheManager
from pyagent_ref.model.config import ModelConfig
from pyagent_ref.sched import Request

BLOCK = 16
SLIDING, FULL = "sliding_attention", "full_attention"
MODELS = {
    # name: (layers, KV heads, head dim, window, layer types)
    "Mistral-7B (32 sliding, window 4096)": (32, 8, 128, 4096, (SLIDING,) * 32),
    "Gemma-2-9B (21 sliding + 21 full, window 4096)": (42, 8, 256, 4096, (SLIDING, FULL) * 21),
    "Gemma-3-12B (40 sliding + 8 full, window 1024)": (
        48,
        8,
        256,
        1024,
        ((SLIDING,) * 5 + (FULL,)) * 8,
    ),
}


def model_config(layers: int, kv_heads: int, head_dim: int, window: int, types) -> ModelConfig:
    return ModelConfig(
        architecture="bench",
        vocab_size=32000,
        hidden_size=kv_heads * head_dim,
        intermediate_size=1,
        num_hidden_layers=layers,
        num_attention_heads=kv_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=131072,
        sliding_window=window,
        layer_types=types,
    )


def fill(kv: KVCacheManager, context: int, step: int) -> tuple[int, int]:
    """Admit requests of `context` tokens until one no longer fits: prefill in chunks
    of `step`, then one decode step. Returns (requests that fit, blocks the first holds)."""
    held, fitted = 0, 0
    while True:
        request = Request(str(fitted), [1] * context)
        done = 0
        while done < context:
            n = min(step, context - done)
            if kv.allocate_slots(request, n) is None:
                return fitted, held
            done += n
            request.num_computed_tokens = done
        request.append_output_token_ids(2)
        if kv.allocate_slots(request, 1) is None:
            return fitted, held
        request.num_computed_tokens += 1
        if not fitted:
            held = sum(not b.is_null for group in kv.get_blocks(request).blocks for b in group)
        fitted += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 GiB, one context")
    parser.add_argument("--budget-gib", type=float, default=None, help="KV memory (GiB)")
    parser.add_argument("--step", type=int, default=2048, help="prefill chunk (tokens)")
    args = parser.parse_args()
    budget_gib = args.budget_gib or (4.0 if args.quick else 16.0)
    contexts = (8192,) if args.quick else (8192, 32768, 131072)
    budget = int(budget_gib * 2**30)
    print(f"KV budget {budget_gib:g} GiB, bf16, block {BLOCK} tokens, prefill chunk {args.step}")
    print(
        f"{'model':<48} {'context':>7} {'layout':<7} {'blocks':>7} {'KiB/block':>9} "
        f"{'blocks/req':>10} {'MiB/req':>8} {'max reqs':>8}"
    )
    for name, shape in MODELS.items():
        config = model_config(*shape)
        for context in contexts:
            fitted = {}
            for layout in ("full", "groups"):
                groups = kv_cache_groups(config, BLOCK, 2, hybrid=layout == "groups")
                kv_config = KVCacheConfig.from_memory(budget, groups)
                kv = KVCacheManager(kv_config, ops=pyagent_ref.ops, enable_caching=False)
                fitted[layout], held = fill(kv, context, args.step)
                ratio = (
                    f" x{fitted['groups'] / fitted['full']:.1f}"
                    if layout == "groups" and fitted["full"]
                    else ""
                )
                print(
                    f"{name if layout == 'full' else '':<48} "
                    f"{context if layout == 'full' else '':>7} {layout:<7} "
                    f"{kv_config.num_blocks:>7} {kv_config.bytes_per_block / 2**10:>9.0f} "
                    f"{held:>10} {held * kv_config.bytes_per_block / 2**20:>8.0f} "
                    f"{fitted[layout]:>8}{ratio}"
                )


if __name__ == "__main__":
    main()
