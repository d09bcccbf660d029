"""JSON log lines: the fields, the request id from the context or the record, extras,
exceptions; and configure_logging's formats."""

from __future__ import annotations

import io
import json
import logging
import re

import pytest

from pyagent_ref.observe.logs import (
    JsonFormatter,
    configure_logging,
    new_request_id,
    request_id,
)


def record(msg="hello %s", args=("you",), **extra) -> logging.LogRecord:
    rec = logging.LogRecord("pyagent_ref.x", logging.WARNING, __file__, 1, msg, args, None)
    rec.__dict__.update(extra)
    return rec


def test_a_line_is_one_json_object_with_the_request_id():
    fmt = JsonFormatter()
    line = json.loads(fmt.format(record()))
    assert line["level"] == "WARNING" and line["logger"] == "pyagent_ref.x"
    assert line["message"] == "hello you" and "request_id" not in line
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-11-29T02:10:00.123Z")
    token = request_id.set("abc")
    try:
        assert json.loads(fmt.format(record()))["request_id"] == "abc"
        assert re.fullmatch(r"cmpl-abc-[0-9a-f]{8}", new_request_id("cmpl"))
        # the record's own id wins; extras land as fields (not JSON-able ones as str)
        line = json.loads(fmt.format(record(request_id="cmpl-1", ttft_s=0.5, obj=object())))
        assert line["request_id"] == "cmpl-1" and line["ttft_s"] == 0.5
        assert line["obj"].startswith("<object object")
    finally:
        request_id.reset(token)
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", new_request_id("cmpl"))  # outside a request
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = record(msg="failed", args=())
        rec.exc_info = sys.exc_info()
    line = json.loads(fmt.format(rec))
    assert "ValueError: boom" in line["exception"] and "\n" not in fmt.format(rec)


@pytest.mark.parametrize("json_lines", [True, False])
def test_configure_logging(json_lines):
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("info", json_lines=json_lines, stream=stream)
    try:
        token = request_id.set("r-1")
        logging.getLogger("pyagent_ref.test").info("served", extra={"tokens": 3})
        request_id.reset(token)
        logging.getLogger("pyagent_ref.test").info("idle")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    first, second = stream.getvalue().splitlines()
    if json_lines:
        assert json.loads(first)["request_id"] == "r-1" and json.loads(first)["tokens"] == 3
        assert "request_id" not in json.loads(second)
    else:
        assert "INFO pyagent_ref.test [r-1] served" in first
        assert "[-] idle" in second
    with pytest.raises(ValueError, match="log level must be a logging level name, got 'loud'"):
        configure_logging("loud")
