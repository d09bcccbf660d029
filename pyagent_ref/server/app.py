"""The FastAPI application: routes, the API key check, and the engine's lifetime.

    GET  /  (the chat playground)  /health  /version  /metrics  /v1/models
    POST /v1/completions  /v1/chat/completions  /v1/responses  /v1/embeddings
         /v1/score (/score)  /rerank (/v1/rerank, /v2/rerank)  /classify
         /tokenize  /detokenize  /v1/load_lora_adapter  /v1/unload_lora_adapter
         /start_profile  /stop_profile (torch.profiler, with --profiler-dir)

Every answer carries an X-Request-Id (the client's, or a fresh one), which the log lines
and engine request ids of that request share (`observe.logs`).

LoRA adapters (the engine's enable_lora) are models of their own: ``model`` names one
(a 404 for a name the server does not serve), /v1/models lists them with their base as
``parent``; they are served from the start (`ServerConfig.lora_modules`) or loaded and
unloaded while the server runs, as vLLM's endpoints do.

Every route but /, /health, /version and /metrics needs ``Authorization: Bearer KEY`` when
the server has an API key (the playground is a static page: its own API calls send the key
typed into it). Shutting down (uvicorn's SIGINT / SIGTERM) drains: uvicorn stops accepting
connections and waits for the open ones, then the engine is shut down with drain=True, so
every request in flight finishes.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import uuid
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from starlette.datastructures import Headers

from .. import __version__
from ..observe.logs import request_id as log_request_id
from .chat import create_chat_completion
from .completions import create_completion
from .embeddings import create_embedding
from .engine import ServingEngine
from .errors import APIError, install_error_handlers
from .protocol import (
    ChatCompletionRequest,
    ClassificationRequest,
    ClassificationResponse,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    RerankRequest,
    RerankResponse,
    ResponsesRequest,
    ScoreRequest,
    ScoreResponse,
    TokenizeRequest,
    TokenizeResponse,
    UnloadLoRAAdapterRequest,
)
from .responses import create_response
from .scoring import create_classification, create_rerank, create_score
from .state import ServerConfig, ServerState

_OPEN_PATHS = {"/", "/health", "/version", "/metrics"}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The playground loads nothing but itself and talks only to this server; the browser
# enforces that.
_PLAYGROUND_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)


def build_app(engine: ServingEngine, config: ServerConfig | None = None) -> FastAPI:
    """A server over ``engine`` (which it shuts down, draining, when it stops)."""
    state = ServerState(engine, config or ServerConfig())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        for lora in state.loras.values():  # --lora-modules: a bad one stops the start
            await engine.add_lora(lora)
        yield
        await engine.shutdown(drain=True)

    app = FastAPI(title="pyagent", version=__version__, lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)

    app.add_middleware(_RequestGate, state=state)

    @app.post("/start_profile")
    async def start_profile() -> Response:
        """Start torch.profiler on the engine core (needs --profiler-dir)."""
        try:
            await engine.start_profile()
        except RuntimeError as exc:
            raise APIError(400, str(exc)) from None
        return Response(status_code=200)

    @app.post("/stop_profile")
    async def stop_profile() -> dict:
        """Stop it and write the trace; answers its path."""
        try:
            return {"trace": await engine.stop_profile()}
        except RuntimeError as exc:
            raise APIError(400, str(exc)) from None

    playground = (resources.files(__package__) / "static" / "playground.html").read_text("utf-8")

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(playground, headers={"Content-Security-Policy": _PLAYGROUND_CSP})

    @app.get("/health")
    async def health() -> Response:
        """200 while the engine can serve; 503 (and why) once its core process died."""
        failure = getattr(engine.core, "failure", None)
        if failure is not None:
            raise APIError(503, failure)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", response_model_exclude_none=True)
    async def models() -> ModelList:
        base = state.config.served_model_name
        card = ModelCard(
            id=base,
            root=str(engine.config.model or "pyagent-default"),
            max_model_len=engine.core.max_model_len,
        )
        adapters = [
            ModelCard(id=name, root=lora.lora_path, parent=base)
            for name, lora in state.loras.items()
        ]
        return ModelList(data=[card, *adapters])

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> PlainTextResponse:
        _check_lora_enabled(engine)
        if req.lora_name in state.loras or req.lora_name == state.config.served_model_name:
            raise APIError(
                400, f"The lora adapter {req.lora_name!r} has already been loaded.", "lora_name"
            )
        lora = state.new_lora(req.lora_name, req.lora_path)
        try:
            await engine.add_lora(lora)
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise APIError(400, f"LoRA adapter {req.lora_name!r}: {exc}", "lora_path") from None
        if req.lora_name in state.loras:  # loaded meanwhile by another request
            await engine.remove_lora(lora.lora_int_id)
            raise APIError(
                400, f"The lora adapter {req.lora_name!r} has already been loaded.", "lora_name"
            )
        state.loras[req.lora_name] = lora
        return PlainTextResponse(f"Success: LoRA adapter {req.lora_name!r} added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        _check_lora_enabled(engine)
        lora = state.loras.get(req.lora_name)
        if lora is None or req.lora_int_id not in (None, lora.lora_int_id):
            raise APIError(
                404,
                f"The lora adapter {req.lora_name!r} cannot be found.",
                "lora_name",
                "model_not_found",
            )
        del state.loras[req.lora_name]
        await engine.remove_lora(lora.lora_int_id)  # requests in flight finish with it
        return PlainTextResponse(f"Success: LoRA adapter {req.lora_name!r} removed successfully.")

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest, request: Request):
        return _dumped(await create_completion(req, state, request))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return _dumped(await create_chat_completion(req, state, request))

    @app.post("/v1/responses", response_model=None)
    async def responses(req: ResponsesRequest, request: Request):
        return _dumped(await create_response(req, state, request))

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, request: Request) -> EmbeddingResponse:
        return await create_embedding(req, state, request)

    @app.post("/v1/score", response_model_exclude_none=True)
    @app.post("/score", response_model_exclude_none=True)
    async def score(req: ScoreRequest, request: Request) -> ScoreResponse:
        return await create_score(req, state, request)

    @app.post("/rerank", response_model_exclude_none=True)
    @app.post("/v1/rerank", response_model_exclude_none=True)
    @app.post("/v2/rerank", response_model_exclude_none=True)
    async def rerank(req: RerankRequest, request: Request) -> RerankResponse:
        return await create_rerank(req, state, request)

    @app.post("/classify")
    async def classify(req: ClassificationRequest, request: Request) -> ClassificationResponse:
        return await create_classification(req, state, request)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> TokenizeResponse:
        state.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of prompt and messages", "prompt")
        try:
            if req.prompt is not None:
                ids = state.tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
            else:
                ids = state.tokenizer.apply_chat_template(
                    req.messages,
                    add_generation_prompt=req.add_generation_prompt,
                    tokenize=True,
                    **(req.chat_template_kwargs or {}),
                )
        except (ValueError, TypeError) as exc:
            param = "prompt" if req.prompt is not None else "messages"
            raise APIError(400, str(exc), param) from None
        return TokenizeResponse(count=len(ids), max_model_len=engine.core.max_model_len, tokens=ids)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> DetokenizeResponse:
        state.check_model(req.model)
        try:
            return DetokenizeResponse(prompt=state.tokenizer.decode(req.tokens))
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc), "tokens") from None

    return app


class _RequestGate:
    """Every HTTP request's id and API key check, as plain ASGI middleware (starlette's
    ``@app.middleware`` would relay each chunk of a stream through a task and a memory
    stream of its own, per middleware).

    The request's id: the client's X-Request-Id if it is a plain token, else a fresh
    one. It is in every log line while the request is served (set in this request's
    task, whose context ends with it), in its engine request ids, and echoed in the
    answer's X-Request-Id, a 401 included.
    """

    def __init__(self, app, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        rid = headers.get("x-request-id", "")
        if not _REQUEST_ID.fullmatch(rid):
            rid = uuid.uuid4().hex
        log_request_id.set(rid)
        tag = [(b"x-request-id", rid.encode())]

        async def send_tagged(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *tag]
            await send(message)

        key = self.state.config.api_key
        if key is not None and scope["path"] not in _OPEN_PATHS:
            sent = headers.get("authorization", "")
            if not secrets.compare_digest(sent.encode(), f"Bearer {key}".encode()):
                what = "no API key was sent" if not sent else "the API key is not valid"
                error = APIError(
                    401, f"{what}: send 'Authorization: Bearer <key>'", code="invalid_api_key"
                )
                await error.response()(scope, receive, send_tagged)
                return
        await self.app(scope, receive, send_tagged)


def _check_lora_enabled(engine: ServingEngine) -> None:
    if not engine.config.enable_lora:
        raise APIError(400, "LoRA is not enabled: start the server with --enable-lora")


def _dumped(result):
    """Pydantic responses as JSON without their None fields; streams as they are."""
    if isinstance(result, Response):
        return result
    return Response(result.model_dump_json(exclude_none=True), media_type="application/json")
