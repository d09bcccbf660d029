"""A client of remote OpenAI-compatible servers with retries, a circuit breaker and a
rate limit (`RemoteLLM`, `remote.resilience`)."""

from .client import RemoteLLM, request_body
from .resilience import (
    CircuitBreaker,
    CircuitOpenError,
    RateLimiter,
    RemoteHTTPError,
    RemoteRequestError,
    RetryPolicy,
)

__all__ = [
    "CircuitBreaker",
    "CircuitOpenError",
    "RateLimiter",
    "RemoteHTTPError",
    "RemoteLLM",
    "RemoteRequestError",
    "RetryPolicy",
    "request_body",
]
