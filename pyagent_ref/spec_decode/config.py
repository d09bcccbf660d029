"""`SpeculativeConfig`: the engine's speculative-decoding settings, under vLLM's names."""

from __future__ import annotations

from dataclasses import dataclass, fields

METHODS = ("ngram",)
"""The proposers that exist (vLLM's method names)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SpeculativeConfig:
    """How a request's next tokens are proposed before the target model verifies them.

    method: the proposer, one of `METHODS`: "ngram" looks the tokens up in the request's
        own prompt and output (`ngram.propose_ngram`).
    num_speculative_tokens: drafts proposed per step, an int >= 1; a step then emits
        between 1 and num_speculative_tokens + 1 tokens.
    prompt_lookup_min, prompt_lookup_max: for "ngram", the shortest and the longest
        suffix of the sequence that is searched for, ints with
        1 <= prompt_lookup_min <= prompt_lookup_max.

    Raises ValueError naming the field and the value for a value out of range, an
    unknown method, or prompt_lookup_min > prompt_lookup_max; TypeError for a value that
    is not an int (or not a str, for method).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.method, str):
            raise TypeError(f"method must be a str, got {self.method!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                "prompt_lookup_min must be <= prompt_lookup_max, got "
                f"prompt_lookup_min={self.prompt_lookup_min}, "
                f"prompt_lookup_max={self.prompt_lookup_max}"
            )

    @classmethod
    def from_dict(cls, value: dict) -> SpeculativeConfig:
        """From a dict of the fields (vLLM's --speculative-config JSON object)."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; its keys are {known}")
        return cls(**value)
