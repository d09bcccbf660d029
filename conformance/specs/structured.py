"""Properties of `ops.structured` (see `pyagent_ref/ops/structured.py` for the contract).

`apply_token_bitmask` is discrete: every entry of the result is either the input logit,
bit for bit, or -inf, so every check is exact. The oracle reads the bitmask with numpy's
`unpackbits` over the little-endian bytes of each word (bit j of word w is bit j % 8 of
byte 4 * w + j // 8), independently of the reference's shifts.

Inputs: logits float16, float32 or float64 of shape (1-5, 1-100), finite values with
ties and -inf; bitmasks int32 with the words that catch layout bugs (0, -1, only the sign
bit, only bit 0, random words), ceil(vocab / 32) words wide, or one word narrower, one
wider, or none. The edges have their own properties: the structural ones (row
independence, strides, inputs untouched, errors) draw `TYPICAL` cases, float16 or float32
logits (xgrammar's kernel rejects float64) under a mask that covers the vocabulary, so
that an implementation's rule at an edge does not hide whether it gets the structure
right; the oracle and the differential check draw every case.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

import pyagent_ref.ops.structured  # noqa: F401 - binds pyagent_ref.ops.structured for the reference

from .. import checks, contract
from ..core import Case, Ctx, Spec, to_numpy
from ._common import (
    NEG_INF,
    add_does_not_modify_inputs,
    add_matches_reference,
    add_rejects_invalid_input,
    check_like_input,
    error_variants,
    reference_shapes,
)

OPS = contract.names("structured")

spec = Spec("structured", OPS)

SHAPES = reference_shapes("structured")
APPLY = SHAPES["apply_token_bitmask"]

DTYPES = (np.float16, np.float32, np.float64)
COMMON_DTYPES = (np.float16, np.float32)
#: Words that tell the layouts apart: none, all, the sign bit alone, bit 0 alone.
WORDS = (0, -1, -(2**31), 1)


def words_for(vocab: int) -> int:
    """The bitmask width a vocabulary of `vocab` tokens needs: ceil(vocab / 32)."""
    return -(-vocab // 32)


# --- strategies -----------------------------------------------------------------------------


def float_logits(dtype: Any, shape: tuple[int, int], non_finite: bool = False) -> Any:
    """(batch, vocab) logits of `dtype`: finite values with ties and -inf; with
    `non_finite`, NaN and +inf too."""
    width = np.dtype(dtype).itemsize * 8
    options = [
        st.sampled_from((0.0, 1.0, -1.0, 2.5)),
        st.floats(-60, 60, width=width),
        st.just(NEG_INF),
    ]
    if non_finite:
        options += [st.just(float("nan")), st.just(float("inf"))]
    return hnp.arrays(np.dtype(dtype), shape, elements=st.one_of(options))


def bitmasks(batch: int, words: int) -> Any:
    """(batch, words) int32 bitmasks made of the telling words and random ones."""
    word = st.one_of(st.sampled_from(WORDS), st.integers(-(2**31), 2**31 - 1))
    return hnp.arrays(np.int32, (batch, words), elements=word)


@st.composite
def bitmask_cases(
    draw: Any, width: str = "any", dtypes: tuple[Any, ...] = DTYPES, non_finite: bool = False
) -> Case:
    """width: "exact" (ceil(vocab / 32) words), "covering" (exact or one word wider),
    "narrow" (logits wider than the mask's 32 * words tokens), or "any" (exact, one word
    wider, one narrower, or no word)."""
    dtype = draw(st.sampled_from(dtypes))
    batch, vocab = draw(st.integers(1, 5)), draw(st.integers(1, 100))
    need = words_for(vocab)
    if width == "exact":
        words = need
    elif width == "covering":
        words = draw(st.sampled_from((need, need + 1)))
    elif width == "narrow":
        vocab = max(vocab, 33)
        words = draw(st.integers(0, words_for(vocab) - 1))
    else:
        words = draw(st.sampled_from((need, need, need, need + 1, need - 1, 0)))
    logits = draw(float_logits(dtype, (batch, vocab), non_finite))
    return Case(logits=logits, bitmask=draw(bitmasks(batch, words)))


TYPICAL = bitmask_cases(width="covering", dtypes=COMMON_DTYPES)


@st.composite
def single_bit_cases(draw: Any) -> Case:
    """One row allowing exactly one token t (t < vocab), the mask ceil(vocab / 32) wide."""
    vocab = draw(st.integers(1, 100))
    token = draw(st.integers(0, vocab - 1))
    mask = np.zeros((1, words_for(vocab)), np.uint32)
    mask[0, token // 32] = np.uint32(1) << np.uint32(token % 32)
    logits = np.arange(vocab, dtype=draw(st.sampled_from(COMMON_DTYPES)))[None, :]
    return Case(logits=logits, bitmask=mask.view(np.int32), token=token)


# --- the oracle -----------------------------------------------------------------------------


def allowed_tokens(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """(batch, vocab) booleans: token i of row b is allowed iff i < 32 * words and bit i % 32
    of bitmask[b, i // 32] is set."""
    bits = np.unpackbits(bitmask.astype("<i4").view(np.uint8), axis=1, bitorder="little")
    allowed = np.zeros((bitmask.shape[0], vocab), bool)
    covered = min(vocab, bits.shape[1])
    allowed[:, :covered] = bits[:, :covered] == 1
    return allowed


def expected(case: Case) -> np.ndarray:
    return np.where(allowed_tokens(case.bitmask, case.logits.shape[1]), case.logits, NEG_INF)


def call(ctx: Ctx, case: Case) -> Any:
    return ctx.call("apply_token_bitmask", case.logits, case.bitmask)


# --- properties -----------------------------------------------------------------------------


@spec.prop("apply_token_bitmask", bitmask_cases())
def keeps_exactly_the_allowed_tokens(ctx: Ctx, case: Case) -> None:
    """out[b, i] is logits[b, i], unchanged, where bit i % 32 of word i // 32 of row b is set
    (and i < 32 * words), and -inf everywhere else."""
    out = call(ctx, case)
    checks.assert_equal(out, expected(case), what="masked logits")


@spec.prop("apply_token_bitmask", single_bit_cases())
def bit_j_of_word_w_is_token_32w_plus_j(ctx: Ctx, case: Case) -> None:
    """A mask with the single bit j of word w set (least significant bit first) keeps token
    32 * w + j and nothing else."""
    out = call(ctx, case)
    kept = np.flatnonzero(~np.isneginf(out[0]))
    assert kept.tolist() == [case.token], f"kept tokens {kept.tolist()}, expected [{case.token}]"


@spec.prop("apply_token_bitmask", TYPICAL)
def rows_are_independent(ctx: Ctx, case: Case) -> None:
    """Each row of the result depends only on its own logits row and bitmask row: the batch
    gives the rows computed one at a time."""
    out = call(ctx, case)
    for b in range(case.logits.shape[0]):
        alone = ctx.call("apply_token_bitmask", case.logits[b : b + 1], case.bitmask[b : b + 1])
        checks.assert_equal(out[b : b + 1], alone, what=f"row {b}")


@spec.prop("apply_token_bitmask", bitmask_cases(width="narrow", dtypes=COMMON_DTYPES))
def masks_tokens_past_the_mask(ctx: Ctx, case: Case) -> None:
    """Logits wider than the mask: every token i >= 32 * words is masked (a bitmask allows
    only the tokens it describes)."""
    out = call(ctx, case)
    covered = 32 * case.bitmask.shape[1]
    beyond = out[:, covered:]
    assert np.all(np.isneginf(beyond)), f"a token >= {covered} is kept: {beyond}"


@spec.prop("apply_token_bitmask", TYPICAL)
def ignores_bits_past_the_vocab(ctx: Ctx, case: Case) -> None:
    """The bits of tokens >= vocab (the tail of the last word, extra words) do not matter:
    setting or clearing all of them gives the same result."""
    vocab = case.logits.shape[1]
    bits = np.unpackbits(case.bitmask.astype("<i4").view(np.uint8), axis=1, bitorder="little")
    results = []
    for fill in (0, 1):
        flipped = bits.copy()
        flipped[:, vocab:] = fill
        mask = np.packbits(flipped, axis=1, bitorder="little").view("<i4").astype(np.int32)
        results.append(ctx.call("apply_token_bitmask", case.logits, mask))
    checks.assert_equal(results[1], results[0], what="result with the bits past the vocab set")


@spec.prop(
    "apply_token_bitmask",
    bitmask_cases(width="covering", dtypes=COMMON_DTYPES, non_finite=True),
)
def does_not_read_the_values(ctx: Ctx, case: Case) -> None:
    """NaN and +inf logits are no error: they are kept where allowed and masked elsewhere."""
    out = call(ctx, case)
    checks.assert_equal(out, expected(case), what="masked logits")


@spec.prop("apply_token_bitmask", bitmask_cases(width="covering"))
def returns_array_like_logits(ctx: Ctx, case: Case) -> None:
    """A new array of the logits' library, device, dtype and shape (not the input object)."""
    logits, bitmask = ctx.convert(case.logits), ctx.convert(case.bitmask)
    out = ctx.fn("apply_token_bitmask")(logits, bitmask)
    check_like_input(out, logits)
    assert out is not logits, "returned the input object itself, not a new array"


@spec.prop("apply_token_bitmask", TYPICAL)
def accepts_strided_input(ctx: Ctx, case: Case) -> None:
    """Non-contiguous logits and bitmasks (padded rows, every other column, column-major)
    give the result of contiguous ones: the spec does not restrict the memory layout."""
    want = expected(case)
    for layout in ctx.LAYOUTS:
        logits, bitmask = ctx.strided(case.logits, layout), ctx.strided(case.bitmask, layout)
        got = to_numpy(ctx.fn("apply_token_bitmask")(logits, bitmask))
        checks.assert_equal(got, want, what=f"result for {layout} inputs")


def bitmask_errors(case: Case) -> list[tuple[str, tuple[Any, ...], type]]:
    x, m = case.logits, case.bitmask
    return [
        ("integer logits", (np.zeros(x.shape, np.int64), m), TypeError),
        ("logits as a list", (x.tolist(), m), TypeError),
        ("logits of shape (vocab,)", (x[0], m), ValueError),
        ("logits of shape (1, batch, vocab)", (x[None], m), ValueError),
        ("an int64 bitmask", (x, m.astype(np.int64)), TypeError),
        ("a uint32 bitmask", (x, m.view(np.uint32)), TypeError),
        ("a boolean bitmask", (x, m != 0), TypeError),
        ("a float32 bitmask", (x, m.astype(np.float32)), TypeError),
        ("a bitmask as a list", (x, m.tolist()), TypeError),
        ("a bitmask of shape (words,)", (x, m[0]), ValueError),
        ("a bitmask of shape (1, batch, words)", (x, m[None]), ValueError),
        ("a bitmask with one row more", (x, np.concatenate([m, m[:1]])), ValueError),
    ]


def _compare(case: Case, got: Any, ref: Any) -> None:
    assert got.dtype == ref.dtype, f"dtype {got.dtype}, the reference's {ref.dtype}"
    checks.assert_equal(got, ref, what="masked logits")


add_does_not_modify_inputs(spec, APPLY, TYPICAL)
add_rejects_invalid_input(spec, APPLY, error_variants(TYPICAL, bitmask_errors))
add_matches_reference(
    spec, APPLY, bitmask_cases(), _compare, "The reference's result, exactly (same dtype)."
)
