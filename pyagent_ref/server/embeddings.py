"""POST /v1/embeddings: each input's final hidden states pooled into one vector.

Every input is one pooling request of the engine (`AsyncLLM.embed`), batched with the
requests in flight. How a prompt is pooled is the model's (`model.pooling.PoolerConfig`:
sentence-transformers' pooling and normalisation for an encoder such as
all-MiniLM-L6-v2, the last token for a decoder) unless the server's ``--pooling-type``
says otherwise; ``dimensions`` truncates a Matryoshka model's embedding (a 400 naming the
field for another model), ``normalize`` (vLLM's extra) overrides the model's choice.
``encoding_format: "base64"`` sends each vector as the base64 of its little-endian
float32 bytes, as OpenAI does.
"""

from __future__ import annotations

import base64
import uuid

import numpy as np
from fastapi import Request

from ..engine.llm import _gather_all
from ..model.pooling import PoolingParams
from .completions import _prompts
from .errors import APIError, bad_request
from .protocol import EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from .state import ServerState
from .streaming import until_disconnected


async def create_embedding(
    req: EmbeddingRequest, state: ServerState, request: Request
) -> EmbeddingResponse:
    lora = state.check_model(req.model)
    state.check_serving()
    inputs = _prompts(req.input)
    if not inputs:
        raise APIError(400, "input must not be empty, got []", "input")
    try:
        pooling = PoolingParams(
            state.config.pooling_type, normalize=req.normalize, dimensions=req.dimensions
        )
        state.engine.pooler_config.resolve(pooling)  # a 400 before any request is queued
    except (ValueError, TypeError) as exc:
        raise bad_request(exc, {"dimensions": "dimensions", "normalize": "normalize"}) from None
    rid = f"embd-{uuid.uuid4().hex}"
    state.seats.take(len(inputs))
    try:
        jobs = [state.engine.embed(p, pooling, f"{rid}-{i}", lora) for i, p in enumerate(inputs)]
        outs = await until_disconnected(request, _gather_all(jobs))
    except (ValueError, TypeError) as exc:
        raise bad_request(exc, {"prompt": "input"}) from None
    finally:
        state.seats.give(len(inputs))
    failed = [o for o in outs if o.embedding is None]
    if failed:
        raise APIError(500, f"input {outs.index(failed[0])} failed: {failed[0].error}")
    data = [
        EmbeddingData(index=i, embedding=_encoded(o.embedding, req.encoding_format))
        for i, o in enumerate(outs)
    ]
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    usage = EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    return EmbeddingResponse(data=data, model=state.model_name(req.model), usage=usage)


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
