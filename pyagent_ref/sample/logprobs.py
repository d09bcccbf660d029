"""The log-probabilities of sampled positions, as they travel from the sampler to the
user (`ModelRunnerOutput` -> `EngineCoreOutput` -> `CompletionOutput.logprobs`).

Inside the engine one position is a `Logprobs` holding array rows of the sampler's
`topk_logprobs` result. What users get is a `LogprobsColumns`: every position of a
completion (or of a prompt) in flat columns, so that k logprobs over thousands of tokens
cost a few growing arrays, not millions of Python objects; its positions read as
vLLM's `dict[token id, Logprob]`, built when read.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np


@dataclass(frozen=True)
class Logprobs:
    """Log-probabilities at one sampled position, from the sampler to the user.

    Which distribution they are taken from is the engine's `logprobs_mode` (see
    `sample.sampler.LOGPROBS_MODES`; by default the model's own, "raw_logprobs").
    top_ids / top_logprobs: 1-D arrays of the k most likely tokens, best first, ties
    by lower id. sampled_id / sampled_logprob / sampled_rank: the drawn token; rank 1
    is the most likely, and tied tokens share a rank (1 + the number of strictly
    likelier tokens).
    """

    top_ids: np.ndarray
    top_logprobs: np.ndarray
    sampled_id: int
    sampled_logprob: float
    sampled_rank: int


def logprobs_rows(
    topk: tuple[Any, Any, Any, Any], tokens: Sequence[int], counts: Sequence[int | None]
) -> list[Logprobs | None]:
    """One `Logprobs` per row from `ops.sampling.topk_logprobs`'s (values, ids, sampled
    logprob, sampled rank) for the rows' tokens: row i keeps its counts[i] best entries,
    or is None where counts[i] is None."""
    values, ids, chosen, rank = (np.asarray(a) for a in topk)
    return [
        None
        if k is None
        else Logprobs(ids[i, :k], values[i, :k], int(tokens[i]), float(chosen[i]), int(rank[i]))
        for i, k in enumerate(counts)
    ]


@dataclass(frozen=True)
class Logprob:
    """One token's entry at one position of `CompletionOutput.logprobs` (vLLM's shape):
    its log-probability, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str


class LogprobsColumns(Sequence):
    """Positions' logprobs in flat columns; position i reads as vLLM's dict.

    Position i owns entries ends[i-1] .. ends[i] of the token_ids / logprobs / ranks
    columns: the sampled (or prompt) token first, then the top ones best first. It reads
    as {token id: Logprob(logprob, rank, text)}, a token listed twice keeping its first
    entry, and as None when it has no entry (the first prompt position, which nothing
    predicts). `token_text(id)` gives the text of a token when a position is read.
    """

    def __init__(self, token_text: Callable[[int], str]) -> None:
        self.token_text = token_text
        self.token_ids, self.ranks, self.ends = array("q"), array("q"), array("q")
        self.logprobs = array("d")

    def append(self, position: Logprobs | None) -> None:
        """Add a position (None: one without entries)."""
        if position is not None:
            top = np.asarray(position.top_logprobs, dtype=np.float64)
            # ties share a rank: 1 + the number of strictly likelier entries before it
            ranks = 1 + np.searchsorted(-top, -top, side="left")
            self.token_ids.append(position.sampled_id)
            self.token_ids.frombytes(np.asarray(position.top_ids, dtype=np.int64).tobytes())
            self.logprobs.append(position.sampled_logprob)
            self.logprobs.frombytes(top.tobytes())
            self.ranks.append(position.sampled_rank)
            self.ranks.frombytes(ranks.astype(np.int64).tobytes())
        self.ends.append(len(self.token_ids))

    def extend(self, positions: Iterable[Logprobs | None]) -> None:
        for position in positions:
            self.append(position)

    def join(self, other: LogprobsColumns) -> None:
        """Append all of other's positions (the next delta's, when deltas merge)."""
        if len(other):
            self._copy(other, 0, len(other))

    def __len__(self) -> int:
        return len(self.ends)

    @overload
    def __getitem__(self, i: int) -> dict[int, Logprob] | None: ...
    @overload
    def __getitem__(self, i: slice) -> LogprobsColumns: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._slice(*i.indices(len(self)))
        if not -len(self) <= i < len(self):
            raise IndexError(f"position {i} out of range for {len(self)} positions")
        i %= len(self)
        start, end = self.ends[i - 1] if i else 0, self.ends[i]
        if start == end:
            return None
        entries: dict[int, Logprob] = {}
        for j in range(start, end):
            token = self.token_ids[j]
            if token not in entries:
                entries[token] = Logprob(self.logprobs[j], self.ranks[j], self.token_text(token))
        return entries

    def _slice(self, start: int, stop: int, step: int) -> LogprobsColumns:
        out = LogprobsColumns(self.token_text)
        if step != 1:
            for i in range(start, stop, step):
                out._copy(self, i, i + 1)
        elif start < stop:
            out._copy(self, start, stop)
        return out

    def _copy(self, other: LogprobsColumns, first: int, last: int) -> None:
        """Append other's positions first .. last - 1."""
        lo, hi = other.ends[first - 1] if first else 0, other.ends[last - 1]
        base = len(self.token_ids) - lo
        self.token_ids.extend(other.token_ids[lo:hi])
        self.logprobs.extend(other.logprobs[lo:hi])
        self.ranks.extend(other.ranks[lo:hi])
        self.ends.extend(e + base for e in other.ends[first:last])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # mutable, like a list

    def __repr__(self) -> str:
        return f"LogprobsColumns({list(self)!r})"
