"""State-space layers: the causal convolution and the selective scans of Mamba models.

A Mamba layer (Gu and Dao 2023; Mamba-2, Dao and Gu 2024) mixes tokens without
attention: a causal depthwise convolution of width w, then a selective state-space
recurrence whose parameters depend on the token. For one channel (Mamba-1) or one head
(Mamba-2) with a hidden state h of N features per input feature:

    dt_t = softplus(dt_t + dt_bias)            the step size (when dt_softplus)
    h_t  = exp(dt_t A) h_{t-1} + dt_t x_t B_t    zero-order hold of A, Euler step of B
    y_t  = C_t . h_t + D x_t

A is negative (the state decays), B_t and C_t are the token's input and output maps,
D a skip connection. Mamba-1 has A per channel and state feature; Mamba-2 one scalar A
per head of P channels, which makes the recurrence a matrix of rank N: the SSD "dual"
form that `ssd_scan` evaluates by chunks.

Batches are flattened as attention's are: sequence s holds tokens query_start_loc[s]
.. query_start_loc[s + 1] - 1 of the token axis (a prefill chunk, or one decode
token). Each sequence continues from the state it carries in (`conv_state`: the w - 1
inputs before its first token; `state`: h after the tokens before), zeros for a new
sequence, and each op returns the state after the sequence's last token next to its
output: it writes nothing in place. The ops:

- `causal_conv1d`: the convolution, any sequence lengths, static shapes (no value is
  read on the host, so a CUDA graph can record it).
- `selective_scan`: Mamba-1's scan, step by step or by chunks (a parallel prefix scan
  of the affine maps h -> a h + b inside each chunk, the state carried between chunks).
- `ssd_scan`: Mamba-2's scan in the chunked dual form.
- `selective_state_update`: one token of Mamba-2's recurrence per sequence, static
  shapes (decode steps, CUDA graphs).

Float inputs may be float16, bfloat16, float32 or float64. The scans compute in float32
(float64 when x is float64) and return output and state in that dtype, as Mamba's
kernels keep the state in float32; the convolution returns its output in x's dtype and
its state exactly (it only moves inputs).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from array_api_compat import device

from ._arrays import ANY_FLOAT_DTYPE_NAMES, can_read_values, dtype_name, namespace

__all__ = ["causal_conv1d", "selective_scan", "ssd_scan", "selective_state_update"]

ACTIVATIONS = (None, "silu")


# --- validation -----------------------------------------------------------------------------


def _float_array(x: Any, name: str, shape: tuple[int | None, ...]) -> Any:
    """The namespace of float array `x` of `shape` (None: any length on that axis);
    TypeError / ValueError naming it."""
    xp = namespace(x, name)
    if dtype_name(x) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name} must be a float array, got dtype {dtype_name(x)}")
    if x.ndim != len(shape) or any(
        w is not None and w != n for w, n in zip(shape, x.shape, strict=True)
    ):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        want = f"({want},)" if len(shape) == 1 else f"({want})"
        raise ValueError(f"{name} must have shape {want}, got {tuple(x.shape)}")
    return xp


def _optional(x: Any, name: str, shape: tuple[int | None, ...]) -> None:
    if x is not None:
        _float_array(x, name, shape)


def _compute_dtype(xp: Any, x: Any) -> Any:
    return xp.float64 if dtype_name(x) == "float64" else xp.float32


def _check_query_start_loc(query_start_loc: Any, num_tokens: int, num_seqs: int) -> None:
    """Integers of shape (num_seqs + 1,) from 0, non-decreasing, ending at num_tokens
    (values are checked only where they can be read: see `can_read_values`)."""
    namespace(query_start_loc, "query_start_loc")
    if "int" not in dtype_name(query_start_loc):
        raise TypeError(
            f"query_start_loc must be integers, got dtype {dtype_name(query_start_loc)}"
        )
    if tuple(query_start_loc.shape) != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must have shape ({num_seqs + 1},) (one more than the "
            f"sequences of the state), got {tuple(query_start_loc.shape)}"
        )
    if not can_read_values(query_start_loc):
        return
    qsl = [int(v) for v in query_start_loc]
    if qsl[0] != 0 or qsl[-1] != num_tokens or any(b < a for a, b in pairwise(qsl)):
        raise ValueError(f"query_start_loc must rise from 0 to the {num_tokens} tokens, got {qsl}")


def _check_scan_params(
    x: Any, dt: Any, B: Any, C: Any, D: Any, dt_bias: Any, rows: int, heads: int
) -> int:
    """Checks the scans share: dt (rows, heads), B and C (rows, groups, N) with groups
    dividing heads, D and dt_bias (heads,). Returns the number of groups."""
    _float_array(dt, "dt", (rows, heads))
    _float_array(B, "B", (rows, None, None))
    groups = B.shape[1]
    _float_array(C, "C", tuple(B.shape))
    if groups < 1 or heads % groups:
        raise ValueError(f"B's groups ({groups}) must divide the {heads} heads")
    _optional(D, "D", (heads,))
    _optional(dt_bias, "dt_bias", (heads,))
    return groups


def _softplus(xp: Any, v: Any) -> Any:
    """log(1 + exp(v)), without overflow."""
    return xp.maximum(v, 0.0) + xp.log1p(xp.exp(-xp.abs(v)))


def _step_sizes(xp: Any, dt: Any, dt_bias: Any, dt_softplus: bool, compute: Any) -> Any:
    """dt (+ dt_bias), through softplus when asked, in the compute dtype."""
    step = xp.astype(dt, compute)
    if dt_bias is not None:
        step = step + xp.astype(dt_bias, compute)
    return _softplus(xp, step) if dt_softplus else step


def _by_head(xp: Any, BC: Any, heads: int) -> Any:
    """(..., groups, N) -> (..., heads, N): head h reads group h // (heads / groups)."""
    groups = BC.shape[-2]
    group_of_head = xp.arange(heads, device=device(BC)) // (heads // groups)
    return xp.take(BC, group_of_head, axis=BC.ndim - 2)


def _host_lengths(query_start_loc: Any) -> tuple[list[int], list[int]]:
    qsl = [int(v) for v in query_start_loc]
    return qsl[:-1], [b - a for a, b in pairwise(qsl)]


# --- the convolution ------------------------------------------------------------------------


def causal_conv1d(
    x: Any,
    weight: Any,
    bias: Any,
    conv_state: Any,
    query_start_loc: Any,
    activation: str | None = None,
) -> tuple[Any, Any]:
    """Depthwise causal 1-D convolution of each sequence of a flattened batch, continuing
    from the inputs it carries in.

    With w = weight.shape[1] and k = w - 1: sequence s is preceded by conv_state[s], the k
    inputs before its first token (oldest first; zeros for a new sequence). Let xx_s be
    those k inputs followed by the sequence's tokens. Token j of sequence s (the row t =
    query_start_loc[s] + j of x) gets, for every channel c:
        out[t, c] = act(bias[c] + sum over i in [0, w) of weight[c, i] * xx_s[j + i, c])
    so weight[c, w - 1] multiplies the token itself and weight[c, 0] the input k tokens
    back; nothing later than the token is read. act is the identity (activation None)
    or silu(v) = v / (1 + exp(-v)). new_state[s] holds the last k rows of xx_s, the
    inputs the sequence continues from (conv_state[s] unchanged for an empty sequence).
    Sums are computed in float32 (float64 for float64 x) and rounded once to x's dtype;
    the state is moved, never rounded. Shapes alone decide the work: no value is read
    on the host.

    Args:
        x: float array, shape (num_tokens, channels).
        weight: x's dtype, shape (channels, w), w >= 1.
        bias: None, or x's dtype, shape (channels,).
        conv_state: x's dtype, shape (num_seqs, channels, w - 1).
        query_start_loc: integer array, shape (num_seqs + 1,), rising from 0 to num_tokens.
        activation: None or "silu".
    Returns:
        (out, new_state): out like x; new_state like conv_state.
    Raises:
        TypeError: non-float x, weight, bias or conv_state, or one of another dtype than
            x; non-integer query_start_loc.
        ValueError: shapes that disagree (the message names the array), a
            query_start_loc that does not rise from 0 to num_tokens, an unknown
            activation.
    """
    xp = _float_array(x, "x", (None, None))
    num_tokens, channels = x.shape
    _float_array(weight, "weight", (channels, None))
    width = weight.shape[1]
    if width < 1:
        raise ValueError(f"weight must have a width >= 1, got shape {tuple(weight.shape)}")
    _optional(bias, "bias", (channels,))
    _float_array(conv_state, "conv_state", (None, channels, width - 1))
    for name, a in (("weight", weight), ("bias", bias), ("conv_state", conv_state)):
        if a is not None and dtype_name(a) != dtype_name(x):
            raise TypeError(f"{name} must have x's dtype {dtype_name(x)}, got {dtype_name(a)}")
    num_seqs, k = conv_state.shape[0], width - 1
    _check_query_start_loc(query_start_loc, num_tokens, num_seqs)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    dev, compute = device(x), _compute_dtype(xp, x)
    qsl = xp.astype(query_start_loc, xp.int64)
    starts, lengths = qsl[:-1], qsl[1:] - qsl[:-1]
    # the state as rows (sequence s, column m) -> row s * k + m, channels last
    state_rows = xp.reshape(xp.permute_dims(conv_state, (0, 2, 1)), (num_seqs * k, channels))

    def inputs(seq: Any, index: Any, row_of_x: Any) -> Any:
        """xx_seq[index] for each entry: a state row below k, else a row of x."""
        from_state = xp.take(state_rows, seq * k + xp.clip(index, 0, max(k - 1, 0)), axis=0)
        if num_tokens == 0:
            return from_state
        from_x = xp.take(x, xp.clip(row_of_x, 0, num_tokens - 1), axis=0)
        return xp.where((index >= k)[:, None], from_x, from_state) if k else from_x

    token = xp.arange(num_tokens, dtype=xp.int64, device=dev)
    seq = xp.searchsorted(qsl[1:], token, side="right")  # the sequence of each token
    j = token - xp.take(starts, seq)
    acc = xp.zeros((num_tokens, channels), dtype=compute, device=dev)
    if bias is not None:
        acc = acc + xp.astype(bias, compute)
    w = xp.astype(weight, compute)
    for i in range(width):  # xx_s[j + i] is the token k - i rows back
        tap = inputs(seq, j + i, token - (k - i)) if k else x
        acc = acc + xp.astype(tap, compute) * w[:, i]
    if activation == "silu":
        acc = acc / (1.0 + xp.exp(-acc))
    out = xp.astype(acc, x.dtype)
    seqs = xp.arange(num_seqs, dtype=xp.int64, device=dev)
    columns = [inputs(seqs, lengths + m, starts + lengths + m - k) for m in range(k)]
    if not columns:
        return out, xp.zeros(conv_state.shape, dtype=conv_state.dtype, device=dev)
    return out, xp.stack(columns, axis=2)


# --- Mamba-1 --------------------------------------------------------------------------------


def selective_scan(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    state: Any,
    query_start_loc: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    chunk_size: int | None = None,
) -> tuple[Any, Any]:
    """Mamba-1's selective scan of each sequence of a flattened batch, from its state.

    Channel d of token t (N state features each), starting from h = state[s]:
        delta = dt[t, d] (+ dt_bias[d]), then softplus(delta) = log(1 + exp(delta)) when
            dt_softplus
        h[d, n] = exp(delta A[d, n]) h[d, n] + delta x[t, d] B[t, n]
        y[t, d] = sum over n of C[t, n] h[d, n]  (+ D[d] x[t, d])  (times silu(z[t, d]))
    and new_state[s] is h after the sequence's last token (state[s] itself for an
    empty sequence). Computed in float32 (float64 for float64 x).

    `chunk_size` says how the reference evaluates the recurrence, not what it computes:
    None steps through the tokens one at a time; c >= 1 cuts each sequence into chunks
    of c tokens and composes each chunk's affine maps h -> a h + b at once by a parallel
    prefix scan (log2 c rounds of (a2, b2) o (a1, b1) = (a2 a1, a2 b1 + b2), which is
    associative), carrying the state from chunk to chunk. Every value gives the same
    result up to rounding.

    Args:
        x: float array, shape (num_tokens, channels).
        dt: float array, shape (num_tokens, channels).
        A: float array, shape (channels, N).
        B: float array, shape (num_tokens, N).
        C: float array, shape (num_tokens, N).
        state: float array, shape (num_seqs, channels, N).
        query_start_loc: integer array, shape (num_seqs + 1,), rising from 0 to num_tokens.
        D: None or a float array of shape (channels,).
        z: None or a float array of shape (num_tokens, channels).
        dt_bias: None or a float array of shape (channels,).
        dt_softplus: pass the step sizes through softplus.
        chunk_size: None or an int >= 1.
    Returns:
        (y, new_state): shapes (num_tokens, channels) and (num_seqs, channels, N), float32
        (float64 for float64 x), in x's library and device.
    Raises:
        TypeError: a non-float array, non-integer query_start_loc, a chunk_size that is
            not None or an int.
        ValueError: shapes that disagree (the message names the array), a
            query_start_loc that does not rise from 0 to num_tokens, chunk_size < 1.
    """
    xp = _float_array(x, "x", (None, None))
    num_tokens, channels = x.shape
    _float_array(A, "A", (channels, None))
    n = A.shape[1]
    _float_array(dt, "dt", (num_tokens, channels))
    _float_array(B, "B", (num_tokens, n))
    _float_array(C, "C", (num_tokens, n))
    _float_array(state, "state", (None, channels, n))
    _check_query_start_loc(query_start_loc, num_tokens, state.shape[0])
    _optional(D, "D", (channels,))
    _optional(z, "z", (num_tokens, channels))
    _optional(dt_bias, "dt_bias", (channels,))
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)):
        raise TypeError(f"chunk_size must be None or an int, got {type(chunk_size).__name__}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    compute, dev = _compute_dtype(xp, x), device(x)
    step = _step_sizes(xp, dt, dt_bias, dt_softplus, compute)
    a_mat, h = xp.astype(A, compute), xp.astype(state, compute)
    xc, bc, cc = (xp.astype(v, compute) for v in (x, B, C))
    starts, lengths = _host_lengths(query_start_loc)
    num_seqs, longest = len(lengths), max(lengths, default=0)
    start_t = xp.asarray(starts, dtype=xp.int64, device=dev)
    length_t = xp.asarray(lengths, dtype=xp.int64, device=dev)

    def maps(j: Any) -> tuple[Any, Any, Any]:
        """For positions j (num_seqs, m) of every sequence: the affine maps h -> a h + b
        of those tokens, (num_seqs, m, channels, N) each (the identity past a sequence's
        end), and their rows of C."""
        rows = xp.clip(start_t[:, None] + j, 0, max(num_tokens - 1, 0))
        flat = xp.reshape(rows, (-1,))

        def gather(v: Any) -> Any:
            return xp.reshape(xp.take(v, flat, axis=0), (*rows.shape, v.shape[1]))

        delta = xp.where((j < length_t[:, None])[..., None], gather(step), 0.0)
        decay = xp.exp(delta[..., None] * a_mat)
        drive = (delta * gather(xc))[..., None] * gather(bc)[..., None, :]
        return decay, drive, gather(cc)

    outputs = []  # per position j (sequential) or chunk: C . h of every sequence
    if num_tokens and chunk_size is None:
        for j in range(longest):
            decay, drive, c_rows = maps(xp.full((num_seqs, 1), j, dtype=xp.int64, device=dev))
            h = decay[:, 0] * h + drive[:, 0]
            outputs.append(xp.sum(h * c_rows, axis=-1)[:, None])
    elif num_tokens:
        size = min(chunk_size, longest)
        offsets = xp.arange(size, dtype=xp.int64, device=dev)
        for first in range(0, longest, size):
            j = xp.broadcast_to(first + offsets, (num_seqs, size))
            a, b, c_rows = maps(j)  # (num_seqs, size, channels, N)
            shift = 1
            while shift < size:  # inclusive prefix scan: maps of positions 0..l composed
                a_prev = xp.concat([xp.ones_like(a[:, :shift]), a[:, :-shift]], axis=1)
                b_prev = xp.concat([xp.zeros_like(b[:, :shift]), b[:, :-shift]], axis=1)
                a, b = a * a_prev, a * b_prev + b
                shift *= 2
            hs = a * h[:, None] + b
            outputs.append(xp.sum(hs * c_rows[:, :, None, :], axis=-1))
            h = hs[:, -1]
    if not outputs:
        return xp.zeros((num_tokens, channels), dtype=compute, device=dev), h
    # token t, position j of sequence s, sits at [j, s] of the stacked outputs
    per_position = xp.concat(outputs, axis=1)  # (num_seqs, positions, channels)
    token = xp.arange(num_tokens, dtype=xp.int64, device=dev)
    ends = xp.asarray(
        [a + b for a, b in zip(starts, lengths, strict=True)], dtype=xp.int64, device=dev
    )
    seq = xp.searchsorted(ends, token, side="right")
    j = token - xp.take(start_t, seq)
    flat = xp.reshape(per_position, (-1, channels))
    y = xp.take(flat, seq * per_position.shape[1] + j, axis=0)
    if D is not None:
        y = y + xp.astype(D, compute) * xc
    if z is not None:
        zc = xp.astype(z, compute)
        y = y * (zc / (1.0 + xp.exp(-zc)))
    return y, h


# --- Mamba-2 --------------------------------------------------------------------------------


def _segment_sums(xp: Any, log_decay: Any) -> Any:
    """seg[..., l, s] = sum of log_decay[..., r] over s < r <= l for s <= l, -inf above
    the diagonal: summed directly (a masked cumulative sum), not as the difference of
    two running sums, which would cancel."""
    size = log_decay.shape[-1]
    idx = xp.arange(size, device=device(log_decay))
    below = idx[:, None] > idx[None, :]  # [r, s]: r > s
    terms = xp.where(below, log_decay[..., :, None], 0.0)
    seg = xp.cumulative_sum(terms, axis=-2)
    return xp.where(idx[:, None] >= idx[None, :], seg, -float("inf"))


def _in_chunks(xp: Any, rows: Any, size: int, compute: Any) -> Any:
    """Rows (length, ...) zero-padded to whole chunks of `size` and cut into them, as
    (chunks, ..., size, ...): the second axis of rows last but one, positions after it,
    for the matrix products."""
    pad = -rows.shape[0] % size
    if pad:
        padding = xp.zeros((pad, *rows.shape[1:]), dtype=compute, device=device(rows))
        rows = xp.concat([rows, padding])
    rows = xp.reshape(rows, (rows.shape[0] // size, size, *rows.shape[1:]))
    return xp.moveaxis(rows, 1, 2)


def ssd_scan(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    state: Any,
    query_start_loc: Any,
    chunk_size: int = 256,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]:
    """Mamba-2's selective scan (state space duality) of each sequence of a flattened
    batch, from its state, in the chunked dual form.

    Head h (P channels, N state features, group g = h // (heads / groups) of B and C)
    of token t, starting from H = state[s] (P x N):
        delta = dt[t, h] (+ dt_bias[h]), then softplus when dt_softplus
        H = exp(delta A[h]) H + delta x[t, h] (outer) B[t, g]
        y[t, h] = H C[t, g]  (+ D[h] x[t, h])
    and new_state[s] is H after the sequence's last token. Computed in float32 (float64
    for float64 x).

    Since A is one scalar per head, y is a masked matrix product (the dual form): with
    a_r = delta_r A[h] and L[t, u] = exp(a_{u+1} + ... + a_t) for u <= t (0 above),
        y_t = sum over u <= t of L[t, u] (C_t . B_u) delta_u x_u  +  exp(a_1 + .. + a_t) C_t H_0
    Each sequence is cut into chunks of `chunk_size` tokens from its first: inside a
    chunk the first term runs as dense matrix products, the chunk's end state is
    exp(sum of a over the chunk) H_0 + sum over u of L[end, u] delta_u x_u B_u^T, and the
    states carry from chunk to chunk. Any chunk size gives the result of the token by
    token recurrence above up to rounding.

    Args:
        x: float array, shape (num_tokens, heads, P).
        dt: float array, shape (num_tokens, heads).
        A: float array, shape (heads,).
        B: float array, shape (num_tokens, groups, N), groups dividing heads.
        C: float array, shape (num_tokens, groups, N).
        state: float array, shape (num_seqs, heads, P, N).
        query_start_loc: integer array, shape (num_seqs + 1,), rising from 0 to num_tokens.
        chunk_size: int >= 1.
        D: None or a float array of shape (heads,).
        dt_bias: None or a float array of shape (heads,).
        dt_softplus: pass the step sizes through softplus.
    Returns:
        (y, new_state): shapes (num_tokens, heads, P) and (num_seqs, heads, P, N), float32
        (float64 for float64 x), in x's library and device.
    Raises:
        TypeError: a non-float array, non-integer query_start_loc, a chunk_size that is
            not an int.
        ValueError: shapes that disagree (the message names the array), groups not
            dividing heads, a query_start_loc that does not rise from 0 to num_tokens,
            chunk_size < 1.
    """
    xp = _float_array(x, "x", (None, None, None))
    num_tokens, heads, p = x.shape
    _float_array(A, "A", (heads,))
    _check_scan_params(x, dt, B, C, D, dt_bias, num_tokens, heads)
    n = B.shape[2]
    _float_array(state, "state", (None, heads, p, n))
    _check_query_start_loc(query_start_loc, num_tokens, state.shape[0])
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    compute, dev = _compute_dtype(xp, x), device(x)
    step = _step_sizes(xp, dt, dt_bias, dt_softplus, compute)  # (T, heads)
    a_head = xp.astype(A, compute)
    xc = xp.astype(x, compute)
    b_head, c_head = (_by_head(xp, xp.astype(v, compute), heads) for v in (B, C))
    starts, lengths = _host_lengths(query_start_loc)
    ys, finals = [], []
    for s, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        h = xp.astype(state[s, ...], compute)  # (heads, P, N)
        if length == 0:
            finals.append(h)
            continue
        size = min(chunk_size, length)
        chunks = -(-length // size)
        rows = slice(start, start + length)
        # (chunks, heads, size): padding has delta 0, so decay 1 and no input
        delta = _in_chunks(xp, step[rows, ...], size, compute)
        log_decay = delta * a_head[:, None]
        u = _in_chunks(xp, xc[rows, ...], size, compute) * delta[..., None]  # delta x
        b_c = _in_chunks(xp, b_head[rows, ...], size, compute)  # (chunks, heads, size, N)
        c_c = _in_chunks(xp, c_head[rows, ...], size, compute)
        # inside each chunk, from its own start (the diagonal blocks)
        mask = xp.exp(_segment_sums(xp, log_decay))  # (chunks, heads, size, size)
        scores = (c_c @ xp.matrix_transpose(b_c)) * mask
        y = scores @ u
        # what each chunk adds to the state over its length, and the decay it applies
        to_end = mask[..., -1, :]  # exp(a_{u+1} + .. + a_end): (chunks, heads, size)
        added = xp.matrix_transpose(u) @ (b_c * to_end[..., None])  # (chunks, heads, P, N)
        from_start = xp.exp(xp.cumulative_sum(log_decay, axis=-1))  # exp(a_1 + .. + a_l)
        entering = []
        for c in range(chunks):  # the recurrence between chunks
            entering.append(h)
            h = from_start[c, :, -1][:, None, None] * h + added[c, ...]
        h0 = xp.stack(entering)  # (chunks, heads, P, N): the state each chunk starts from
        y = y + (c_c @ xp.matrix_transpose(h0)) * from_start[..., None]
        y = xp.reshape(xp.moveaxis(y, 2, 1), (chunks * size, heads, p))[:length, ...]
        ys.append(y)
        finals.append(h)
    if ys:
        y = xp.concat(ys, axis=0)
    else:
        y = xp.zeros((num_tokens, heads, p), dtype=compute, device=dev)
    if D is not None:
        y = y + xp.astype(D, compute)[:, None] * xc
    if finals:
        return y, xp.stack(finals)
    return y, xp.zeros((0, heads, p, n), dtype=compute, device=dev)


def selective_state_update(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
) -> tuple[Any, Any]:
    """One token of Mamba-2's recurrence for each of a batch of sequences (a decode step).

    Row s is one token of sequence s, whose state before it is state[s]; head h (group
    g = h // (heads / groups)):
        delta = dt[s, h] (+ dt_bias[h]), then softplus when dt_softplus
        new_state[s, h] = exp(delta A[h]) state[s, h] + delta x[s, h] (outer) B[s, g]
        y[s, h] = new_state[s, h] C[s, g]  (+ D[h] x[s, h])
    the same step as `ssd_scan` on sequences of one token. Computed in float32 (float64
    for float64 x). Shapes alone decide the work: no value is read on the host, so a CUDA
    graph can record it.

    Args:
        state: float array, shape (num_seqs, heads, P, N).
        x: float array, shape (num_seqs, heads, P).
        dt: float array, shape (num_seqs, heads).
        A: float array, shape (heads,).
        B: float array, shape (num_seqs, groups, N), groups dividing heads.
        C: float array, shape (num_seqs, groups, N).
        D: None or a float array of shape (heads,).
        dt_bias: None or a float array of shape (heads,).
        dt_softplus: pass the step sizes through softplus.
    Returns:
        (y, new_state): shapes (num_seqs, heads, P) and (num_seqs, heads, P, N), float32
        (float64 for float64 x), in x's library and device.
    Raises:
        TypeError: a non-float array.
        ValueError: shapes that disagree (the message names the array), groups not
            dividing heads.
    """
    xp = _float_array(x, "x", (None, None, None))
    num_seqs, heads, p = x.shape
    _float_array(A, "A", (heads,))
    _check_scan_params(x, dt, B, C, D, dt_bias, num_seqs, heads)
    _float_array(state, "state", (num_seqs, heads, p, B.shape[2]))
    compute = _compute_dtype(xp, x)
    delta = _step_sizes(xp, dt, dt_bias, dt_softplus, compute)  # (seqs, heads)
    xc = xp.astype(x, compute)
    b_head, c_head = (_by_head(xp, xp.astype(v, compute), heads) for v in (B, C))
    decay = xp.exp(delta * xp.astype(A, compute))[..., None, None]
    new = (
        decay * xp.astype(state, compute)
        + (delta[..., None] * xc)[..., None] * b_head[:, :, None, :]
    )
    y = xp.sum(new * c_head[:, :, None, :], axis=-1)
    if D is not None:
        y = y + xp.astype(D, compute)[:, None] * xc
    return y, new
