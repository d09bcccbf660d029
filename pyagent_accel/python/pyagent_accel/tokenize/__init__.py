"""Accelerated tokenization: `bpe` is `pyagent_ref.tokenize.bpe`'s `BytePairEncoding` in Rust.

Unlike `pyagent_accel.ops`, this package builds on `pyagent_ref` (loading, validation and
error messages are the reference's), so it needs `pyagent_ref` importable.
"""

from __future__ import annotations

from . import bpe

__all__ = ["bpe"]
