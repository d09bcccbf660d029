"""The accelerated ops: one module per `pyagent_ref.ops` module, same public names.

import pyagent_accel.ops as ops
token = ops.sampling.sample(logits, temperature, seeds, positions)
"""

from __future__ import annotations

from . import hashing, sampling

MODULES = ("sampling", "hashing")

__all__ = ["MODULES", "hashing", "sampling"]
