"""Structured logs: one JSON object per line, with the request id of the HTTP request
(or engine request) a line is about.

    {"time": "2026-11-29T02:10:00.123Z", "level": "INFO", "logger": "pyagent_ref.engine.llm",
     "message": "request cmpl-4f..-9a..-0 finished: length, 5 prompt + 16 output tokens",
     "request_id": "cmpl-4f..-9a..-0", "finish_reasons": ["length"], "ttft_s": 0.012, ...}

`request_id` is a context variable: the server's middleware sets it for each HTTP
request (to the client's X-Request-Id, or a fresh one) and echoes it in the response's
X-Request-Id; the engine's request ids are built from it (``cmpl-<id>-<8 hex>-0``),
so the lines of one request and its spans name it. A log call may also pass
``extra={"request_id": ...}`` (the engine's own lines, logged outside any HTTP request).
Any other ``extra`` field lands in the object as is (JSON-encoded with ``str`` as the
fallback).
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import os
import sys
import uuid

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pyagent_request_id", default=None
)

# a LogRecord's own attributes: everything else on a record came from ``extra``
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's colored copy of the message
    "taskName",
}


def new_request_id(prefix: str) -> str:
    """A fresh engine request id: ``<prefix>-<request_id>-<8 hex>`` while an HTTP
    request is served (its id, made unique: a client may send one X-Request-Id twice,
    a retry while the first attempt still runs), else ``<prefix>-<32 hex>``."""
    rid = request_id.get()
    return (
        f"{prefix}-{uuid.uuid4().hex}" if rid is None else f"{prefix}-{rid}-{uuid.uuid4().hex[:8]}"
    )


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON: time (UTC, ISO 8601, ms), level, logger,
    message, request_id (the record's, else the context's; absent if neither),
    exception (its traceback) and the record's ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        line = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid is not None:
            line["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _RequestIdFilter(logging.Filter):
    """Gives every record a ``request_id`` (the context's, or "-") for text formats."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get() or "-"
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


# how the processes this one spawns (the engine core's) log: "<json|text>:<level>"
LOG_ENV = "PYAGENT_LOG_CONFIG"


def configure_logging(level: str | int = "info", json_lines: bool = False, stream=None):
    """Send the root logger's records to ``stream`` (stderr) at ``level``, as JSON lines
    or as text with the request id; returns the handler (remove it to undo). Logging
    to stderr, it also tells the processes spawned from now on to log the same way
    (`LOG_ENV`, read by `configure_logging_from_env`): the engine core's lines then
    read as the server's."""
    if isinstance(level, str):
        if not isinstance(logging.getLevelName(level.upper()), int):
            raise ValueError(f"log level must be a logging level name, got {level!r}")
        level = level.upper()
    handler = logging.StreamHandler(stream or sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.addFilter(_RequestIdFilter())
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    if stream is None:
        os.environ[LOG_ENV] = f"{'json' if json_lines else 'text'}:{level}"
    return handler


def configure_logging_from_env() -> None:
    """In a spawned process: log as the parent's `configure_logging` set up (nothing
    if it did not, or if the value is not one it writes)."""
    form, _, level = os.environ.get(LOG_ENV, "").partition(":")
    if form in ("json", "text") and level:
        try:
            configure_logging(int(level) if level.isdigit() else level, json_lines=form == "json")
        except ValueError:
            pass
