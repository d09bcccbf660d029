"""Per-layer scales of an FP8 KV cache, read from a checkpoint.

A checkpoint quantized for an FP8 KV cache (llm-compressor, ModelOpt, vLLM's) stores
`model.layers.<i>.self_attn.k_scale` and `.v_scale`: the numbers each key and value of
layer i is divided by before its cast to fp8 (and multiplied by when read back). A
scale of several values (one per head) counts as its largest. The engine passes them
to `LlamaForCausalLM.set_kv_cache_dtype`; the weight loader skips these tensors.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

SCALE_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.([kv])_scale$")


def read_kv_scales(files: list[Path]) -> dict[int, tuple[float, float]]:
    """{layer: (k_scale, v_scale)} for every layer with a scale in the safetensors
    `files` (a layer with one of the two gets 1.0 for the other); {} when none has.

    Raises:
        ValueError: a scale that is not positive and finite (the message names the
            tensor), or an unreadable file.
    """
    from safetensors import SafetensorError, safe_open

    found: dict[int, dict[str, float]] = {}
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    match = SCALE_NAME.search(name)
                    if match is None:
                        continue
                    value = float(f.get_tensor(name).float().max())
                    if not 0 < value < math.inf:
                        raise ValueError(
                            f"checkpoint tensor {name!r} must be a positive finite KV "
                            f"scale, got {value}"
                        )
                    found.setdefault(int(match[1]), {})[match[2]] = value
        except SafetensorError as exc:
            raise ValueError(f"{path} is not a readable safetensors file: {exc}") from exc
    return {i: (s.get("k", 1.0), s.get("v", 1.0)) for i, s in sorted(found.items())}
