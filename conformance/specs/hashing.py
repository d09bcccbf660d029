"""Properties of `ops.hashing` (see `pyagent_ref/ops/hashing.py` for the contract).

The oracle (`conformance.oracles`) re-derives the deterministic CBOR encoding and the
block hash from the docstrings and RFC 8949, so most properties compare with it rather
than with the reference; golden vectors pin the bytes so that they cannot drift.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import contract, oracles
from ..core import Case, Ctx, Spec
from ._common import add_rejects_invalid_input, error_variants, reference_shapes

OPS = contract.names("hashing")
ALGORITHMS = ("sha256", "xxh3_128")
DIGEST_SIZES = {"sha256": 32, "xxh3_128": 16}

spec = Spec("hashing", OPS)

SHAPES = reference_shapes("hashing")

# Golden values, computed once from the oracle and checked against the reference when
# they were written down. They never change: a different value means a different cache key.
ROOT_HASHES = {
    "sha256": "c813061e0f9e329d3eca0c882aec0cd365d221ae00ee7c90d9350e962601dc44",
    "xxh3_128": "6122996dd50c4f84c78fd6b44a1abd7b",
}
GOLDEN_KEYS = [("lora", "adapter-1"), ("mm", b"\x00\xff", 7), ("salt", "s")]
GOLDEN_BLOCKS = (
    # (algorithm, tokens, extra keys, hash of the block on the root)
    (
        "sha256",
        [1, 2, 3, 4],
        [],
        "4e7b86f207d8f371cfc6cdddfa1432051b8deea599ad4fe6023ebaafa3ecd49d",
    ),
    ("xxh3_128", [0, 2**64 - 1], GOLDEN_KEYS, "99022b5fc65baf069ba1236c3907845a"),
)
GOLDEN_CHAIN = (  # hash_blocks(range(10), 4): two full blocks, the partial one skipped
    "449bd09c047875ee07929728dfbe026f895dad499f3b3ff0fe0eafd174eb5923",
    "6a45adafca559f081774aed0d2724a7bb236a9c9c2dd9c263e86e48314e03b35",
)

# --- strategies -----------------------------------------------------------------------------

U64 = 2**64
algorithms = st.sampled_from(ALGORITHMS)
token_values = st.one_of(
    st.integers(0, 50_000),
    st.sampled_from((0, 23, 24, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63, U64 - 1)),
)
cbor_ints = st.one_of(
    st.integers(-U64, U64 - 1),
    st.sampled_from(
        (0, 23, 24, 255, 256, -24, -25, -256, -257, U64 - 1, -U64, 2**32, -(2**32) - 1)
    ),
)
cbor_values = st.recursive(
    st.one_of(cbor_ints, st.binary(max_size=40), st.text(max_size=30)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.lists(inner, max_size=5).map(tuple)),
    max_leaves=20,
)
extra_key = st.one_of(
    st.tuples(st.just("lora"), st.one_of(st.text(max_size=12), st.integers(0, 2**63))),
    st.tuples(
        st.just("mm"),
        st.one_of(st.text(max_size=12), st.binary(max_size=16)),
        st.integers(0, 2**40),
    ),
    st.tuples(st.just("salt"), st.text(max_size=12)),
)
extra_keys = st.lists(extra_key, max_size=3)


def parents(algorithm: str) -> Any:
    return st.binary(min_size=DIGEST_SIZES[algorithm], max_size=DIGEST_SIZES[algorithm])


@st.composite
def block_cases(draw: Any) -> Case:
    algorithm = draw(algorithms)
    return Case(
        parent_hash=draw(parents(algorithm)),
        token_ids=draw(st.lists(token_values, max_size=20)),
        extra_keys=draw(extra_keys),
        algorithm=algorithm,
    )


@st.composite
def chain_cases(draw: Any) -> Case:
    algorithm = draw(algorithms)
    block_size = draw(st.integers(1, 6))
    tokens = draw(st.lists(token_values, max_size=30))
    n = len(tokens) // block_size
    keys = draw(st.one_of(st.none(), st.lists(extra_keys, min_size=n, max_size=n)))
    parent = draw(st.one_of(st.none(), parents(algorithm)))
    return Case(
        token_ids=tokens, block_size=block_size, extra_keys=keys, algorithm=algorithm, parent=parent
    )


def token_array(tokens: list[int]) -> np.ndarray:
    """The tokens as a 1-D integer numpy array (uint64 when they need the 64th bit)."""
    dtype = np.uint64 if any(t >= 2**63 for t in tokens) else np.int64
    return np.array(tokens, dtype=dtype).reshape(-1)


def block(ctx: Ctx, case: Case) -> bytes:
    return ctx.call_raw(
        "hash_block", case.parent_hash, case.token_ids, case.extra_keys, case.algorithm
    )


def chain(ctx: Ctx, case: Case, **changes: Any) -> list[bytes]:
    args = {name: getattr(case, name) for name in SHAPES["hash_blocks"].args}
    args.update(changes)
    return ctx.call_raw("hash_blocks", *args.values())


# ================================================================================ cbor_encode


def matches_rfc8949_examples(ctx: Ctx) -> None:
    """The RFC 8949 Appendix A examples within the encoding's domain encode to the RFC's bytes."""
    for value, hexed in oracles.RFC8949_EXAMPLES:
        got = ctx.call_raw("cbor_encode", value)
        assert bytes(got) == bytes.fromhex(hexed), (
            f"cbor_encode({value!r}) = {bytes(got).hex()}, RFC: {hexed}"
        )


spec.add("cbor_encode", matches_rfc8949_examples)


@spec.prop("cbor_encode", cbor_values)
def matches_independent_encoder(ctx: Ctx, value: Any) -> None:
    """The bytes equal an independent deterministic-CBOR encoder's (shortest heads, UTF-8 text)."""
    got = ctx.call_raw("cbor_encode", value)
    assert isinstance(got, bytes), f"returned {type(got).__name__}, not bytes"
    assert got == oracles.cbor(value), f"got {got.hex()}, expected {oracles.cbor(value).hex()}"


def _as_lists(value: Any) -> Any:
    return [_as_lists(v) for v in value] if isinstance(value, (list, tuple)) else value


@spec.prop("cbor_encode", cbor_values)
def decodes_back_to_the_value(ctx: Ctx, value: Any) -> None:
    """A strict decoder (rejecting non-shortest heads and trailing bytes) gives the value back."""
    data = ctx.call_raw("cbor_encode", value)
    assert oracles.cbor_decode(data) == _as_lists(value), "decoded value differs"


@spec.prop("cbor_encode", cbor_values)
def tuples_lists_and_bytearrays_alike(ctx: Ctx, value: Any) -> None:
    """A tuple encodes like the list with the same items; a bytearray like its bytes."""

    def swap(v: Any) -> Any:
        if isinstance(v, tuple):
            return [swap(x) for x in v]
        if isinstance(v, list):
            return tuple(swap(x) for x in v)
        if isinstance(v, bytes):
            return bytearray(v)
        return v

    assert ctx.call_raw("cbor_encode", swap(value)) == ctx.call_raw("cbor_encode", value)


def cbor_errors(inside: list[Any]) -> list[tuple[str, tuple[Any, ...], type]]:
    return [
        ("a bool", (True,), TypeError),
        ("a float", (1.5,), TypeError),
        ("None", (None,), TypeError),
        ("a dict", ({"a": 1},), TypeError),
        ("a numpy integer", (np.int64(3),), TypeError),
        ("a bool inside a list", ([*inside, False],), TypeError),
        ("2**64", (U64,), ValueError),
        ("-2**64 - 1", (-U64 - 1,), ValueError),
        ("2**64 inside a list", ([*inside, [U64]],), ValueError),
    ]


add_rejects_invalid_input(
    spec, SHAPES["cbor_encode"], error_variants(st.lists(cbor_values, max_size=3), cbor_errors)
)


# ================================================================================== root_hash


def root_hash_is_hash_of_cbor_label(ctx: Ctx) -> None:
    """root_hash(a) = H_a(cbor("pyagent.prefix-cache.v1")) for both algorithms, with the digest
    size."""
    for algorithm in ALGORITHMS:
        got = ctx.call_raw("root_hash", algorithm)
        assert got == oracles.root_hash(algorithm), f"{algorithm}: {bytes(got).hex()}"
        assert len(got) == DIGEST_SIZES[algorithm]


def root_hash_golden_values(ctx: Ctx) -> None:
    """The root hashes are the fixed golden values (they key every cached block)."""
    for algorithm, hexed in ROOT_HASHES.items():
        got = ctx.call_raw("root_hash", algorithm)
        assert got.hex() == hexed, f"{algorithm}: {got.hex()}, golden {hexed}"


def root_hash_defaults_to_sha256(ctx: Ctx) -> None:
    """root_hash() with no argument is the sha256 root."""
    assert ctx.call_raw("root_hash") == oracles.root_hash("sha256")


def root_hash_rejects_unknown_algorithm(ctx: Ctx) -> None:
    """An unknown algorithm name ("md5", "SHA256", "") raises ValueError."""
    for name in ("md5", "SHA256", ""):
        exc = ctx.raises("root_hash", name)
        assert isinstance(exc, ValueError), (
            f"root_hash({name!r}) raised {exc!r}, expected ValueError"
        )


for _f in (
    root_hash_is_hash_of_cbor_label,
    root_hash_golden_values,
    root_hash_defaults_to_sha256,
    root_hash_rejects_unknown_algorithm,
):
    spec.add("root_hash", _f)


# ================================================================================= hash_block


@spec.prop("hash_block", block_cases())
def is_hash_of_cbor_triple(ctx: Ctx, case: Case) -> None:
    """hash_block = H(cbor([parent, tokens, keys])), by the independent encoder and
    hashlib/xxhash."""
    want = oracles.hash_block(case.parent_hash, case.token_ids, case.extra_keys, case.algorithm)
    got = block(ctx, case)
    assert isinstance(got, bytes), f"returned {type(got).__name__}, not bytes"
    assert got == want, f"got {got.hex()}, expected {want.hex()}"


@spec.prop("hash_block", block_cases())
def has_the_digest_size(ctx: Ctx, case: Case) -> None:
    """The digest is 32 bytes for sha256 and 16 for xxh3_128."""
    assert len(block(ctx, case)) == DIGEST_SIZES[case.algorithm]


def hash_block_golden_vectors(ctx: Ctx) -> None:
    """Fixed blocks hash to their golden values (sha256 without keys; xxh3_128 with all three key
    kinds)."""
    for algorithm, tokens, keys, hexed in GOLDEN_BLOCKS:
        got = ctx.call_raw(
            "hash_block", bytes.fromhex(ROOT_HASHES[algorithm]), tokens, keys, algorithm
        )
        assert got.hex() == hexed, f"{algorithm} {tokens}: {got.hex()}, golden {hexed}"


spec.add("hash_block", hash_block_golden_vectors)


@spec.prop("hash_block", st.tuples(block_cases(), st.data()))
def changes_with_any_token(ctx: Ctx, pair: Any) -> None:
    """Changing one token, appending one or dropping one each change the hash."""
    case, data = pair
    tokens = list(case.token_ids)
    others = [[*tokens, data.draw(token_values, label="appended")]]
    if tokens:
        i = data.draw(st.integers(0, len(tokens) - 1), label="index")
        changed = [*tokens]
        changed[i] = data.draw(token_values.filter(lambda t: t != tokens[i]), label="new value")
        others += [changed, tokens[:i] + tokens[i + 1 :]]
    want = block(ctx, case)
    for other in others:
        got = ctx.call_raw("hash_block", case.parent_hash, other, case.extra_keys, case.algorithm)
        assert got != want, f"tokens {tokens} and {other} hash alike"


@spec.prop("hash_block", st.tuples(block_cases(), st.data()))
def changes_with_parent(ctx: Ctx, pair: Any) -> None:
    """Another parent hash gives another hash."""
    case, data = pair
    parent = data.draw(parents(case.algorithm).filter(lambda p: p != case.parent_hash))
    changed = ctx.call_raw("hash_block", parent, case.token_ids, case.extra_keys, case.algorithm)
    assert changed != block(ctx, case)


@spec.prop("hash_block", st.tuples(block_cases(), st.data()))
def changes_with_extra_keys(ctx: Ctx, pair: Any) -> None:
    """Adding, removing or reordering extra keys changes the hash (keys are hashed in order)."""
    case, data = pair
    keys = list(case.extra_keys)
    choices = ["add"] + (["remove"] if keys else []) + (["reorder"] if len(set(keys)) > 1 else [])
    kind = data.draw(st.sampled_from(choices))
    if kind == "add":
        other = [*keys, data.draw(extra_key)]
    elif kind == "remove":
        other = keys[:-1]
    else:
        other = keys[1:] + keys[:1]
        if other == keys:
            other = keys[::-1]
    if [list(k) for k in other] == [list(k) for k in keys]:
        return
    changed = ctx.call_raw("hash_block", case.parent_hash, case.token_ids, other, case.algorithm)
    assert changed != block(ctx, case), f"keys {keys} and {other} hash alike"


@spec.prop("hash_block", block_cases())
def array_tokens_hash_like_lists(ctx: Ctx, case: Case) -> None:
    """Tokens as a 1-D integer array (of the chosen library) or a tuple hash like the list."""
    want = block(ctx, case)
    arr = ctx.convert(token_array(case.token_ids))
    for form in (arr, tuple(case.token_ids)):
        got = ctx.call_raw("hash_block", case.parent_hash, form, case.extra_keys, case.algorithm)
        assert got == want, f"tokens as {type(form).__name__} hash differently"


@spec.prop("hash_block", block_cases(), differential=True)
def hash_block_matches_reference(ctx: Ctx, case: Case) -> None:
    """Exactly the reference's bytes (array tokens in the chosen library)."""
    arr = ctx.convert(token_array(case.token_ids))
    got = ctx.call_raw("hash_block", case.parent_hash, arr, case.extra_keys, case.algorithm)
    want = ctx.ref("hash_block", case.parent_hash, case.token_ids, case.extra_keys, case.algorithm)
    assert got == want


def _block_error_options(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    size = DIGEST_SIZES[case.algorithm]
    return [
        ("a str parent", {"parent_hash": "x" * size}, TypeError),
        ("a parent one byte short", {"parent_hash": case.parent_hash[:-1]}, ValueError),
        ("an unknown algorithm", {"algorithm": "md5"}, ValueError),
        ("a float token", {"token_ids": [*case.token_ids, 1.5]}, TypeError),
        ("a bool token", {"token_ids": [True, *case.token_ids]}, TypeError),
        ("a negative token", {"token_ids": [*case.token_ids, -1]}, ValueError),
        ("a token == 2**64", {"token_ids": [U64]}, ValueError),
        ("float token array", {"token_ids": np.zeros(3, np.float64)}, TypeError),
        ("2-D token array", {"token_ids": np.zeros((2, 2), np.int64)}, ValueError),
        ("tokens given as a str", {"token_ids": "abc"}, TypeError),
        ("tokens given as an int", {"token_ids": 5}, TypeError),
        ("extra_keys given as an int", {"extra_keys": 5}, TypeError),
        ("an extra key with an unknown tag", {"extra_keys": [("foo", 1)]}, ValueError),
        ("an extra key with a missing field", {"extra_keys": [("lora",)]}, ValueError),
        ("a lora key named by a float", {"extra_keys": [("lora", 1.5)]}, ValueError),
        ("an mm key with a negative offset", {"extra_keys": [("mm", "h", -1)]}, ValueError),
        ("a salt that is not a str", {"extra_keys": [("salt", 5)]}, ValueError),
        # The reference raises ValueError for an entry that is not a tagged tuple (the
        # hash_block docstring's "TypeError: ... untagged keys" reads otherwise; see docs).
        ("an extra key that is not a tuple", {"extra_keys": [5]}, ValueError),
        ("a lora id >= 2**64", {"extra_keys": [("lora", U64)]}, ValueError),
    ]


def block_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    out = []
    for why, change, exc in _block_error_options(case):
        args = {name: getattr(case, name) for name in SHAPES["hash_block"].args}
        args.update(change)
        out.append((why, tuple(args.values()), exc))
    return out


add_rejects_invalid_input(spec, SHAPES["hash_block"], error_variants(block_cases(), block_errors))


# ================================================================================ hash_blocks


@spec.prop("hash_blocks", chain_cases(), uses=("hash_block", "root_hash"))
def folds_hash_block(ctx: Ctx, case: Case) -> None:
    """hash_blocks equals folding hash_block over the full blocks, starting at parent or the
    root."""
    got = chain(ctx, case)
    prev = case.parent if case.parent is not None else ctx.call_raw("root_hash", case.algorithm)
    want = []
    for i in range(len(case.token_ids) // case.block_size):
        keys = [] if case.extra_keys is None else case.extra_keys[i]
        tokens = case.token_ids[i * case.block_size : (i + 1) * case.block_size]
        prev = ctx.call_raw("hash_block", prev, tokens, keys, case.algorithm)
        want.append(prev)
    assert list(got) == want, "chain differs from folding hash_block"


@spec.prop("hash_blocks", chain_cases())
def matches_independent_chain(ctx: Ctx, case: Case) -> None:
    """Each hash is H(cbor([previous, block tokens, block keys])) by the oracle, from the root or
    parent."""
    prev = case.parent if case.parent is not None else oracles.root_hash(case.algorithm)
    want = []
    for i in range(len(case.token_ids) // case.block_size):
        keys = [] if case.extra_keys is None else case.extra_keys[i]
        prev = oracles.hash_block(
            prev,
            case.token_ids[i * case.block_size : (i + 1) * case.block_size],
            keys,
            case.algorithm,
        )
        want.append(prev)
    got = chain(ctx, case)
    assert isinstance(got, list), f"returned {type(got).__name__}, not a list"
    assert got == want, "chain differs from the oracle's"


@spec.prop("hash_blocks", chain_cases())
def one_hash_per_full_block(ctx: Ctx, case: Case) -> None:
    """len(result) == len(tokens) // block_size, each of the algorithm's digest size."""
    got = chain(ctx, case)
    assert len(got) == len(case.token_ids) // case.block_size, f"{len(got)} hashes"
    assert all(len(h) == DIGEST_SIZES[case.algorithm] for h in got)


@spec.prop("hash_blocks", st.tuples(chain_cases(), st.data()))
def prefixes_hash_alike(ctx: Ctx, pair: Any) -> None:
    """A prefix of the tokens (any partial tail dropped) gives a prefix of the hashes."""
    case, data = pair
    cut = data.draw(st.integers(0, len(case.token_ids)))
    n = cut // case.block_size
    keys = None if case.extra_keys is None else case.extra_keys[:n]
    shorter = chain(ctx, case, token_ids=case.token_ids[:cut], extra_keys=keys)
    assert list(shorter) == list(chain(ctx, case))[:n]


@spec.prop("hash_blocks", chain_cases(), uses=("root_hash",))
def none_parent_is_root_hash(ctx: Ctx, case: Case) -> None:
    """parent=None chains on root_hash(algorithm)."""
    root = ctx.call_raw("root_hash", case.algorithm)
    assert chain(ctx, case, parent=None) == chain(ctx, case, parent=root)


@spec.prop(
    "hash_blocks",
    st.tuples(chain_cases().filter(lambda c: len(c.token_ids) >= c.block_size), st.data()),
)
def change_affects_its_block_and_later_ones(ctx: Ctx, pair: Any) -> None:
    """Changing a token of block j leaves hashes before j alone and changes j and every later
    one."""
    case, data = pair
    n = len(case.token_ids) // case.block_size
    i = data.draw(st.integers(0, n * case.block_size - 1))
    tokens = list(case.token_ids)
    tokens[i] = data.draw(token_values.filter(lambda t: t != case.token_ids[i]))
    before, after = chain(ctx, case), chain(ctx, case, token_ids=tokens)
    j = i // case.block_size
    assert before[:j] == after[:j], f"changing block {j} changed an earlier hash"
    assert all(a != b for a, b in zip(before[j:], after[j:], strict=True)), (
        f"changing block {j} left a later hash unchanged"
    )


@spec.prop("hash_blocks", chain_cases())
def array_tokens_chain_like_lists(ctx: Ctx, case: Case) -> None:
    """Tokens as a 1-D integer array of the chosen library give the same chain as the list."""
    arr = ctx.convert(token_array(case.token_ids))
    assert chain(ctx, case, token_ids=arr) == chain(ctx, case)


def hash_blocks_golden_chain(ctx: Ctx) -> None:
    """hash_blocks(range(10), 4) is the fixed pair of golden sha256 hashes."""
    got = [h.hex() for h in ctx.call_raw("hash_blocks", list(range(10)), 4)]
    assert got == list(GOLDEN_CHAIN), f"got {got}"


spec.add("hash_blocks", hash_blocks_golden_chain)


@spec.prop("hash_blocks", chain_cases(), differential=True)
def hash_blocks_matches_reference(ctx: Ctx, case: Case) -> None:
    """Exactly the reference's list of digests."""
    args = [getattr(case, name) for name in SHAPES["hash_blocks"].args]
    assert chain(ctx, case) == ctx.ref("hash_blocks", *args)


def chain_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    n = len(case.token_ids) // case.block_size
    size = DIGEST_SIZES[case.algorithm]
    options = [
        ("block_size 0", {"block_size": 0}, ValueError),
        ("a negative block_size", {"block_size": -2}, ValueError),
        ("a float block_size", {"block_size": float(case.block_size)}, TypeError),
        ("block_size True", {"block_size": True}, TypeError),
        ("extra_keys for one block too many", {"extra_keys": [[]] * (n + 1)}, ValueError),
        ("a parent one byte long", {"parent": b"\x00"}, ValueError),
        ("a str parent", {"parent": "x" * size}, TypeError),
        ("an unknown algorithm", {"algorithm": "sha1"}, ValueError),
        ("a float token", {"token_ids": [0.5]}, TypeError),
        ("a negative token", {"token_ids": [*case.token_ids, -3]}, ValueError),
    ]
    out = []
    for why, change, exc in options:
        args = {name: getattr(case, name) for name in SHAPES["hash_blocks"].args}
        args.update(change)
        if "token_ids" in change and case.extra_keys is not None:
            args["extra_keys"] = None  # keep exactly one thing wrong
        out.append((why, tuple(args.values()), exc))
    return out


add_rejects_invalid_input(spec, SHAPES["hash_blocks"], error_variants(chain_cases(), chain_errors))


# ================================================================================= constants


def algorithms_constant(ctx: Ctx) -> None:
    """ALGORITHMS lists "sha256" and "xxh3_128", in that order."""
    assert tuple(ctx.fn("ALGORITHMS")) == ALGORITHMS, f"got {ctx.fn('ALGORITHMS')!r}"


def digest_sizes_constant(ctx: Ctx) -> None:
    """DIGEST_SIZES maps sha256 to 32 and xxh3_128 to 16."""
    assert dict(ctx.fn("DIGEST_SIZES")) == DIGEST_SIZES, f"got {ctx.fn('DIGEST_SIZES')!r}"


spec.add("ALGORITHMS", algorithms_constant, name="equals_specified_value")
spec.add("DIGEST_SIZES", digest_sizes_constant, name="equals_specified_value")
