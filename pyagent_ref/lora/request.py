"""What a request names to be served with an adapter, and the limits of the engine's slots."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoRARequest:
    """One LoRA adapter, as a request names it (vLLM's `LoRARequest`).

    lora_name: how clients name it (the server's `model` field).
    lora_int_id: its id, >= 1, unique per adapter for the engine's lifetime: the prefix
        cache keys every block of a request by it (`kv_cache.request_hashing`), so two
        adapters never share KV; reusing an id for other weights is refused.
    lora_path: a directory in PEFT's format (`adapter_config.json`,
        `adapter_model.safetensors`).
    Raises:
        TypeError: a name or path that is not a str (a Path is taken), an id that is
            not an int.
        ValueError: an empty name or path, an id < 1.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if isinstance(self.lora_path, Path):
            object.__setattr__(self, "lora_path", str(self.lora_path))
        for name in ("lora_name", "lora_path"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"LoRARequest.{name} must be a str, got {value!r}")
            if not value:
                raise ValueError(f"LoRARequest.{name} must not be empty")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise TypeError(f"LoRARequest.lora_int_id must be an int, got {self.lora_int_id!r}")
        if self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be >= 1, got {self.lora_int_id}")


@dataclass(frozen=True)
class LoRAConfig:
    """The engine's adapter slots (vLLM's names).

    max_loras: adapters one step may use, each in a slot of every adapted layer.
    max_lora_rank: the slots' rank: an adapter of a larger rank is refused at load.
    max_cpu_loras: adapters kept loaded on the host (least recently used evicted
        first, pinned ones never); None: max_loras. At least max_loras.
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            value = getattr(self, name)
            if value is None and name == "max_cpu_loras":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras must be >= max_loras={self.max_loras} (every adapter of a "
                f"step is loaded on the host first), got {self.max_cpu_loras}"
            )

    @property
    def cpu_capacity(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras
