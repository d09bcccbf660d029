"""Sampling parameters of one request, with vLLM's names and validation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The sampler computes in float32: a parameter must round to a finite float32, and one
# that must be positive must not round to zero (top_p 1e-50 would become 0).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38
GREEDY_TEMPERATURE = 1e-5


@dataclass
class SamplingParams:
    """How to pick each next token of a request, and when to stop.

    Names and meanings follow vLLM (and through it the OpenAI API):
        n: completions per prompt (each with its own seed stream).
        temperature: below GREEDY_TEMPERATURE (1e-5, vLLM's bound) is greedy, as
            dividing by it would overflow; above, it scales the logits down by it.
        top_p: nucleus mass in (0, 1]; top_k: 0 or -1 disables, else keep the k best;
        min_p: in [0, 1], relative probability floor.
        presence_penalty, frequency_penalty: in [-2, 2], over generated tokens;
        repetition_penalty: > 0, over prompt and generated tokens (1 disables).
        logit_bias: token id -> bias in [-100, 100].
        seed: the request's Philox key; None draws one at random at admission.
        max_tokens: generated tokens at most (None: up to the model's context);
        min_tokens: EOS and stop token ids are ignored before this many.
        stop: strings that end the output (None, one str or a list);
        stop_token_ids: tokens that do (None or a list).
        ignore_eos: keep going past EOS. include_stop_str_in_output: keep the stop string.
        logprobs: how many top log-probabilities to return per generated token (None: none).
        skip_special_tokens, spaces_between_special_tokens: detokenization options.

    Float parameters must be numbers that float32 (the sampler's dtype) holds.
    Raises ValueError for a value out of range and TypeError for a container of the
    wrong type, naming the field and the value.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        self.stop = _string_list("stop", self.stop)
        self.stop_token_ids = _int_list("stop_token_ids", self.stop_token_ids)
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise TypeError(
                "logit_bias must be None or a dict of token id -> bias, "
                f"got {type(self.logit_bias).__name__}: {self.logit_bias!r}"
            )
        self._validate()

    def _validate(self) -> None:
        """Checks that need only the parameters; those that need the model (token ids
        against its vocabulary, lengths against its context) run at admission
        (`pyagent_ref.engine.admission`)."""

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if not _is_int(self.n) or self.n < 1:
            raise bad("n", "must be an int >= 1")
        if not _is_float32(self.temperature) or self.temperature < 0:
            raise bad("temperature", f"must be a number in [0, {FLOAT32_MAX:.3g}]")
        if not _is_float32(self.top_p) or not FLOAT32_TINY <= self.top_p <= 1:
            raise bad("top_p", f"must be in (0, 1] (and >= {FLOAT32_TINY:.3g}, in float32)")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (disabled) or a positive int")
        if not _is_float32(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_float32(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                raise bad(name, "must be in [-2, 2]")
        if not _is_float32(self.repetition_penalty) or self.repetition_penalty < FLOAT32_TINY:
            raise bad(
                "repetition_penalty", f"must be a number in [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.3g}]"
            )
        if self.seed is not None and (not _is_int(self.seed) or not -(2**63) <= self.seed < 2**64):
            raise bad("seed", "must be None or a 64-bit int")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise bad("max_tokens", "must be None or an int >= 1")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens}, "
                f"max_tokens={self.max_tokens}"
            )
        if any(not s for s in self.stop):
            raise bad("stop", "must hold non-empty strings")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must hold token ids >= 0")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise bad("logprobs", "must be None or an int >= 0")
        for token, value in (self.logit_bias or {}).items():
            if not _is_int(token) or token < 0 or not _is_float32(value) or abs(value) > 100:
                raise ValueError(
                    f"logit_bias entries must map token ids >= 0 to numbers in [-100, 100], "
                    f"got {token!r}: {value!r}"
                )
        for name in (
            "ignore_eos",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def sampling_temperature(self) -> float:
        """The temperature as the sampling ops take it: 0 means greedy."""
        return 0.0 if self.greedy else self.temperature

    @property
    def top_k_or_disabled(self) -> int:
        """top_k as the op takes it: 0 disables."""
        return max(self.top_k, 0)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float32(v: Any) -> bool:
    """A real number (not a bool) that float32 holds without overflow."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    return math.isfinite(v) and abs(v) <= FLOAT32_MAX


def _string_list(name: str, value: Any) -> list[str]:
    """None, one string or an iterable of strings, as a list (vLLM's forms of `stop`)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    items = list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(s, str) for s in items):
        raise TypeError(f"{name} must be None, a str or a list of str, got {value!r}")
    return items


def _int_list(name: str, value: Any) -> list[int]:
    """None or an iterable of ints (token ids), as a list."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple, set, frozenset)) else None
    if items is None or not all(_is_int(t) for t in items):
        raise TypeError(f"{name} must be None or a list of int token ids, got {value!r}")
    return items
