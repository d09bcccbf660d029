"""Sampling parameters of one request, with vLLM's names and validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    """How to pick each next token of a request, and when to stop.

    Names and meanings follow vLLM (and through it the OpenAI API):
        n: completions per prompt (each with its own seed stream).
        temperature: 0 is greedy; > 0 scales the logits down by it.
        top_p: nucleus mass in (0, 1]; top_k: 0 or -1 disables, else keep the k best;
        min_p: in [0, 1], relative probability floor.
        presence_penalty, frequency_penalty: in [-2, 2], over generated tokens;
        repetition_penalty: > 0, over prompt and generated tokens (1 disables).
        logit_bias: token id -> bias in [-100, 100].
        seed: the request's Philox key; None draws one at random at admission.
        max_tokens: generated tokens at most (None: up to the model's context);
        min_tokens: EOS and stop token ids are ignored before this many.
        stop: strings that end the output; stop_token_ids: tokens that do.
        ignore_eos: keep going past EOS. include_stop_str_in_output: keep the stop string.
        logprobs: how many top log-probabilities to return per generated token (None: none).
        skip_special_tokens, spaces_between_special_tokens: detokenization options.
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
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.n) or self.n < 1:
            raise bad("n", "must be an int >= 1")
        if not is_num(self.temperature) or self.temperature < 0:
            raise bad("temperature", "must be a finite number >= 0")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "must be in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (disabled) or a positive int")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not is_num(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                raise bad(name, "must be in [-2, 2]")
        if not is_num(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "must be a finite number > 0")
        if self.seed is not None and (not is_int(self.seed) or not -(2**63) <= self.seed < 2**64):
            raise bad("seed", "must be None or a 64-bit int")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            raise bad("max_tokens", "must be None or an int >= 1")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens}, "
                f"max_tokens={self.max_tokens}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must hold non-empty strings")
        if any(not is_int(t) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must hold token ids >= 0")
        if self.logprobs is not None and (not is_int(self.logprobs) or self.logprobs < 0):
            raise bad("logprobs", "must be None or an int >= 0")
        for token, value in (self.logit_bias or {}).items():
            if not is_int(token) or token < 0 or not is_num(value) or not -100 <= value <= 100:
                raise ValueError(
                    f"logit_bias entries must map token ids >= 0 to numbers in [-100, 100], "
                    f"got {token!r}: {value!r}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def top_k_or_disabled(self) -> int:
        """top_k as the op takes it: 0 disables."""
        return max(self.top_k, 0)
