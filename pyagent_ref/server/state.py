"""What every handler needs: the engine, the model's name, the parsers, the limits."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from ..lora import LoRARequest
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
    lora_modules: LoRA adapters served from the start, name -> directory (PEFT's
        format); each is a model clients name (`model`). Needs the engine's enable_lora.
    """

    served_model_name: str = "pyagent-default"
    api_key: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_queue: int | None = None
    pooling_type: str | None = None
    lora_modules: dict[str, str] = field(default_factory=dict)

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
        for name in self.lora_modules:
            if name == self.served_model_name:
                raise ValueError(
                    f"lora_modules: the adapter name {name!r} is the served model's name"
                )


@dataclass
class ServerState:
    engine: ServingEngine
    config: ServerConfig
    tool_parser: type[ToolParser] | None = None
    reasoning_parser: type[ReasoningParser] | None = None
    seats: Seats = field(init=False)
    metrics: ServerMetrics = field(init=False)
    loras: dict[str, LoRARequest] = field(init=False)  # the served adapters, by name

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
        if cfg.lora_modules and not self.engine.config.enable_lora:
            raise ValueError("lora_modules (--lora-modules) needs the engine's --enable-lora")
        self.loras = {}
        self._lora_ids = itertools.count(1)
        for name, path in cfg.lora_modules.items():
            self.loras[name] = LoRARequest(name, next(self._lora_ids), str(path))

    def new_lora(self, name: str, path: str) -> LoRARequest:
        """A request for a new adapter (a fresh id: one id never names two adapters)."""
        return LoRARequest(name, next(self._lora_ids), path)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter ``model`` names, None for the served model (None means it),
        or a 404 for any other name (as OpenAI and vLLM answer)."""
        if model is None or model == self.config.served_model_name:
            return None
        if model in self.loras:
            return self.loras[model]
        adapters = f" and the LoRA adapters {sorted(self.loras)}" if self.loras else ""
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves "
            f"{self.config.served_model_name!r}{adapters}",
            "model",
            "model_not_found",
        )

    def model_name(self, model: str | None) -> str:
        """The name responses carry: the adapter's when one was asked for."""
        return model if model in self.loras else self.config.served_model_name

    def check_serving(self) -> None:
        """503 while the engine is asleep or shutting down."""
        core = self.engine.core
        if not core.accepting:
            raise APIError(503, "the server is shutting down and accepts no new requests")
        if core.asleep:
            raise APIError(503, "the engine is asleep; wake it up to serve requests")
