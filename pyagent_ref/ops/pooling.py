"""Pooling: per-request vectors from the hidden states of a flattened batch.

An embedding or classification model does not sample: each request's final hidden
states become one vector (or one per token) that is the answer. The batch is the one the
model ran on: request r owns the rows [query_start_loc[r], query_start_loc[r + 1]) of
`hidden` (as in `ops.attention`), rows past query_start_loc[-1] are padding.

- `pool`: one row per request: its last token's state (a causal model has read the
  whole prompt into it), its first ([CLS]: BERT's classification token), the mean of
  its tokens (sentence-transformers' default), or "all": every token's row.
- `normalize`: each row scaled to unit L2 norm, optionally after keeping its first
  `dimensions` features (a Matryoshka embedding: trained so that a prefix is an
  embedding too, renormalised once truncated).
- `classify`: a classification head's scores as probabilities: softmax over the labels
  (several labels), sigmoid (one score per label: a cross-encoder's relevance), or the
  raw scores.
- `cosine_similarity`: row-by-row cosine of two embeddings (a bi-encoder's score).

Computation is in float32 (float64 for float64 input), results in that dtype.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from ._arrays import ANY_FLOAT_DTYPE_NAMES, can_read_values, dtype_name, first_bad_row, namespace

__all__ = ["pool", "normalize", "classify", "cosine_similarity"]

POOLING_TYPES = ("last", "cls", "mean", "all")
ACTIVATIONS = ("softmax", "sigmoid", "none")
NORM_EPS = 1e-12  # a row of smaller norm is divided by this (torch's F.normalize)
COSINE_EPS = 1e-8  # each norm is at least this in a cosine (torch's F.cosine_similarity)


# --- validation -----------------------------------------------------------------------------


def _rows(x: Any, name: str) -> Any:
    """The namespace of a 2-D float array `x`; TypeError/ValueError naming it."""
    xp = namespace(x, name)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (rows, features), got shape {tuple(x.shape)}")
    return xp


def _compute(xp: Any, x: Any) -> Any:
    """x in its compute dtype: float64 for float64, float32 otherwise."""
    return xp.astype(x, xp.float64 if dtype_name(x) == "float64" else xp.float32)


def _spans(query_start_loc: Any, num_tokens: int) -> list[tuple[int, int]]:
    """[(start, end)] of every request, after checking query_start_loc."""
    namespace(query_start_loc, "query_start_loc")
    if "int" not in dtype_name(query_start_loc):
        raise TypeError(
            f"query_start_loc must be integers, got dtype {dtype_name(query_start_loc)}"
        )
    if query_start_loc.ndim != 1 or query_start_loc.shape[0] < 1:
        raise ValueError(
            f"query_start_loc must have shape (num_reqs + 1,), got {tuple(query_start_loc.shape)}"
        )
    qsl = [int(v) for v in query_start_loc]
    if qsl[0] < 0 or qsl[-1] > num_tokens:
        raise ValueError(
            f"query_start_loc must lie in [0, {num_tokens}] (the rows of hidden), "
            f"got {qsl[0]} .. {qsl[-1]}"
        )
    for r in range(len(qsl) - 1):
        if qsl[r + 1] <= qsl[r]:
            raise ValueError(
                f"request {r} has no tokens to pool: query_start_loc[{r}] = {qsl[r]}, "
                f"query_start_loc[{r + 1}] = {qsl[r + 1]} (they must increase)"
            )
    return list(zip(qsl[:-1], qsl[1:], strict=True))


# --- the ops --------------------------------------------------------------------------------


def pool(hidden: Any, query_start_loc: Any, pooling_type: str) -> Any:
    """Each request's hidden states reduced as `pooling_type` says.

    For request r with rows [s, e) = [query_start_loc[r], query_start_loc[r + 1]):
        "last": hidden[e - 1]
        "cls":  hidden[s]
        "mean": the sum of hidden[s:e] over the rows, divided by e - s, in the compute
                dtype (float32; float64 for float64 hidden)
        "all":  hidden[s:e], every row (the requests' rows one after another)
    Rows outside every span (padding) are never read. A request's result depends only
    on its own rows, never on the rest of the batch.

    Args:
        hidden: float array (float16, bfloat16, float32 or float64), shape
            (num_tokens, hidden_size).
        query_start_loc: integer array, shape (num_reqs + 1,), strictly increasing (every
            request has at least one row), within [0, num_tokens]; num_reqs may be 0.
        pooling_type: one of POOLING_TYPES.
    Returns:
        A new array in hidden's library and device, float32 (float64 for float64
        hidden): shape (num_reqs, hidden_size), or (total rows of the spans,
        hidden_size) for "all".
    Raises:
        TypeError: non-float hidden, non-integer query_start_loc.
        ValueError: hidden not 2-D, query_start_loc not 1-D, outside [0, num_tokens] or
            not strictly increasing (the message names the empty request), an unknown
            pooling_type.
    """
    xp = _rows(hidden, "hidden")
    if pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {pooling_type!r}")
    spans = _spans(query_start_loc, hidden.shape[0])
    h = _compute(xp, hidden)
    if not spans:
        return xp.zeros((0, hidden.shape[1]), dtype=h.dtype, device=device(hidden))
    if pooling_type == "all":
        return xp.concat([h[s:e, :] for s, e in spans], axis=0)
    if pooling_type == "mean":
        return xp.stack([xp.sum(h[s:e, :], axis=0) / (e - s) for s, e in spans])
    index = [e - 1 if pooling_type == "last" else s for s, e in spans]
    return xp.take(h, xp.asarray(index, dtype=xp.int64, device=device(hidden)), axis=0)


def normalize(x: Any, dimensions: int | None = None) -> Any:
    """Each row scaled to unit L2 norm, after keeping its first `dimensions` features.

    y = x[:, :dimensions] (x itself when dimensions is None), then for each row
    y[i] / max(||y[i]||, 1e-12), computed in float32 (float64 for float64 x). A zero row
    stays zero. With `dimensions`, this is a Matryoshka embedding: truncated first, then
    renormalised (not the prefix of the normalised full row).

    Args:
        x: float array (float16, bfloat16, float32 or float64), shape (rows, features).
        dimensions: None, or an int in [1, features].
    Returns:
        A new array of shape (rows, dimensions or features), float32 (float64 for
        float64 x), in x's library and device.
    Raises:
        TypeError: non-float x, a dimensions that is not an int.
        ValueError: x not 2-D, dimensions outside [1, features].
    """
    xp = _rows(x, "x")
    features = x.shape[1]
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise TypeError(f"dimensions must be an int or None, got {dimensions!r}")
        if not 1 <= dimensions <= features:
            raise ValueError(
                f"dimensions must be in [1, {features}] (the embedding's size), got {dimensions}"
            )
    y = _compute(xp, x)[:, : features if dimensions is None else dimensions]
    norms = xp.sqrt(xp.sum(y * y, axis=1, keepdims=True))
    return y / xp.clip(norms, NORM_EPS, None)


def classify(logits: Any, activation: str = "softmax") -> Any:
    """A classification head's scores as the model's outputs.

    "softmax": each row becomes exp(x - max) / sum(exp(x - max)), a distribution over
    the labels; "sigmoid": each entry becomes 1 / (1 + exp(-x)), a probability per label
    (a cross-encoder's single relevance score); "none": the scores themselves. Computed
    in float32 (float64 for float64 logits).

    Args:
        logits: float array (float16, bfloat16, float32 or float64), shape
            (rows, labels), labels >= 1, every entry finite.
        activation: one of ACTIVATIONS.
    Returns:
        A new array like logits, float32 (float64 for float64 logits).
    Raises:
        TypeError: non-float logits.
        ValueError: logits not 2-D or without labels, a NaN or infinite entry (the
            message names the row), an unknown activation.
    """
    xp = _rows(logits, "logits")
    if logits.shape[1] == 0:
        raise ValueError(f"logits must have at least one label, got shape {tuple(logits.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    x = _compute(xp, logits)
    if can_read_values(logits):
        row = first_bad_row(xp, xp.any(~xp.isfinite(x), axis=1))
        if row is not None:
            raise ValueError(f"logits row {row} contains NaN or inf")
    if activation == "softmax":
        e = xp.exp(x - xp.max(x, axis=1, keepdims=True))
        return e / xp.sum(e, axis=1, keepdims=True)
    if activation == "sigmoid":
        tail = xp.exp(-xp.abs(x))  # never overflows: sigmoid(x) = 1 / (1 + exp(-x))
        return xp.where(x >= 0, 1.0 / (1.0 + tail), tail / (1.0 + tail))
    return x


def cosine_similarity(a: Any, b: Any) -> Any:
    """The cosine of the angle between a[i] and b[i], for every row i.

    cos[i] = (a[i] . b[i]) / (max(||a[i]||, 1e-8) * max(||b[i]||, 1e-8)), computed in
    float32 (float64 when both are float64): in [-1, 1] up to rounding, 0 when a row is
    zero.

    Args:
        a: float array (float16, bfloat16, float32 or float64), shape (rows, features).
        b: float array of a's shape (any float dtype).
    Returns:
        A new array of shape (rows,), float32 (float64 when a and b are float64), in a's
        library and device.
    Raises:
        TypeError: a non-float a or b.
        ValueError: a or b not 2-D, shapes that differ.
    """
    xp = _rows(a, "a")
    _rows(b, "b")
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"a and b must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    both64 = dtype_name(a) == "float64" and dtype_name(b) == "float64"
    compute = xp.float64 if both64 else xp.float32
    x, y = xp.astype(a, compute), xp.astype(b, compute)
    na = xp.clip(xp.sqrt(xp.sum(x * x, axis=1)), COSINE_EPS, None)
    nb = xp.clip(xp.sqrt(xp.sum(y * y, axis=1)), COSINE_EPS, None)
    return xp.sum(x * y, axis=1) / (na * nb)
