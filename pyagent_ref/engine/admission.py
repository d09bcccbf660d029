"""Admission: every check that can be made before a request is queued.

A request that passes them can only end by finishing (a stop condition or its length),
by an abort, or by an error of its own (`finish_reason="error"`); one that fails them
raises here, before anything is queued, with a ValueError or TypeError that names the
parameter and the value. `SamplingParams` checks its own values when it is built; what
needs the model is checked here:

    prompt   a str that is valid Unicode (no lone surrogates), a non-empty sequence of
             int token ids (numpy or torch integers too, never bool or bytes), or
             vLLM's dict forms {"prompt": str} and {"prompt_token_ids": [int, ...]}
    ids      prompt ids, stop_token_ids, logit_bias keys, allowed_token_ids,
             bad_words_token_ids (the bad words, tokenized) and
             dry_sequence_breaker_ids in [0, vocab_size)
    n        at most MAX_N completions per prompt (the OpenAI API's bound)
    logprobs and prompt_logprobs at most max_logprobs
    length   prompt + max_tokens <= max_model_len (max_tokens=None takes the rest); a
             pooling request's prompt <= max_model_len, and an encoder's <=
             max_num_batched_tokens (it runs whole in one step)
    task     a generation request on an engine that generates, a pooling request's task
             (embed, classify, score) among those the engine serves (`runner`, `task`)
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..sample.params import SamplingParams
from ..sched.request import Request

MAX_N = 128


@dataclass(frozen=True)
class Limits:
    """What admission checks a request against: the model's vocabulary and context,
    the engine's bound on returned log-probabilities, the tasks it serves
    (`model.pooling.supported_tasks`) under its runner, and, for an encoder, the most
    prompt tokens one step computes."""

    vocab_size: int
    max_model_len: int
    max_logprobs: int
    tasks: tuple[str, ...] = ("generate", "embed", "score")
    runner: str = "auto"
    architecture: str = ""
    whole_prompt_tokens: int | None = None


def prompt_token_ids(prompt: Any, encode) -> tuple[str | None, list[int]]:
    """(text or None, token ids) of one prompt; `encode` tokenizes text.

    Raises TypeError for a prompt of another type and ValueError for an empty one or
    text that is not valid Unicode. Ids are range-checked by `check_request`.
    """
    if isinstance(prompt, dict):
        return _dict_prompt(prompt, encode)
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"prompt is not valid Unicode: {exc.reason} at index {exc.start} "
                f"({prompt[exc.start : exc.end]!r})"
            ) from None
        ids = list(encode(prompt))
        if not ids:
            raise ValueError(f"prompt {prompt!r} encodes to no tokens")
        return prompt, ids
    if isinstance(prompt, (bytes, bytearray, memoryview)) or not _is_id_sequence(prompt):
        raise TypeError(
            "prompt must be a str, a sequence of int token ids or a dict with 'prompt' or "
            f"'prompt_token_ids', got {type(prompt).__name__}: {_short(prompt)}"
        )
    ids = [_token_id("prompt", t) for t in prompt]
    if not ids:
        raise ValueError("prompt must not be empty")
    return None, ids


def check_n(params: SamplingParams) -> None:
    if params.n > MAX_N:
        raise ValueError(f"n must be <= {MAX_N}, got {params.n}")


def check_request(request: Request, limits: Limits) -> None:
    """Raise if `request` could never be served within `limits` (see the module doc)."""
    _check_task(request, limits)
    params = request.sampling_params
    _check_ids("prompt", request.prompt_token_ids, limits.vocab_size)
    _check_ids("stop_token_ids", params.stop_token_ids, limits.vocab_size)
    _check_ids("logit_bias", (params.logit_bias or {}).keys(), limits.vocab_size)
    _check_ids("allowed_token_ids", params.allowed_token_ids or (), limits.vocab_size)
    for seq in params.bad_words_token_ids or ():
        _check_ids("bad_words_token_ids", seq, limits.vocab_size)
    _check_ids("dry_sequence_breaker_ids", params.dry_sequence_breaker_ids or (), limits.vocab_size)
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > limits.max_logprobs:
            raise ValueError(
                f"{name} must be <= max_logprobs={limits.max_logprobs} (an engine option), "
                f"got {value}"
            )
    num_prompt = request.num_prompt_tokens
    if request.pooling_params is not None:
        _check_pooling_length(num_prompt, limits)
        return
    if num_prompt >= limits.max_model_len:
        raise ValueError(
            f"the prompt has {num_prompt} tokens, which leaves no room to generate in "
            f"max_model_len={limits.max_model_len}"
        )
    if num_prompt + request.max_tokens > limits.max_model_len:
        raise ValueError(
            f"max_tokens={request.max_tokens} is too large: the prompt has {num_prompt} "
            f"tokens and max_model_len={limits.max_model_len} leaves room for "
            f"{limits.max_model_len - num_prompt}"
        )


def _check_task(request: Request, limits: Limits) -> None:
    pooling = request.pooling_params
    task = "generate" if pooling is None else pooling.task
    if task in limits.tasks:
        return
    model = limits.architecture or "the model"
    if task == "generate":
        raise ValueError(
            f"this engine does not generate (runner={limits.runner!r}, {model}): it serves "
            f"{list(limits.tasks)}"
        )
    raise ValueError(
        f"task {task!r} is not served by this engine (runner={limits.runner!r}, {model}): it "
        f"serves {list(limits.tasks)}"
    )


def _check_pooling_length(num_prompt: int, limits: Limits) -> None:
    if num_prompt > limits.max_model_len:
        raise ValueError(
            f"the prompt has {num_prompt} tokens, more than max_model_len={limits.max_model_len}"
        )
    whole = limits.whole_prompt_tokens
    if whole is not None and num_prompt > whole:
        raise ValueError(
            f"the prompt has {num_prompt} tokens, more than max_num_batched_tokens={whole}: an "
            "encoder computes a prompt whole in one step (bidirectional attention cannot be "
            "chunked); raise max_num_batched_tokens"
        )


def _dict_prompt(prompt: dict, encode) -> tuple[str | None, list[int]]:
    keys = set(prompt) & {"prompt", "prompt_token_ids"}
    if len(keys) != 1:
        raise ValueError(
            "a dict prompt must have exactly one of 'prompt' (text) or 'prompt_token_ids', "
            f"got keys {sorted(map(str, prompt))}"
        )
    if "prompt" in keys:
        if not isinstance(prompt["prompt"], str):
            raise TypeError(f"prompt['prompt'] must be a str, got {_short(prompt['prompt'])}")
        return prompt_token_ids(prompt["prompt"], encode)
    ids = prompt["prompt_token_ids"]
    if isinstance(ids, str):
        raise TypeError(f"prompt['prompt_token_ids'] must be a list of ints, got {ids!r}")
    return prompt_token_ids(ids, encode)


def _is_id_sequence(prompt: Any) -> bool:
    """A list, tuple, range, or 1-D numpy/torch array (ints are checked one by one)."""
    if isinstance(prompt, Sequence):
        return True
    shape = getattr(prompt, "shape", None)
    return shape is not None and len(shape) == 1


def _token_id(name: str, value: Any) -> int:
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise TypeError(f"{name} must hold int token ids, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must hold int token ids, got {_short(value)}") from None


def _check_ids(name: str, ids: Iterable[int], vocab_size: int) -> None:
    for t in ids:
        if not 0 <= t < vocab_size:
            raise ValueError(
                f"{name} holds token id {t}, outside the model's vocabulary [0, {vocab_size})"
            )


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
