"""Structured-output ops: applying a grammar's token bitmask to the logits.

A grammar matcher (`pyagent_ref.structured`) fills, for every request, a bitmask of the
tokens that may come next; the sampler applies it right before sampling, so a masked token
can never be drawn. The bitmask is in the layout the ecosystem shares (llguidance,
xgrammar, outlines-core, vLLM), so a mask filled by any of them can be applied here:

    bitmask: int32, shape (batch, words); token i is allowed iff
             (bitmask[b, i // 32] >> (i % 32)) & 1 == 1

bit 0 being the least significant bit of the word. A vocabulary of V tokens needs
words = ceil(V / 32); the bits of the last word past V describe no token.
"""

from __future__ import annotations

from typing import Any

from array_api_compat import device

from ._arrays import ANY_FLOAT_DTYPE_NAMES, check_token_bitmask, dtype_name, namespace

__all__ = ["apply_token_bitmask"]

_NEG_INF = float("-inf")


def apply_token_bitmask(logits: Any, bitmask: Any) -> Any:
    """Mask every token whose bit is clear: the logits of the tokens a grammar allows.

    With (batch, vocab) = logits.shape and words = bitmask.shape[1], the result is

        out[b, i] = logits[b, i]  if i < 32 * words and bit (i % 32) of bitmask[b, i // 32]
                                  is set (bit 0 = least significant)
                    -inf          otherwise

    So bit j of word w stands for token 32 * w + j; a token past the mask's width
    (i >= 32 * words, logits wider than the mask) is masked, as llguidance does: a bitmask
    allows only the tokens it describes (xgrammar leaves those columns unchanged instead).
    Bits past the vocab (the tail of the last word, or whole extra words) are ignored. The
    values of the logits are not read: NaN and +inf are kept where allowed, and a row may
    end up all -inf (a grammar that allows nothing). Computed without host reads, so it may
    run inside a captured CUDA graph.

    Args:
        logits: float16, bfloat16, float32 or float64, shape (batch, vocab).
        bitmask: int32, shape (batch, words), words >= 0; a numpy array or a torch tensor,
            read on the logits' device (a small copy if it lives elsewhere).
    Returns:
        A new array like `logits` (library, device, dtype, shape); the inputs are not
        modified.
    Raises:
        TypeError: logits that are not floats, a bitmask that is not int32, or an argument
            that is not a numpy array or torch tensor.
        ValueError: logits that are not 2-D, a bitmask that is not 2-D or has a different
            number of rows (the message gives the shapes).
    """
    xp = namespace(logits, "logits")
    if dtype_name(logits) not in ANY_FLOAT_DTYPE_NAMES:
        raise TypeError(f"logits must be a float array, got dtype {dtype_name(logits)}")
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (batch, vocab), got shape {tuple(logits.shape)}")
    batch, vocab = logits.shape
    check_token_bitmask(bitmask, batch)
    covered = min(vocab, 32 * bitmask.shape[1])  # the tokens the mask describes
    words = -(-covered // 32)
    where = device(logits)
    packed = xp.asarray(bitmask[:, :words], device=where)
    shifts = xp.arange(32, dtype=xp.int32, device=where)
    bits = xp.reshape((packed[:, :, None] >> shifts) & 1, (batch, 32 * words))
    allowed = bits[:, :covered] != 0
    if covered < vocab:
        beyond = xp.zeros((batch, vocab - covered), dtype=xp.bool, device=where)
        allowed = xp.concat([allowed, beyond], axis=1)
    return xp.where(allowed, logits, _NEG_INF)
