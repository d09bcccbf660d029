"""The ops: stateless array functions whose docstrings are their specification.

Subsystems never import an ops module directly; they receive a namespace from `load`,
so the same engine runs on the reference ops or on the accelerated ones:

    ops = pyagent_ref.ops.load("auto")
    token = ops.sampling.sample(logits, temperature, seeds, positions)
"""

from __future__ import annotations

import importlib
from types import ModuleType

from . import block_table, hashing, layers, rope, sampling

MODULES = ("sampling", "hashing", "block_table", "layers", "rope")
IMPLEMENTATIONS = ("ref", "accel", "auto")

__all__ = [
    "MODULES",
    "IMPLEMENTATIONS",
    "block_table",
    "hashing",
    "layers",
    "load",
    "rope",
    "sampling",
]


def load(name: str = "auto") -> ModuleType:
    """The ops namespace of an implementation: "ref", "accel" or "auto".

    "ref" is this package; "accel" is `pyagent_accel.ops` and raises ImportError when
    the wheel is not installed; "auto" is accel when it imports, else ref. The result
    has one attribute per ops module (`.sampling`, `.hashing`, `.block_table`, `.layers`,
    `.rope`).
    """
    if name == "ref":
        return importlib.import_module(__name__)
    if name == "accel":
        return importlib.import_module("pyagent_accel.ops")
    if name == "auto":
        try:
            return importlib.import_module("pyagent_accel.ops")
        except ImportError:
            return importlib.import_module(__name__)
    raise ValueError(f"name must be one of {IMPLEMENTATIONS}, got {name!r}")
