"""A request as the KV cache and the scheduler see it: tokens and what changes their KV."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MultiModalFeature:
    """A multimodal item in the prompt: its content hash and the prompt span it fills.

    Its placeholder tokens [offset, offset + length) look alike for any image, so the
    content hash must enter the prefix-cache key of every block the span overlaps.
    """

    content_hash: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1:
            raise ValueError(
                f"a multimodal feature needs offset >= 0 and length >= 1, "
                f"got offset={self.offset}, length={self.length}"
            )


@dataclass(eq=False)
class Request:
    """One generation request.

    Attributes:
        request_id: unique among live requests.
        prompt_token_ids: the prompt, at least one token.
        output_token_ids: tokens generated so far.
        num_computed_tokens: tokens whose KV is in the cache (or being computed in the
            scheduled step).
        lora_name: the LoRA adapter, if any (part of the prefix-cache key).
        mm_features: multimodal items in the prompt (part of the key of the blocks
            they overlap).
        cache_salt: isolates this request's prefix cache from requests with another
            salt (part of the key of the first block).
        num_encoder_tokens: encoder input length, for encoder-decoder models (the
            cross-attention KV it needs).
        block_hashes: hashes of the full blocks of all_token_ids, filled by
            `kv_cache.RequestBlockHasher`.
    """

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    lora_name: str | None = None
    mm_features: tuple[MultiModalFeature, ...] = ()
    cache_salt: str | None = None
    num_encoder_tokens: int = 0
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_token_ids must not be empty")
        self.prompt_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        self.output_token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
