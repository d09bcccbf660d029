"""The embedded default model: a small Llama and its BPE tokenizer, shipped in the package.

It is trained by `tools/train_default_model.py` on the Python standard library's own
sources (see the README beside the weights), so the engine runs and generates
recognisable Python-like text on any machine, offline.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "default_model"


def default_model_path() -> Path:
    """The directory of the embedded model (HF layout: config.json, model.safetensors,
    tokenizer.json, tokenizer_config.json). FileNotFoundError if it is missing."""
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the embedded model is missing from {DEFAULT_MODEL_DIR}; "
            "rebuild it with: python tools/train_default_model.py"
        )
    return DEFAULT_MODEL_DIR
