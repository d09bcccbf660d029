"""Qwen2-VL's positions in three dimensions (M-RoPE), from a token's place in the prompt.

Qwen2-VL's decoder rotates queries and keys by three positions per token (temporal,
height, width: `ops.rope.apply_mrope`). A text token has the same value in all three
rows; the tokens of an image (its patch grid after the 2 x 2 merge: t x h x w tokens,
row-major) share one start value s and add their grid coordinates: (s + ti, s + hi,
s + wi). The text after an image resumes at s + max(t, h, w), one past the largest
coordinate, so an image of t * h * w tokens advances the positions by max(t, h, w)
only. Every token after an image is therefore shifted by the same amount: the delta,
sum over the images before it of max(t, h, w) - t * h * w; a decoded token at sequence
index p has p + delta in all three rows.

The three rows are a function of the token's sequence index and the prompt's images
alone, so a prefill chunk, a decode step, a recompute after preemption or the rest of
a prompt after a prefix-cache hit get them from the indices they compute.

Worked example: two text tokens, an image of grid (1, 2, 3) at offset 2 (six tokens),
two text tokens, then the first decoded token (index 10):

>>> mrope_positions(range(11), [(2, (1, 2, 3))])
array([[0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7],
       [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7],
       [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7]])
>>> mrope_delta([(2, (1, 2, 3))])
-3
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["mrope_positions", "mrope_delta"]

Image = tuple[int, tuple[int, int, int]]  # (offset of its first token, (t, h, w) merged grid)


def _checked(images: Iterable[Image]) -> list[Image]:
    out: list[Image] = []
    end = 0
    for offset, grid in sorted(images, key=lambda image: image[0]):
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"an image grid must be (t, h, w), each >= 1, got {tuple(grid)}")
        if offset < end:
            raise ValueError(f"image spans overlap: an image at offset {offset} before {end}")
        out.append((int(offset), tuple(int(n) for n in grid)))
        end = offset + grid[0] * grid[1] * grid[2]
    return out


def mrope_delta(images: Iterable[Image]) -> int:
    """The shift of every token after all the images: sum of max(t, h, w) - t * h * w.

    Raises:
        ValueError: a grid that is not three ints >= 1, overlapping images.
    """
    return sum(max(grid) - grid[0] * grid[1] * grid[2] for _, grid in _checked(images))


def mrope_positions(positions: Iterable[int], images: Sequence[Image]) -> np.ndarray:
    """The (temporal, height, width) positions, int64 (3, n), of tokens at the sequence
    indices `positions` (any order, any subset: a chunk, a decode) of a prompt whose
    images are `images`: (offset, (t, h, w)) each, the grid in decoder tokens (the
    patch grid divided by the merge size in h and w). See the module docstring.

    Raises:
        ValueError: a negative index, a grid that is not three ints >= 1, overlapping
            images.
    """
    p = np.asarray(list(positions) if not isinstance(positions, np.ndarray) else positions)
    p = p.astype(np.int64).reshape(-1)
    if p.size and p.min() < 0:
        raise ValueError(f"positions must be >= 0, got {int(p.min())}")
    out = np.broadcast_to(p, (3, p.size)).copy()
    shift = 0  # of the text before the current image
    for offset, (t, h, w) in _checked(images):
        length = t * h * w
        inside = (p >= offset) & (p < offset + length)
        j = p[inside] - offset
        out[:, inside] = offset + shift + np.stack([j // (h * w), j // w % h, j % w])
        out[:, p >= offset + length] += max(t, h, w) - length
        shift += max(t, h, w) - length
    return out
