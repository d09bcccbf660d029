"""``use_beam_search: true`` on /v1/completions and /v1/chat/completions (vLLM's extra
field): the ``n`` choices are the ``n`` best sequences of a beam search of width ``n``
(`AsyncLLM.beam_search`, HF's greedy ``num_beams`` search), ranked by
cum_logprob / length ** ``length_penalty``.

As in vLLM, a beam search reads only ``n``, the token limit, ``ignore_eos``,
``include_stop_str_in_output``, ``length_penalty`` and ``temperature`` (which must be 0);
the other sampling fields do not apply to it. What cannot be honoured is refused with a
400 naming the field: streaming (the beams are only known at the end), logprobs, a LoRA
adapter, and constraints (``structured_outputs``, ``response_format``, a required or
named ``tool_choice``). Chat image parts go with every beam (each image encoded once).
"""

from __future__ import annotations

from fastapi import Request

from ..engine.beam_search import BeamSearchOutput, BeamSearchParams
from ..engine.llm import Prompt, _gather_all
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest
from .state import ServerState
from .streaming import until_disconnected

# BeamSearchParams' names -> the request's
FIELDS = {"beam_width": "n", "length_penalty": "length_penalty", "temperature": "temperature"}


def beam_params(
    req: CompletionRequest | ChatCompletionRequest,
    max_tokens: int | None,
    refused: dict[str, bool],
    max_tokens_field: str = "max_tokens",
) -> BeamSearchParams:
    """The search's parameters; a 400 naming the first field in ``refused`` that is set
    (or that the search cannot take) or a value out of range. max_tokens None: the
    rest of the context (set by the caller)."""
    refused = {"stream": req.stream, **refused}
    for name, given in refused.items():
        if given:
            raise APIError(400, f"{name} is not supported with use_beam_search", name)
    try:
        return BeamSearchParams(
            beam_width=req.n,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            temperature=req.temperature or 0.0,
            length_penalty=req.length_penalty,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
    except (ValueError, TypeError) as exc:
        raise bad_request(exc, FIELDS | {"max_tokens": max_tokens_field}) from None


async def run_beam_searches(
    state: ServerState, request: Request, prompts: list[Prompt], params: BeamSearchParams, rid: str
) -> list[BeamSearchOutput]:
    """One search per prompt (request ids ``rid-i``), all at once; each holds beam_width
    seats of the server's queue while it runs. A client that leaves cancels them
    (aborting their steps); an admission error is a 400."""
    seats = params.beam_width * len(prompts)
    state.seats.take(seats)
    try:
        searches = [
            state.engine.beam_search(p, params, f"{rid}-{i}") for i, p in enumerate(prompts)
        ]
        return await until_disconnected(request, _gather_all(searches))
    except (ValueError, TypeError) as exc:
        raise bad_request(exc) from None
    finally:
        state.seats.give(seats)
