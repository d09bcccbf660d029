"""An OpenAI-compatible HTTP server over one `AsyncLLM`: ``pyagent serve``.

    protocol.py     the API's request and response shapes (pydantic)
    sampling.py     request fields -> SamplingParams, with 400s naming the field
    errors.py       OpenAI's error shape and status codes, in one exception handler
    engine.py       ServingEngine (AsyncLLM + logprobs and metrics on deltas), seats (429)
    completions.py  POST /v1/completions
    chat.py         POST /v1/chat/completions, tool-call and reasoning parsers
    metrics.py      GET /metrics (prometheus-client, ``pyagent:`` prefix)
    app.py          the FastAPI app: routes, API key, lifespan (shutdown drains)

Run it: ``pyagent serve --port 8000`` (docs/serving.md).
"""

from __future__ import annotations

from .app import build_app
from .engine import ServingEngine
from .state import ServerConfig

__all__ = ["ServerConfig", "ServingEngine", "build_app", "serve"]


def serve(
    engine: ServingEngine,
    config: ServerConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    shutdown_timeout: float | None = 60.0,
    log_format: str = "text",
) -> None:
    """Serve until SIGINT/SIGTERM, then drain (at most ``shutdown_timeout`` seconds).
    log_format: "text", or "json" for one JSON object per line, uvicorn's lines
    included (`observe.logs`); either way every line carries its request id. Logging
    is configured here unless the root logger has a handler already (`pyagent serve`
    configures it before it builds the engine, whose core process logs alike)."""
    import logging

    import uvicorn
    import uvicorn.config

    from ..observe.logs import configure_logging

    if log_format not in ("text", "json"):
        raise ValueError(f"log_format must be 'text' or 'json', got {log_format!r}")
    if not logging.getLogger().handlers:
        configure_logging(log_level, json_lines=log_format == "json")
    app = build_app(engine, config)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # json: uvicorn's loggers propagate to the root handler, formatted as ours
        log_config=uvicorn.config.LOGGING_CONFIG if log_format == "text" else None,
        timeout_graceful_shutdown=shutdown_timeout,
    )
