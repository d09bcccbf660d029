"""A request's fields -> `SamplingParams`, in one place.

Values are not range-checked here: `SamplingParams` does that, and its ValueError or
TypeError (which names the field) becomes a 400 whose ``param`` is the request's name for
the field (`errors.bad_request`). What is checked here is only what has no
`SamplingParams` counterpart: the shape of ``logit_bias``'s keys, the chat API's
``top_logprobs`` without ``logprobs``, and fields the server does not implement.
"""

from __future__ import annotations

from ..sample.params import SamplingParams
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields

# engine name -> the chat API's name, where they differ
CHAT_FIELDS = {
    "max_tokens": "max_completion_tokens",
    "logprobs": "top_logprobs",
    "prompt": "messages",
}


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """JSON object keys are strings: ``{"50256": -100}`` -> ``{50256: -100}``."""
    if bias is None:
        return None
    out = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except ValueError:
            raise APIError(
                400, f"logit_bias keys must be token ids, got {key!r}", "logit_bias"
            ) from None
    return out


def _common(req: SamplingFields, skip_special_tokens: bool) -> dict:
    """The keyword arguments both APIs share (None means the engine's default)."""
    given = {
        "n": req.n,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
        "logit_bias": _logit_bias(req.logit_bias),
        "allowed_token_ids": req.allowed_token_ids,
        "bad_words": req.bad_words,
        "typical_p": req.typical_p,
        "epsilon_cutoff": req.epsilon_cutoff,
        "eta_cutoff": req.eta_cutoff,
        "no_repeat_ngram_size": req.no_repeat_ngram_size,
        "dry_multiplier": req.dry_multiplier,
        "dry_base": req.dry_base,
        "dry_allowed_length": req.dry_allowed_length,
        "dry_penalty_last_n": req.dry_penalty_last_n,
        "dry_sequence_breakers": req.dry_sequence_breakers,
        "xtc_threshold": req.xtc_threshold,
        "xtc_probability": req.xtc_probability,
        "mirostat_mode": req.mirostat_mode,
        "mirostat_tau": req.mirostat_tau,
        "mirostat_eta": req.mirostat_eta,
        "seed": req.seed,
        "min_tokens": req.min_tokens,
        "stop": req.stop,
        "stop_token_ids": req.stop_token_ids,
        "ignore_eos": req.ignore_eos,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "prompt_logprobs": req.prompt_logprobs,
        "skip_special_tokens": skip_special_tokens
        if req.skip_special_tokens is None
        else req.skip_special_tokens,
    }
    return {name: value for name, value in given.items() if value is not None}


def _build(kwargs: dict, fields: dict[str, str] | None = None) -> SamplingParams:
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as exc:
        raise bad_request(exc, fields) from None


def completion_params(req: CompletionRequest) -> SamplingParams:
    """/v1/completions: ``max_tokens`` defaults to 16 (OpenAI's), None takes the rest of
    the context; ``logprobs`` is the number of top tokens per position, the echoed
    prompt's positions included."""
    if req.suffix is not None:
        raise APIError(
            400, "suffix is not supported: the engine does not do fill-in-the-middle", "suffix"
        )
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(
            400, f"best_of is not supported (it must equal n), got {req.best_of}", "best_of"
        )
    kwargs = _common(req, skip_special_tokens=True)
    if req.echo and req.logprobs is not None:  # the echoed prompt's tokens get logprobs too
        kwargs["prompt_logprobs"] = max(req.logprobs, req.prompt_logprobs or 0)
    kwargs.update(
        max_tokens=req.max_tokens,
        logprobs=req.logprobs,
        structured_outputs=req.structured_outputs,
    )
    return _build(kwargs)


def chat_params(
    req: ChatCompletionRequest, skip_special_tokens: bool, structured_outputs: dict | None
) -> SamplingParams:
    """/v1/chat/completions: ``max_completion_tokens`` (or the older ``max_tokens``)
    defaults to the rest of the context; ``logprobs: true`` returns the sampled token's
    log-probability and ``top_logprobs`` the most likely ones besides;
    ``structured_outputs`` is the constraint `chat.structured_outputs` found."""
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true, got logprobs false", "top_logprobs")
    kwargs = _common(req, skip_special_tokens)
    kwargs["max_tokens"] = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    kwargs["logprobs"] = (req.top_logprobs or 0) if req.logprobs else None
    kwargs["structured_outputs"] = structured_outputs
    fields = dict(CHAT_FIELDS)
    if req.max_completion_tokens is None:
        del fields["max_tokens"]  # the request used the older name
    return _build(kwargs, fields)
