"""Adapters: third-party implementations behind the pyagent op signatures.

An adapter is a module with one attribute per ops module it covers (`sampling`, ...),
each an object whose attributes are op functions with the reference's names and
signatures (numpy or torch arrays in, the input's library out); for `tokenize`, one
loader per vocabulary (see `conformance/specs/tokenize.py`). Ops it lacks are simply
absent; it may say why in `CONFORMANCE_MISSING = {"module.op" or "module.*": reason}`.
Run the suite on it with `python -m conformance <adapter module>`; where it knowingly
differs from the specification, record it in `conformance.divergences`.

- `hf_transformers`: Hugging Face transformers' logits processors, RMS norm, SiLU and RoPE.
- `vllm`: vLLM's sampler functions, logits processors, layers and prefix-cache hashing
  (`nox -s vllm`).
- `hf_tokenizers`: the `tokenizers` library on the tokenizer.json vocabularies.
- `tiktoken`: tiktoken on cl100k_base and on the tokenizer.json vocabularies' ranks.
- `xgrammar`, `llguidance`: their functions applying a token bitmask (`ops.structured`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from .. import contract


def lazy_namespaces(
    module: str, functions: dict[str, Any], modules: Sequence[str], load: Callable[[], Any]
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) for an adapter: ``<adapter>.sampling`` (for
    each module in ``modules``) is a namespace of the adapter's ``functions`` (its
    globals) named like the reference module's ops (like the vocabularies, for
    ``tokenize``). It is built on first access after ``load()`` imported the third-party
    library, so importing the adapter never fails and a missing library is a clear
    ImportError when the suite asks for an op."""
    built: dict[str, SimpleNamespace] = {}

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's name
        if name not in modules:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if name not in built:
            load()
            ops = {op: functions[op] for op in _op_names(name) if op in functions}
            built[name] = SimpleNamespace(**ops)
        return built[name]

    return __getattr__


def _op_names(module: str) -> tuple[str, ...]:
    """The functions of the reference ops module `module`, or the ops of the spec of another
    contract (the vocabularies of `tokenize`)."""
    if module in contract.modules():
        return contract.functions(module)
    from ..core import all_specs

    return all_specs()[module].ops
