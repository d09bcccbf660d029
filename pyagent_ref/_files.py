"""Reading the small JSON files of a checkpoint directory, with errors that name the file.

A model directory holds several of them (``config.json``, ``generation_config.json``,
``model.safetensors.index.json``, ``tokenizer_config.json``, ...). A truncated or hand-edited
one should fail with the file's path, not with a bare "Expecting value: line 2 column 1".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json_object"]


def read_json_object(path: str | Path) -> dict[str, Any]:
    """The JSON object stored in the UTF-8 file at ``path``.

    Raises:
        FileNotFoundError: there is no file at ``path`` (the message names it).
        ValueError: the file is not UTF-8 text, not valid JSON, or holds a JSON value that
            is not an object (an array, a string, ...). The message names the file and, for
            invalid JSON, the decoder's reason with its line and column.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data
