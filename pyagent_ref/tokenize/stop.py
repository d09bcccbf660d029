"""Stop strings and stop token ids, applied to streamed text.

The text of a request arrives as deltas (from `IncrementalDetokenizer`). A stop string
can end inside a delta, or span several deltas, so a streaming checker must not emit text
that may turn out to be the start of a stop string: it holds that tail back until the
next delta settles the question. The rule is to hold back the **longest suffix of the
not-yet-emitted text that is a proper prefix of some stop string** (so at most
``max(len(s) for s in stop) - 1`` characters, and nothing when the tail cannot start a
stop string). When the stop string is to be included in the output nothing needs holding
back at all: every character before the end of the stop string is output anyway.

Which occurrence stops the output: the one that **ends first** (the first one a reader
going left to right sees complete); of several ending at the same place, the longest
(it starts first). A streaming checker cannot do otherwise: when a stop string completes,
it cannot wait to see whether a longer stop string that started earlier will complete too.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from ._base import check_flag

__all__ = ["StopChecker", "StopResult", "find_stop"]


class StopResult(NamedTuple):
    """What `StopChecker.update` decided for one delta.

    Attributes:
        text: the text that may be emitted now (possibly "").
        finished: whether the request stopped at this delta.
        stop_reason: the stop string (str) or stop token id (int) that stopped it, or None.
    """

    text: str
    finished: bool
    stop_reason: str | int | None


def find_stop(text: str, stop: Sequence[str], min_end: int = 0) -> tuple[int, int, str] | None:
    """The first occurrence of a stop string in ``text`` whose end is at least ``min_end``.

    "First" is by end position, ties broken by the earliest start (see the module
    docstring). ``end`` is exclusive: ``min_end = k + 1`` finds only occurrences that
    include a character at index ``k`` or later.

    Returns:
        ``(begin, end, stop_string)`` with ``text[begin:end] == stop_string``, or None.
    """
    best: tuple[int, int, str] | None = None
    for s in stop:
        # The first occurrence of s starting at or after this point is also the first to end.
        begin = text.find(s, max(0, min_end - len(s)))
        if begin < 0:
            continue
        end = begin + len(s)
        if best is None or (end, begin) < (best[1], best[0]):
            best = (begin, end, s)
    return best


class StopChecker:
    """Streaming stop-string and stop-token detection for one request.

    Feed every text delta of the request to `update`, in order. Contract: let ``full`` be
    the concatenation of all deltas fed. The concatenation of every ``result.text``
    returned (plus `finish` if the request ends for another reason) is

    * ``full[:begin]``, or ``full[:end]`` if ``include_stop_str_in_output``, where
      ``(begin, end, s) = find_stop(full, stop)`` is the first stop-string occurrence;
    * ``full`` if no stop string occurs.

    Text once returned is never retracted; what is held back at any moment is exactly the
    longest suffix of the unreturned text that is a proper prefix of a stop string (empty
    if ``include_stop_str_in_output``).

    A stop token is signalled by passing its id: `update` then finishes with the id as
    reason after checking the delta for stop strings (a stop string completed by that very
    delta wins), and releases all held-back text. Whether the stop token's own text is in
    the delta is the caller's choice (vLLM leaves it out unless
    ``include_stop_str_in_output``).

    Args:
        stop: stop strings, non-empty, duplicates ignored.
        stop_token_ids: ids that end the request (EOS is one unless ``ignore_eos``).
        include_stop_str_in_output: keep the stop string at the end of the output.

    Raises:
        TypeError: ``stop`` is a single str, or a wrong element type.
        ValueError: an empty stop string or a negative stop token id.
    """

    def __init__(
        self,
        stop: Iterable[str] = (),
        stop_token_ids: Iterable[int] = (),
        *,
        include_stop_str_in_output: bool = False,
    ) -> None:
        if isinstance(stop, str):
            raise TypeError(f"stop must be a list of str, got the str {stop!r}; use [{stop!r}]")
        strings = []
        for i, s in enumerate(stop):
            if not isinstance(s, str):
                raise TypeError(f"stop[{i}] must be a str, got {s!r}")
            if not s:
                raise ValueError(f"stop[{i}] must not be empty, got {s!r}")
            if s not in strings:
                strings.append(s)
        ids = set()
        for i, token_id in enumerate(stop_token_ids):
            if isinstance(token_id, bool) or not hasattr(type(token_id), "__index__"):
                raise TypeError(f"stop_token_ids[{i}] must be an int, got {token_id!r}")
            if operator.index(token_id) < 0:
                raise ValueError(f"stop_token_ids[{i}] must be >= 0, got {token_id}")
            ids.add(operator.index(token_id))
        self._stop = tuple(strings)
        self._stop_ids = frozenset(ids)
        self._include = check_flag(include_stop_str_in_output, "include_stop_str_in_output")
        self._max_len = max((len(s) for s in self._stop), default=0)
        self._text = ""  # everything fed so far, up to the stop point once finished
        self._emitted = 0  # len of the prefix of _text already returned
        self._finished = False
        self._stop_reason: str | int | None = None

    @property
    def stop(self) -> tuple[str, ...]:
        return self._stop

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop_ids

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def stop_reason(self) -> str | int | None:
        return self._stop_reason

    @property
    def output_text(self) -> str:
        """All text returned so far."""
        return self._text[: self._emitted]

    @property
    def held_back(self) -> str:
        """The text fed but not returned yet (a possible start of a stop string)."""
        return "" if self._finished else self._text[self._emitted :]

    def is_stop_token(self, token_id: int) -> bool:
        """Whether ``token_id`` is one of the stop token ids."""
        return token_id in self._stop_ids

    def _hold_length(self) -> int:
        """Length of the longest suffix of the unreturned text that is a proper prefix of a
        stop string (0 when stop strings are included in the output)."""
        if self._include:
            return 0
        pending = self._text[self._emitted :]
        for k in range(min(len(pending), self._max_len - 1), 0, -1):
            tail = pending[-k:]
            if any(len(s) > k and s.startswith(tail) for s in self._stop):
                return k
        return 0

    def _release(self, upto: int, reason: str | int | None, finished: bool) -> StopResult:
        assert upto >= self._emitted, "returned text would be retracted"
        text = self._text[self._emitted : upto]
        self._emitted = upto
        if finished:
            self._text = self._text[:upto]
            self._finished = True
            self._stop_reason = reason
        return StopResult(text, finished, reason)

    def update(self, delta: str, token_id: int | None = None) -> StopResult:
        """Take the next text delta (and, optionally, the token id that produced it).

        Returns:
            The text safe to emit now, whether the request finished, and why.

        Raises:
            TypeError: ``delta`` is not a str.
            ValueError: the checker already finished.
        """
        if not isinstance(delta, str):
            raise TypeError(f"delta must be a str, got {type(delta).__name__}")
        if self._finished:
            raise ValueError(f"update called after the request stopped ({self._stop_reason!r})")
        searched_upto = len(self._text)
        self._text += delta
        if self._stop and delta:
            hit = find_stop(self._text, self._stop, min_end=searched_upto + 1)
            if hit is not None:
                begin, end, s = hit
                return self._release(end if self._include else begin, s, finished=True)
        if token_id is not None and token_id in self._stop_ids:
            return self._release(len(self._text), operator.index(token_id), finished=True)
        return self._release(len(self._text) - self._hold_length(), None, finished=False)

    def finish(self) -> str:
        """End the request for a reason other than a stop (length, abort): return the
        held-back text, since no stop string can complete any more."""
        if self._finished:
            return ""
        return self._release(len(self._text), None, finished=True).text
