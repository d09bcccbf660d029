"""hash algorithm "sha256_cbor": vLLM's block hashes, byte for byte.

The oracle is vLLM's definition of the hash function, sha256_cbor(x) =
SHA-256(cbor2.dumps(x, canonical=True)), applied to the tuple vLLM hashes for a block,
(parent, tuple(tokens), extra keys or None), with the extra keys built here from vLLM's
documented rules, independently of `kv_cache.vllm_hashing`.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyagent_ref.ops as ops_pkg
from pyagent_ref.kv_cache import KVCacheManager
from pyagent_ref.kv_cache.request_hashing import RequestBlockHasher
from pyagent_ref.lora import LoRARequest
from pyagent_ref.sched import Request
from pyagent_ref.sched.request import MultiModalFeature

from .helpers import admit, full_config

cbor2 = pytest.importorskip("cbor2")
OPS = ops_pkg.load("ref")


def sha256_cbor(value) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def vllm_chain(tokens, block_size, seed, lora_name=None, mm=(), salt=None) -> list[bytes]:
    """vLLM's request block hasher, from its documented rules."""
    parent = sha256_cbor(seed)
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        end = start + block_size
        keys = [lora_name] if lora_name else []
        for identifier, offset, length in sorted(mm, key=lambda m: m[1]):
            if end > offset and start < offset + length:
                keys.append((identifier, offset - start))
        if start == 0 and salt:
            keys.append(salt)
        parent = sha256_cbor((parent, tuple(tokens[start:end]), tuple(keys) if keys else None))
        hashes.append(parent)
    return hashes


def hashes_of(request: Request, block_size: int) -> list[bytes]:
    RequestBlockHasher(block_size, OPS, "sha256_cbor").update(request)
    return request.block_hashes


def test_root_is_the_hash_of_vllms_seed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    hasher = RequestBlockHasher(4, OPS, "sha256_cbor")
    assert hasher.root == sha256_cbor("vllm-none-hash")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert RequestBlockHasher(4, OPS, "sha256_cbor").root == sha256_cbor("0")


def test_a_block_without_keys_hashes_cbor_null(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    got = hashes_of(Request("a", [1, 2, 3, 4, 5]), 4)
    assert got == [sha256_cbor((sha256_cbor("42"), (1, 2, 3, 4), None))]
    # pyagent's own scheme differs (another root, an empty array): the option matters
    assert got != OPS.hashing.hash_blocks([1, 2, 3, 4, 5], 4)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32), min_size=1, max_size=40),
    block_size=st.integers(1, 8),
    seed=st.sampled_from([None, "0", "12345", "random"]),
    lora=st.booleans(),
    mm=st.lists(
        st.tuples(st.text(min_size=1, max_size=6), st.integers(0, 30), st.integers(1, 12)),
        max_size=3,
    ),
    salt=st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=5)),
)
def test_chains_equal_vllms(tokens, block_size, seed, lora, mm, salt):
    env = {} if seed is None else {"PYTHONHASHSEED": seed}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONHASHSEED", raising=False)
        for k, v in env.items():
            mp.setenv(k, v)
        lora_request = LoRARequest("adapter-x", 7, "/nowhere") if lora else None
        request = Request(
            "r",
            tokens,
            lora_request=lora_request,
            mm_features=tuple(MultiModalFeature(h, o, n) for h, o, n in mm),
            cache_salt=salt,
        )
        got = hashes_of(request, block_size)
    want = vllm_chain(
        tokens, block_size, seed or "vllm-none-hash", "adapter-x" if lora else None, mm, salt
    )
    assert got == want


def test_hashes_extend_incrementally(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    hasher = RequestBlockHasher(3, OPS, "sha256_cbor")
    request = Request("a", list(range(5)), cache_salt="s")
    hasher.update(request)
    request.output_token_ids.extend([9, 9, 9])
    hasher.update(request)
    assert request.block_hashes == vllm_chain(
        [0, 1, 2, 3, 4, 9, 9, 9], 3, "vllm-none-hash", salt="s"
    )


def test_prefix_cache_hits_with_vllm_hashes():
    kv = KVCacheManager(full_config(16), OPS, hash_algorithm="sha256_cbor")
    admit(kv, Request("a", list(range(10))))
    _, hit = kv.get_computed_blocks(Request("b", list(range(10))))
    assert hit == 8
    # another adapter or salt shares nothing
    lora = LoRARequest("other", 2, "/nowhere")
    _, hit = kv.get_computed_blocks(Request("c", list(range(10)), lora_request=lora))
    assert hit == 0


def test_bad_algorithm_and_a_nameless_adapter_are_refused():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        RequestBlockHasher(4, OPS, "sha256_pickle")

    class Nameless:
        request_id, lora_id, mm_features, cache_salt = "n", 3, (), None
        block_hashes: list = []
        num_tokens = 4

        def token_ids(self, start, end):
            return [0, 1, 2, 3][start:end]

    with pytest.raises(ValueError, match="lora_name"):
        RequestBlockHasher(4, OPS, "sha256_cbor").update(Nameless())


def test_vllm_itself_agrees(monkeypatch):
    """With vLLM installed, its own hasher (through the conformance adapter) gives the
    same root and chain as ours under the same PYTHONHASHSEED."""
    pytest.importorskip("vllm")
    from conformance.adapters import vllm as adapter

    monkeypatch.setenv("PYTHONHASHSEED", "7")
    adapter._ROOTS.clear()  # vLLM reads the seed when its NONE_HASH is set
    tokens = list(range(37))
    assert adapter.root_hash("sha256") == RequestBlockHasher(4, OPS, "sha256_cbor").root
    assert adapter.hash_blocks(tokens, 4, None, "sha256") == hashes_of(Request("v", tokens), 4)
    adapter._ROOTS.clear()
