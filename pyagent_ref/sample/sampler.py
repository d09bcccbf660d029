"""The sampler: one step's logits and per-request parameters in, one token per request out.

The pipeline, in vLLM's order, every stage an op of the chosen ops namespace:
    grammar bitmask (structured outputs) -> allowed_token_ids -> bad words (against the
    output) -> no-repeat n-grams (prompt + output)
    -> custom logits processors (`logits_processor`) -> penalties -> DRY (prompt +
    output) -> logit bias -> min_tokens mask -> temperature -> min_p -> top_k -> top_p
    -> typical_p -> epsilon -> eta -> XTC -> mirostat -> sample (-> mirostat_update)
The masks commute (a masked token stays -inf through every later stage). HF's three
warpers that vLLM lacks come after top-k/top-p, in HF's order; like HF (which applies
no warper without do_sample) they leave greedy rows alone: typical_p can mask the most
likely token, so a greedy row gets typical_p 1. DRY is a repetition penalty, so it sits
with the penalties on the raw logits (llama.cpp runs it right after its penalties).
XTC comes after every truncation, as in text-generation-webui: its threshold reads the
probabilities the request samples from (temperature and the filters applied), and it
always removes the most likely token when it fires, so greedy rows skip it like
typical_p. Mirostat v2 is last, as in llama.cpp where it is the final sampler before
the draw: it truncates what the other stages left by the request's current mu, and
after the draw `mirostat_update` gives the request's next mu, which `SamplerOutput`
returns (the runner keeps it with the request; see `SamplingRow.mirostat_mu`).
The log-probabilities a request asks for are taken where `LOGPROBS_MODES` says: of the
model's logits as they come ("raw") or of the final logits `sample` draws from
("processed"), as log-probabilities or as the logits themselves.
A stage is skipped when no row of the batch uses it; a disabled stage is the identity
per row, so skipping never changes a row's token and sampling stays batch-invariant.

Speculative decoding (`Sampler.verify`) runs the same pipeline on each of a request's
k + 1 target rows — row i as if drafts 0 .. i-1 were already its output — and replaces
the last stage by `spec_decode.rejection_sample`, which emits 1 to k + 1 tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from ..spec_decode.tree import accepted_path
from .logits_processor import LogitsProcessor
from .logprobs import Logprobs, logprobs_rows
from .params import SamplingParams

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
"""vLLM's names: raw = before every stage of the pipeline (the model's own distribution),
processed = after all of them (temperature and truncation included)."""


@dataclass
class SamplingRow:
    """What the sampler needs of one request this step."""

    request_id: str
    params: SamplingParams
    seed: int
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    stop_ids: Sequence[int] = ()  # masked while len(output) < params.min_tokens
    # int32 words, (1, words): the tokens its grammar allows next; in `verify`, one row
    # per node of its drafts, (1 + len(draft_token_ids), words)
    bitmask: np.ndarray | None = None
    draft_token_ids: Sequence[int] = ()  # speculative decoding: the drafts `verify` checks
    draft_parents: Sequence[int] | None = None  # None: a chain; else the drafts' tree
    # mirostat v2: the request's mu for this token (None: the first token, 2 * tau)
    mirostat_mu: float | None = None

    @property
    def position(self) -> int:
        """The output position of the token being drawn (the Philox counter)."""
        return len(self.output_token_ids)


@dataclass
class SamplerOutput:
    """Sampled token ids, and if asked, the log-probabilities of each row."""

    token_ids: list[int]
    logprobs: list[Logprobs | None]
    # per row: its next mirostat mu (None for rows without mirostat)
    mirostat_mu: list[float | None] = dataclasses.field(default_factory=list)


def _padded(rows: Sequence[Sequence[int]]) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


class Sampler:
    """Applies the sampling ops of `ops` (ref or accel) to a batch of rows."""

    def __init__(
        self,
        ops: ModuleType,
        logprobs_mode: str = "raw_logprobs",
        logits_processors: Sequence[LogitsProcessor] = (),
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}"
            )
        self.logprobs_mode = logprobs_mode
        self.logits_processors = list(logits_processors)
        self.ops = ops.sampling
        self.structured = ops.structured
        self.spec = ops.spec_decode

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """One token per row of `logits`, drawn with its row's parameters."""
        x, logprobs, temperature = self._process(logits, rows)
        tokens = self.ops.sample(
            x, temperature, torch.from_numpy(_seeds(rows)), torch.from_numpy(_positions(rows))
        )
        token_list = [int(t) for t in tokens]
        return SamplerOutput(
            token_list,
            self._with_sampled(logprobs, token_list, rows),
            self._mirostat_update(x, rows, token_list),
        )

    def verify(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow]
    ) -> list[tuple[list[int], list[Logprobs] | None, float | None]]:
        """Speculative decoding: the tokens each request emits, their logprobs, and the
        request's next mirostat mu (None without mirostat).

        Request b (rows[b], with k_b = len(draft_token_ids) drafts) owns the k_b + 1
        consecutive rows of `logits` that score its last token and each draft, in the
        layout of `spec_decode.rejection_sample`. Row i is processed as the sampler
        processes a plain row whose output already ends with drafts 0 .. i-1 (so
        penalties and min_tokens see them, and its Philox position is position + i);
        then `rejection_sample` keeps the accepted drafts and adds one token. Greedy
        requests get exactly greedy decoding's tokens, the others its distribution.
        When a row's drafts form a tree (`draft_parents`), row i's output ends with the
        drafts on the path from the root to node i instead (its Philox position is
        position + depth), and `rejection_sample_tree` keeps the accepted path; if any
        row has a tree, the chains of the others are verified as trees too (the tree op
        emits exactly what the linear one does on a chain).
        Mirostat requests take no drafts (the engine proposes none for them: each
        token's truncation depends on the mu the previous token left), so their one row
        is sampled as `__call__` samples it; drafts on one are a ValueError.
        """
        for r in rows:
            if r.params.mirostat and r.draft_token_ids:
                raise ValueError(
                    f"request {r.request_id}: mirostat requests take no speculative drafts, "
                    f"got {len(r.draft_token_ids)}"
                )
        trees = any(r.draft_parents is not None for r in rows)
        paths = [_node_paths(r) for r in rows]  # per row: each node's drafts, root first
        expanded = [
            dataclasses.replace(
                r,
                output_token_ids=[*r.output_token_ids, *path],
                draft_token_ids=(),
                draft_parents=None,
                bitmask=None if r.bitmask is None else r.bitmask[node : node + 1],
            )
            for r, node_paths in zip(rows, paths, strict=True)
            for node, path in enumerate(node_paths)
        ]
        x, logprobs, temperature = self._process(logits, expanded)
        first = np.cumsum([0] + [len(r.draft_token_ids) + 1 for r in rows])[:-1]
        drafts = np.array([t for r in rows for t in r.draft_token_ids], dtype=np.int64)
        counts = np.array([len(r.draft_token_ids) for r in rows], dtype=np.int64)
        seeds, positions = _seeds(rows), _positions(rows)
        if trees:
            parents = np.array([p for r in rows for p in _parents(r)], dtype=np.int64)
            emitted = self.spec.rejection_sample_tree(
                x, drafts, counts, parents, temperature[first], seeds, positions
            )
        else:
            emitted = self.spec.rejection_sample(
                x, drafts, counts, None, temperature[first], seeds, positions
            )
        tokens = [[int(t) for t in row if t >= 0] for row in np.asarray(emitted)]
        # a mirostat request has one row (no drafts) and emits one token
        which = [b for b, r in enumerate(rows) if r.params.mirostat]
        mus = (
            self._mirostat_update(
                x[first[which]], [rows[b] for b in which], [tokens[b][0] for b in which]
            )
            if which
            else []
        )
        next_mu = dict(zip(which, mus, strict=True))
        # each emitted token is the sampled token of its node's row (the accepted path's
        # nodes: consecutive rows for a chain); the other rows score token 0
        path_rows = [
            first[b] + np.array(accepted_path(r.draft_token_ids, _parents(r), tokens[b]))
            for b, r in enumerate(rows)
        ]
        sampled = [0] * len(expanded)
        for b, at in enumerate(path_rows):
            for row, token in zip(at, tokens[b], strict=True):
                sampled[row] = token
        per_row = self._with_sampled(logprobs, sampled, expanded)
        return [
            (
                tokens[b],
                [per_row[i] for i in path_rows[b]] if r.params.logprobs is not None else None,
                next_mu.get(b),
            )
            for b, r in enumerate(rows)
        ]

    def _process(self, logits: torch.Tensor, rows: Sequence[SamplingRow]):
        """Every stage before the draw: (final logits, the values logprobs are taken from
        if any row asks (`LOGPROBS_MODES`), the temperatures as `sample` takes them)."""
        s, p = self.ops, [r.params for r in rows]
        raw = logits.float()
        x = self._mask_by_grammar(raw, rows)
        x = self._mask_tokens(x, rows)
        if self.logits_processors:
            x = x.clone() if x is raw else x  # raw logprobs stay the model's
            for processor in self.logits_processors:
                x = processor.apply(x, rows)
        if any(q.repetition_penalty != 1 or q.frequency_penalty or q.presence_penalty for q in p):
            x = s.apply_penalties(
                x,
                _padded([r.prompt_token_ids for r in rows]),
                _padded([r.output_token_ids for r in rows]),
                np.array([q.repetition_penalty for q in p], dtype=np.float32),
                np.array([q.frequency_penalty for q in p], dtype=np.float32),
                np.array([q.presence_penalty for q in p], dtype=np.float32),
            )
        if any(q.dry for q in p):
            x = s.apply_dry(
                x,
                _padded([[*r.prompt_token_ids, *r.output_token_ids] for r in rows]),
                np.array([q.dry_multiplier if q.dry else 0.0 for q in p], dtype=np.float64),
                np.array([q.dry_base for q in p], dtype=np.float64),
                np.array([q.dry_allowed_length for q in p], dtype=np.int64),
                np.array([q.dry_penalty_last_n for q in p], dtype=np.int64),
                _padded([q.dry_sequence_breaker_ids or () for q in p]),
            )
        if any(q.logit_bias for q in p):
            biases = [sorted((q.logit_bias or {}).items()) for q in p]
            x = s.apply_logit_bias(
                x,
                _padded([[t for t, _ in b] for b in biases]),
                np.array(_padded_values([[v for _, v in b] for b in biases]), dtype=np.float64),
            )
        x = self._mask_early_stops(x, rows)
        temperature = np.array([q.sampling_temperature for q in p], dtype=np.float32)
        x = s.apply_temperature(x, temperature)
        if any(q.min_p > 0 for q in p):
            x = s.apply_min_p(x, np.array([q.min_p for q in p], dtype=np.float32))
        if any(q.top_k_or_disabled for q in p):
            x = s.apply_top_k(x, np.array([q.top_k_or_disabled for q in p], dtype=np.int64))
        if any(q.top_p < 1 for q in p):
            x = s.apply_top_p(x, np.array([q.top_p for q in p], dtype=np.float32))
        warped = [q.typical_p if not q.greedy else 1.0 for q in p]
        if any(v < 1 for v in warped):
            x = s.apply_typical_p(x, np.array(warped, dtype=np.float32))
        if any(q.epsilon_cutoff > 0 for q in p):
            x = s.apply_epsilon_cutoff(x, np.array([q.epsilon_cutoff for q in p], np.float32))
        if any(q.eta_cutoff > 0 for q in p):
            x = s.apply_eta_cutoff(x, np.array([q.eta_cutoff for q in p], dtype=np.float32))
        if any(q.xtc for q in p):
            x = s.apply_xtc(
                x,
                np.array([q.xtc_threshold for q in p], dtype=np.float32),
                np.array([q.xtc_probability if q.xtc else 0.0 for q in p], dtype=np.float32),
                _seeds(rows),
                _positions(rows),
            )
        if any(q.mirostat for q in p):
            x = s.apply_mirostat(x, np.array([_mu(r) for r in rows], dtype=np.float64))
        return (
            x,
            self._logprobs(raw if self.logprobs_mode.startswith("raw") else x, rows),
            temperature,
        )

    def _mirostat_update(
        self, x: torch.Tensor, rows: Sequence[SamplingRow], tokens: Sequence[int]
    ) -> list[float | None]:
        """Each mirostat row's next mu, from the logits it drew `tokens` from; None for
        the other rows."""
        which = [i for i, r in enumerate(rows) if r.params.mirostat]
        if not which:
            return [None] * len(rows)
        p = [rows[i].params for i in which]
        mu = self.ops.mirostat_update(
            x[which],
            np.array([tokens[i] for i in which], dtype=np.int64),
            np.array([_mu(rows[i]) for i in which], dtype=np.float64),
            np.array([q.mirostat_tau for q in p], dtype=np.float64),
            np.array([q.mirostat_eta for q in p], dtype=np.float64),
        )
        out: list[float | None] = [None] * len(rows)
        for i, value in zip(which, np.asarray(mu).tolist(), strict=True):
            out[i] = float(value)
        return out

    def _mask_tokens(self, x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """allowed_token_ids, bad words (matched against the output, as vLLM does) and
        no-repeat n-grams (over prompt + output, as HF does). A row they leave without
        any token is a ValueError naming its request (the model runner fails that request
        alone)."""
        s, p = self.ops, [r.params for r in rows]
        if not any(
            q.allowed_token_ids or q.bad_words_token_ids or q.no_repeat_ngram_size for q in p
        ):
            return x
        if any(q.allowed_token_ids for q in p):
            x = s.apply_allowed_token_ids(x, _padded([q.allowed_token_ids or () for q in p]))
        if any(q.bad_words_token_ids for q in p):
            words = [q.bad_words_token_ids or () for q in p]
            num = max(len(w) for w in words)
            longest = max(len(seq) for w in words for seq in w)
            bad = np.full((len(rows), num, longest), -1, dtype=np.int64)
            for i, w in enumerate(words):
                for j, seq in enumerate(w):
                    bad[i, j, : len(seq)] = seq
            x = s.apply_bad_words(x, _padded([r.output_token_ids for r in rows]), bad)
        if any(q.no_repeat_ngram_size for q in p):
            x = s.apply_no_repeat_ngram(
                x,
                _padded([[*r.prompt_token_ids, *r.output_token_ids] for r in rows]),
                np.array([q.no_repeat_ngram_size for q in p], dtype=np.int64),
            )
        dead = torch.isneginf(torch.as_tensor(x)).all(dim=1)
        if bool(dead.any()):
            rid = rows[int(dead.int().argmax())].request_id
            raise ValueError(
                f"request {rid}: its allowed_token_ids, bad_words and no_repeat_ngram_size "
                "(with the other constraints of this step) leave no token to sample"
            )
        return x

    def _mask_by_grammar(self, x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """Structured outputs: a token its row's grammar does not allow next is masked
        (rows without a grammar get a mask of all ones)."""
        if all(r.bitmask is None for r in rows):
            return x
        bitmask = np.full((len(rows), -(-x.shape[1] // 32)), -1, dtype=np.int32)
        for i, r in enumerate(rows):
            if r.bitmask is not None:
                bitmask[i] = r.bitmask
        return self.structured.apply_token_bitmask(x, bitmask)

    @staticmethod
    def _mask_early_stops(x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """min_tokens: EOS and stop token ids cannot be drawn before min_tokens outputs."""
        early = [
            (i, r.stop_ids)
            for i, r in enumerate(rows)
            if len(r.output_token_ids) < r.params.min_tokens
        ]
        if not early:
            return x
        x = x.clone()
        for i, ids in early:
            x[i, list(ids)] = float("-inf")
        return x

    def _logprobs(self, x: torch.Tensor, rows: Sequence[SamplingRow]):
        """What the logprobs are taken from, or None if no row asks for them."""
        if not any(r.params.logprobs is not None for r in rows):
            return None
        return self.ops.log_softmax(x) if self.logprobs_mode.endswith("logprobs") else x

    def _with_sampled(self, logprobs, tokens, rows):
        if logprobs is None:
            return [None] * len(rows)
        num = max(r.params.logprobs or 0 for r in rows)
        topk = self.ops.topk_logprobs(logprobs, num, np.array(tokens, dtype=np.int64))
        return logprobs_rows(topk, tokens, [r.params.logprobs for r in rows])


def _seeds(rows: Sequence[SamplingRow]) -> np.ndarray:
    """The rows' Philox keys as int64 (the bit pattern of the unsigned 64-bit seed)."""
    return np.array([r.seed for r in rows], dtype=np.uint64).astype(np.int64)


def _positions(rows: Sequence[SamplingRow]) -> np.ndarray:
    return np.array([r.position for r in rows], dtype=np.int64)


def _mu(row: SamplingRow) -> float:
    """The mirostat mu a row is truncated with: its request's, 2 * tau at the first token;
    +inf (no truncation) for rows without mirostat."""
    if not row.params.mirostat:
        return float("inf")
    return 2.0 * row.params.mirostat_tau if row.mirostat_mu is None else row.mirostat_mu


def _padded_values(rows: Sequence[Sequence[float]]) -> list[list[float]]:
    width = max((len(r) for r in rows), default=0)
    return [list(r) + [0.0] * (max(width, 1) - len(r)) for r in rows]


def _parents(row: SamplingRow) -> Sequence[int]:
    """The parents of a row's drafts: its tree's, or a chain's (draft i after node i)."""
    if row.draft_parents is None:
        return range(len(row.draft_token_ids))
    return row.draft_parents


def _node_paths(row: SamplingRow) -> list[list[int]]:
    """Per node of a row's draft tree (the root first): the drafts from the root down to
    it, which its verification row reads as already output."""
    paths: list[list[int]] = [[]]
    for token, parent in zip(row.draft_token_ids, _parents(row), strict=True):
        paths.append([*paths[parent], token])
    return paths
