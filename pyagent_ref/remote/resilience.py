"""What keeps a client of a remote server well-behaved when the server is not: retries
with jittered backoff (tenacity), a circuit breaker and a client-side rate limit.

    RetryPolicy       which failures are retried, how often, how long to wait between
    CircuitBreaker    stop calling a server that keeps failing; probe it now and then
    RateLimiter       at most so many requests per second (a token bucket)

All three are thread-safe and take their clock (and sleep) as arguments, so a test can
drive them without waiting. `remote.client.RemoteLLM` wires them around each HTTP call.
"""

from __future__ import annotations

import dataclasses
import email.utils
import threading
import time
from collections.abc import Callable

import httpx
import tenacity

# statuses worth another try: the server is busy, restarting, or a proxy lost it
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class RemoteHTTPError(RuntimeError):
    """The server answered with an error status; ``status`` and its ``message``."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"the server answered {status}: {message}")
        self.status, self.message, self.retry_after_s = status, message, retry_after_s


class RemoteRequestError(RemoteHTTPError, ValueError):
    """A 4xx that another try would not change (a bad field, an unknown model): never
    retried, and a ValueError, as the local `LLM` raises for a bad request."""


class CircuitOpenError(RuntimeError):
    """The circuit breaker is open: the server failed too often; no call was made."""


def is_retryable(exc: BaseException) -> bool:
    """A transport failure (refused, reset, dropped mid-answer, timed out) or a status
    in `RETRY_STATUSES`. An open circuit is not retried: it fails fast by design."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, RemoteHTTPError) and exc.status in RETRY_STATUSES


def is_server_failure(exc: BaseException) -> bool:
    """What counts against the circuit breaker: the server is unreachable or broken
    (a transport failure, a 5xx). A 4xx, 429 included, means it is up and answering."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, RemoteHTTPError) and exc.status >= 500


def retry_after_s(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """A Retry-After header's wait in seconds (delta-seconds or an HTTP date); None if
    absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now())


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How a failed call is tried again.

    max_attempts: calls at most, the first included (1: never retry).
    backoff_s, max_backoff_s: the wait before attempt k+1 is drawn uniformly from
        [0, min(max_backoff_s, backoff_s * 2**(k-1))] ("full jitter": clients that
        failed together do not come back together); a server's Retry-After (429, 503)
        raises it to at least that, still capped by max_backoff_s.
    deadline_s: no new attempt starts after this many seconds since the first (None:
        no limit but max_attempts).
    """

    max_attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not self.backoff_s >= 0:
            raise ValueError(f"backoff_s must be >= 0, got {self.backoff_s!r}")
        if not self.max_backoff_s >= self.backoff_s:
            raise ValueError(
                f"max_backoff_s must be >= backoff_s ({self.backoff_s}), got {self.max_backoff_s!r}"
            )
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be None or > 0, got {self.deadline_s!r}")

    def retrying(self, sleep: Callable[[float], None] = time.sleep) -> tenacity.Retrying:
        """A tenacity controller: retries what `is_retryable` says, reraises the last
        failure when out of attempts (or time)."""
        stop = tenacity.stop_after_attempt(self.max_attempts)
        if self.deadline_s is not None:
            stop = stop | tenacity.stop_after_delay(self.deadline_s)
        jitter = tenacity.wait_random_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            asked = getattr(exc, "retry_after_s", None) or 0.0
            return min(self.max_backoff_s, max(jitter(state), asked))

        return tenacity.Retrying(
            stop=stop,
            wait=wait,
            retry=tenacity.retry_if_exception(is_retryable),
            sleep=sleep,
            reraise=True,
        )


class CircuitBreaker:
    """Fail fast while a server is down, and find out when it is back.

    closed: calls go through; ``failure_threshold`` failures in a row open it.
    open: `before_call` raises CircuitOpenError for ``reset_timeout_s``, then the
        circuit is half-open.
    half-open: one call (the probe) goes through, the others fail fast; the probe's
        success closes the circuit, its failure opens it for another reset_timeout_s.

    The caller reports each call's outcome with `record_success` / `record_failure`
    (what counts as a failure is the caller's: `is_server_failure`).
    """

    def __init__(
        self,
        failure_threshold: int = 5,
        reset_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(failure_threshold, int) or failure_threshold < 1:
            raise ValueError(f"failure_threshold must be an int >= 1, got {failure_threshold!r}")
        if not reset_timeout_s > 0:
            raise ValueError(f"reset_timeout_s must be > 0, got {reset_timeout_s!r}")
        self.failure_threshold, self.reset_timeout_s, self.clock = (
            failure_threshold,
            reset_timeout_s,
            clock,
        )
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None  # None: closed
        self._probing = False

    @property
    def state(self) -> str:
        """ "closed", "open" or "half_open"."""
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self.clock() - self._opened_at < self.reset_timeout_s:
            return "open"
        return "half_open"

    def before_call(self) -> None:
        """Let a call through, or raise CircuitOpenError (open, or a probe is out)."""
        with self._lock:
            state = self._state()
            if state == "closed":
                return
            if state == "half_open" and not self._probing:
                self._probing = True
                return
            left = self.reset_timeout_s - (self.clock() - self._opened_at)
            raise CircuitOpenError(
                f"the circuit breaker is open after {self._failures} failures in a row; "
                + (f"next probe in {left:.1f} s" if left > 0 else "a probe is in flight")
            )

    def record_success(self) -> None:
        with self._lock:
            self._failures, self._opened_at, self._probing = 0, None, False

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1  # a failed probe: still past the threshold, so it reopens
            if self._failures >= self.failure_threshold:
                self._opened_at = self.clock()
            self._probing = False


class RateLimiter:
    """A token bucket: on average at most ``rate`` acquisitions per second, in bursts of
    at most ``burst``. `acquire` takes a token, sleeping until one is due; callers are
    served in the order they asked (each reserves the next token under the lock, then
    sleeps outside it)."""

    def __init__(
        self,
        rate: float,
        burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0 (requests per second), got {rate!r}")
        if not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be an int >= 1, got {burst!r}")
        self.rate, self.burst, self.clock, self.sleep = rate, burst, clock, sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._at = clock()

    def acquire(self) -> float:
        """Take one token; returns the seconds slept for it."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= 1  # below zero: reserved, due when the bucket refills to 0
            wait = max(0.0, -self._tokens / self.rate)
        if wait:
            self.sleep(wait)
        return wait
