"""The accelerated ops: one module per `pyagent_ref.ops` module, same public names.

import pyagent_accel.ops as ops
token = ops.sampling.sample(logits, temperature, seeds, positions)
"""

from __future__ import annotations

from . import (
    attention,
    block_table,
    gguf,
    hashing,
    layers,
    lora,
    moe,
    pooling,
    quant,
    rope,
    sampling,
    spec_decode,
    ssm,
    structured,
)

MODULES = (
    "sampling",
    "hashing",
    "block_table",
    "layers",
    "rope",
    "attention",
    "structured",
    "spec_decode",
    "moe",
    "lora",
    "pooling",
    "ssm",
    "quant",
    "gguf",
)

__all__ = [
    "MODULES",
    "attention",
    "block_table",
    "gguf",
    "hashing",
    "layers",
    "lora",
    "moe",
    "pooling",
    "quant",
    "rope",
    "sampling",
    "spec_decode",
    "ssm",
    "structured",
]
