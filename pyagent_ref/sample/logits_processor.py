"""Custom logits processors: user code that rewrites a whole batch of logits each step.

vLLM v1's model: a processor is built once per engine, keeps whatever per-request state it
needs, hears which requests join and leave the batch (`update_state`), and transforms the
batch's logits in one call (`apply`), leaving the rows of requests that do not use it as
they are. Per-request settings travel in `SamplingParams.extra_args`, checked at admission
by `validate_params` (a ValueError there is the request's error, nothing is queued).

    class BanUntil(LogitsProcessor):
        '''extra_args={"ban": [ids], "until": n}: the ids cannot be drawn before output n.'''

        @classmethod
        def validate_params(cls, params):
            ...  # raise ValueError naming the bad argument

        def apply(self, logits, rows):
            for i, row in enumerate(rows):
                args = row.params.extra_args or {}
                if "ban" in args and len(row.output_token_ids) < args["until"]:
                    logits[i, args["ban"]] = float("-inf")
            return logits

    LLM(model, logits_processors=[BanUntil])   # or "my_module:BanUntil"

Where they run: after the structured-output mask and the token masks (allowed ids, bad
words, no-repeat n-grams), before penalties, logit bias and temperature, in the order
given. `apply` gets float32 logits of shape (rows, vocab) on the host and one
`SamplingRow` per row (request id, parameters, prompt and output tokens); with
speculative decoding a request owns several consecutive rows, each with the drafts before
it in its output. It may change `logits` in place and must return the batch (a new
tensor of the same shape is fine). A row left entirely -inf fails its request.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .params import SamplingParams

if TYPE_CHECKING:
    from .sampler import SamplingRow


@dataclass(frozen=True)
class BatchUpdate:
    """Who joined and who left the batch since the last step.

    added: (request id, its parameters, its prompt token ids) of each request that will
        sample from this step on (new, or back from preemption).
    removed: the ids of requests that finished, were aborted or were preempted (told
        at the next step the engine runs).
    """

    added: list[tuple[str, SamplingParams, Sequence[int]]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


class LogitsProcessor(ABC):
    """Base class of custom logits processors (see the module docstring). A subclass
    must define `apply`; one that does not cannot be instantiated (TypeError when the
    engine is built)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    @classmethod  # noqa: B027 - an optional hook
    def validate_params(cls, params: SamplingParams) -> None:
        """Raise ValueError (naming the argument and value) if `params.extra_args`
        holds settings of this processor it cannot use. Default: accept everything."""

    def update_state(self, batch_update: BatchUpdate) -> None:  # noqa: B027 - an optional hook
        """Called before `apply` each step the batch changed. Default: nothing to keep."""

    @abstractmethod
    def apply(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """The batch's logits after this processor (see the module docstring)."""


def load_logits_processors(entries: Sequence[type | str]) -> list[type[LogitsProcessor]]:
    """The processor classes of `entries`: classes, or "module:Class" / "module.Class"
    import paths. Raises TypeError (naming the entry) for anything that is not a
    `LogitsProcessor` subclass, ValueError for a path that does not import."""
    classes = []
    for entry in entries:
        cls = entry
        if isinstance(entry, str):
            module, sep, name = entry.rpartition(":") if ":" in entry else entry.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name) if sep else None
            except (ImportError, AttributeError) as exc:
                raise ValueError(
                    f"logits_processors entry {entry!r} does not import: {exc}"
                ) from None
        if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
            raise TypeError(
                f"logits_processors entries must be LogitsProcessor subclasses or their "
                f"import paths, got {entry!r}"
            )
        classes.append(cls)
    return classes
