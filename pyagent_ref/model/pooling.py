"""Pooling: a prompt's hidden states become one embedding vector (``/v1/embeddings``).

The engine runs a pooling request like the prefill of a generation request, chunk by
chunk, keeping the final hidden states (after the model's last norm) of its prompt
tokens; when the prompt is done, `pool` turns them into one vector and the request
finishes without sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["POOLING_TYPES", "PoolingParams", "pool"]

POOLING_TYPES = ("last", "mean", "cls")


@dataclass(frozen=True)
class PoolingParams:
    """How a prompt's hidden states become its embedding.

    pooling_type: "last" (the last token's state: what a causal model has read the
        whole prompt into), "mean" (the average over the prompt's tokens) or "cls" (the
        first token's state, for models trained to put it there).
    normalize: scale the vector to unit L2 norm (cosine similarity is then a dot product).
    Raises ValueError / TypeError naming the field and the value.
    """

    pooling_type: str = "last"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}"
            )
        if not isinstance(self.normalize, bool):
            raise TypeError(f"normalize must be a bool, got {self.normalize!r}")

    @property
    def needs_every_token(self) -> bool:
        """Whether every prompt token's state is needed (so no prefix-cache hit may skip
        computing one): true for "mean" and "cls"; "last" needs only the last, which a
        cache hit never covers."""
        return self.pooling_type != "last"


def pool(hidden: torch.Tensor, params: PoolingParams) -> torch.Tensor:
    """The embedding of one prompt from its hidden states, shape (num_tokens, hidden_size):
    a (hidden_size,) float32 vector, pooled as ``params`` says (module docstring)."""
    states = hidden.float()
    if params.pooling_type == "mean":
        vector = states.mean(dim=0)
    elif params.pooling_type == "cls":
        vector = states[0]
    else:
        vector = states[-1]
    if params.normalize:
        vector = vector / vector.norm().clamp_min(1e-12)
    return vector
