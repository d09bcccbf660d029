"""The embedded default model, shipped inside pyagent_ref.

``pyagent_ref/model/default/`` holds it: a ~3.8 M-parameter Llama
(``LlamaForCausalLM`` layout, bfloat16 safetensors, tied embeddings, GQA 8 query / 2 KV
heads) and its 4096-token byte-level BPE tokenizer with a chat template, trained on the
Python standard library's sources by ``tools/train_default_model.py``. It lets the engine,
the server, the docs and the tests run a real model offline. See ``default/README.md``.

``pyagent_ref/model/default_draft/`` holds its draft for speculative decoding
(``default_draft_model_path``): a one-layer Llama over the same vocabulary, distilled from
it by ``tools/train_draft_model.py``. See ``default_draft/README.md``.
"""

from __future__ import annotations

import pathlib
from importlib import resources

__all__ = ["default_draft_model_path", "default_model_path"]


def default_model_path() -> pathlib.Path:
    """Return the directory of the embedded default model.

    The directory is laid out like a Hugging Face model repository: ``config.json``
    (``LlamaConfig``), ``model.safetensors``, ``generation_config.json``,
    ``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template), so it can
    be passed to pyagent's own loader or to ``transformers`` ``from_pretrained``.
    Nothing is downloaded; the files are part of the package.

    Returns:
        The absolute path of ``pyagent_ref/model/default``.
    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing (for example
            a build that left out the package data, or a checkout where
            ``tools/train_default_model.py`` has not been run).
    """
    return _packaged_model("default", "tools/train_default_model.py")


def default_draft_model_path() -> pathlib.Path:
    """Return the directory of the embedded default model's draft model.

    A one-layer Llama over the default model's vocabulary, for speculative decoding's
    "draft_model" method (``SpeculativeConfig(model=default_draft_model_path())``): it has
    ``config.json``, ``generation_config.json`` and ``model.safetensors``, no tokenizer
    files (it shares the default model's tokenizer).

    Returns:
        The absolute path of ``pyagent_ref/model/default_draft``.
    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing (a build
            that left out the package data, or a checkout where
            ``tools/train_draft_model.py`` has not been run).
    """
    return _packaged_model("default_draft", "tools/train_draft_model.py")


def _packaged_model(name: str, script: str) -> pathlib.Path:
    """The directory `name` of this package, which must hold a config.json."""
    try:
        path = pathlib.Path(str(resources.files(__package__).joinpath(name)))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - unusual importers
        path = pathlib.Path(__file__).resolve().parent / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{name} model not found at {path}: run {script}")
    return path
