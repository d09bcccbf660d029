"""Errors in OpenAI's JSON shape, with the status the OpenAI clients map to exceptions.

    400 invalid_request_error   a bad field (the client raises BadRequestError)
    401 authentication_error    a missing or wrong API key (AuthenticationError)
    404 not_found_error         an unknown model or path (NotFoundError)
    429 rate_limit_error        the server's queue is full (RateLimitError)
    503 service_unavailable     the engine is asleep, shutting down, or its core process
                                died (InternalServerError)
    500 server_error            a bug (InternalServerError)

Handlers raise `APIError`; `install_error_handlers` turns it, pydantic's validation errors
(never FastAPI's default 422 body) and anything unexpected into that shape. The engine
says what is wrong with a request by raising ValueError or TypeError whose message starts
with the parameter's name; `bad_request` keeps that name as ``param``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..engine.core_proc import EngineDeadError
from ..sample.params import SamplingParams
from .protocol import ErrorInfo, ErrorResponse

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error answer: status, message, and the parameter it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        info = ErrorInfo(
            message=self.message,
            type=_TYPES.get(self.status, "server_error"),
            param=self.param,
            code=self.code,
        )
        return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=self.status)


_LEADING_NAME = re.compile(r"^(?:the )?([a-z_]+)")


def bad_request(exc: Exception, fields: Mapping[str, str] | None = None) -> APIError:
    """A 400 for a ValueError/TypeError of the engine (or of `SamplingParams`).

    Their messages start with the parameter's name ("temperature must be ...", "the
    prompt has 2000 tokens ..."); ``fields`` maps engine names to the request's field
    names where they differ (``max_tokens`` -> ``max_completion_tokens``). A message that
    names no known field gives ``param`` None.
    """
    message = str(exc)
    fields = fields or {}
    match = _LEADING_NAME.match(message)
    name = match.group(1) if match else None
    return APIError(400, message, fields.get(name, name) if name in _KNOWN | set(fields) else None)


# Names the engine's messages start with: SamplingParams' fields, and admission's "prompt".
_KNOWN = {f.name for f in dataclasses.fields(SamplingParams)} | {"prompt"}


def _validation_error(exc: RequestValidationError) -> APIError:
    """pydantic's first complaint as one 400: ``param`` is the field's path
    (``messages.0.content``), the message says what was wrong and what was sent."""
    first = exc.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        message = f"unknown field {param!r}: this server does not support it"
    elif first.get("type") == "json_invalid":
        message = f"the request body is not valid JSON: {first.get('msg')}"
        param = None
    else:
        got = first.get("input")
        shown = repr(got) if len(repr(got)) <= 200 else repr(got)[:197] + "..."
        message = f"{param or 'body'}: {first.get('msg')} (got {shown})"
    return APIError(400, message, param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return APIError(exc.status_code, message).response()

    @app.exception_handler(EngineDeadError)
    async def _dead(request: Request, exc: EngineDeadError) -> JSONResponse:
        return APIError(503, str(exc)).response()

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s", request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
