"""The resilience pieces on their own, on a fake clock: the circuit breaker's states, the
rate limiter's spacing, the retry policy's jittered and capped waits."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyagent_ref.remote.resilience import (
    CircuitBreaker,
    CircuitOpenError,
    RateLimiter,
    RemoteHTTPError,
    RemoteRequestError,
    RetryPolicy,
    is_retryable,
    is_server_failure,
    retry_after_s,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_the_breaker_opens_after_the_threshold_fails_fast_and_probes_once():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=3, reset_timeout_s=10, clock=clock)
    for _ in range(2):
        b.before_call()
        b.record_failure()
    b.before_call()
    b.record_success()  # a success in between resets the count
    for _ in range(3):
        assert b.state == "closed"
        b.before_call()
        b.record_failure()
    assert b.state == "open"
    with pytest.raises(CircuitOpenError, match="after 3 failures in a row; next probe in 10.0 s"):
        b.before_call()
    clock.t += 9.9
    with pytest.raises(CircuitOpenError):
        b.before_call()
    clock.t += 0.1
    assert b.state == "half_open"
    b.before_call()  # the probe
    with pytest.raises(CircuitOpenError, match="a probe is in flight"):
        b.before_call()
    b.record_failure()  # the probe failed: open again for a full timeout
    assert b.state == "open"
    clock.t += 10
    b.before_call()
    b.record_success()
    assert b.state == "closed"
    b.before_call()


def test_the_breaker_rejects_bad_settings():
    with pytest.raises(ValueError, match="failure_threshold must be an int >= 1, got 0"):
        CircuitBreaker(failure_threshold=0)
    with pytest.raises(ValueError, match="reset_timeout_s must be > 0, got -1"):
        CircuitBreaker(reset_timeout_s=-1)


@settings(max_examples=50, deadline=None)
@given(
    rate=st.floats(0.5, 100),
    burst=st.integers(1, 5),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=30),
)
def test_the_rate_limiter_never_exceeds_its_rate_beyond_the_burst(rate, burst, gaps):
    """Whenever callers come, in any window [a, b] at most burst + rate * (b - a)
    acquisitions complete; and a caller never waits when a token is free."""
    clock = Clock()
    limiter = RateLimiter(rate, burst, clock=clock, sleep=clock.sleep)
    done = []
    for gap in gaps:
        clock.t += gap
        limiter.acquire()
        done.append(clock.t)
    for i in range(len(done)):
        for j in range(i, len(done)):
            assert j - i + 1 <= burst + rate * (done[j] - done[i]) + 1e-6
    assert RateLimiter(rate, burst, clock=clock, sleep=clock.sleep).acquire() == 0


def test_the_rate_limiter_spaces_a_burst_at_its_rate():
    clock = Clock()
    limiter = RateLimiter(4, burst=2, clock=clock, sleep=clock.sleep)
    waits = [limiter.acquire() for _ in range(5)]
    assert waits == pytest.approx([0, 0, 0.25, 0.25, 0.25])
    with pytest.raises(ValueError, match="rate must be > 0"):
        RateLimiter(0)
    with pytest.raises(ValueError, match="burst must be an int >= 1, got 0"):
        RateLimiter(1, burst=0)


def _fail_times(policy: RetryPolicy, errors: list[BaseException]) -> tuple[list[float], int]:
    """Run a call that raises ``errors`` in turn, then succeeds; the waits and the calls."""
    waits, calls = [], []

    def call():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    for attempt in policy.retrying(sleep=waits.append):
        with attempt:
            call()
    return waits, len(calls)


def test_retries_wait_a_jittered_capped_exponential_backoff():
    policy = RetryPolicy(max_attempts=6, backoff_s=0.1, max_backoff_s=0.5)
    errors = [httpx.ConnectError("refused")] * 5
    runs = [_fail_times(policy, errors) for _ in range(200)]
    assert all(calls == 6 for _, calls in runs)
    for k, cap in enumerate([0.1, 0.2, 0.4, 0.5, 0.5]):
        waits = [w[k] for w, _ in runs]
        assert all(0 <= w <= cap for w in waits)
        assert max(waits) > 0.6 * cap and min(waits) < 0.4 * cap  # jittered across its range


def test_retry_after_raises_the_wait_and_a_4xx_is_not_retried():
    policy = RetryPolicy(max_attempts=3, backoff_s=0.01, max_backoff_s=2.0)
    waits, calls = _fail_times(policy, [RemoteHTTPError(503, "busy", retry_after_s=1.5)])
    assert calls == 2 and waits[0] == pytest.approx(1.5)
    with pytest.raises(RemoteRequestError):
        _fail_times(policy, [RemoteRequestError(400, "bad")])
    with pytest.raises(RemoteHTTPError, match="the server answered 500: broken"):
        _fail_times(policy, [RemoteHTTPError(500, "broken")] * 3)  # attempts spent


def test_what_is_retried_and_what_counts_against_the_breaker():
    dropped = httpx.RemoteProtocolError("peer closed connection")
    assert is_retryable(dropped) and is_server_failure(dropped)
    assert is_retryable(httpx.ReadTimeout("slow")) and is_server_failure(httpx.ReadTimeout("x"))
    busy, down, missing = (
        RemoteHTTPError(429, ""),
        RemoteHTTPError(503, ""),
        RemoteRequestError(404, ""),
    )
    assert is_retryable(busy) and not is_server_failure(busy)
    assert is_retryable(down) and is_server_failure(down)
    assert not is_retryable(missing) and not is_server_failure(missing)
    assert not is_retryable(CircuitOpenError("open"))


def test_retry_after_header_forms():
    assert retry_after_s("2") == 2.0 and retry_after_s(None) is None
    assert retry_after_s("soon") is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=lambda: 1445412470.0) == 10.0


def test_the_policy_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_attempts must be an int >= 1, got 0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match=r"max_backoff_s must be >= backoff_s \(1\), got 0.5"):
        RetryPolicy(backoff_s=1, max_backoff_s=0.5)
    with pytest.raises(ValueError, match="deadline_s must be None or > 0, got 0"):
        RetryPolicy(deadline_s=0)
