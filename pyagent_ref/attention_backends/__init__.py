"""Attention backends: other implementations of `ops.attention`'s two attention ops.

A backend provides `paged_attention` and `paged_decode_attention` with the reference's
contract (`pyagent_ref.ops.attention`); the cache writes (`reshape_and_cache`,
`concat_and_cache_mla`) stay the engine ops'. The engine picks one by name
(`EngineConfig.attention_backend`), and the model receives it inside its ops namespace,
so no layer branches on the backend:

    "auto"   the engine ops' own attention (`ops=`: the Rust twin on the host, the
             reference on other devices) — the fastest measured on this project's CPUs
    "ref"    the reference (`pyagent_ref.ops.attention`)
    "accel"  the Rust twin (`pyagent_accel.ops.attention`; host tensors only)
    "sdpa"   torch's scaled_dot_product_attention, request by request (`.sdpa`)
    "flex"   torch's FlexAttention over the paged cache in place (`.flex`)

Each backend module is a conformance target of its own (it declares the ops it does
not provide), judged by the attention spec like any implementation:

    python -m conformance pyagent_ref.attention_backends.flex --array torch
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..ops import MODULES

BACKENDS = ("auto", "ref", "accel", "sdpa", "flex")
ATTENTION_OPS = ("paged_attention", "paged_decode_attention")

# what a backend module declares missing, for the conformance suite
CONFORMANCE_MISSING = {
    f"{m}.*": "an attention backend provides attention only"
    for m in (*MODULES, "tokenize", "matcher")
}
CONFORMANCE_MISSING.pop("attention.*")
CONFORMANCE_MISSING |= {
    f"attention.{op}": "the cache writes are the engine ops' (the backend only attends)"
    for op in ("reshape_and_cache", "concat_and_cache_mla")
}


def backend_module(name: str) -> ModuleType:
    """The module whose paged_attention / paged_decode_attention backend `name` uses
    ("auto" has none: the engine ops' own). ValueError naming an unknown backend."""
    if name not in BACKENDS or name == "auto":
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")
    if name in ("ref", "accel"):
        return importlib.import_module(f"pyagent_{name}.ops.attention")
    return importlib.import_module(f"{__name__}.{name}")


def with_attention_backend(ops: ModuleType, name: str) -> ModuleType:
    """`ops` (a `pyagent_ref.ops.load` namespace) whose attention module takes its
    attention ops from backend `name`; `ops` itself for "auto"."""
    if name == "auto":
        return ops
    backend = backend_module(name)
    merged = ModuleType(f"{ops.__name__}[attention={name}]", ops.__doc__)
    for module in getattr(ops, "MODULES", MODULES):
        setattr(merged, module, getattr(ops, module))
    merged.MODULES = getattr(ops, "MODULES", MODULES)
    attention = ModuleType(f"{ops.attention.__name__}[{name}]", ops.attention.__doc__)
    attention.__all__ = list(ops.attention.__all__)
    for op in attention.__all__:
        setattr(attention, op, getattr(backend if op in ATTENTION_OPS else ops.attention, op))
    merged.attention = attention
    return merged
