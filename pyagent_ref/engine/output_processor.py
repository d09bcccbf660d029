"""The output processor: token ids from the engine core in, text out.

Per completion it runs an incremental detokenizer (text deltas that never split a UTF-8
character) and a stop-string checker (which holds back only text that could still turn
out to start a stop string). A stop string ends a completion the core knows nothing
about, so the processor returns those requests for the engine to abort. A prompt with
n > 1 completions is one parent with n children; it finishes when they all have.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..sample.logprobs import LogprobsColumns
from ..sample.params import SamplingParams
from ..sched.outputs import EngineCoreOutput
from ..sched.request import Request
from ..tokenize import IncrementalDetokenizer, StopChecker
from .outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass
class _Child:
    request: Request
    params: SamplingParams
    index: int
    detokenizer: IncrementalDetokenizer
    stop: StopChecker
    completion: CompletionOutput
    new_text: str = ""  # since the last delta, like the two lists below
    new_ids: list[int] = field(default_factory=list)
    sent_logprobs: int = 0  # positions of completion.logprobs in deltas already
    detokenize_s: float = 0.0  # spent in its detokenizer and stop checker

    def metrics(self) -> RequestMetrics:
        return RequestMetrics.of(self.request, self.detokenize_s)


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: dict[str, _Child]
    stream: bool
    prompt_logprobs: LogprobsColumns | None = None
    prompt_logprobs_sent: bool = False  # in a delta already


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._token_texts: dict[int, str] = {}
        self.requests: dict[str, _Parent] = {}
        self._child_to_parent: dict[str, str] = {}
        self._deltas: list[tuple[str, RequestOutput]] = []

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        children: Sequence[Request],
        stream: bool = False,
    ) -> None:
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        states = {}
        for i, child in enumerate(children):
            states[child.request_id] = _Child(
                request=child,
                params=params,
                index=i,
                detokenizer=IncrementalDetokenizer(
                    self.tokenizer,
                    prompt_ids=prompt_token_ids,
                    skip_special_tokens=params.skip_special_tokens,
                    spaces_between_special_tokens=params.spaces_between_special_tokens,
                ),
                stop=StopChecker(
                    params.stop, include_stop_str_in_output=params.include_stop_str_in_output
                ),
                completion=CompletionOutput(
                    i, "", [], logprobs=None if params.logprobs is None else self._columns()
                ),
            )
            self._child_to_parent[child.request_id] = request_id
        self.requests[request_id] = _Parent(
            request_id, prompt, list(prompt_token_ids), states, stream
        )

    def unfinished_children(self, request_id: str) -> list[str]:
        """The ids of a parent's children that have not finished (none if unknown)."""
        parent = self.requests.get(request_id)
        if parent is None:
            return []
        return [cid for cid, c in parent.children.items() if not c.completion.finished]

    def process(self, outputs: Sequence[EngineCoreOutput]) -> tuple[list[str], list[RequestOutput]]:
        """Apply one step's core outputs. Returns (children ended here that the core
        still runs — by a stop string or an error of their own — to be aborted there;
        parents that finished). An exception while processing one child (its
        detokenizer, its stop checker) finishes that child with finish_reason "error"
        and touches no other."""
        to_abort, touched = [], {}
        for out in outputs:
            pid = self._child_to_parent.get(out.req_id)
            if pid is None:
                continue
            parent = self.requests[pid]
            child = parent.children[out.req_id]
            if child.completion.finished:
                continue
            if out.prompt_logprobs is not None and parent.prompt_logprobs is None:
                parent.prompt_logprobs = self._columns([None, *out.prompt_logprobs])
            try:
                ended_here = self._apply(child, out)
            except Exception as exc:
                comp = child.completion
                comp.finish_reason = "error"
                comp.error = f"processing its output failed: {type(exc).__name__}: {exc}"
                ended_here = out.finish_reason is None
            if ended_here:
                to_abort.append(out.req_id)
            touched[pid] = parent
        finished = []
        for pid, parent in touched.items():
            done = all(c.completion.finished for c in parent.children.values())
            if parent.stream:
                self._deltas.append((pid, self._delta(parent, done)))
            if done:
                finished.append(self._final(parent))
                self._forget(pid)
        return to_abort, finished

    def take_deltas(self) -> list[tuple[str, RequestOutput]]:
        deltas, self._deltas = self._deltas, []
        return deltas

    def _forget(self, request_id: str) -> None:
        parent = self.requests.pop(request_id)
        for cid in parent.children:
            del self._child_to_parent[cid]

    def _apply(self, child: _Child, out: EngineCoreOutput) -> bool:
        """Feed one output to a child; True if a stop string ended it."""
        comp = child.completion
        if out.pooled is not None:
            comp.embedding = out.pooled
        comp.token_ids.extend(out.new_token_ids)
        child.new_ids.extend(out.new_token_ids)
        if out.logprobs is not None and comp.logprobs is not None:
            comp.logprobs.extend(out.logprobs)  # one per new token
        core_done = out.finish_reason is not None
        ids = list(out.new_token_ids)
        if out.finish_reason == "stop" and not child.params.include_stop_str_in_output:
            ids = ids[:-1]  # the core stopped on EOS or a stop token id: not part of the text
        start = time.perf_counter()
        text = child.detokenizer.add_tokens(ids)
        if core_done:
            text += child.detokenizer.finish()
        emit, stopped, stop_str = child.stop.update(text)
        if core_done and not stopped:
            emit += child.stop.finish()
        child.detokenize_s += time.perf_counter() - start
        comp.text += emit
        child.new_text += emit
        if stopped:
            comp.finish_reason, comp.stop_reason = "stop", stop_str
            return not core_done
        if core_done:
            comp.finish_reason, comp.stop_reason = out.finish_reason, out.stop_reason
            comp.error = out.error
        return False

    def _columns(self, positions=()) -> LogprobsColumns:
        """Logprobs storage whose entries' texts are the tokens decoded alone."""
        out = LogprobsColumns(self._token_text)
        out.extend(positions)
        return out

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text

    def _delta(self, parent: _Parent, done: bool) -> RequestOutput:
        """What each completion gained since the last delta (text, token ids, their
        logprobs if asked for); the last delta also carries the requests' metrics."""
        comps = []
        for c in parent.children.values():
            logprobs = c.completion.logprobs
            comps.append(
                CompletionOutput(
                    c.index,
                    c.new_text,
                    c.new_ids,
                    c.completion.finish_reason,
                    c.completion.stop_reason,
                    logprobs=None if logprobs is None else logprobs[c.sent_logprobs :],
                    error=c.completion.error,
                    embedding=c.completion.embedding,
                )
            )
            c.new_text, c.new_ids = "", []
            c.sent_logprobs = 0 if logprobs is None else len(logprobs)
        metrics = [c.metrics() for c in parent.children.values()] if done else []
        prompt_logprobs = None
        if parent.prompt_logprobs is not None and not parent.prompt_logprobs_sent:
            prompt_logprobs, parent.prompt_logprobs_sent = parent.prompt_logprobs, True
        return RequestOutput(
            parent.request_id,
            parent.prompt,
            parent.prompt_token_ids,
            comps,
            done,
            metrics,
            prompt_logprobs,
        )

    def _final(self, parent: _Parent) -> RequestOutput:
        children = sorted(parent.children.values(), key=lambda c: c.index)
        return RequestOutput(
            parent.request_id,
            parent.prompt,
            parent.prompt_token_ids,
            [c.completion for c in children],
            finished=True,
            metrics=[c.metrics() for c in children],
            prompt_logprobs=parent.prompt_logprobs,
        )
