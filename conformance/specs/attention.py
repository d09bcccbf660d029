"""Properties of `ops.attention` (see `pyagent_ref/ops/attention.py` for the contract).

A batch is drawn the way the engine builds one: 1-4 requests, each a prefill chunk (1-5
query tokens after 0-6 cached ones) or a single-token decode (after 0-10), 0-2 padding
query tokens, MHA / GQA / MQA head counts (1-2 KV heads, 1-3 query heads per KV head),
head_size 1-8, block_size 1-8, every request's blocks distinct and shuffled over the
cache (plus spare blocks), unused table entries pointing anywhere, float32 or float64,
and optionally a sliding window (1-8), a soft cap (5 or 30) and ALiBi slopes; causal, or
not (an encoder's bidirectional attention over each request's whole sequence).

The oracle is a dense attention computed here in float64: each request's keys and
values are read position by position through its block table, scores masked causally
(and by the window), softmax, weighted sum. Tolerance (oracle and differential check):
|got - want| <= TOL[dtype] * (1 + max |v| of the request), TOL = 2e-5 for float32 (scores
and softmax in float32, exp amplifying score rounding) and 1e-11 for float64.
`reshape_and_cache` is exact: the cache holds the key/value cast to its dtype.
`concat_and_cache_mla` likewise: each written slot holds [kv_c, k_pe] cast to the cache
dtype; its cases draw 1-6 blocks of 1-8 slots, a latent of 1-8 + 1-4 features, 0-8 tokens
with distinct slots and 0-3 padding tokens, float32 or float64 sources and cache.

MLA attends over its latent cache with `paged_attention` / `paged_decode_attention`,
passing the one cache (as a single KV head) for both keys and values: the
`latent_cache_as_keys_and_values` properties check that an implementation gives the
result of two separate copies there (it must not assume the two caches are distinct).

`paged_decode_attention` batches are drawn the same way with one query token per request,
0-2 padding requests (seq_len 0) anywhere among them, and 0-2 spare table columns; its
oracle is the same dense attention (zeros for padding requests).

FP8 KV caches: a third of the attention and decode cases hold their caches as uint8
codes of an fp8 format ("fp8", "fp8_e4m3", "fp8_e5m2"), encoded from the drawn float
caches with k_scale and v_scale of 1, 0.25 or 4; the dense oracle reads them
dequantized (the format's value of each code times the scale), with the same
tolerance. Half the `reshape_and_cache` cases write into an fp8 cache, with scales of
1, 0.5, 0.01 or 8 and keys up to 1000 in magnitude (so some saturate). The oracle of
the codes is torch's own cast, torch.clamp(float32(x) / float32(scale), -max, max)
.to(torch.float8_e4m3fn / float8_e5m2), and of the values torch's view of the codes:
the written codes equal it bit for bit, and dequantized they are within the format's
relative rounding bound of x (2^-4 for e4m3, 2^-3 for e5m2; half a subnormal step
times the scale below the smallest normal), saturating at +-max * scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

import pyagent_ref.ops.attention  # noqa: F401 - binds pyagent_ref.ops.attention

from .. import checks, contract
from ..core import Case, Ctx, Spec, to_numpy
from ._common import (
    FLOAT_DTYPES,
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    assert_within,
    check_like_input,
    error_variants,
    reference_shapes,
)

OPS = contract.names("attention")
TOL = {"float32": 2e-5, "float64": 1e-11}

spec = Spec("attention", OPS)

SHAPES = reference_shapes("attention")
ATTN_ARGS = SHAPES["paged_attention"].args
DECODE_ARGS = SHAPES["paged_decode_attention"].args
int_dtypes = st.sampled_from((np.int32, np.int64))
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# the largest relative rounding error of each format (half its mantissa step) and the
# smallest normal
FP8_BOUND = {torch.float8_e4m3fn: (2.0**-4, 2.0**-6), torch.float8_e5m2: (2.0**-3, 2.0**-14)}
AUTO = {"kv_cache_dtype": "auto", "k_scale": 1.0, "v_scale": 1.0}


def fp8_codes(x: np.ndarray, scale: float, kv_cache_dtype: str) -> np.ndarray:
    """The oracle of an fp8 cache write: torch's saturating cast of x / scale, as uint8."""
    dtype = FP8[kv_cache_dtype]
    y = torch.from_numpy(np.asarray(x)).float() / torch.tensor(scale, dtype=torch.float32)
    top = torch.finfo(dtype).max
    return torch.clamp(y, -top, top).to(dtype).view(torch.uint8).numpy()


def fp8_values(codes: np.ndarray, scale: float, kv_cache_dtype: str) -> np.ndarray:
    """float64 values of uint8 codes times the scale."""
    x = torch.from_numpy(np.ascontiguousarray(codes)).view(FP8[kv_cache_dtype]).double()
    return x.numpy() * scale


def cache_values(case: Case, which: str) -> np.ndarray:
    """The case's key or value cache as float64 values (dequantized if fp8)."""
    cache = getattr(case, f"{which}_cache")
    if case.kv_cache_dtype == "auto":
        return cache.astype(np.float64)
    return fp8_values(cache, getattr(case, f"{which[0]}_scale"), case.kv_cache_dtype)


@st.composite
def fp8_fields(draw: Any, kc: np.ndarray, vc: np.ndarray, fp8: bool | None) -> dict[str, Any]:
    """The caches and the kv_cache_dtype / k_scale / v_scale fields: float caches with
    "auto", or (a third of the time, or always with fp8=True) the caches encoded."""
    if not (draw(st.integers(0, 2)) == 0 if fp8 is None else fp8):
        return {"key_cache": kc, "value_cache": vc, **AUTO}
    name = draw(st.sampled_from(tuple(FP8)))
    ks, vs = (draw(st.sampled_from((1.0, 0.25, 4.0))) for _ in range(2))
    return {
        "key_cache": fp8_codes(kc, ks, name),
        "value_cache": fp8_codes(vc, vs, name),
        "kv_cache_dtype": name,
        "k_scale": ks,
        "v_scale": vs,
    }


# --- strategies -----------------------------------------------------------------------------


@st.composite
def attention_cases(
    draw: Any,
    window: bool | None = None,
    extras: bool = True,
    padding: bool = True,
    causal: bool | None = None,
    fp8: bool | None = None,
) -> Case:
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="values seed"))
    n_reqs = draw(st.integers(1, 4))
    q_lens, seq_lens = [], []
    for _ in range(n_reqs):
        if draw(st.booleans()):  # prefill chunk
            q, ctx_len = draw(st.integers(1, 5)), draw(st.integers(0, 6))
        else:  # decode
            q, ctx_len = 1, draw(st.integers(0, 10))
        q_lens.append(q)
        seq_lens.append(ctx_len + q)
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    head_size = draw(st.sampled_from((1, 2, 4, 8)))
    bs = draw(st.integers(1, 8))
    used = [-(-s // bs) for s in seq_lens]
    max_blocks = max(used) + draw(st.integers(0, 2))
    num_blocks = sum(used) + draw(st.integers(0, 3))
    ids = draw(st.permutations(range(num_blocks)))
    table = np.zeros((n_reqs, max_blocks), draw(int_dtypes))
    at = 0
    for r, u in enumerate(used):
        table[r, :u] = ids[at : at + u]
        table[r, u:] = rng.integers(0, num_blocks, max_blocks - u)  # unused: anything valid
        at += u
    n_pad = draw(st.integers(0, 2)) if padding else 0
    total = sum(q_lens)
    shape = (num_blocks, bs, kv_heads, head_size)
    if draw(st.booleans()):  # values on a coarse grid: exact ties among scores
        kc = rng.integers(-4, 5, shape) / 4
        vc = rng.integers(-4, 5, shape) / 4
        query = rng.integers(-4, 5, (total + n_pad, heads, head_size)) / 4
    else:
        kc, vc = rng.uniform(-2, 2, shape), rng.uniform(-2, 2, shape)
        query = rng.uniform(-2, 2, (total + n_pad, heads, head_size))
    use_window = draw(st.booleans()) if window is None else window
    soft_cap = draw(st.sampled_from((None, 5.0, 30.0))) if extras else None
    alibi = None
    if extras and draw(st.booleans()):
        alibi = rng.uniform(0, 1, heads).astype(dtype)
    masks = None
    if extras and draw(st.booleans()):  # tree attention: some requests get a mask
        masks = [
            rng.random((q, s)) < 0.6 if draw(st.booleans()) else None
            for q, s in zip(q_lens, seq_lens, strict=True)
        ]
    caches = draw(fp8_fields(kc.astype(dtype), vc.astype(dtype), fp8))
    return Case(
        query=query.astype(dtype),
        key_cache=caches["key_cache"],
        value_cache=caches["value_cache"],
        block_table=table,
        query_start_loc=np.concatenate([[0], np.cumsum(q_lens)]).astype(draw(int_dtypes)),
        seq_lens=np.array(seq_lens, draw(int_dtypes)),
        scale=draw(st.sampled_from((head_size**-0.5, 1.0, 0.25))),
        sliding_window=draw(st.integers(1, 8)) if use_window else None,
        soft_cap=soft_cap,
        alibi_slopes=alibi,
        custom_masks=masks,
        causal=draw(st.booleans()) if causal is None else causal,
        kv_cache_dtype=caches["kv_cache_dtype"],
        k_scale=caches["k_scale"],
        v_scale=caches["v_scale"],
    )


@st.composite
def decode_cases(draw: Any, extras: bool = True, fp8: bool | None = None) -> Case:
    """One query token per request; padding requests (seq_len 0) mixed in."""
    case = draw(attention_cases(extras=extras, padding=False, fp8=fp8))
    last = case.query_start_loc[1:].astype(np.int64) - 1  # each request's last query token
    query, table, lens = case.query[last], case.block_table, case.seq_lens
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(lens)))
        query = np.insert(query, at, draw(st.sampled_from((0.0, 1.5))), axis=0)
        table = np.insert(table, at, draw(st.integers(0, case.key_cache.shape[0] - 1)), axis=0)
        lens = np.insert(lens, at, 0)
    return Case(
        query=query,
        key_cache=case.key_cache,
        value_cache=case.value_cache,
        block_table=table,
        seq_lens=lens,
        scale=case.scale,
        sliding_window=case.sliding_window,
        soft_cap=case.soft_cap,
        alibi_slopes=case.alibi_slopes,
        kv_cache_dtype=case.kv_cache_dtype,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
    )


@st.composite
def cache_cases(draw: Any, fp8: bool | None = None) -> Case:
    num_blocks, bs = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    kv_heads, head_size = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    n_slots = num_blocks * bs
    n = draw(st.integers(0, min(8, n_slots)))
    real = draw(st.lists(st.integers(0, n_slots - 1), min_size=n, max_size=n, unique=True))
    slots = list(real)
    n_pad = draw(st.integers(0, 3))
    for _ in range(n_pad):
        slots.insert(draw(st.integers(0, len(slots))), -1)
    t = len(slots)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="values seed"))
    kv_dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    cache_dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    shape, cache_shape = (t, kv_heads, head_size), (num_blocks, bs, kv_heads, head_size)
    fields = {**AUTO}
    if draw(st.booleans()) if fp8 is None else fp8:  # an fp8 cache, keys that may saturate
        magnitude = draw(st.sampled_from((1.0, 1000.0)))
        fields["kv_cache_dtype"] = draw(st.sampled_from(tuple(FP8)))
        fields["k_scale"], fields["v_scale"] = (
            draw(st.sampled_from((1.0, 0.5, 0.01, 8.0))) for _ in range(2)
        )
        top = 0x7B if fields["kv_cache_dtype"] == "fp8_e5m2" else 0x7E  # finite codes
        codes = rng.integers(0, top + 1, cache_shape) | (rng.integers(0, 2, cache_shape) << 7)
        key_cache, value_cache = codes.astype(np.uint8), codes[::-1].astype(np.uint8)
    else:
        magnitude = 1.0
        key_cache = rng.uniform(-2, 2, cache_shape).astype(cache_dtype)
        value_cache = rng.uniform(-2, 2, cache_shape).astype(cache_dtype)
    return Case(
        key=(rng.uniform(-2, 2, shape) * magnitude).astype(kv_dtype),
        value=(rng.uniform(-2, 2, shape) * magnitude).astype(kv_dtype),
        key_cache=np.ascontiguousarray(key_cache),
        value_cache=np.ascontiguousarray(value_cache),
        slot_mapping=np.array(slots, draw(int_dtypes)).reshape(t),
        **fields,
    )


def requests(case: Case) -> list[tuple[int, int, int]]:
    q = [int(v) for v in case.query_start_loc]
    return [(r, q[r], q[r + 1]) for r in range(len(q) - 1)]


def attend(ctx: Ctx, case: Case, **changes: Any) -> np.ndarray:
    args = {name: getattr(case, name) for name in ATTN_ARGS}
    args.update(changes)
    return ctx.call("paged_attention", *args.values())


# --- oracle ---------------------------------------------------------------------------------


def dense_attention(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(the attention of every query token in float64, the tolerance of each entry)."""
    q64 = case.query.astype(np.float64)
    out = np.zeros(q64.shape)
    tol = np.zeros(q64.shape)
    _, bs, kv_heads, _ = case.key_cache.shape
    heads = q64.shape[1]
    group = heads // kv_heads
    t_rel = TOL[case.query.dtype.name]
    key_values, value_values = cache_values(case, "key"), cache_values(case, "value")
    for r, start, end in requests(case):
        s = int(case.seq_lens[r])
        pos = np.arange(s)
        blocks = case.block_table[r, pos // bs].astype(np.int64)
        k = key_values[blocks, pos % bs]  # (s, kv_heads, d)
        v = value_values[blocks, pos % bs]
        vmax = float(np.abs(v).max()) if v.size else 0.0
        for i in range(end - start):
            p = s - (end - start) + i
            for h in range(heads):
                g = h // group
                score = case.scale * (k[:, g] @ q64[start + i, h])
                if case.alibi_slopes is not None:
                    score = score + float(case.alibi_slopes[h]) * (pos - p)
                if case.soft_cap is not None:
                    score = case.soft_cap * np.tanh(score / case.soft_cap)
                visible = pos <= p if case.causal else pos < s
                if case.sliding_window is not None:
                    visible &= pos > p - case.sliding_window
                if case.custom_masks is not None and case.custom_masks[r] is not None:
                    visible &= case.custom_masks[r][i]
                if not visible.any():
                    continue  # nothing visible: the output stays 0
                score = np.where(visible, score, -np.inf)
                w = np.exp(score - score.max())
                out[start + i, h] = (w / w.sum()) @ v[:, g]
            tol[start + i] = t_rel * (1 + vmax)
    return out, tol


# =========================================================================== paged_attention


@spec.prop("paged_attention", attention_cases())
def equals_dense_masked_attention(ctx: Ctx, case: Case) -> None:
    """Each query token's output is the softmax (causal or over the whole sequence,
    windowed, soft-capped, ALiBi-biased) attention over its own sequence read through the
    block table, as a dense float64 computation gives it, within TOL[dtype] * (1 + max |v|)."""
    out = attend(ctx, case)
    want, tol = dense_attention(case)
    assert_within(out, want, tol, "attention output")


@spec.prop("paged_attention", attention_cases(window=False, extras=False, causal=True))
def dense_causal_without_options(ctx: Ctx, case: Case) -> None:
    """Plain causal attention (no window, soft cap or ALiBi) equals the dense oracle, so a
    bug in an option's code path cannot hide the plain one."""
    out = attend(ctx, case)
    want, tol = dense_attention(case)
    assert_within(out, want, tol, "attention output")


@spec.prop("paged_attention", attention_cases())
def padding_queries_get_zeros(ctx: Ctx, case: Case) -> None:
    """Query tokens past query_start_loc[-1] (padding) get exactly 0."""
    out = attend(ctx, case)
    total = int(case.query_start_loc[-1])
    pad = out[total:]
    checks.assert_equal(pad, np.zeros(pad.shape, pad.dtype), what="padding rows")


@spec.prop("paged_attention", st.tuples(attention_cases(), st.randoms(use_true_random=False)))
def invariant_to_permuting_block_ids(ctx: Ctx, pair: Any) -> None:
    """Relabelling the cache's blocks (moving block b to pi(b) in both caches and in the
    table) leaves the output unchanged: only the table decides where a position lives."""
    case, rnd = pair
    n = case.key_cache.shape[0]
    pi = np.array(rnd.sample(range(n), n), np.int64)
    kc, vc = np.empty_like(case.key_cache), np.empty_like(case.value_cache)
    kc[pi], vc[pi] = case.key_cache, case.value_cache
    table = pi[case.block_table.astype(np.int64)].astype(case.block_table.dtype)
    want = attend(ctx, case)
    got = attend(ctx, case, key_cache=kc, value_cache=vc, block_table=table)
    _, tol = dense_attention(case)
    assert_within(got, want, tol, "output after relabelling blocks")


@spec.prop("paged_attention", attention_cases(extras=False, causal=True))
def window_of_one_copies_own_value(ctx: Ctx, case: Case) -> None:
    """With sliding_window = 1 every query token sees only its own position: the output of
    head h is the value of KV head h // group at that position."""
    out = attend(ctx, case, sliding_window=1)
    _, bs, kv_heads, _ = case.key_cache.shape
    group = case.query.shape[1] // kv_heads
    for r, start, end in requests(case):
        s = int(case.seq_lens[r])
        for i in range(end - start):
            p = s - (end - start) + i
            block = int(case.block_table[r, p // bs])
            v = cache_values(case, "value")[block, p % bs]
            want = np.repeat(v, group, axis=0)
            assert_within(
                out[start + i],
                want,
                TOL[case.query.dtype.name] * (1 + np.abs(want)),
                f"token {start + i} (request {r}, position {p})",
            )


@spec.prop("paged_attention", attention_cases(window=False, extras=False, causal=False))
def non_causal_output_follows_a_permutation_of_the_queries(ctx: Ctx, case: Case) -> None:
    """Without the causal mask (and without a window, ALiBi or masks) every query token
    of a request sees the same keys, whatever its position: reversing the order of each
    request's query tokens reverses the order of their outputs."""
    out = attend(ctx, case)
    order = np.arange(case.query.shape[0])
    for _, start, end in requests(case):
        order[start:end] = order[start:end][::-1]
    got = attend(ctx, case, query=np.ascontiguousarray(case.query[order]))
    _, tol = dense_attention(case)
    assert_within(got, out[order], 2 * tol, "outputs of the reversed queries")


@spec.prop("paged_attention", attention_cases(), name="returns_documented_types")
def attention_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new array like query (library, device, dtype, shape)."""
    args = [ctx.convert(getattr(case, a)) for a in ATTN_ARGS]
    out = ctx.fn("paged_attention")(*args)
    check_like_input(out, args[0])
    assert out is not args[0], "returned the query object itself"


def fp8_errors(case: Case) -> list[tuple[str, dict[str, Any], type]]:
    """Bad kv_cache_dtype / scale arguments, and float caches named fp8 (the options every
    op of the module rejects)."""
    options: list[tuple[str, dict[str, Any], type]] = [
        ("unknown kv_cache_dtype", {"kv_cache_dtype": "fp16"}, ValueError),
        ("a zero k_scale", {"k_scale": 0.0}, ValueError),
        ("a negative v_scale", {"v_scale": -1.0}, ValueError),
        ("an infinite k_scale", {"k_scale": float("inf")}, ValueError),
        ("a string v_scale", {"v_scale": "1"}, TypeError),
    ]
    if case.kv_cache_dtype == "auto" and "float" in case.key_cache.dtype.name:
        options.append(
            ("float caches with kv_cache_dtype='fp8'", {"kv_cache_dtype": "fp8"}, TypeError)
        )
    return options


def with_changes(
    case: Case, names: tuple[str, ...], options: list[tuple[str, dict[str, Any], type]]
) -> list[tuple[str, tuple[Any, ...], type]]:
    """Error variants: the case's arguments `names` with each option's changes, plus a KV
    cache whose head count does not divide the query's (when one exists), plus
    `fp8_errors`."""
    q, kc = case.query, case.key_cache
    options = [*options, *fp8_errors(case)]
    if q.shape[1] % (kc.shape[2] + 1):
        shape = (*kc.shape[:2], kc.shape[2] + 1, kc.shape[3])
        bad = np.zeros(shape, kc.dtype)
        change = {"key_cache": bad, "value_cache": bad.copy()}
        options = [*options, ("num_heads not a multiple of num_kv_heads", change, ValueError)]
    out = []
    for why, change, exc in options:
        args = {name: getattr(case, name) for name in names}
        args.update(change)
        out.append((why, tuple(args.values()), exc))
    return out


def attention_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    q, kc = case.query, case.key_cache
    qsl, lens, table = case.query_start_loc, case.seq_lens, case.block_table
    bs = kc.shape[1]
    first_q = int(qsl[1] - qsl[0])
    rest: list[Any] = [None] * (len(lens) - 1)  # no mask for the other requests
    short, long_ = lens.copy(), lens.copy()
    short[0] = first_q - 1
    long_[0] = table.shape[1] * bs + 1
    options: list[tuple[str, dict[str, Any], type]] = [
        ("integer query", {"query": np.zeros(q.shape, np.int64)}, TypeError),
        ("float query_start_loc", {"query_start_loc": qsl.astype(np.float64)}, TypeError),
        ("float seq_lens", {"seq_lens": lens.astype(np.float64)}, TypeError),
        ("float block_table", {"block_table": table.astype(np.float64)}, TypeError),
        ("3-D key_cache", {"key_cache": kc[0]}, ValueError),
        (
            "cache head_size != query head_size",
            {
                "key_cache": np.zeros((*kc.shape[:3], kc.shape[3] + 1), kc.dtype),
                "value_cache": np.zeros((*kc.shape[:3], kc.shape[3] + 1), kc.dtype),
            },
            ValueError,
        ),
        ("seq_lens one longer", {"seq_lens": np.append(lens, 1).astype(lens.dtype)}, ValueError),
        ("block_table one row short", {"block_table": table[:-1]}, ValueError),
        ("seq_len shorter than its query tokens", {"seq_lens": short}, ValueError),
        ("seq_len past its block table", {"seq_lens": long_}, ValueError),
        ("causal not a bool", {"causal": 1}, TypeError),
        ("custom_masks one entry short", {"custom_masks": [None] * (len(lens) - 1)}, ValueError),
        (
            "custom mask one key too wide",
            {"custom_masks": [np.ones((first_q, int(lens[0]) + 1), bool)] + rest},
            ValueError,
        ),
        (
            "integer custom mask",
            {"custom_masks": [np.ones((first_q, int(lens[0])), np.int64)] + rest},
            TypeError,
        ),
    ]
    return with_changes(case, ATTN_ARGS, options)


def _attention_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, tol = dense_attention(case)
    assert_within(got, ref, tol, "attention output")


add_does_not_modify_inputs(spec, SHAPES["paged_attention"], attention_cases())
add_rejects_invalid_input(
    spec,
    SHAPES["paged_attention"],
    error_variants(attention_cases(padding=False), attention_errors),
)
add_matches_reference(
    spec,
    SHAPES["paged_attention"],
    attention_cases(),
    _attention_compare,
    "The reference's output within TOL[dtype] * (1 + max |v| of the request).",
)


# ========================================================================= reshape_and_cache


def write_cache(ctx: Ctx, case: Case, **changes: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """(the op's return value, key_cache, value_cache) after the implementation's call on
    converted copies of the caches (the op writes in place)."""
    args = {name: getattr(case, name) for name in SHAPES["reshape_and_cache"].args}
    args.update(changes)
    conv = {k: ctx.convert(v) for k, v in args.items()}
    ret = ctx.fn("reshape_and_cache")(*conv.values())
    return ret, np.array(to_numpy(conv["key_cache"])), np.array(to_numpy(conv["value_cache"]))


@spec.prop("reshape_and_cache", cache_cases())
def writes_exactly_the_non_padding_slots(ctx: Ctx, case: Case) -> None:
    """Slot s = slot_mapping[t] >= 0 of both caches becomes key[t] / value[t] cast to the
    cache dtype (with an fp8 cache: torch's saturating cast of key[t] / k_scale, value[t] /
    v_scale, bit for bit); every other slot (and padding tokens' data) is left untouched;
    returns None."""
    ret, kc, vc = write_cache(ctx, case)
    assert ret is None, f"returned {type(ret).__name__}, not None"
    for name, src, before, after, scale in (
        ("key_cache", case.key, case.key_cache, kc, case.k_scale),
        ("value_cache", case.value, case.value_cache, vc, case.v_scale),
    ):
        n, bs, h, d = before.shape
        want = before.reshape(n * bs, h, d).copy()
        for t, s in enumerate(case.slot_mapping.tolist()):
            if s >= 0 and case.kv_cache_dtype == "auto":
                want[s] = src[t].astype(before.dtype)
            elif s >= 0:
                want[s] = fp8_codes(src[t], scale, case.kv_cache_dtype)
        checks.assert_shape_dtype(after, before.shape, before.dtype, name)
        checks.assert_equal(after.reshape(n * bs, h, d), want, what=f"{name} slots")


@spec.prop("reshape_and_cache", cache_cases(), uses=("paged_attention",))
def written_keys_are_attended(ctx: Ctx, case: Case) -> None:
    """After the write, a one-token decode at the last written slot with a window of 1 reads
    back exactly that token's value (the two ops agree on the slot layout)."""
    real = [(t, s) for t, s in enumerate(case.slot_mapping.tolist()) if s >= 0]
    if not real:
        return
    t, s = real[-1]
    _, kc, vc = write_cache(ctx, case)
    n, bs, h, d = kc.shape
    fp8 = case.kv_cache_dtype != "auto"
    dtype = np.dtype(np.float32) if fp8 else kc.dtype
    query = np.ones((1, h, d), dtype)
    table = np.array([[s // bs]], np.int64)
    out = ctx.call(
        "paged_attention",
        query,
        kc,
        vc,
        table,
        np.array([0, 1]),
        np.array([s % bs + 1]),
        1.0,
        1,
        None,
        None,
        None,
        True,
        case.kv_cache_dtype,
        case.k_scale,
        case.v_scale,
    )
    want = case.value[t].astype(kc.dtype) if not fp8 else vc.reshape(n * bs, h, d)[s]
    if fp8:
        want = fp8_values(want, case.v_scale, case.kv_cache_dtype)
    assert_within(
        out[0],
        want,
        TOL[dtype.name] * (1 + np.abs(want)),
        f"value of token {t} read back from slot {s}",
    )


@spec.prop("reshape_and_cache", cache_cases(fp8=True))
def fp8_round_trip_within_the_format_bound(ctx: Ctx, case: Case) -> None:
    """An fp8 cache read back (code value times the scale) is within the format's
    relative rounding bound of what was written (2^-4 for e4m3, 2^-3 for e5m2; below the
    smallest normal, half a subnormal step), and a value beyond max * scale reads back
    as +-max * scale (saturation): per written slot, x = key[t] or value[t]."""
    _, kc, vc = write_cache(ctx, case)
    dtype = FP8[case.kv_cache_dtype]
    rel, tiny = FP8_BOUND[dtype]
    top = float(torch.finfo(dtype).max)
    for src, cache, scale in ((case.key, kc, case.k_scale), (case.value, vc, case.v_scale)):
        n, bs, h, d = cache.shape
        for t, s in enumerate(case.slot_mapping.tolist()):
            if s < 0:
                continue
            x = src[t].astype(np.float32).astype(np.float64)
            y = x / np.float32(scale)
            got = fp8_values(cache.reshape(n * bs, h, d)[s], scale, case.kv_cache_dtype)
            want = np.where(np.abs(y) > top, np.sign(y) * top * scale, x)
            # rel * tiny: half the subnormal step; 2^-20: the float32 division of x by scale
            bound = (rel * np.abs(want) + rel * tiny * scale) * (1 + 2.0**-20)
            assert_within(got, want, bound, f"slot {s} (token {t}) read back")


def cache_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    k, v, kc, vc, sm = case.key, case.value, case.key_cache, case.value_cache, case.slot_mapping
    n_slots = kc.shape[0] * kc.shape[1]
    past = np.append(sm, n_slots).astype(sm.dtype)
    k1 = np.concatenate([k, k[:1] if len(k) else np.zeros((1, *k.shape[1:]), k.dtype)])
    v1 = np.concatenate([v, v[:1] if len(v) else np.zeros((1, *v.shape[1:]), v.dtype)])
    out = [
        ("float slot_mapping", (k, v, kc, vc, sm.astype(np.float64)), TypeError),
        ("a slot past the cache", (k1, v1, kc, vc, past), ValueError),
        ("value_cache of another shape", (k, v, kc, vc[:, :, :, :0], sm), ValueError),
        (
            "key with another head_size",
            (np.zeros((*k.shape[:2], k.shape[2] + 1), k.dtype), v, kc, vc, sm),
            ValueError,
        ),
        (
            "one slot more than tokens",
            (k, v, kc, vc, np.append(sm, -1).astype(sm.dtype)),
            ValueError,
        ),
        ("3-D key_cache", (k, v, kc[0], vc[0], sm), ValueError),
    ]
    fortran = np.asfortranarray(kc)
    if not fortran.flags.c_contiguous:
        out.append(("a non-contiguous key_cache", (k, v, fortran, vc, sm), ValueError))
    fp8 = (case.kv_cache_dtype, case.k_scale, case.v_scale)
    out = [(why, (*args, *fp8), exc) for why, args, exc in out]
    for why, change, exc in fp8_errors(case):
        fields = dict(zip(("kv_cache_dtype", "k_scale", "v_scale"), fp8, strict=True))
        fields.update(change)
        out.append((why, (k, v, kc, vc, sm, *fields.values()), exc))
    return out


def _cache_compare(ctx: Ctx, case: Case) -> None:
    """Both caches exactly as the reference leaves them (the same bytes in every slot)."""
    args = [getattr(case, a) for a in SHAPES["reshape_and_cache"].args]
    args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    ctx.ref("reshape_and_cache", *args)
    _, kc, vc = write_cache(ctx, case)
    checks.assert_equal(kc, args[2], what="key_cache")
    checks.assert_equal(vc, args[3], what="value_cache")


spec.add(
    "reshape_and_cache",
    _cache_compare,
    cache_cases(),
    differential=True,
    name="matches_reference",
)


@spec.prop("reshape_and_cache", cache_cases())
def does_not_modify_inputs(ctx: Ctx, case: Case) -> None:
    """key, value and slot_mapping are unchanged by the call (only the caches are written)."""
    conv = {a: ctx.convert(getattr(case, a)) for a in SHAPES["reshape_and_cache"].args}
    ctx.fn("reshape_and_cache")(*conv.values())
    for name in ("key", "value", "slot_mapping"):
        checks.assert_equal(to_numpy(conv[name]), getattr(case, name), what=f"{name} after")


add_rejects_invalid_input(
    spec, SHAPES["reshape_and_cache"], error_variants(cache_cases(), cache_errors)
)


# ====================================================================== concat_and_cache_mla


@st.composite
def mla_cache_cases(draw: Any) -> Case:
    num_blocks, bs = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    rank, rope = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    n_slots = num_blocks * bs
    n = draw(st.integers(0, min(8, n_slots)))
    slots = draw(st.lists(st.integers(0, n_slots - 1), min_size=n, max_size=n, unique=True))
    for _ in range(draw(st.integers(0, 3))):
        slots.insert(draw(st.integers(0, len(slots))), -1)
    t = len(slots)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="values seed"))
    src_dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    cache_dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    return Case(
        kv_c=rng.uniform(-2, 2, (t, rank)).astype(src_dtype),
        k_pe=rng.uniform(-2, 2, (t, rope)).astype(src_dtype),
        kv_cache=rng.uniform(-2, 2, (num_blocks, bs, rank + rope)).astype(cache_dtype),
        slot_mapping=np.array(slots, draw(int_dtypes)).reshape(t),
    )


MLA_CACHE_ARGS = SHAPES["concat_and_cache_mla"].args


def write_latents(ctx: Ctx, case: Case, **changes: Any) -> tuple[Any, np.ndarray]:
    """(the op's return value, kv_cache) after the implementation's call on a converted
    copy of the cache (the op writes in place)."""
    args = {name: getattr(case, name) for name in MLA_CACHE_ARGS}
    args.update(changes)
    conv = {k: ctx.convert(v) for k, v in args.items()}
    ret = ctx.fn("concat_and_cache_mla")(*conv.values())
    return ret, np.array(to_numpy(conv["kv_cache"]))


@spec.prop("concat_and_cache_mla", mla_cache_cases())
def writes_the_latent_into_exactly_the_non_padding_slots(ctx: Ctx, case: Case) -> None:
    """Slot s = slot_mapping[t] >= 0 becomes kv_c[t] followed by k_pe[t], cast to the
    cache dtype; every other slot is left untouched; returns None."""
    ret, after = write_latents(ctx, case)
    assert ret is None, f"returned {type(ret).__name__}, not None"
    before = case.kv_cache
    n, bs, width = before.shape
    want = before.reshape(n * bs, width).copy()
    for t, s in enumerate(case.slot_mapping.tolist()):
        if s >= 0:
            want[s] = np.concatenate([case.kv_c[t], case.k_pe[t]]).astype(before.dtype)
    checks.assert_shape_dtype(after, before.shape, before.dtype, "kv_cache")
    checks.assert_equal(after.reshape(n * bs, width), want, what="kv_cache slots")


@spec.prop("concat_and_cache_mla", mla_cache_cases(), uses=("paged_attention",))
def written_latents_are_attended(ctx: Ctx, case: Case) -> None:
    """After the write, a one-token query at the last written slot with a window of 1,
    over the cache viewed as one KV head for both keys and values (how MLA attends),
    reads back exactly that token's latent: the ops agree on the slot layout."""
    real = [(t, s) for t, s in enumerate(case.slot_mapping.tolist()) if s >= 0]
    if not real:
        return
    t, s = real[-1]
    _, after = write_latents(ctx, case)
    bs, width = after.shape[1:]
    latent = after[:, :, None, :]
    table = np.array([[s // bs]], np.int64)
    one = np.ones((1, 1, width), after.dtype)
    out = ctx.call(
        "paged_attention",
        one,
        latent,
        latent,
        table,
        np.array([0, 1]),
        np.array([s % bs + 1]),
        1.0,
        1,
    )
    want = np.concatenate([case.kv_c[t], case.k_pe[t]]).astype(after.dtype)
    assert_within(
        out[0, 0],
        want,
        TOL[after.dtype.name] * (1 + np.abs(want)),
        f"latent of token {t} read back from slot {s}",
    )


def _mla_cache_compare(ctx: Ctx, case: Case) -> None:
    """The cache exactly as the reference leaves it (the same bytes in every slot)."""
    args = [np.array(getattr(case, a), copy=True) for a in MLA_CACHE_ARGS]
    ctx.ref("concat_and_cache_mla", *args)
    _, after = write_latents(ctx, case)
    checks.assert_equal(after, args[2], what="kv_cache")


spec.add(
    "concat_and_cache_mla",
    _mla_cache_compare,
    mla_cache_cases(),
    differential=True,
    name="matches_reference",
)


@spec.prop("concat_and_cache_mla", mla_cache_cases(), name="does_not_modify_inputs")
def mla_cache_does_not_modify_inputs(ctx: Ctx, case: Case) -> None:
    """kv_c, k_pe and slot_mapping are unchanged by the call (only the cache is written)."""
    conv = {a: ctx.convert(getattr(case, a)) for a in MLA_CACHE_ARGS}
    ctx.fn("concat_and_cache_mla")(*conv.values())
    for name in ("kv_c", "k_pe", "slot_mapping"):
        checks.assert_equal(to_numpy(conv[name]), getattr(case, name), what=f"{name} after")


def mla_cache_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    c, pe, cache, sm = case.kv_c, case.k_pe, case.kv_cache, case.slot_mapping
    n_slots = cache.shape[0] * cache.shape[1]
    past = np.append(sm, n_slots).astype(sm.dtype)
    c1 = np.concatenate([c, np.zeros((1, c.shape[1]), c.dtype)])
    pe1 = np.concatenate([pe, np.zeros((1, pe.shape[1]), pe.dtype)])
    out = [
        ("float slot_mapping", (c, pe, cache, sm.astype(np.float64)), TypeError),
        ("a slot past the cache", (c1, pe1, cache, past), ValueError),
        (
            "k_pe one feature wider",
            (c, np.zeros((len(sm), pe.shape[1] + 1), pe.dtype), cache, sm),
            ValueError,
        ),
        ("kv_c one token longer", (c1, pe, cache, sm), ValueError),
        ("3-D kv_c", (c[:, None], pe, cache, sm), ValueError),
        ("4-D kv_cache", (c, pe, cache[:, :, None], sm), ValueError),
        (
            "one slot more than tokens",
            (c, pe, cache, np.append(sm, -1).astype(sm.dtype)),
            ValueError,
        ),
    ]
    fortran = np.asfortranarray(cache)
    if not fortran.flags.c_contiguous:
        out.append(("a non-contiguous kv_cache", (c, pe, fortran, sm), ValueError))
    return out


add_rejects_invalid_input(
    spec, SHAPES["concat_and_cache_mla"], error_variants(mla_cache_cases(), mla_cache_errors)
)


# --- the latent cache as both caches of the attention ops ------------------------------------


def latent_case(case: Case) -> Case:
    """`case` with one KV head whose cache serves as keys and values (MLA's absorbed form):
    the key cache's first KV head, the query heads attending to it."""
    latent = np.ascontiguousarray(case.key_cache[:, :, :1])
    fields = {name: getattr(case, name) for name in case._fields}
    return Case(**{**fields, "key_cache": latent, "value_cache": latent})


@spec.prop("paged_attention", attention_cases(), name="latent_cache_as_keys_and_values")
def attention_latent_cache_as_keys_and_values(ctx: Ctx, case: Case) -> None:
    """One array passed as both key_cache and value_cache (MLA's latent cache) gives the
    result of two separate copies of it, and the dense oracle's."""
    case = latent_case(case)
    shared = ctx.convert(case.key_cache)
    args = [ctx.convert(getattr(case, a)) for a in ATTN_ARGS]
    args[1] = args[2] = shared
    got = to_numpy(ctx.fn("paged_attention")(*args))
    want, tol = dense_attention(case)
    assert_within(got, want, tol, "attention over one cache as keys and values")
    assert_within(got, attend(ctx, case, value_cache=case.key_cache.copy()), tol, "vs two copies")
    checks.assert_equal(to_numpy(shared), case.key_cache, what="the shared cache after the call")


# ==================================================================== paged_decode_attention


def decode(ctx: Ctx, case: Case, **changes: Any) -> np.ndarray:
    args = {name: getattr(case, name) for name in DECODE_ARGS}
    args.update(changes)
    return ctx.call("paged_decode_attention", *args.values())


def as_flattened_batch(case: Case) -> tuple[Case, np.ndarray]:
    """(the real requests of a decode case as a `paged_attention` case, their rows)."""
    real = np.flatnonzero(case.seq_lens > 0)
    flat = Case(
        **{name: getattr(case, name) for name in DECODE_ARGS},
        query_start_loc=np.arange(len(real) + 1),
        custom_masks=None,
        causal=True,
    )
    flat.query = case.query[real]
    flat.block_table = case.block_table[real]
    flat.seq_lens = case.seq_lens[real]
    return flat, real


def dense_decode(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The dense oracle for every request (zeros for padding), and the tolerance."""
    out = np.zeros(case.query.shape)
    tol = np.full(case.query.shape, TOL[case.query.dtype.name])
    flat, real = as_flattened_batch(case)
    if len(real):
        out[real], tol[real] = dense_attention(flat)
    return out, tol


@spec.prop("paged_decode_attention", decode_cases())
def decode_equals_dense_masked_attention(ctx: Ctx, case: Case) -> None:
    """Each request's token (at position seq_lens[r] - 1) gets the dense float64 attention
    over its sequence (causal, windowed, soft-capped, ALiBi-biased) within
    TOL[dtype] * (1 + max |v|); padding requests (seq_len 0) get exactly 0."""
    out = decode(ctx, case)
    want, tol = dense_decode(case)
    assert_within(out, want, tol, "decode attention output")
    pad = out[case.seq_lens == 0]
    checks.assert_equal(pad, np.zeros(pad.shape, pad.dtype), what="padding requests")


@spec.prop("paged_decode_attention", decode_cases(), uses=("paged_attention",))
def agrees_with_paged_attention(ctx: Ctx, case: Case) -> None:
    """On the real requests, the output equals `paged_attention` of the same requests as a
    flattened batch of single-token queries (query_start_loc = 0, 1, ..., n), within the
    oracle's tolerance: the two ops are one contract on decode batches."""
    flat, real = as_flattened_batch(case)
    if not len(real):
        return
    got = decode(ctx, case)[real]
    want = attend(ctx, flat)
    _, tol = dense_attention(flat)
    assert_within(got, want, 2 * tol, "decode vs paged_attention")


@spec.prop("paged_decode_attention", st.tuples(decode_cases(), st.randoms(use_true_random=False)))
def ignores_blocks_past_each_sequence(ctx: Ctx, pair: Any) -> None:
    """Table entries past a request's last block, and every cache block no request uses,
    may hold anything: rewriting them leaves the output unchanged (to the oracle's
    tolerance). This is what lets a graph gather whole static-width table rows."""
    case, rnd = pair
    n_blocks, bs = case.key_cache.shape[:2]
    table = case.block_table.copy()
    used = set()
    for r, s in enumerate(case.seq_lens.tolist()):
        u = -(-s // bs)
        used.update(table[r, :u].tolist())
        for j in range(u, table.shape[1]):
            table[r, j] = rnd.randrange(n_blocks)
    kc, vc = case.key_cache.copy(), case.value_cache.copy()
    for b in set(range(n_blocks)) - used:
        if case.kv_cache_dtype == "auto":
            kc[b], vc[b] = rnd.uniform(-50, 50), rnd.uniform(-50, 50)
        else:  # finite codes (an unused NaN would reach the output through 0 * NaN)
            kc[b], vc[b] = rnd.randrange(0x70), rnd.randrange(0x70) | 0x80
    want = decode(ctx, case)
    got = decode(ctx, case, block_table=table, key_cache=kc, value_cache=vc)
    _, tol = dense_decode(case)
    assert_within(got, want, tol, "output after rewriting unused blocks")


@spec.prop("paged_decode_attention", decode_cases(), name="returns_documented_types")
def decode_returns_documented_types(ctx: Ctx, case: Case) -> None:
    """A new array like query (library, device, dtype, shape)."""
    args = [ctx.convert(getattr(case, a)) for a in DECODE_ARGS]
    out = ctx.fn("paged_decode_attention")(*args)
    check_like_input(out, args[0])
    assert out is not args[0], "returned the query object itself"


@spec.prop("paged_decode_attention", decode_cases(), name="latent_cache_as_keys_and_values")
def decode_latent_cache_as_keys_and_values(ctx: Ctx, case: Case) -> None:
    """One array passed as both key_cache and value_cache (MLA's latent cache, the decode
    path a CUDA graph captures) gives the dense oracle's result, padding requests zeros."""
    case = latent_case(case)
    shared = ctx.convert(case.key_cache)
    args = [ctx.convert(getattr(case, a)) for a in DECODE_ARGS]
    args[1] = args[2] = shared
    got = to_numpy(ctx.fn("paged_decode_attention")(*args))
    want, tol = dense_decode(case)
    assert_within(got, want, tol, "decode attention over one cache as keys and values")
    checks.assert_equal(to_numpy(shared), case.key_cache, what="the shared cache after the call")


def decode_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    q, kc = case.query, case.key_cache
    lens, table = case.seq_lens, case.block_table
    past, negative = lens.copy(), lens.copy()
    past[0] = table.shape[1] * kc.shape[1] + 1
    negative[-1] = -1
    options: list[tuple[str, dict[str, Any], type]] = [
        ("integer query", {"query": np.zeros(q.shape, np.int64)}, TypeError),
        ("float seq_lens", {"seq_lens": lens.astype(np.float64)}, TypeError),
        ("float block_table", {"block_table": table.astype(np.float64)}, TypeError),
        ("3-D key_cache", {"key_cache": kc[0]}, ValueError),
        ("seq_lens one longer", {"seq_lens": np.append(lens, 1).astype(lens.dtype)}, ValueError),
        ("block_table one row short", {"block_table": table[:-1]}, ValueError),
        ("1-D block_table", {"block_table": table[:, 0]}, ValueError),
        ("a seq_len past the block table", {"seq_lens": past}, ValueError),
        ("a negative seq_len", {"seq_lens": negative}, ValueError),
    ]
    return with_changes(case, DECODE_ARGS, options)


def _decode_compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    _, tol = dense_decode(case)
    assert_within(got, ref, tol, "decode attention output")


add_does_not_modify_inputs(spec, SHAPES["paged_decode_attention"], decode_cases())
add_rejects_invalid_input(
    spec, SHAPES["paged_decode_attention"], error_variants(decode_cases(), decode_errors)
)
add_matches_reference(
    spec,
    SHAPES["paged_decode_attention"],
    decode_cases(),
    _decode_compare,
    "The reference's output within TOL[dtype] * (1 + max |v| of the request).",
)
