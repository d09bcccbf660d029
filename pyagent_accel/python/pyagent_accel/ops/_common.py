"""The validation layer of the ops wrappers (private): arguments converted and checked
as `pyagent_ref.ops` converts and checks them, the float-array helpers of layers, rope,
attention and structured (`FLOAT_KINDS`, `array_library`, `float_view`, `float_as`, `wrap_float`),
the builder of the sampling wrappers, and the checks of spec_decode's flattened layout.

The checks mirror `pyagent_ref.ops._arrays` and the ops step for step (same order,
exception classes and messages) for the two array libraries pyagent_accel supports:
numpy arrays and torch CPU tensors. torch is never imported here: a value is a tensor
only if torch is already loaded and the value is an instance of `torch.Tensor`.

Main arrays (logits, logprobs) are handed to Rust as zero-copy numpy views. Rows may
be strided (e.g. `logits[:, :vocab]` of a padded array), but each row must be
contiguous: a hidden copy of a (batch, vocab) array would cost more than the op.
Per-row parameters and id arrays are small and are converted like the reference
converts them.

A sampling op is declared by `op(module, native, *steps)`: its native function (whose
signature is the op's) and the steps the reference takes on the other arguments, in
the reference's order: conversions (`Rows`, `TokenIds`, `Bias`, `Count`) and value
checks (`Values`). See `op` for the order of the row checks of the logits.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .. import _native

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I16 = np.dtype(np.int16)
I64 = np.dtype(np.int64)
FLOAT_DTYPE_NAMES = ("float32", "float64")
LOGITS_DTYPE = None  # `Rows` dtype: the dtype of the op's logits

Check = _native.Check

# --- arrays ---------------------------------------------------------------------------


def torch_module() -> Any:
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(x: Any) -> str:
    """'float32', 'int64', ... for a numpy array or torch tensor.

    Cached per dtype: `str()` of a numpy dtype costs microseconds, as much as an op on
    a decode batch.
    """
    dtype = x.dtype
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
        return name
    except TypeError:  # an unhashable dtype attribute
        return str(dtype).removeprefix("torch.")


def check_cpu(x: Any, name: str) -> None:
    """TypeError for a tensor that is not on the CPU (never copied silently).

    Asks `is_cpu` first: building the tensor's `device` object costs a microsecond.
    """
    if not x.is_cpu:
        raise TypeError(
            f"{name} is a torch tensor on device {x.device}; pyagent_accel works on CPU "
            f"arrays only (move it with .cpu(), or use pyagent_ref for {x.device.type} tensors)"
        )


def torch_dtype(dtype: np.dtype) -> Any:
    torch = sys.modules["torch"]
    return {F32: torch.float32, F64: torch.float64, I64: torch.int64}[dtype]


def tensor_to_numpy(t: Any) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (detached if it requires grad; a
    negative-bit view is resolved, a copy as torch must make)."""
    try:
        return t.numpy()
    except RuntimeError:  # requires grad, or a negative-bit view
        return t.detach().resolve_neg().numpy()


def native_array(arr: np.ndarray) -> np.ndarray:
    """`arr` as a contiguous, aligned array (copies only small, non-contiguous input)."""
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.array(arr, order="C", copy=True)
    return arr


def wrap(out: Any, torch_in: bool) -> Any:
    """A result array (or a tuple of them) in the input's library (torch: zero-copy)."""
    if isinstance(out, tuple):
        return tuple(wrap(o, torch_in) for o in out)
    if torch_in:
        return sys.modules["torch"].from_numpy(out)
    return out


# --- float arrays of any float dtype (layers, rope, attention, structured) ----------------
#
# Rust reads float16, float32 and float64 arrays as they are, and bfloat16 (which numpy
# lacks) as its bits in an int16 array; a bfloat16 result comes back as int16 bits too.

FLOAT_KINDS = ("float16", "bfloat16", "float32", "float64")


def array_library(x: Any, name: str) -> bool:
    """Whether `x` is a torch tensor (False: a numpy array or scalar); TypeError for
    anything else, with the message of the reference's `_arrays.namespace`."""
    if isinstance(x, (np.ndarray, np.generic)):
        return False
    if is_torch(x):
        return True
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def bitmask_library(bitmask: Any) -> bool:
    """The reference's `_arrays.check_token_bitmask` up to the row count (the library, the
    int32 dtype, two dimensions, with its messages); whether `bitmask` is a tensor."""
    torch_in = array_library(bitmask, "bitmask")
    kind = dtype_name(bitmask)
    if kind != "int32":
        raise TypeError(f"bitmask must be int32 (32 tokens per word), got dtype {kind}")
    if bitmask.ndim != 2:
        raise ValueError(
            f"bitmask must have shape (batch, words), got shape {tuple(bitmask.shape)}"
        )
    return torch_in


def float_view(x: Any, name: str, torch_in: bool) -> np.ndarray:
    """The numpy array Rust reads for a float array (dtype already checked), zero-copy
    and in its layout: a numpy array as is, a CPU tensor through `.numpy()`, bfloat16 (a
    tensor, or a numpy array of ml_dtypes' bfloat16) as its bits in an int16 array.
    TypeError for a tensor on another device."""
    if not torch_in:
        x = x if isinstance(x, np.ndarray) else np.asarray(x)
        return x.view(I16) if dtype_name(x) == "bfloat16" else x
    check_cpu(x, name)
    if x.requires_grad:
        x = x.detach()
    torch = sys.modules["torch"]
    if x.dtype is torch.bfloat16:
        x = x.view(torch.int16)
    return tensor_to_numpy(x)


def float_as(x: Any, kind: str) -> Any:
    """Float array `x` converted to the float dtype named `kind` in its own library (as
    the reference's `xp.astype`); `x` itself when it has that dtype. numpy has no
    bfloat16: a numpy array goes through torch for it."""
    if dtype_name(x) == kind:
        return x
    torch = sys.modules.get("torch")
    if is_torch(x):
        return x.to(getattr(torch, kind))
    if kind == "bfloat16":  # only reachable with a bfloat16 tensor, so torch is loaded
        return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)
    return np.asarray(x).astype(kind)


def wrap_float(out: np.ndarray, like: Any, torch_in: bool) -> Any:
    """The inverse of `float_view` for a Rust result of `like`'s dtype: numpy as is, else
    a zero-copy tensor; bfloat16 reinterpreted from its int16 bits as `like`'s dtype."""
    if torch_in:
        t = sys.modules["torch"].from_numpy(out)
        return t.view(like.dtype) if out.dtype == I16 else t
    return out.view(like.dtype) if out.dtype == I16 else out


# --- main arrays: the checks the reference makes first ----------------------------------


def logits_array(x: Any, name: str = "logits", any_layout: bool = False) -> tuple[np.ndarray, bool]:
    """The cheap checks of `check_logits`; returns (numpy view, input was torch).

    The row checks (NaN/+inf, all -inf) run in Rust, fused with each op. Rows must be
    contiguous unless `any_layout` (an op that reads a few rows, copying a strided one).
    """
    if isinstance(x, np.ndarray):
        torch_in = False
    elif is_torch(x):
        check_cpu(x, name)
        torch_in = True
    elif isinstance(x, np.generic):
        x, torch_in = np.asarray(x), False
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")
    kind = dtype_name(x)
    if kind not in FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be float32 or float64, got dtype {kind}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, vocab), got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must have a non-empty vocab axis, got shape {tuple(x.shape)}")
    arr = tensor_to_numpy(x) if torch_in else x
    if any_layout and arr.flags.aligned:
        return arr, torch_in
    rows_ok = arr.flags.c_contiguous or arr.strides[1] == arr.itemsize or arr.shape[1] == 1
    if not (rows_ok and arr.flags.aligned):
        raise ValueError(
            f"{name} must have contiguous rows (unit stride along the vocab axis), got "
            f"strides {arr.strides} for shape {tuple(arr.shape)}; pyagent_accel does not "
            "copy it silently (pass np.ascontiguousarray(x) or x.contiguous())"
        )
    return arr, torch_in


def check_logits(x: np.ndarray, name: str = "logits") -> None:
    """The row checks of `check_logits` (NaN/+inf, then all -inf), in Rust. Only error
    paths call it, so logits whose rows are strided are copied for it."""
    if not (x.flags.c_contiguous or x.strides[1] == x.itemsize or x.shape[1] == 1):
        x = np.ascontiguousarray(x)
    _native.check_logits(x, name)


def seeds_array(seeds: Any, name: str = "seeds") -> tuple[np.ndarray, bool]:
    """The checks `philox_uniform` makes on its seeds; returns (int64 array, input was torch)."""
    if isinstance(seeds, np.ndarray):
        torch_in = False
    elif is_torch(seeds):
        check_cpu(seeds, name)
        torch_in = True
    elif isinstance(seeds, np.generic):
        seeds, torch_in = np.asarray(seeds), False
    else:
        raise TypeError(
            f"{name} must be a numpy array or a torch tensor, got {type(seeds).__name__}"
        )
    kind = dtype_name(seeds)
    if "int" not in kind:
        raise TypeError(f"{name} must be an integer array, got dtype {kind}")
    if seeds.ndim != 1:
        raise ValueError(f"{name} must have shape (batch,), got shape {tuple(seeds.shape)}")
    if torch_in:
        arr = tensor_to_numpy(seeds.to(torch_dtype(I64)))
    else:
        arr = seeds.astype(I64, copy=False)
    return native_array(arr), torch_in


# --- the steps of an op, after its main array --------------------------------------------
#
# A step converts or checks one argument of a call in place: `args` is the list of the
# call's arguments, `at` maps a parameter name to its position, `x` is the main array
# (a numpy view) and `torch_in` says whether the inputs are torch tensors.


def row_param(value: Any, name: str, dtype: np.dtype, batch: int, torch_in: bool) -> np.ndarray:
    """A per-row parameter as `_arrays.row_param` converts it: a (batch,) numpy array of
    `dtype`, converted by the library of the main array (torch if `torch_in`)."""
    if (
        not torch_in
        and type(value) is np.ndarray
        and value.dtype == dtype
        and value.ndim == 1
        and value.shape[0] == batch
    ):
        return native_array(value)
    kind = dtype_name(value) if hasattr(value, "dtype") else None
    if kind is not None and not ("float" in kind or "int" in kind):
        raise TypeError(f"{name} must hold numbers, got dtype {kind}")
    if kind is not None and "float" in kind and dtype == I64:
        raise TypeError(f"{name} must hold integers, got dtype {kind}")
    if is_torch(value):
        check_cpu(value, name)
    try:
        if torch_in:
            torch = sys.modules["torch"]
            arr = torch.asarray(value, dtype=torch_dtype(dtype), device="cpu")
        else:
            arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise TypeError(f"{name} must be array-like of numbers, got {value!r}") from exc
    if arr.ndim != 1 or arr.shape[0] != batch:
        raise ValueError(
            f"{name} must have shape ({batch},) to match the batch, got shape {tuple(arr.shape)}"
        )
    return native_array(tensor_to_numpy(arr) if torch_in else arr)


@dataclass(frozen=True)
class Rows:
    """A per-row parameter (`row_param`) of `dtype` (LOGITS_DTYPE: the logits' dtype)."""

    name: str
    dtype: np.dtype | None

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        i = at[self.name]
        dtype = x.dtype if self.dtype is None else self.dtype
        args[i] = row_param(args[i], self.name, dtype, x.shape[0], torch_in)


@dataclass(frozen=True)
class TokenIds:
    """Token ids as `sampling._token_ids` converts them: padded (batch, n) int64 ids,
    each < vocab; entries < 0 are padding."""

    name: str

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        name, i, (batch, vocab) = self.name, at[self.name], x.shape
        ids = args[i]
        kind = dtype_name(ids) if hasattr(ids, "dtype") else "int"
        if "int" not in kind:
            raise TypeError(f"{name} must be an integer array, got dtype {kind}")
        if is_torch(ids):
            check_cpu(ids, name)
        if torch_in:
            torch = sys.modules["torch"]
            arr = torch.asarray(ids, dtype=torch.int64, device="cpu")
        else:
            arr = np.asarray(ids, dtype=I64)
        if arr.ndim != 2 or arr.shape[0] != batch:
            raise ValueError(f"{name} must have shape ({batch}, n), got shape {tuple(arr.shape)}")
        arr = native_array(tensor_to_numpy(arr) if torch_in else arr)
        if arr.size:
            top = int(arr.max())
            if top >= vocab:
                raise ValueError(f"{name} holds token id {top}, outside the vocab of {vocab}")
        args[i] = arr


@dataclass(frozen=True)
class PaddingLast:
    """`sampling._lengths` on converted ids: along the last axis, no token id (>= 0) may
    follow padding; the message names the first such index, as the reference's does."""

    name: str

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        ids = args[at[self.name]]
        valid = ids >= 0
        wrong = valid & (np.cumsum(~valid, axis=-1) > 0)
        if wrong.any():
            index = [int(i) for i in np.argwhere(wrong)[0]]
            raise ValueError(
                f"{self.name}{index} is a token id after padding (padding must come last), "
                f"got {int(ids[tuple(index)])}"
            )


@dataclass(frozen=True)
class Sequences:
    """Token sequences as `sampling.apply_bad_words` converts them: (batch, words,
    max_len) int64 ids, each < vocab; entries < 0 are padding."""

    name: str

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        name, i, (batch, vocab) = self.name, at[self.name], x.shape
        seqs = args[i]
        kind = dtype_name(seqs) if hasattr(seqs, "dtype") else "int"
        if "int" not in kind:
            raise TypeError(f"{name} must be an integer array, got dtype {kind}")
        if is_torch(seqs):
            check_cpu(seqs, name)
        if torch_in:
            torch = sys.modules["torch"]
            arr = tensor_to_numpy(torch.asarray(seqs, dtype=torch.int64, device="cpu"))
        else:
            arr = np.asarray(seqs, dtype=I64)
        if arr.ndim != 3 or arr.shape[0] != batch:
            raise ValueError(
                f"{name} must have shape ({batch}, words, max_len), got shape {tuple(arr.shape)}"
            )
        arr = native_array(arr)
        if arr.size:
            top = int(arr.max())
            if top >= vocab:
                raise ValueError(f"{name} holds token id {top}, outside the vocab of {vocab}")
        args[i] = arr


@dataclass(frozen=True)
class Bias:
    """Finite float64 weights, one per entry of the (converted) token ids `ids`."""

    name: str
    ids: str

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        name, i, ids = self.name, at[self.name], args[at[self.ids]]
        bias = args[i]
        kind = dtype_name(bias) if hasattr(bias, "dtype") else "float"
        if not ("float" in kind or "int" in kind):
            raise TypeError(f"{name} must hold numbers, got dtype {kind}")
        if is_torch(bias):
            check_cpu(bias, name)
        if torch_in:
            torch = sys.modules["torch"]
            b = tensor_to_numpy(torch.asarray(bias, dtype=torch.float64, device="cpu"))
        else:
            b = np.asarray(bias, dtype=F64)
        if tuple(b.shape) != tuple(ids.shape):
            raise ValueError(
                f"{name} must have the shape of {self.ids} {tuple(ids.shape)}, got {tuple(b.shape)}"
            )
        b = native_array(b)
        if _native.first_bad(b.reshape(-1), Check.FINITE) >= 0:
            raise ValueError(f"{name} must be finite, got a NaN or infinite entry")
        args[i] = b


@dataclass(frozen=True)
class Count:
    """A Python int (not a bool) >= 0, and <= the vocab if `at_most_vocab`."""

    name: str
    at_most_vocab: bool = False

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        name, num = self.name, args[at[self.name]]
        if isinstance(num, bool) or not isinstance(num, int):
            raise TypeError(f"{name} must be an int, got {num!r}")
        if self.at_most_vocab:
            vocab = x.shape[1]
            if not 0 <= num <= vocab:
                raise ValueError(f"{name} must be in [0, {vocab}], got {num}")
        elif num < 0:
            raise ValueError(f"{name} must be >= 0, got {num}")


def check_values(arr: np.ndarray, check: Any, message: str, vocab: int = 0) -> None:
    """ValueError `message`, formatted with row, value and vocab, for the first entry of
    the converted 1-D array `arr` that `check` (a _native.Check) rejects; `vocab` ends
    the range of Check.INDEX.

    The scan runs in Rust (`_native.first_bad`); the message is formatted here so
    values print exactly as the reference prints them (Python float/int repr).
    """
    row = _native.first_bad(arr, check, vocab)
    if row >= 0:
        value = int(arr[row]) if arr.dtype.kind == "i" else float(arr[row])
        raise ValueError(message.format(row=row, value=value, vocab=vocab))


@dataclass(frozen=True)
class Values:
    """`check_values` on a converted argument; the vocab is the length of the main
    array's last axis."""

    name: str
    check: Any  # a _native.Check
    message: str

    def __call__(self, args: list[Any], at: dict[str, int], x: np.ndarray, torch_in: bool) -> None:
        check_values(args[at[self.name]], self.check, self.message, x.shape[-1])


# --- speculative decoding: the flattened layout of `spec_decode` ----------------------------
#
# As `pyagent_ref.ops.spec_decode` checks them (its `_validated`, `_draft_probs` and the
# per-request parameters of `rejection_sample`), for target logits `x` already through
# `logits_array`. The checks the reference makes with its array library (conversions,
# printed values) use the logits' library here too.

INT64_MAX = 2**63 - 1


def int_vector(value: Any, name: str, torch_in: bool) -> np.ndarray:
    """Integers as int64 (any shape: the caller checks it), converted by the logits'
    library: TypeError for another dtype or for what the library cannot convert."""
    kind = dtype_name(value) if hasattr(value, "dtype") else "int"
    if "int" not in kind:
        raise TypeError(f"{name} must hold integers, got dtype {kind}")
    if is_torch(value):
        check_cpu(value, name)
    try:
        if torch_in:
            torch = sys.modules["torch"]
            arr = tensor_to_numpy(torch.asarray(value, dtype=torch.int64, device="cpu"))
        else:
            arr = np.asarray(value, dtype=I64)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise TypeError(f"{name} must be array-like of integers, got {value!r}") from exc
    return native_array(arr)


def draft_layout(
    x: np.ndarray, draft_token_ids: Any, num_draft_tokens: Any, torch_in: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(num_draft_tokens, draft_token_ids) as int64 vectors, checked against each other
    and against the (N + batch, vocab) target logits `x`."""
    counts = int_vector(num_draft_tokens, "num_draft_tokens", torch_in)
    drafts = int_vector(draft_token_ids, "draft_token_ids", torch_in)
    if counts.ndim != 1:
        raise ValueError(f"num_draft_tokens must have shape (batch,), got {tuple(counts.shape)}")
    check_values(counts, Check.NONNEG, "num_draft_tokens[{row}] must be >= 0, got {value}")
    batch, total = counts.shape[0], int(counts.sum())
    if drafts.ndim != 1 or drafts.shape[0] != total:
        raise ValueError(
            f"draft_token_ids must have shape ({total},) (the sum of num_draft_tokens), "
            f"got shape {tuple(drafts.shape)}"
        )
    if x.shape[0] != total + batch:
        raise ValueError(
            f"target_logits must have {total + batch} rows (one per draft and one per "
            f"request), got shape {tuple(x.shape)}"
        )
    message = "draft_token_ids[{row}] must be in [0, {vocab}), got {value}"
    check_values(drafts, Check.INDEX, message, x.shape[1])
    return counts, drafts


def draft_probs_array(draft_probs: Any, x: np.ndarray, batch: int, torch_in: bool) -> Any:
    """None, or q as the numpy array Rust reads (its own float dtype and layout): shape
    (N, vocab) for the (N + batch, vocab) target logits `x`, every entry finite and >= 0.
    The message of a bad row prints it as the reference does (float64, logits' library)."""
    if draft_probs is None:
        return None
    kind = dtype_name(draft_probs) if hasattr(draft_probs, "dtype") else type(draft_probs).__name__
    if kind not in FLOAT_DTYPE_NAMES:
        raise TypeError(f"draft_probs must be None or float32 or float64, got {kind}")
    q = float_view(draft_probs, "draft_probs", is_torch(draft_probs))
    shape = (x.shape[0] - batch, x.shape[1])
    if tuple(q.shape) != shape:
        raise ValueError(
            f"draft_probs must have shape {shape} (drafts, vocab), got {tuple(q.shape)}"
        )
    # min and max (NaN propagates) decide validity in two vectorised passes; only a bad q
    # is scanned for its first bad entry
    if q.size and not (q.min() >= 0 and q.max() < np.inf):
        row = _native.first_bad(np.ravel(q), Check.FINITE_NONNEG) // shape[1]
        if torch_in:
            torch = sys.modules["torch"]
            q64 = torch.asarray(draft_probs, dtype=torch.float64, device="cpu")
        else:
            q64 = np.asarray(draft_probs, dtype=F64)
        raise ValueError(f"draft_probs row {row} must be finite and >= 0, got {q64[row]}")
    return q


def request_scalars(
    counts: np.ndarray, temperature: Any, seeds: Any, positions: Any, torch_in: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(temperature float64, seeds int64, positions int64), one per request: temperatures
    finite and >= 0, positions leaving room for the request's k + 1 tokens."""
    batch = counts.shape[0]
    t = row_param(temperature, "temperature", F64, batch, torch_in)
    check_values(t, Check.FINITE_NONNEG, "temperature[{row}] must be finite and >= 0, got {value}")
    seed = row_param(seeds, "seeds", I64, batch, torch_in)
    pos = row_param(positions, "positions", I64, batch, torch_in)
    bad = np.flatnonzero((pos < 0) | (pos > INT64_MAX - counts))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"positions[{b}] must be in [0, 2**63 - 1 - num_draft_tokens[{b}]], got {int(pos[b])}"
        )
    return t, seed, pos


Step = Callable[[list[Any], dict[str, int], np.ndarray, bool], None]


class Main(NamedTuple):
    """How an op reads its first argument: `load(value, name)` gives (numpy array,
    input was torch); `row_checks(array, name)`, if any, are the reference's checks of
    its rows, which it makes before looking at the other arguments."""

    load: Callable[[Any, str], tuple[np.ndarray, bool]]
    row_checks: Callable[[np.ndarray, str], None] | None


LOGITS = Main(logits_array, check_logits)
SEEDS = Main(seeds_array, None)


def op(module: str, native: Any, *steps: Step, main: Main = LOGITS) -> Callable[..., Any]:
    """The public op of `module` that runs `native` (a `_native` function).

    The op has the native function's name and signature (the reference's, which the
    tests check). A call reads the first argument with `main.load`, runs `steps` in
    order on the others, then calls `native` with the main array and the converted
    arguments; results come back in the input's library.

    The reference checks the rows of the logits (NaN/+inf, all -inf) before any other
    argument. Here the native op checks them, fused with its work; so when a step
    fails, the row checks run first, and a bad row is the error reported, as in the
    reference.
    """
    signature = inspect.signature(native)
    params = tuple(signature.parameters)
    main_name, arity = params[0], len(params)
    at = {name: i for i, name in enumerate(params)}
    calls = tuple(step.__call__ for step in steps)  # bound methods: cheaper to call

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != arity:
            args = signature.bind(*args, **kwargs).args
        x, torch_in = main.load(args[0], main_name)
        values = list(args)
        values[0] = x
        try:
            for step in calls:
                step(values, at, x, torch_in)
        except Exception:
            if main.row_checks is not None:
                main.row_checks(x, main_name)
            raise
        return wrap(native(*values), torch_in)

    name = native.__name__
    contract = module.replace("pyagent_accel", "pyagent_ref", 1)
    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__doc__ = f"{native.__doc__}\n\nContract: `{contract}.{name}` (its docstring)."
    return call
