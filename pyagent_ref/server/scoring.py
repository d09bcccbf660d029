"""POST /v1/score, /rerank and /classify: the pooling APIs beyond embeddings (vLLM's).

- /v1/score (also /score): ``text_1`` against each of ``text_2`` (1 to N), or pairwise
  (N to N), as `LLM.score` pairs them: a cross-encoder reads each pair together and
  scores it with its head; an embedding model scores a pair by the cosine of the two
  embeddings.
- /rerank, /v1/rerank, /v2/rerank (Jina's and Cohere's shape): the documents scored
  against the query as /v1/score does, ordered best first, the ``top_n`` best.
- /classify: the class probabilities of each input through the model's classification
  head, with the label of the most likely class.

Each pair or input is a request of the engine, batched with those in flight; an input
the engine refuses (a model without the task, a prompt too long) is a 400 naming the
field, and nothing of the call stays queued.
"""

from __future__ import annotations

import uuid

from fastapi import Request

from ..engine.llm import _gather_all, score_pairs
from ..model.pooling import PoolingParams
from .completions import _prompts
from .errors import APIError, bad_request
from .protocol import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingUsage,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from .state import ServerState
from .streaming import until_disconnected


async def create_score(req: ScoreRequest, state: ServerState, request: Request) -> ScoreResponse:
    state.check_model(req.model)
    state.check_serving()
    outs = await _score(
        state, request, req.text_1, req.text_2, req.activation, ("text_1", "text_2")
    )
    data = [ScoreData(index=i, score=o.score) for i, o in enumerate(outs)]
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return ScoreResponse(
        id=f"score-{uuid.uuid4().hex}",
        model=state.config.served_model_name,
        data=data,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


async def create_rerank(req: RerankRequest, state: ServerState, request: Request) -> RerankResponse:
    state.check_model(req.model)
    state.check_serving()
    if req.top_n is not None and req.top_n < 1:
        raise APIError(400, f"top_n must be >= 1, got {req.top_n}", "top_n")
    fields = ("query", "documents")
    outs = await _score(state, request, req.query, req.documents, req.activation, fields)
    order = sorted(range(len(outs)), key=lambda i: -outs[i].score)[: req.top_n]
    results = [
        RerankResult(
            index=i,
            document=RerankDocument(text=req.documents[i]) if req.return_documents else None,
            relevance_score=outs[i].score,
        )
        for i in order
    ]
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return RerankResponse(
        id=f"rerank-{uuid.uuid4().hex}",
        model=state.config.served_model_name,
        usage=RerankUsage(total_tokens=tokens),
        results=results,
    )


async def create_classification(
    req: ClassificationRequest, state: ServerState, request: Request
) -> ClassificationResponse:
    state.check_model(req.model)
    state.check_serving()
    inputs = _prompts(req.input)
    if not inputs:
        raise APIError(400, "input must not be empty, got []", "input")
    pooling = PoolingParams(activation=req.activation, task="classify")
    rid = f"classify-{uuid.uuid4().hex}"
    state.seats.take(len(inputs))
    try:
        jobs = [state.engine.classify(p, pooling, f"{rid}-{i}") for i, p in enumerate(inputs)]
        outs = await until_disconnected(request, _gather_all(jobs))
    except (ValueError, TypeError) as exc:
        raise bad_request(exc, {"prompt": "input"}) from None
    finally:
        state.seats.give(len(inputs))
    _raise_failed(outs, [o.probs for o in outs])
    labels = state.engine.pooler_config.labels
    data = []
    for i, o in enumerate(outs):
        best = max(range(len(o.probs)), key=o.probs.__getitem__)
        label = labels[best] if labels else None
        data.append(
            ClassificationData(index=i, label=label, probs=o.probs, num_classes=len(o.probs))
        )
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return ClassificationResponse(
        id=rid,
        model=state.config.served_model_name,
        data=data,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


async def _score(state, request, data_1, data_2, activation, fields: tuple[str, str]):
    """`AsyncLLM.score` of the pairs, its errors as 400s naming the request's fields
    (`fields`: those of data_1 and data_2)."""
    first, second = fields
    try:
        score_pairs(data_1, data_2)
    except (ValueError, TypeError) as exc:
        message = str(exc).replace("data_1", first).replace("data_2", second)
        raise APIError(400, message, first if message.startswith(first) else second) from None
    seats = len(data_2) if isinstance(data_2, list) else 1
    state.seats.take(seats)
    try:
        pooling = PoolingParams(activation=activation, task="score")
        outs = await until_disconnected(
            request, state.engine.score(data_1, data_2, pooling, f"score-{uuid.uuid4().hex}")
        )
    except (ValueError, TypeError) as exc:
        raise bad_request(exc, {"prompt": second}) from None
    finally:
        state.seats.give(seats)
    _raise_failed(outs, [o.score for o in outs])
    return outs


def _raise_failed(outs: list, values: list) -> None:
    """A 500 for the first output that did not finish (its request's error)."""
    for i, (out, value) in enumerate(zip(outs, values, strict=True)):
        if value is None:
            raise APIError(500, f"input {i} failed: {out.error}")
