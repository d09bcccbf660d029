"""The embedded default model, shipped inside pyagent_ref.

``pyagent_ref/model/default/`` holds it: a ~3.8 M-parameter Llama
(``LlamaForCausalLM`` layout, bfloat16 safetensors, tied embeddings, GQA 8 query / 2 KV
heads) and its 4096-token byte-level BPE tokenizer with a chat template, trained on the
Python standard library's sources by ``tools/train_default_model.py``. It lets the engine,
the server, the docs and the tests run a real model offline. See ``default/README.md``.
"""

from __future__ import annotations

import pathlib
from importlib import resources

__all__ = ["default_model_path"]


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
    try:
        path = pathlib.Path(str(resources.files(__package__).joinpath("default")))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - unusual importers
        path = pathlib.Path(__file__).resolve().parent / "default"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"default model not found at {path}: run tools/train_default_model.py"
        )
    return path
