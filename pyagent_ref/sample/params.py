"""Sampling parameters of one request, with vLLM's names and validation."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# The sampler computes in float32: a parameter must round to a finite float32, and one
# that must be positive must not round to zero (top_p 1e-50 would become 0).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38
GREEDY_TEMPERATURE = 1e-5
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
"""llama.cpp's and koboldcpp's default DRY sequence breakers."""
MIROSTAT_MODES = (0, 2)


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on the whole output text (vLLM's ``StructuredOutputsParams``).

    Exactly one of:
        json: a JSON Schema (a dict, or its JSON text): the output is a JSON text valid
            under it;
        regex: the output matches the pattern as a whole (`pyagent_ref.structured.regex`);
        choice: the output is one of these strings;
        grammar: a grammar in GBNF / EBNF or Lark syntax (`structured.ebnf`);
        json_object: True: the output is any JSON object (OpenAI's JSON mode).
    Options of the JSON kinds:
        whitespace_pattern: a regex for the whitespace allowed between JSON tokens (None:
            a line break at most, then up to 16 spaces or tabs,
            `structured.constraints.GENERATION_WHITESPACE`);
        disable_any_whitespace: no whitespace at all between JSON tokens;
        disable_additional_properties: objects have only the properties a schema names
            (as if ``additionalProperties: false`` where the schema does not say).

    Raises TypeError / ValueError naming the field and the value; the constraint itself
    (a malformed pattern, schema or grammar) is checked when it is compiled, at admission.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        kinds = [k for k in _CONSTRAINT_KINDS if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError(
                f"structured_outputs needs exactly one of {_CONSTRAINT_KINDS}, got "
                f"{kinds or 'none'}"
            )
        for name, types in (
            ("json", (str, dict)),
            ("regex", str),
            ("grammar", str),
            ("json_object", bool),
            ("whitespace_pattern", str),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, types):
                raise TypeError(f"structured_outputs.{name} has the wrong type: {value!r}")
        if self.choice is not None:
            choice = self.choice
            if not isinstance(choice, (list, tuple)) or not all(isinstance(c, str) for c in choice):
                raise TypeError(f"structured_outputs.choice must be a list of str, got {choice!r}")
            if not choice:
                raise ValueError("structured_outputs.choice must name at least one string, got []")
            object.__setattr__(self, "choice", list(choice))
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"structured_outputs.{name} must be a bool, got {getattr(self, name)!r}"
                )

    @property
    def kind(self) -> str:
        """Which constraint this is: one of ``json, regex, choice, grammar, json_object``."""
        return next(k for k in _CONSTRAINT_KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple:
        """A hashable key: equal keys compile to the same grammar (the compile cache's key)."""
        value = getattr(self, self.kind)
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, list):
            value = tuple(value)
        return (
            self.kind,
            value,
            self.whitespace_pattern,
            self.disable_any_whitespace,
            self.disable_additional_properties,
        )


_CONSTRAINT_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class SamplingParams:
    """How to pick each next token of a request, and when to stop.

    Names and meanings follow vLLM (and through it the OpenAI API):
        n: completions per prompt (each with its own seed stream).
        temperature: below GREEDY_TEMPERATURE (1e-5, vLLM's bound) is greedy, as
            dividing by it would overflow; above, it scales the logits down by it.
        top_p: nucleus mass in (0, 1]; top_k: 0 or -1 disables, else keep the k best;
        min_p: in [0, 1], relative probability floor.
        typical_p: locally typical sampling's mass in (0, 1] (1 disables);
        epsilon_cutoff: absolute probability floor in [0, 1) (0 disables);
        eta_cutoff: entropy-scaled probability floor in [0, 1) (0 disables). These
            three are HF transformers' warpers (vLLM has none of them).
        presence_penalty, frequency_penalty: in [-2, 2], over generated tokens;
        repetition_penalty: > 0, over prompt and generated tokens (1 disables).
        logit_bias: token id -> bias in [-100, 100].
        allowed_token_ids: None, or the only token ids that may be generated.
        bad_words: None, or words never to generate: the frontend tokenizes each (with
            and without a leading space, as vLLM does) into bad_words_token_ids, the
            token sequences the sampler bans (the last token of a sequence is masked
            when the output ends with the rest of it). bad_words_token_ids may also be
            given directly (lists of token ids); the frontend adds the words' to them.
        no_repeat_ngram_size: no n-gram of this size repeats within prompt + output
            (HF's; 0 disables).
        dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
        dry_sequence_breakers: DRY, koboldcpp's and llama.cpp's repetition penalty
            (`ops.sampling.apply_dry`, over prompt + output): a token that would extend
            a repeat of n >= dry_allowed_length (an int >= 1) tokens loses
            dry_multiplier * dry_base ** (n - dry_allowed_length) from its logit.
            dry_multiplier >= 0 (0 disables), dry_base > 1, dry_penalty_last_n >= -1
            (the last n tokens; -1 the whole context, 0 disables, as in llama.cpp).
            dry_sequence_breakers: strings that end a repeat (default llama.cpp's
            newline, colon, double quote, asterisk); the frontend tokenizes each and
            every token of its encoding becomes a breaker token id, added to
            dry_sequence_breaker_ids (which may also be given directly).
        xtc_threshold, xtc_probability: XTC ("exclude top choices",
            `ops.sampling.apply_xtc`): at each position, with probability
            xtc_probability (in [0, 1]; 0 disables) drawn from the request's seed, when
            two or more tokens have probability >= xtc_threshold (in [0, 1]), all but
            the least likely of them are removed. Like typical_p, it leaves greedy
            requests alone.
        mirostat_mode, mirostat_tau, mirostat_eta: mirostat (llama.cpp's): 0 off, 2
            mirostat v2 (1, the original mirostat, is not supported): tokens more
            surprising than mu bits are dropped and mu, which starts at
            2 * mirostat_tau (> 0, the target surprise), moves by mirostat_eta (in
            (0, 1]) times the error after each token (`ops.sampling.apply_mirostat`,
            `mirostat_update`). Requests with mirostat get no speculative drafts.
        seed: the request's Philox key; None draws one at random at admission.
        max_tokens: generated tokens at most (None: up to the model's context);
        min_tokens: EOS and stop token ids are ignored before this many.
        stop: strings that end the output (None, one str or a list);
        stop_token_ids: tokens that do (None or a list).
        ignore_eos: keep going past EOS. include_stop_str_in_output: keep the stop string.
        logprobs: how many top log-probabilities to return per generated token (None: none).
        prompt_logprobs: how many top log-probabilities to return per prompt token (None:
            none); the prompt is then computed in full, never taken from the prefix cache.
        skip_special_tokens, spaces_between_special_tokens: detokenization options.
        structured_outputs: a constraint on the output (`StructuredOutputsParams`, or a
            dict of its fields): JSON Schema, regex, choice, grammar or JSON object.
        extra_args: None, or a dict of settings for custom logits processors (vLLM's
            name; see `sample.logits_processor`), which check them at admission.

    Float parameters must be numbers that float32 (the sampler's dtype) holds.
    Raises ValueError for a value out of range and TypeError for a container of the
    wrong type, naming the field and the value.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[int]] | None = None
    no_repeat_ngram_size: int = 0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: list[str] = field(default_factory=lambda: list(DRY_SEQUENCE_BREAKERS))
    dry_sequence_breaker_ids: list[int] | None = None
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.structured_outputs, Mapping):
            known = [f.name for f in fields(StructuredOutputsParams)]
            unknown = sorted(set(self.structured_outputs) - set(known))
            if unknown:
                raise ValueError(
                    f"structured_outputs has unknown keys {unknown}; its keys are {known}"
                )
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if not isinstance(self.structured_outputs, StructuredOutputsParams | None):
            raise TypeError(
                "structured_outputs must be None, a StructuredOutputsParams or a dict of its "
                f"fields, got {self.structured_outputs!r}"
            )
        self.stop = _string_list("stop", self.stop)
        self.stop_token_ids = _int_list("stop_token_ids", self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _int_list("allowed_token_ids", self.allowed_token_ids)
        if self.bad_words is not None:
            self.bad_words = _string_list("bad_words", self.bad_words)
        if self.bad_words_token_ids is not None:
            value = self.bad_words_token_ids
            if not isinstance(value, (list, tuple)):
                raise TypeError(
                    f"bad_words_token_ids must be None or a list of lists of int token ids, "
                    f"got {value!r}"
                )
            self.bad_words_token_ids = [_int_list("bad_words_token_ids", s) for s in value]
        self.dry_sequence_breakers = _string_list(
            "dry_sequence_breakers", self.dry_sequence_breakers
        )
        if self.dry_sequence_breaker_ids is not None:
            self.dry_sequence_breaker_ids = _int_list(
                "dry_sequence_breaker_ids", self.dry_sequence_breaker_ids
            )
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise TypeError(
                "logit_bias must be None or a dict of token id -> bias, "
                f"got {type(self.logit_bias).__name__}: {self.logit_bias!r}"
            )
        self._validate()

    def _validate(self) -> None:
        """Checks that need only the parameters; those that need the model (token ids
        against its vocabulary, lengths against its context) run at admission
        (`pyagent_ref.engine.admission`)."""

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if not _is_int(self.n) or self.n < 1:
            raise bad("n", "must be an int >= 1")
        if not _is_float32(self.temperature) or self.temperature < 0:
            raise bad("temperature", f"must be a number in [0, {FLOAT32_MAX:.3g}]")
        if not _is_float32(self.top_p) or not FLOAT32_TINY <= self.top_p <= 1:
            raise bad("top_p", f"must be in (0, 1] (and >= {FLOAT32_TINY:.3g}, in float32)")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise bad("top_k", "must be -1, 0 (disabled) or a positive int")
        if not _is_float32(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad("min_p", "must be in [0, 1]")
        if not _is_float32(self.typical_p) or not FLOAT32_TINY <= self.typical_p <= 1:
            raise bad("typical_p", f"must be in (0, 1] (and >= {FLOAT32_TINY:.3g}, in float32)")
        for name in ("epsilon_cutoff", "eta_cutoff"):
            if not _is_float32(getattr(self, name)) or not 0 <= getattr(self, name) < 1:
                raise bad(name, "must be in [0, 1)")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise bad("allowed_token_ids", "must be None or name at least one token id")
        if any(t < 0 for t in self.allowed_token_ids or ()):
            raise bad("allowed_token_ids", "must hold token ids >= 0")
        if any(not w.strip() for w in self.bad_words or ()):
            raise bad("bad_words", "must hold words that are not empty or blank")
        for ids in self.bad_words_token_ids or ():
            if not ids or any(t < 0 for t in ids):
                raise bad("bad_words_token_ids", "must hold non-empty lists of token ids >= 0")
        if not _is_int(self.no_repeat_ngram_size) or self.no_repeat_ngram_size < 0:
            raise bad("no_repeat_ngram_size", "must be an int >= 0 (0 disables)")
        self._validate_dry_xtc_mirostat(bad)
        for name in ("presence_penalty", "frequency_penalty"):
            if not _is_float32(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                raise bad(name, "must be in [-2, 2]")
        if not _is_float32(self.repetition_penalty) or self.repetition_penalty < FLOAT32_TINY:
            raise bad(
                "repetition_penalty", f"must be a number in [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.3g}]"
            )
        if self.seed is not None and (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not -(2**63) <= self.seed < 2**64
        ):
            raise bad("seed", "must be None or a 64-bit int")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise bad("max_tokens", "must be None or an int >= 1")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens}, "
                f"max_tokens={self.max_tokens}"
            )
        if any(not s for s in self.stop):
            raise bad("stop", "must hold non-empty strings")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must hold token ids >= 0")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise bad(name, "must be None or an int >= 0")
        for token, value in (self.logit_bias or {}).items():
            if not _is_int(token) or token < 0 or not _is_float32(value) or abs(value) > 100:
                raise ValueError(
                    f"logit_bias entries must map token ids >= 0 to numbers in [-100, 100], "
                    f"got {token!r}: {value!r}"
                )
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise TypeError(f"extra_args must be None or a dict, got {self.extra_args!r}")
        for name in (
            "ignore_eos",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "spaces_between_special_tokens",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def _validate_dry_xtc_mirostat(self, bad: Any) -> None:
        if not _is_float32(self.dry_multiplier) or self.dry_multiplier < 0:
            raise bad("dry_multiplier", "must be a number >= 0 (0 disables)")
        if not _is_float32(self.dry_base) or self.dry_base <= 1:
            raise bad("dry_base", "must be a number > 1")
        if not _is_int(self.dry_allowed_length) or self.dry_allowed_length < 1:
            raise bad("dry_allowed_length", "must be an int >= 1")
        if not _is_int(self.dry_penalty_last_n) or self.dry_penalty_last_n < -1:
            raise bad(
                "dry_penalty_last_n", "must be an int >= -1 (-1: the whole context, 0 disables)"
            )
        if any(not s for s in self.dry_sequence_breakers):
            raise bad("dry_sequence_breakers", "must hold non-empty strings")
        if any(t < 0 for t in self.dry_sequence_breaker_ids or ()):
            raise bad("dry_sequence_breaker_ids", "must hold token ids >= 0")
        for name in ("xtc_threshold", "xtc_probability"):
            if not _is_float32(getattr(self, name)) or not 0 <= getattr(self, name) <= 1:
                raise bad(name, "must be in [0, 1]")
        if self.mirostat_mode == 1 and _is_int(self.mirostat_mode):
            raise bad("mirostat_mode", "1 (mirostat v1) is not supported: use 2 (v2) or 0 (off)")
        if not _is_int(self.mirostat_mode) or self.mirostat_mode not in MIROSTAT_MODES:
            raise bad("mirostat_mode", "must be 0 (off) or 2 (mirostat v2)")
        if not _is_float32(self.mirostat_tau) or self.mirostat_tau < FLOAT32_TINY:
            raise bad("mirostat_tau", "must be a number > 0")
        if not _is_float32(self.mirostat_eta) or not 0 < self.mirostat_eta <= 1:
            raise bad("mirostat_eta", "must be in (0, 1]")

    @property
    def dry(self) -> bool:
        """Whether DRY is on (a multiplier > 0 over a non-empty window)."""
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0

    @property
    def xtc(self) -> bool:
        """Whether XTC can fire (a probability > 0 on a request that samples)."""
        return self.xtc_probability > 0 and not self.greedy

    @property
    def mirostat(self) -> bool:
        return self.mirostat_mode == 2

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def sampling_temperature(self) -> float:
        """The temperature as the sampling ops take it: 0 means greedy."""
        return 0.0 if self.greedy else self.temperature

    @property
    def top_k_or_disabled(self) -> int:
        """top_k as the op takes it: 0 disables."""
        return max(self.top_k, 0)


def _is_int(v: Any) -> bool:
    """An int (not a bool) that int64 holds: every integer parameter reaches the ops as
    an int64 (the seed, which may be any 64-bit pattern, has its own check)."""
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _is_float32(v: Any) -> bool:
    """A real number (not a bool) that float32 holds without overflow (an int of any
    size is compared exactly: converting it to float first could overflow)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    return (isinstance(v, int) or math.isfinite(v)) and abs(v) <= FLOAT32_MAX


def _string_list(name: str, value: Any) -> list[str]:
    """None, one string or an iterable of strings, as a list (vLLM's forms of `stop`)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    items = list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(s, str) for s in items):
        raise TypeError(f"{name} must be None, a str or a list of str, got {value!r}")
    return items


def _int_list(name: str, value: Any) -> list[int]:
    """None or an iterable of ints (token ids), as a list."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple, set, frozenset)) else None
    if items is None or not all(_is_int(t) for t in items):
        raise TypeError(f"{name} must be None or a list of int token ids, got {value!r}")
    return items
