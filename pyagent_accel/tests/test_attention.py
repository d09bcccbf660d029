"""pyagent_accel.ops.attention against pyagent_ref.ops.attention (numpy and torch CPU).

Outputs within a float tolerance of the reference (the summation order differs) for
float32/float64/float16/bfloat16, MHA/GQA/MQA, sliding window, soft cap, ALiBi, custom
masks, ragged batches with padding; the cache write exactly as the reference leaves the
cache; the same exception class and message for each bad input the reference rejects;
TypeError for tensors off the CPU; ValueError, never a crash, for inconsistent input
handed to `_native` directly. The conformance suite (`python -m conformance
pyagent_accel attention`) is the specification check; these are regression tests.
"""

from __future__ import annotations

import numpy as np
import pyagent_accel._native as native
import pytest
from pyagent_accel.ops import attention as A

from pyagent_ref.ops import attention as R

try:
    import torch
except ImportError:  # the numpy cases still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
LIBS = ["numpy", "torch"] if torch is not None else ["numpy"]
# (library, dtype): numpy has no bfloat16
DTYPES = [(lib, dt) for lib in LIBS for dt in ("float32", "float64", "float16")]
DTYPES += [("torch", "bfloat16")] if torch is not None else []
TOL = {"float32": 2e-5, "float64": 1e-11, "float16": 2e-3, "bfloat16": 1.6e-2}
HEADS = [(4, 4), (6, 2), (8, 1)]  # MHA, GQA, MQA


def convert(x, lib, dtype=None):
    """numpy -> the library (float arrays in `dtype`); other values unchanged."""
    if not isinstance(x, np.ndarray):
        return x
    if lib == "numpy":
        return x.astype(dtype) if dtype and x.dtype.kind == "f" else x
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.to(getattr(torch, dtype)) if dtype and t.is_floating_point() else t


def to_f64(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.double().numpy()
    return np.asarray(x, np.float64)


def outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the class and message are compared
        return exc


def same_error(name, *args, **kwargs):
    r = outcome(getattr(R, name), *args, **kwargs)
    a = outcome(getattr(A, name), *args, **kwargs)
    assert isinstance(r, Exception), f"the reference accepts {name}{args}"
    assert type(a) is type(r) and str(a) == str(r), (name, r, a)


def batch(q_lens, ctx_lens, heads=6, kv_heads=2, d=8, bs=4, pad=2, seed=0):
    """A ragged batch in a shuffled paged cache (float64 numpy; spare table columns)."""
    rng = np.random.default_rng(seed)
    seq_lens = [q + c for q, c in zip(q_lens, ctx_lens, strict=True)]
    used = [-(-s // bs) for s in seq_lens]
    num_blocks = sum(used) + 2
    ids = rng.permutation(num_blocks)
    table = rng.integers(0, num_blocks, (len(seq_lens), max(used) + 1))
    at = 0
    for r, u in enumerate(used):
        table[r, :u] = ids[at : at + u]
        at += u
    shape = (num_blocks, bs, kv_heads, d)
    return dict(
        query=rng.uniform(-2, 2, (sum(q_lens) + pad, heads, d)),
        key_cache=rng.uniform(-2, 2, shape),
        value_cache=rng.uniform(-2, 2, shape),
        block_table=table,
        query_start_loc=np.concatenate([[0], np.cumsum(q_lens)]),
        seq_lens=np.array(seq_lens),
        scale=d**-0.5,
    )


def options(kind, case):
    heads = case["query"].shape[1]
    q_lens = np.diff(case["query_start_loc"])
    rng = np.random.default_rng(1)
    return {
        "plain": {},
        "window": {"sliding_window": 5},
        "soft_cap": {"soft_cap": 5.0},
        "alibi": {"alibi_slopes": rng.uniform(0, 1, heads)},
        "masks": {
            "custom_masks": [
                (rng.random((q, s)) < 0.6) if r % 2 == 0 else None
                for r, (q, s) in enumerate(zip(q_lens, case["seq_lens"], strict=True))
            ]
        },
        "all": {"sliding_window": 7, "soft_cap": 30.0, "alibi_slopes": rng.uniform(0, 1, heads)},
    }[kind]


def assert_close(got, want, dtype, value_cache):
    tol = TOL[dtype] * (1 + np.abs(to_f64(value_cache)).max())
    err = np.abs(to_f64(got) - to_f64(want)).max(initial=0)
    assert err <= tol, f"max error {err} > {tol}"


def check_like(got, like):
    assert type(got) is type(like) and got.dtype == like.dtype and got.shape == like.shape


# --- results ------------------------------------------------------------------------


@pytest.mark.parametrize("lib,dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("kind", ["plain", "window", "soft_cap", "alibi", "masks", "all"])
def test_paged_attention_matches_reference(lib, dtype, heads, kv_heads, kind):
    # a 40-token prefill chunk (3 work items, transposed key tiles), decodes, a request
    # with no query token, a prefill without context, and 2 padding query tokens
    case = batch([40, 1, 0, 3, 1], [9, 30, 5, 0, 0], heads, kv_heads)
    opts = options(kind, case)
    args = {k: convert(v, lib, dtype) for k, v in case.items()}
    if "custom_masks" in opts:
        opts["custom_masks"] = [
            None if m is None else convert(m, lib) for m in opts["custom_masks"]
        ]
    if "alibi_slopes" in opts:
        opts["alibi_slopes"] = convert(opts["alibi_slopes"], lib, dtype)
    got = A.paged_attention(**args, **opts)
    want = R.paged_attention(**args, **opts)
    check_like(got, args["query"])
    assert_close(got, want, dtype, args["value_cache"])
    assert not to_f64(got)[-2:].any(), "padding query tokens get zeros"


@pytest.mark.parametrize("lib,dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", HEADS)
@pytest.mark.parametrize("kind", ["plain", "all"])
def test_paged_decode_attention_matches_reference(lib, dtype, heads, kv_heads, kind):
    case = batch([1, 1, 1, 1], [0, 20, 7, 33], heads, kv_heads, pad=0, seed=3)
    lens = case["seq_lens"].copy()
    lens[2] = 0  # a padding request
    args = dict(
        query=case["query"],
        key_cache=case["key_cache"],
        value_cache=case["value_cache"],
        block_table=case["block_table"],
        seq_lens=lens,
        scale=case["scale"],
    )
    args = {k: convert(v, lib, dtype) for k, v in args.items()}
    opts = options(kind, case)
    if "alibi_slopes" in opts:
        opts["alibi_slopes"] = convert(opts["alibi_slopes"], lib, dtype)
    got = A.paged_decode_attention(**args, **opts)
    want = R.paged_decode_attention(**args, **opts)
    check_like(got, args["query"])
    assert_close(got, want, dtype, args["value_cache"])
    assert not to_f64(got)[2].any(), "a request with seq_len 0 gets zeros"


def test_strided_query_and_int32_indices():
    case = batch([5, 1], [3, 6])
    wide = np.concatenate([case["query"], case["query"]], axis=2)[:, :, ::2]  # every other
    case["query"] = wide
    case["block_table"] = case["block_table"].astype(np.int32)
    got, want = A.paged_attention(**case), R.paged_attention(**case)
    assert_close(got, want, "float64", case["value_cache"])


def test_window_of_one_reads_each_tokens_own_value():
    case = batch([6, 1], [10, 4], heads=4, kv_heads=2, pad=0)
    out = A.paged_attention(**case, sliding_window=1)
    bs = case["key_cache"].shape[1]
    for r, (start, end) in enumerate(
        zip(case["query_start_loc"][:-1], case["query_start_loc"][1:], strict=True)
    ):
        for i in range(end - start):
            p = case["seq_lens"][r] - (end - start) + i
            v = case["value_cache"][case["block_table"][r, p // bs], p % bs]
            np.testing.assert_allclose(out[start + i], np.repeat(v, 2, axis=0), rtol=1e-12)


# --- reshape_and_cache ------------------------------------------------------------------


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("src", ["float32", "float64", "float16"])
@pytest.mark.parametrize("dst", ["float32", "float64", "float16", "bfloat16"])
def test_reshape_and_cache_writes_what_the_reference_writes(lib, src, dst):
    if lib == "numpy" and dst == "bfloat16":
        pytest.skip("numpy has no bfloat16")
    rng = np.random.default_rng(0)
    qkv = rng.uniform(-2, 2, (6, 3, 2, 5))  # key = qkv[:, 1]: a strided view
    slots = np.array([7, -1, 0, 11, -1, 3])
    cache = rng.uniform(-2, 2, (3, 4, 2, 5))
    key = convert(qkv, lib, src)[:, 1]
    value = convert(qkv, lib, src)[:, 2]
    mine = [convert(cache, lib, dst), convert(cache * 2, lib, dst)]
    theirs = [convert(cache, lib, dst), convert(cache * 2, lib, dst)]
    before = [id(c) for c in mine]
    assert A.reshape_and_cache(key, value, *mine, convert(slots, lib)) is None
    R.reshape_and_cache(key, value, *theirs, convert(slots, lib))
    assert [id(c) for c in mine] == before
    for got, want in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(to_f64(got), to_f64(want))


@needs_torch
def test_reshape_and_cache_writes_the_callers_bf16_tensor():
    cache = torch.zeros(2, 4, 1, 3, dtype=torch.bfloat16)
    key = torch.arange(6, dtype=torch.float32).reshape(2, 1, 3) + 0.5
    A.reshape_and_cache(key, -key, cache, cache.clone(), torch.tensor([6, -1]))
    assert cache[1, 2].tolist() == [[0.5, 1.5, 2.5]]
    assert cache.float().abs().sum() == 4.5


@needs_torch
@pytest.mark.parametrize("src", [torch.float32, torch.float64] if torch is not None else [])
def test_reshape_and_cache_rounds_to_bf16_as_the_reference(src):
    # 1 + 2**-8 + 2**-23: above the tie between two bfloat16 values by its last float32 bit
    key = torch.full((1, 1, 2), 1 + 2**-8 + 2**-23, dtype=src)
    mine, theirs = (torch.zeros(1, 1, 1, 2, dtype=torch.bfloat16) for _ in range(2))
    A.reshape_and_cache(key, key, mine, mine.clone(), torch.tensor([0]))
    R.reshape_and_cache(key, key, theirs, theirs.clone(), torch.tensor([0]))
    assert mine.tolist() == theirs.tolist() == [[[[1 + 2**-7] * 2]]]


# --- concat_and_cache_mla ---------------------------------------------------------------


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("src", ["float32", "float64", "float16"])
@pytest.mark.parametrize("dst", ["float32", "float64", "float16", "bfloat16"])
def test_concat_and_cache_mla_writes_what_the_reference_writes(lib, src, dst):
    if lib == "numpy" and dst == "bfloat16":
        pytest.skip("numpy has no bfloat16")
    rng = np.random.default_rng(1)
    projected = rng.uniform(-2, 2, (6, 9))  # kv_c and k_pe: strided column slices
    slots = np.array([7, -1, 0, 11, -1, 3])
    cache = rng.uniform(-2, 2, (3, 4, 7))
    kv_c, k_pe = convert(projected, lib, src)[:, :5], convert(projected, lib, "float64")[:, 7:]
    mine, theirs = convert(cache, lib, dst), convert(cache, lib, dst)
    assert A.concat_and_cache_mla(kv_c, k_pe, mine, convert(slots, lib)) is None
    R.concat_and_cache_mla(kv_c, k_pe, theirs, convert(slots, lib))
    np.testing.assert_array_equal(to_f64(mine), to_f64(theirs))


@pytest.mark.parametrize("lib", LIBS)
def test_concat_and_cache_mla_errors_match_the_reference(lib):
    c = convert(np.ones((2, 3), np.float32), lib)
    pe = convert(np.ones((2, 2), np.float32), lib)
    cache = convert(np.zeros((3, 2, 5), np.float32), lib)
    sm = convert(np.array([1, -1]), lib)
    fortran = np.asfortranarray(np.zeros((3, 2, 5), np.float32))
    if lib == "torch":
        fortran = torch.zeros(5, 2, 3).permute(2, 1, 0)
    for args in [
        (c, pe, [[0.0]], sm),
        (c, pe, cache[0], sm),
        (c[:1], pe, cache, sm),
        (c, pe[:, :1], cache, sm),
        (c[:, None], pe, cache, sm),
        (c, pe, cache, sm * 1.0),
        (c, pe, cache, convert(np.array([1, 6]), lib)),
        (c, pe, fortran, sm),
    ]:
        same_error("concat_and_cache_mla", *args)


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("lib", LIBS)
def test_attention_errors_match_the_reference(lib):
    case = {k: convert(v, lib) for k, v in batch([3, 1], [2, 5], pad=0).items()}
    q, kc, vc = case["query"], case["key_cache"], case["value_cache"]
    table, lens = case["block_table"], case["seq_lens"]

    def variant(**change):
        return {**case, **change}

    np_or = (lambda x: torch.from_numpy(x)) if lib == "torch" else (lambda x: x)
    bad = [
        variant(query=[[1.0]]),
        variant(query=np_or(np.zeros((4, 6, 8), np.int64))),
        variant(key_cache=kc[0]),
        variant(query=q[:, :, :4]),
        variant(query=q[0]),
        variant(
            key_cache=kc[:, :, :1].repeat(1, 1, 4, 1)
            if lib == "torch"
            else np.repeat(kc[:, :, :1], 4, axis=2)
        ),
        variant(seq_lens=np_or(np.array([5, 6, 1]))),
        variant(block_table=table[:1]),
        variant(seq_lens=np_or(np.array([2, 6]))),
        variant(seq_lens=np_or(np.array([5, 100]))),
        variant(custom_masks=[None]),
        variant(custom_masks=[np_or(np.ones((3, 6), bool)), None]),
        variant(custom_masks=[np_or(np.ones((3, 5), np.int64)), None]),
    ]
    for args in bad:
        same_error("paged_attention", **args)
    dec = dict(
        query=q[:2], key_cache=kc, value_cache=vc, block_table=table, seq_lens=lens, scale=0.5
    )
    bad_decode = [
        {**dec, "query": np_or(np.zeros((2, 6, 8), np.int32))},
        {**dec, "seq_lens": lens * 1.0},
        {**dec, "block_table": table * 1.0},
        {**dec, "key_cache": kc[0]},
        {**dec, "seq_lens": np_or(np.array([5, 6, 1]))},
        {**dec, "block_table": table[:, 0]},
        {**dec, "seq_lens": np_or(np.array([5, 99]))},
        {**dec, "seq_lens": np_or(np.array([-1, 3]))},
    ]
    for args in bad_decode:
        same_error("paged_decode_attention", **args)


@pytest.mark.parametrize("lib", LIBS)
def test_cache_errors_match_the_reference(lib):
    k = convert(np.ones((2, 2, 4), np.float32), lib)
    kc = convert(np.zeros((3, 2, 2, 4), np.float32), lib)
    sm = convert(np.array([1, -1]), lib)
    fortran = convert(np.asfortranarray(np.zeros((3, 2, 2, 4), np.float32)), "numpy")
    if lib == "torch":
        fortran = torch.zeros(4, 2, 2, 3).permute(3, 1, 2, 0)
    for args in [
        (k, k, [[0.0]], kc, sm),
        (k, k, kc[0], kc, sm),
        (k, k, kc, kc[:, :1], sm),
        (k[:, :1], k, kc, kc, sm),
        (k, k, kc, kc, convert(np.array([1, -1, 2]), lib)),
        (k, k, kc, kc, sm * 1.0),
        (k, k, kc, kc, convert(np.array([1, 6]), lib)),
        (k, k, fortran, kc, sm),
    ]:
        same_error("reshape_and_cache", *args)


@needs_torch
def test_tensors_off_the_cpu_raise_type_error():
    case = batch([2, 1], [1, 3], pad=0)
    meta = {
        k: torch.from_numpy(v).to("meta") if isinstance(v, np.ndarray) else v
        for k, v in case.items()
    }
    with pytest.raises(TypeError, match="on device meta"):
        A.paged_attention(**meta)
    dec = {k: meta[k] for k in ("key_cache", "value_cache", "block_table", "seq_lens", "scale")}
    with pytest.raises(TypeError, match="on device meta"):
        A.paged_decode_attention(meta["query"][:2], **dec)
    k = torch.ones(1, 2, 8, device="meta")
    with pytest.raises(TypeError, match="on device meta"):
        A.reshape_and_cache(k, k, meta["key_cache"], meta["value_cache"], torch.tensor([0]))


def test_documented_differences_are_value_errors_naming_the_argument():
    case = batch([3, 1], [2, 5], pad=0)
    table = case["block_table"].copy()
    table[1, 0] = 99
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = 99"):
        A.paged_attention(**{**case, "block_table": table})
    with pytest.raises(ValueError, match="key_cache must be C-contiguous"):
        A.paged_attention(**{**case, "key_cache": np.asfortranarray(case["key_cache"])})
    with pytest.raises(ValueError, match="query_start_loc must lie in"):
        A.paged_attention(**{**case, "query": case["query"][:3]})
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        A.paged_attention(**case, alibi_slopes=np.ones(2))
    with pytest.raises(TypeError, match="value_cache must have key_cache's dtype"):
        A.paged_attention(**{**case, "value_cache": case["value_cache"].astype(np.float32)})


def test_native_rejects_inconsistent_input_without_crashing():
    """The Rust entry points check what their kernels rely on (called directly, with
    none of the wrappers' checks)."""
    case = batch([3, 1], [2, 5], pad=0)
    q, kc, vc = case["query"], case["key_cache"], case["value_cache"]
    table, lens = case["block_table"], case["seq_lens"]
    qsl = case["query_start_loc"]
    calls = [
        lambda: native.paged_attention(q, kc, vc, table, qsl, lens[:1], 1.0),
        lambda: native.paged_attention(q, kc, vc, table[:1], qsl[:2], lens[:1] + 99, 1.0),
        lambda: native.paged_attention(q[:2], kc, vc, table, qsl, lens, 1.0),
        lambda: native.paged_attention(q, kc, vc, table, qsl[::-1].copy(), lens, 1.0),
        lambda: native.paged_attention(q, kc, vc[:1], table, qsl, lens, 1.0),
        lambda: native.paged_attention(q[:, :, :3], kc, vc, table, qsl, lens, 1.0),
        lambda: native.paged_attention(q, kc, vc, table - 50, qsl, lens, 1.0),
        lambda: native.paged_attention(q, kc, vc, table, qsl, lens, 1.0, None, None, np.ones(1)),
        lambda: native.paged_attention(
            q, kc, vc, table, qsl, lens, 1.0, None, None, None, [np.ones((1, 1), bool), None]
        ),
        lambda: native.paged_decode_attention(q[:2], kc, vc, table, lens * 9, 1.0),
        lambda: native.paged_decode_attention(q, kc, vc, table, lens, 1.0),
        lambda: native.paged_decode_attention(q[:2], kc[:, :0], vc[:, :0], table, lens, 1.0),
        lambda: native.reshape_and_cache(q[:2, :2], q[:2, :2], kc, vc, np.array([0, 999])),
        lambda: native.reshape_and_cache(q[:2, :2], q[:2, :2], kc, vc, np.array([0])),
        lambda: native.reshape_and_cache(q[:2, :1], q[:2, :2], kc, vc, np.array([0, 1])),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
