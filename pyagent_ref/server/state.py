"""What every handler needs: the engine, the model's name, the parsers, the limits."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..parsers import ReasoningParser, ToolParser, detect_tool_parser, get_reasoning_parser
from ..parsers import get_tool_parser as _tool_parser_class
from .engine import Seats, ServingEngine
from .errors import APIError
from .metrics import ServerMetrics

logger = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    """The server's own options (the engine's are `EngineConfig`'s).

    served_model_name: the name clients ask for (``model`` in requests).
    api_key: when set, requests must send ``Authorization: Bearer <api_key>``.
    tool_call_parser: a tool parser name, "auto" (detected from the chat template), or None.
    reasoning_parser: a reasoning parser name, or None.
    max_queue: completions that may wait for a seat beyond the engine's max_num_seqs;
        more in flight is a 429. None: no limit.
    pooling_type: how /v1/embeddings pools a prompt's hidden states ("last", "mean" or
        "cls"; None: the model's, `PoolerConfig`).
    """

    served_model_name: str = "pyagent-default"
    api_key: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_queue: int | None = None
    pooling_type: str | None = None

    def __post_init__(self) -> None:
        if self.pooling_type not in (None, "last", "mean", "cls"):
            raise ValueError(
                f"pooling_type must be 'last', 'mean', 'cls' or None, got {self.pooling_type!r}"
            )
        if self.max_queue is not None and (
            not isinstance(self.max_queue, int) or self.max_queue < 0
        ):
            raise ValueError(f"max_queue must be None or an int >= 0, got {self.max_queue!r}")
        if self.tool_call_parser not in (None, "auto"):
            _tool_parser_class(self.tool_call_parser)  # raises for an unknown name
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)


@dataclass
class ServerState:
    engine: ServingEngine
    config: ServerConfig
    tool_parser: type[ToolParser] | None = None
    reasoning_parser: type[ReasoningParser] | None = None
    seats: Seats = field(init=False)
    metrics: ServerMetrics = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        limit = None
        if cfg.max_queue is not None:
            limit = self.engine.core.scheduler_config.max_num_seqs + cfg.max_queue
        self.seats = Seats(limit)
        self.metrics = ServerMetrics(self.engine)
        name = cfg.tool_call_parser
        if name == "auto":
            template = self.engine.tokenizer.chat_templates.get("default", "")
            name = detect_tool_parser(template)
            logger.info("tool call parser detected from the chat template: %s", name)
        self.tool_parser = _tool_parser_class(name) if name else None
        if cfg.reasoning_parser:
            self.reasoning_parser = get_reasoning_parser(cfg.reasoning_parser)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def check_model(self, model: str | None) -> None:
        """404 unless ``model`` is the served model (None means it)."""
        if model is not None and model != self.config.served_model_name:
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves "
                f"{self.config.served_model_name!r}",
                "model",
                "model_not_found",
            )

    def check_serving(self) -> None:
        """503 while the engine is asleep or shutting down."""
        core = self.engine.core
        if not core.accepting:
            raise APIError(503, "the server is shutting down and accepts no new requests")
        if core.asleep:
            raise APIError(503, "the engine is asleep; wake it up to serve requests")
