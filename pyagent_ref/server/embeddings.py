"""POST /v1/embeddings: each input's final hidden states pooled into one vector.

Every input is one pooling request of the engine (`AsyncLLM.embed`), batched with the
generation requests in flight; the server's ``--pooling-type`` says how a prompt's
states are pooled (`model.pooling`). ``encoding_format: "base64"`` sends each vector as
the base64 of its little-endian float32 bytes, as OpenAI does.
"""

from __future__ import annotations

import asyncio
import base64
import uuid

import numpy as np
from fastapi import Request

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
    if req.dimensions is not None:
        raise APIError(
            400,
            f"dimensions is not supported (the model is not trained for truncated "
            f"embeddings), got {req.dimensions}",
            "dimensions",
        )
    inputs = _prompts(req.input)
    if not inputs:
        raise APIError(400, "input must not be empty, got []", "input")
    pooling = PoolingParams(state.config.pooling_type, normalize=req.normalize)
    rid = f"embd-{uuid.uuid4().hex}"
    state.seats.take(len(inputs))
    try:
        outs = await until_disconnected(request, _embed_all(state, inputs, pooling, rid, lora))
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


async def _embed_all(state: ServerState, inputs: list, pooling: PoolingParams, rid: str, lora):
    """Every input's `EmbeddingOutput`, in order; the first admission error cancels (and
    so aborts) the others."""
    tasks = [
        asyncio.ensure_future(state.engine.embed(p, pooling, f"{rid}-{i}", lora))
        for i, p in enumerate(inputs)
    ]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
