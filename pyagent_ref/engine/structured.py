"""Structured outputs in the engine: constraints compiled off the step loop, a matcher per request.

The path of a request with ``SamplingParams.structured_outputs``:

1. admission (`_Frontend._validate`): `StructuredOutputs.compile` turns the constraint
   into a `Grammar` on a worker thread, cached by the constraint's key, so a schema sent
   again is not compiled again. `LLM` waits for it; `AsyncLLM` awaits it, so the engine
   goes on stepping the other requests meanwhile. A malformed constraint is a ValueError
   there, before anything is queued.
2. each child request gets its own `GrammarMatcher` (`StructuredOutputs.matcher`):
   parser state, the vocabulary's token trie and the ids that end the output.
3. each step, `EngineCore` asks every matcher whose request draws a token for the
   bitmask of the tokens allowed next; the sampler masks the others out first.
4. `Scheduler.update_from_output` feeds the drawn token to the matcher; a request whose
   grammar can take nothing more finishes with finish_reason "stop".
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from types import ModuleType
from typing import Any

from .. import structured as reference
from ..sample.params import StructuredOutputsParams
from ..structured.constraints import constraint_grammar
from ..structured.vocab import token_bytes


class StructuredOutputs:
    """Compiles constraints (cached, on ``max_workers`` threads) and makes matchers over
    one tokenizer's vocabulary (its token trie is built on first use).

    ``backend`` is the package whose `EarleyParser`, `TokenTrie` and `GrammarMatcher`
    run the token level: `pyagent_ref.structured` or `pyagent_accel.structured` (the
    same API and masks, in Rust; its grammars are the reference's, handed over once as
    a `CompiledGrammar`). A backend's own `constraint_grammar`, if it has one, compiles
    the constraints (the accelerator's builds the same grammars with Rust automata).
    """

    def __init__(
        self,
        tokenizer,
        backend: ModuleType = reference,
        max_workers: int = 1,
        cache_size: int = 256,
        compile_timeout_s: float = 60.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.backend = backend
        self.compile_timeout_s = compile_timeout_s
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="pyagent-grammar")
        self._cache: OrderedDict[tuple, Future[Any]] = OrderedDict()
        self._cache_size = cache_size
        self._trie = None
        self._lock = threading.Lock()

    def _compile(self, params: StructuredOutputsParams) -> Any:
        """The constraint's grammar, in the backend's form."""
        grammar = getattr(self.backend, "constraint_grammar", constraint_grammar)(params)
        compiled = getattr(self.backend, "CompiledGrammar", None)
        return grammar if compiled is None else compiled(grammar)

    def compile(self, params: StructuredOutputsParams) -> Future[Any]:
        """The future grammar of a constraint; its exception is the constraint's error."""
        key = params.key()
        with self._lock:
            future = self._cache.get(key)
            if future is None:
                future = self._pool.submit(self._compile, params)
                self._cache[key] = future
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
            return future

    def grammar(self, params: StructuredOutputsParams) -> Any:
        """The grammar of a constraint, waiting at most ``compile_timeout_s`` for it;
        ValueError names what is wrong (a compilation still running past the timeout
        goes on in the background, and its result is cached)."""
        try:
            return self.compile(params).result(timeout=self.compile_timeout_s)
        except FutureTimeout:
            raise self.timeout_error(params) from None
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"structured_outputs.{params.kind} cannot be used: {exc}") from None

    def timeout_error(self, params: StructuredOutputsParams) -> ValueError:
        return ValueError(
            f"structured_outputs.{params.kind} cannot be used: compiling it took more than "
            f"{self.compile_timeout_s:g} s"
        )

    def matcher(self, grammar: Any, end_token_ids: Sequence[int]) -> Any:
        """A fresh matcher of ``grammar`` (from `grammar`); ``end_token_ids`` (EOS, stop
        ids) are allowed exactly where the grammar's output may end."""
        parser = self.backend.EarleyParser(grammar)
        return self.backend.GrammarMatcher(parser, self.trie, list(end_token_ids))

    @property
    def trie(self) -> Any:
        with self._lock:
            if self._trie is None:
                self._trie = self.backend.TokenTrie(token_bytes(self.tokenizer))
            return self._trie

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
