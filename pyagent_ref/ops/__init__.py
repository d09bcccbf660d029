"""The ops: stateless array functions whose docstrings are their specification.

Subsystems never import an ops module directly; they receive a namespace from `load`,
so the same engine runs on the reference ops or on the accelerated ones:

    ops = pyagent_ref.ops.load("auto")
    token = ops.sampling.sample(logits, temperature, seeds, positions)
    hidden = ops.layers.rms_norm(hidden, weight, eps)
"""

from __future__ import annotations

import importlib
from types import ModuleType

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
IMPLEMENTATIONS = ("ref", "accel", "auto")

__all__ = [
    "IMPLEMENTATIONS",
    "MODULES",
    "attention",
    "block_table",
    "gguf",
    "hashing",
    "layers",
    "load",
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


def load(name: str = "auto") -> ModuleType:
    """The ops namespace of an implementation: "ref", "accel" or "auto".

    "ref" is this package; "accel" is `pyagent_accel.ops` and raises ImportError when
    the wheel is not installed. "auto" decides per call: each function runs the
    accelerator's twin when its array arguments live on the host (numpy arrays, CPU
    tensors) and the reference when one is a tensor on another device (CUDA, meta),
    which the accelerator does not take; without the wheel, "auto" is "ref". The
    result has one attribute per ops module (`.sampling`, ..., `.quant`, `.gguf`).
    """
    if name == "ref":
        return importlib.import_module(__name__)
    if name == "accel":
        return importlib.import_module("pyagent_accel.ops")
    if name == "auto":
        try:
            accel = importlib.import_module("pyagent_accel.ops")
        except ImportError:
            return importlib.import_module(__name__)
        from ._auto import by_device

        return by_device(importlib.import_module(__name__), accel)
    raise ValueError(f"name must be one of {IMPLEMENTATIONS}, got {name!r}")
