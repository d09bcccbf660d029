"""`SpeculativeConfig`: the engine's speculative-decoding settings, under vLLM's names."""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from .tree import tree_parents

METHODS = ("ngram", "suffix", "draft_model", "medusa")
"""The proposers that exist (vLLM's method names)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tree(value: object) -> tuple[tuple[int, ...], ...]:
    """speculative_token_tree as a tuple of paths; ValueError / TypeError naming it."""
    given = value
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise ValueError(
                f"speculative_token_tree must be a list of tuples of ranks, got {given!r}"
            ) from exc
    if (
        isinstance(value, (str, bytes))
        or not isinstance(value, Sequence)
        or not all(isinstance(path, Sequence) and all(_is_int(r) for r in path) for path in value)
    ):
        raise TypeError(f"speculative_token_tree must be a list of tuples of ints, got {given!r}")
    tree = tuple(tuple(path) for path in value)
    if not tree:
        raise ValueError("speculative_token_tree must have at least one path, got []")
    try:
        tree_parents(tree)
    except ValueError as exc:
        raise ValueError(f"speculative_token_tree: {exc}") from exc
    return tree


@dataclass(frozen=True)
class SpeculativeConfig:
    """How a request's next tokens are proposed before the target model verifies them.

    method: the proposer, one of `METHODS`: "ngram" looks the tokens up in the request's
        own prompt and output (`ngram.propose_ngram`); "suffix" proposes the most
        frequent continuation in a tree of the request's tokens and one of past
        requests' outputs (`suffix`); "draft_model" runs a small model greedily
        (`draft_model`); "medusa" drafts a token tree with Medusa heads on the target's
        last hidden state (`medusa`). None (the default) means "draft_model" if `model`
        is given, else "ngram", as in vLLM.
    num_speculative_tokens: drafts proposed per step, an int >= 1; a step then emits
        between 1 and num_speculative_tokens + 1 tokens. For "medusa", the deepest tree
        level kept (the default shape `medusa.MEDUSA_TREE` has 14 nodes on 3 levels).
    prompt_lookup_min, prompt_lookup_max: for "ngram", the shortest and the longest
        suffix of the sequence that is searched for, ints with
        1 <= prompt_lookup_min <= prompt_lookup_max.
    suffix_decoding_max_tree_depth: for "suffix", the longest string a tree counts, so
        the most tokens a match and its drafts have together; an int >= 1.
    suffix_decoding_max_cached_requests: for "suffix", how many finished requests'
        outputs the global tree keeps (the oldest goes first); an int >= 0, 0 turning
        the global tree off.
    suffix_decoding_max_spec_factor: for "suffix", a match of m tokens earns at most
        floor(max_spec_factor * m) drafts; a finite number > 0.
    suffix_decoding_min_token_prob: for "suffix", drafts stop before the one whose
        cumulative probability falls below it; a number in [0, 1].
    model: for "draft_model", the directory of the draft checkpoint (HF layout, the
        target's vocabulary), a str or a Path; it is loaded, and its vocabulary checked
        against the target's, when the engine is built. For "medusa", the directory of
        the heads (`medusa.MedusaHeads.load`; None: those trained for the embedded
        default model), checked against the target's hidden and vocabulary sizes.
    speculative_token_tree: for "medusa", the tree shape: a list of paths of ranks
        (`tree.tree_parents`), or its Python literal as a str (vLLM's form, e.g.
        "[(0,), (1,), (0, 0)]"); None: `medusa.MEDUSA_TREE`. Kept as a tuple of tuples.
    medusa_min_path_prob: for "medusa", a node is proposed only if the product of the
        heads' probabilities along its path is at least this (a tree that shrinks where
        the heads are unsure, down to no drafts); a number in [0, 1], 0 keeping every node
        of the shape.

    Every field is checked whatever the method; the fields of one method are ignored by
    the others.

    Raises ValueError naming the field and the value for a value out of range, an
    unknown method, prompt_lookup_min > prompt_lookup_max, or "draft_model" without a
    model; TypeError for a value that is not an int (a number, for the two
    suffix_decoding floats; a str, for method; a str or a Path, for model).
    """

    method: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    model: str | Path | None = None
    speculative_token_tree: str | Sequence[Sequence[int]] | None = None
    medusa_min_path_prob: float = 0.0

    def __post_init__(self) -> None:
        if self.model is not None and not isinstance(self.model, (str, Path)):
            raise TypeError(f"model must be None, a str or a Path, got {self.model!r}")
        if self.method is None:
            inferred = "ngram" if self.model is None else "draft_model"
            object.__setattr__(self, "method", inferred)
        if not isinstance(self.method, str):
            raise TypeError(f"method must be a str, got {self.method!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.method == "draft_model" and not self.model:
            raise ValueError(
                "method 'draft_model' needs model, the directory of the draft checkpoint, "
                f"got model={self.model!r}"
            )
        for name, lowest in (
            ("num_speculative_tokens", 1),
            ("prompt_lookup_min", 1),
            ("prompt_lookup_max", 1),
            ("suffix_decoding_max_tree_depth", 1),
            ("suffix_decoding_max_cached_requests", 0),
        ):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if value < lowest:
                raise ValueError(f"{name} must be >= {lowest}, got {value}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                "prompt_lookup_min must be <= prompt_lookup_max, got "
                f"prompt_lookup_min={self.prompt_lookup_min}, "
                f"prompt_lookup_max={self.prompt_lookup_max}"
            )
        for name in (
            "suffix_decoding_max_spec_factor",
            "suffix_decoding_min_token_prob",
            "medusa_min_path_prob",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number, got {value!r}")
        factor = self.suffix_decoding_max_spec_factor
        if not (0 < factor < math.inf):
            raise ValueError(
                f"suffix_decoding_max_spec_factor must be finite and > 0, got {factor}"
            )
        for name in ("suffix_decoding_min_token_prob", "medusa_min_path_prob"):
            prob = getattr(self, name)
            if not 0 <= prob <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {prob}")
        if self.speculative_token_tree is not None:
            object.__setattr__(self, "speculative_token_tree", _tree(self.speculative_token_tree))

    @classmethod
    def from_dict(cls, value: dict) -> SpeculativeConfig:
        """From a dict of the fields (vLLM's --speculative-config JSON object)."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; its keys are {known}")
        return cls(**value)
