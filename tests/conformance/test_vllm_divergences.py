"""The vLLM entries of the divergence registry name real things (no vLLM needed).

Each names a property the suite runs on an op the vLLM adapter provides, or, for
`tokenize.*` (stop strings and the detokenizer, which are not ops), a public name of
`pyagent_ref.tokenize` and a difference that tests/conformance/test_vllm_adapter.py can
report. A typo or a renamed property would otherwise leave an entry that never matches.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyagent_ref.tokenize
from conformance import core, divergences
from conformance.adapters import vllm as adapter

VLLM = divergences.VLLM
DIFFERENTIAL_TESTS = Path(__file__).with_name("test_vllm_adapter.py")


def test_vllm_divergences_name_properties_the_suite_runs():
    properties = {(p.qualified_op, p.name) for p in core.iter_properties()}
    entries = [d for d in divergences.for_implementation(VLLM) if not d.op.startswith("tokenize.")]
    assert entries
    for d in entries:
        assert (d.op, d.property) in properties, f"no property {d.op}.{d.property}"
        module, op = d.op.split(".")
        missing = adapter.CONFORMANCE_MISSING
        assert f"{module}.{op}" not in missing and f"{module}.*" not in missing, d.op


def test_vllm_tokenize_divergences_are_reported_by_the_differential_tests():
    reported = set(
        re.findall(r'registered\(\s*"([\w.]+)",\s*"(\w+)"', DIFFERENTIAL_TESTS.read_text())
    )
    entries = [d for d in divergences.for_implementation(VLLM) if d.op.startswith("tokenize.")]
    assert entries
    for d in entries:
        assert hasattr(pyagent_ref.tokenize, d.op.removeprefix("tokenize.")), d.op
        assert (d.op, d.property) in reported, f"{d.op}.{d.property} is never reported"
    assert reported <= {(d.op, d.property) for d in entries}, (
        "a reported divergence is unregistered"
    )


def test_vllm_divergences_are_unique_and_explained():
    keys = [(d.op, d.property) for d in divergences.for_implementation(VLLM)]
    assert len(keys) == len(set(keys))
    for d in divergences.for_implementation(VLLM):
        # "; " joins independent reasons (conformance.matrix lists each reason once)
        assert all(len(reason) > 40 for reason in d.reason.split("; ")), d.reason


def test_the_hash_divergences_an_option_removes_are_registered_as_removed():
    """Root and null-keys divergences are the ones prefix_caching_hash_algo="sha256_cbor"
    removes (tests/kv_cache/test_vllm_hashing.py checks the bytes); the option exists."""
    from pyagent_ref.engine.core import EngineConfig
    from pyagent_ref.kv_cache.request_hashing import HASH_ALGORITHMS

    removed = [d for d in divergences.for_implementation(VLLM) if divergences.removed_by(d)]
    assert {d.op for d in removed} == {
        "hashing.root_hash",
        "hashing.hash_block",
        "hashing.hash_blocks",
    }
    assert "sha256_cbor" in HASH_ALGORITHMS
    assert EngineConfig(prefix_caching_hash_algo="sha256_cbor").prefix_caching_hash_algo
    for d in removed:
        assert divergences.removed_by(d) == ['EngineConfig(prefix_caching_hash_algo="sha256_cbor")']
