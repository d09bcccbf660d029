"""What the KV cache needs of a request: a Protocol, so that `kv_cache` does not depend
on `sched` (which builds on it). `sched.request.Request` satisfies it, and so does any
object with these attributes (a test's stand-in, another engine's request)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class MultiModalSpan(Protocol):
    """A multimodal item of the prompt: its content hash and the token span it fills."""

    content_hash: str
    offset: int
    length: int


class KVRequest(Protocol):
    """The request-side state that block allocation and prefix caching read.

    block_hashes is the one field the cache writes: the hashes of the request's full
    blocks, appended as they complete (`RequestBlockHasher`).
    """

    request_id: str
    num_computed_tokens: int
    num_encoder_tokens: int
    lora_id: int | None  # the LoRA adapter's id: requests of different adapters share no KV
    mm_features: Sequence[MultiModalSpan]
    cache_salt: str | None
    block_hashes: list[bytes]

    @property
    def num_tokens(self) -> int: ...

    def token_ids(self, start: int, end: int) -> list[int]:
        """The request's tokens [start, end) (prompt then output)."""
        ...
