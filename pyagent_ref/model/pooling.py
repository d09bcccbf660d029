"""Pooling requests: a prompt's final hidden states become its answer, no token sampled.

The engine runs a pooling request like the prefill of a generation request (an
encoder's prompt whole, in one step; a decoder's chunk by chunk), keeping the final
hidden states of its prompt tokens; when the prompt is done, the `Pooler` turns them into
the answer and the request finishes. Three tasks, with vLLM's names:

- "embed": one vector per prompt (`ops.pooling.pool`), optionally truncated to its first
  `dimensions` features (Matryoshka) and scaled to unit norm (`ops.pooling.normalize`).
  With pooling_type "all", one vector per token.
- "classify": the [CLS] state through the model's classification head, then softmax
  over the labels (sigmoid for a single label) unless activation is off
  (`ops.pooling.classify`).
- "score": a cross-encoder's relevance of a (query, document) pair read together: the
  classification head's single logit, through a sigmoid unless activation is off.
  (Scoring with an embedding model compares two embeddings: `LLM.score` does that.)

What a request leaves unset (None) comes from the model (`PoolerConfig`): the pooling
type and normalisation sentence-transformers' files declare for the checkpoint, [CLS]
for a classifier, the last token for a causal model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .._files import read_json_object
from ..ops.pooling import POOLING_TYPES

__all__ = [
    "POOLING_TASKS",
    "POOLING_TYPES",
    "PoolerConfig",
    "Pooler",
    "PoolingParams",
    "supported_tasks",
]

POOLING_TASKS = ("embed", "classify", "score")
RUNNERS = ("auto", "generate", "pooling")
TASKS = ("auto", "generate", *POOLING_TASKS)


@dataclass(frozen=True)
class PoolingParams:
    """What a pooling request returns (vLLM's `PoolingParams`).

    pooling_type: "last" (the last token's state: what a causal model has read the
        prompt into), "mean" (the average over the prompt's tokens), "cls" (the first
        token's state, for models trained to put it there) or "all" (one vector per
        token); None: the model's (`PoolerConfig`).
    normalize: embed: scale each vector to unit L2 norm (cosine similarity is then a dot
        product); None: the model's.
    dimensions: embed: keep the first `dimensions` features (a Matryoshka model's
        shorter embedding), before normalising; None keeps them all.
    activation: classify / score: softmax (sigmoid for one label) over the head's
        logits, or the raw logits; None: on. `softmax` is its older name (vLLM's),
        accepted when it agrees.
    task: "embed", "classify" or "score" (set by `LLM.embed`, `classify`, `score`).
    Raises ValueError / TypeError naming the field and the value.
    """

    pooling_type: str | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    activation: bool | None = None
    softmax: bool | None = None
    task: str = "embed"

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {POOLING_TYPES} or None, got {self.pooling_type!r}"
            )
        for name in ("normalize", "activation", "softmax"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool or None, got {value!r}")
        if self.dimensions is not None:
            if isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int):
                raise TypeError(f"dimensions must be an int or None, got {self.dimensions!r}")
            if self.dimensions < 1:
                raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {POOLING_TASKS}, got {self.task!r}")
        if self.softmax is not None:
            if self.activation is not None and self.activation != self.softmax:
                raise ValueError(
                    f"softmax (the older name of activation) must agree with activation, "
                    f"got softmax={self.softmax}, activation={self.activation}"
                )
            object.__setattr__(self, "activation", self.softmax)
        if self.task != "embed" and (self.dimensions is not None or self.normalize is not None):
            field = "dimensions" if self.dimensions is not None else "normalize"
            raise ValueError(f"{field} applies to embeddings, not to task {self.task!r}")

    @property
    def needs_every_token(self) -> bool:
        """Whether every prompt token's state is needed (so no prefix-cache hit may skip
        computing one): all but "last", which needs only the last, which a cache hit
        never covers."""
        return self.pooling_type != "last"


@dataclass(frozen=True)
class PoolerConfig:
    """A model's pooling: its defaults, and what its requests may ask for.

    pooling_type, normalize: the defaults of embed requests.
    hidden_size: the embedding's size; dimensions above it are refused.
    matryoshka: None (no truncated embeddings), True (any dimensions) or the tuple of
        sizes the model was trained for (config.json's `matryoshka_dimensions`).
    num_labels: the classification head's outputs (0: no head).
    labels: their names (config.json's id2label), in order; empty when it has none.
    """

    pooling_type: str
    normalize: bool
    hidden_size: int
    matryoshka: bool | tuple[int, ...] | None = None
    num_labels: int = 0
    labels: tuple[str, ...] = ()

    @classmethod
    def from_model(cls, config: Any, model_dir: str | Path | None = None) -> PoolerConfig:
        """The pooling of a model from its `ModelConfig` and, for an encoder, the
        sentence-transformers files of its directory: ``1_Pooling/config.json`` (mean,
        cls or lasttoken pooling) and a Normalize module in ``modules.json``; without
        them an encoder pools its [CLS] state, normalised, and a decoder its last token.

        Raises:
            ValueError: a sentence-transformers pooling mode that is not one of those
                (max, weighted mean), naming the file.
        """
        raw = config.raw or {}
        pooling_type, normalize = ("last", True) if config.is_causal else ("cls", True)
        if model_dir is not None and not config.is_causal and not config.num_labels:
            pooling_type, normalize = _sentence_transformers(Path(model_dir), pooling_type)
        dims = raw.get("matryoshka_dimensions")
        matryoshka = tuple(dims) if dims else (True if raw.get("is_matryoshka") else None)
        id2label = raw.get("id2label") if config.num_labels else None
        labels = ()
        if isinstance(id2label, dict) and len(id2label) == config.num_labels:
            try:
                labels = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
            except ValueError:
                labels = ()
        return cls(
            pooling_type,
            normalize,
            config.hidden_size,
            matryoshka,
            config.num_labels,
            labels,
        )

    def resolve(self, params: PoolingParams) -> PoolingParams:
        """`params` with every default filled in, after the checks that need the model.

        Raises:
            ValueError: dimensions the model does not support (not a Matryoshka model, a
                size it was not trained for, more than its hidden size), a classify or
                score request on a model without a classification head (or a score on
                one of several labels), a pooling type other than "cls" for the head.
        """
        if params.task == "embed":
            dims = params.dimensions
            if dims is not None:
                if self.matryoshka is None:
                    raise ValueError(
                        f"dimensions={dims} needs a Matryoshka model (config.json "
                        "'is_matryoshka' or 'matryoshka_dimensions'); this one is not"
                    )
                allowed = self.matryoshka if isinstance(self.matryoshka, tuple) else None
                if allowed and dims not in allowed:
                    raise ValueError(
                        f"dimensions={dims} is not supported: the model was trained for "
                        f"{list(allowed)}"
                    )
                if dims > self.hidden_size:
                    raise ValueError(
                        f"dimensions={dims} exceeds the model's embedding size {self.hidden_size}"
                    )
            return dataclasses.replace(
                params,
                pooling_type=params.pooling_type or self.pooling_type,
                normalize=self.normalize if params.normalize is None else params.normalize,
                softmax=None,
            )
        if not self.num_labels:
            raise ValueError(
                f"task {params.task!r} needs a model with a classification head "
                "(...ForSequenceClassification); this one has none"
            )
        if params.task == "score" and self.num_labels != 1:
            raise ValueError(
                f"task 'score' reads a cross-encoder's single logit; this model has "
                f"{self.num_labels} labels (use classify)"
            )
        if params.pooling_type not in (None, "cls"):
            raise ValueError(
                f"pooling_type must be 'cls' for task {params.task!r} (the classification "
                f"head reads the [CLS] state), got {params.pooling_type!r}"
            )
        activation = True if params.activation is None else params.activation
        return dataclasses.replace(params, pooling_type="cls", activation=activation, softmax=None)

    @property
    def activation_kind(self) -> str:
        """The head's activation (`ops.pooling.classify`): sigmoid for one label (a
        relevance score, a binary classifier), softmax over several."""
        return "sigmoid" if self.num_labels == 1 else "softmax"


def _sentence_transformers(model_dir: Path, default: str) -> tuple[str, bool]:
    """(pooling type, normalize) declared by a sentence-transformers model directory."""
    pooling_type, normalize = default, True
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return pooling_type, normalize
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{modules_file} is not a valid JSON file: {exc}") from exc
    if not isinstance(modules, list):
        raise ValueError(f"{modules_file} must hold a JSON array of modules")
    kinds = [m.get("type", "") for m in modules if isinstance(m, dict)]
    normalize = any(k.endswith("models.Normalize") for k in kinds)
    for m in modules:
        if isinstance(m, dict) and str(m.get("type", "")).endswith("models.Pooling"):
            path = model_dir / str(m.get("path", "")) / "config.json"
            if path.is_file():
                pooling_type = _st_pooling_mode(read_json_object(path), path)
    return pooling_type, normalize


def _st_pooling_mode(cfg: dict, path: Path) -> str:
    modes = {
        "pooling_mode_mean_tokens": "mean",
        "pooling_mode_cls_token": "cls",
        "pooling_mode_lasttoken": "last",
    }
    chosen = [ours for key, ours in modes.items() if cfg.get(key)]
    others = [
        key
        for key, value in cfg.items()
        if key.startswith("pooling_mode_") and value and key not in modes
    ]
    if others or len(chosen) != 1:
        raise ValueError(
            f"{path}: pooling modes {others or sorted(k for k in modes if cfg.get(k))} are not "
            f"supported (one of {sorted(modes)} must be set)"
        )
    return chosen[0]


def supported_tasks(config: Any, runner: str = "auto", task: str = "auto") -> tuple[str, ...]:
    """The requests an engine serves (vLLM's `runner` and `task` engine arguments).

    A decoder generates and, with runner "pooling" or "auto", embeds and scores (by the
    cosine of embeddings); an encoder (BERT) only pools: embeds and scores, or, with a
    classification head, classifies and scores (cross-encoder). runner "generate" or
    "pooling" keeps only those requests; task names the one task the engine is for
    (its runner follows).

    Raises:
        ValueError: an unknown runner or task, a runner or task the model cannot do
            (generation on an encoder, pooling with runner="generate", classify on a
            model without a head), or a task that contradicts the runner; the message
            names the setting and the architecture.
    """
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {RUNNERS}, got {runner!r}")
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    arch = config.architecture
    if config.is_causal:
        model_tasks = ("generate", "embed", "score")
    else:
        model_tasks = ("classify", "score") if config.num_labels else ("embed", "score")
    if task != "auto":
        task_runner = "generate" if task == "generate" else "pooling"
        if runner not in ("auto", task_runner):
            raise ValueError(f"task={task!r} needs runner={task_runner!r}, got runner={runner!r}")
        if task not in model_tasks:
            raise ValueError(f"task={task!r} is not supported by {arch}: it supports {model_tasks}")
        runner = task_runner
    if runner == "generate" and not config.is_causal:
        raise ValueError(
            f"runner='generate': {arch} is an encoder-only model, it cannot generate; "
            "use runner='pooling' (embed, classify, score)"
        )
    if runner == "generate":
        return ("generate",)
    if runner == "pooling":
        return tuple(t for t in model_tasks if t != "generate")
    return model_tasks


class Pooler:
    """Turns the final hidden states of finished pooling requests into their outputs,
    on the engine's ops (`ops.pooling`), requests with the same settings in one call.

    `__call__(items)`: items are (hidden states (num_tokens, hidden), resolved
    PoolingParams) per request; returns per request a list of floats (one vector, the
    class probabilities, or a one-element score) or, for pooling_type "all", a list of
    them (one per token).
    """

    def __init__(self, ops: ModuleType, model: torch.nn.Module, config: PoolerConfig) -> None:
        self.ops, self.model, self.config = ops, model, config

    def __call__(self, items: list[tuple[torch.Tensor, PoolingParams]]) -> list[list]:
        out: list[list] = [[] for _ in items]
        groups: dict[tuple, list[int]] = {}
        for i, (_, params) in enumerate(items):
            key = (
                params.pooling_type,
                params.task,
                params.normalize,
                params.dimensions,
                params.activation,
            )
            groups.setdefault(key, []).append(i)
        for (pooling_type, task, normalize, dims, activation), members in groups.items():
            states = [items[i][0] for i in members]
            lens = torch.tensor([0] + [s.shape[0] for s in states]).cumsum(0)
            pooled = self.ops.pooling.pool(torch.cat(states), lens, pooling_type)
            if task == "embed":
                vectors = self._embed(pooled, normalize, dims)
            else:
                logits = self.model.classification_head(pooled)
                kind = self.config.activation_kind if activation else "none"
                vectors = self.ops.pooling.classify(logits, kind)
            rows = vectors.cpu().tolist()
            if pooling_type == "all":
                bounds = lens.tolist()
                for j, i in enumerate(members):
                    out[i] = rows[bounds[j] : bounds[j + 1]]
            else:
                for j, i in enumerate(members):
                    out[i] = rows[j]
        return out

    def _embed(self, pooled: torch.Tensor, normalize: bool, dims: int | None) -> torch.Tensor:
        if normalize:
            return self.ops.pooling.normalize(pooled, dims)
        return pooled if dims is None else pooled[:, :dims]
