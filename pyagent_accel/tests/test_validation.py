"""The validation layer of the sampling wrappers: which error wins, calls by keyword.

The reference checks the logits (type, dtype, shape, then the rows: NaN/+inf, all
-inf) before any other argument, and the other arguments in its own order. The
accelerator checks the rows in Rust, fused with the op, and runs them first only when
a later argument fails; these tests put a bad row next to every bad argument, and two
bad arguments side by side, and require the reference's exception class and message.
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
from pyagent_accel.ops import sampling as A

from pyagent_ref.ops import sampling as R

try:
    import torch
except ImportError:  # the numpy cases still run
    torch = None

LIBS = ["numpy", "torch"] if torch is not None else ["numpy"]

X = np.zeros((2, 4), np.float32)
X_NAN = X.copy()
X_NAN[1, 2] = np.nan
X_MASKED = X.copy()
X_MASKED[0, :] = -np.inf
LOGITS = {"finite": X, "nan row": X_NAN, "masked row": X_MASKED}

# Valid arguments after the logits (batch 2, vocab 4), by op.
GOOD = {
    "apply_temperature": {"temperature": [1.0, 0.5]},
    "apply_top_k": {"k": [1, 2]},
    "apply_top_p": {"p": [0.5, 1.0]},
    "apply_min_p": {"min_p": [0.1, 0.0]},
    "apply_penalties": {
        "prompt_ids": [[1], [2]],
        "output_ids": [[1], [-1]],
        "repetition_penalty": [1.0, 1.2],
        "frequency_penalty": [0.0, 0.5],
        "presence_penalty": [0.0, 0.1],
    },
    "apply_logit_bias": {"token_ids": [[1], [2]], "bias": [[1.0], [2.0]]},
    "log_softmax": {},
    "topk_logprobs": {"num": 2, "sampled": [0, 1]},
    "sample": {"temperature": [1.0, 0.0], "seeds": [1, 2], "positions": [0, 3]},
}

# Values the reference rejects, by parameter name: a dtype, a shape, a range.
BAD = {
    "temperature": [["a", "b"], [1.0], [1.0, -1.0], [np.nan, 1.0]],
    "k": [[1.5, 2.0], [1]],
    "p": [np.array([True, False]), [0.0, 1.0]],
    "min_p": [np.array(["a", "b"]), [-0.1, 1.0]],
    "prompt_ids": [[[1]], [[1], [4]], np.array([[1.0], [2.0]])],
    "output_ids": [[[1], [2], [3]], [[9], [0]]],
    "repetition_penalty": [[1.0, 0.0], [1.0]],
    "frequency_penalty": [[0.0, np.inf], ["x", 0.0]],
    "presence_penalty": [[np.nan, 0.0]],
    "token_ids": [[[1], [7]], np.array([[1.0], [2.0]])],
    "bias": [[[1.0], [np.inf]], [[1.0, 2.0], [1.0, 2.0]], np.array([["a"], ["b"]])],
    "num": [1.0, True, 5, -1],
    "sampled": [[0, 4], [-1, 0], [0.5, 0]],
    "seeds": [[1.0, 2.0], [1]],
    "positions": [[0, -1], [0], np.array([0.0, 1.0])],
}


def as_lib(x, lib):
    if lib == "torch" and isinstance(x, np.ndarray) and x.dtype.kind in "fiub":
        return torch.from_numpy(x)
    return x


def outcome(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None


def calls(name, bad_count):
    """(logits kind, arguments) with `bad_count` arguments replaced by bad values."""
    params = list(GOOD[name])
    for kind, logits in LOGITS.items():
        for chosen in itertools.combinations(params, bad_count):
            for values in itertools.product(*(BAD[p] for p in chosen)):
                args = dict(GOOD[name]) | dict(zip(chosen, values, strict=True))
                yield kind, [logits] + [args[p] for p in params]


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("bad_count", [0, 1, 2])
@pytest.mark.parametrize("name", list(GOOD))
def test_the_reference_error_wins(name, bad_count, lib):
    for kind, args in calls(name, bad_count):
        args = [as_lib(a, lib) for a in args]
        ref, acc = outcome(getattr(R, name), *args), outcome(getattr(A, name), *args)
        assert ref == acc, f"{name} ({kind} logits, {args[1:]}): ref {ref} vs accel {acc}"


# One valid call of every op, positional.
VALID = {name: [X, *good.values()] for name, good in GOOD.items()}
VALID["philox_uniform"] = [np.array([1, -2]), [0, 3], 5]


def results(out):
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("name", list(VALID))
def test_keyword_arguments_bind_like_the_reference(name):
    params = list(inspect.signature(getattr(R, name)).parameters)
    args = VALID[name]
    want = results(getattr(R, name)(*args))
    by_keyword = dict(zip(params, args, strict=True))
    rest = {p: a for p, a in by_keyword.items() if p != params[0]}
    for got in (getattr(A, name)(**by_keyword), getattr(A, name)(args[0], **rest)):
        for w, g in zip(want, results(got), strict=True):
            np.testing.assert_array_equal(w, g)


@pytest.mark.parametrize("name", list(VALID))
def test_wrong_arity_is_a_type_error(name):
    args = VALID[name]
    for bad in (args[:-1], [*args, 1]):
        with pytest.raises(TypeError):
            getattr(R, name)(*bad)
        with pytest.raises(TypeError):
            getattr(A, name)(*bad)
    with pytest.raises(TypeError):
        getattr(A, name)(*args, unknown=1)


@pytest.mark.parametrize("name", A.__all__)
def test_ops_are_native_wrappers_that_name_their_contract(name):
    op = getattr(A, name)
    assert op.__module__ == "pyagent_accel.ops.sampling"
    assert op.__name__ == op.__qualname__ == name
    assert inspect.unwrap(op) is op  # not a wrapper of the reference function
    assert f"`pyagent_ref.ops.sampling.{name}`" in op.__doc__
    assert list(inspect.signature(op).parameters) == list(
        inspect.signature(getattr(R, name)).parameters
    )
