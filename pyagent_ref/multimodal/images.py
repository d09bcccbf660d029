"""Images as prompts carry them: decoding and the content hash (the `mm_hash`).

An image arrives as a PIL image, an array of pixels (height, width) or (height, width,
channels) of uint8, the bytes of an encoded file (PNG, JPEG, ... whatever pillow reads),
or a data URL "data:image/<type>;base64,<payload>" (OpenAI's `image_url` form; no other
URL is fetched: the engine never reaches the network). Every form becomes an RGB PIL
image. Its content hash is SHA-256 over its size and its RGB bytes, so the same pixels
hash the same whichever form they came in, and any other pixels hash differently.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from typing import Any

DATA_URL_PREFIX = "data:"


def load_image(value: Any, name: str = "image"):
    """The RGB PIL image of `value` (see the module docstring).

    Raises:
        ValueError: bytes or a data URL that do not decode to an image, a URL that is
            not a base64 data URL, an array of another shape or dtype (the message names
            `name` and what is wrong).
        TypeError: a value of another type.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, str):
        value = _data_url_bytes(value, name)
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            with Image.open(io.BytesIO(bytes(value))) as image:
                return image.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise ValueError(f"{name} could not be decoded as an image: {exc}") from None
    shape = getattr(value, "shape", None)
    if shape is not None:
        import numpy as np

        array = np.asarray(value)
        if array.dtype != np.uint8 or array.ndim not in (2, 3) or 0 in array.shape:
            raise ValueError(
                f"{name} as an array must be uint8 of shape (height, width) or (height, "
                f"width, 1 | 3 | 4), got {array.dtype} {array.shape}"
            )
        if array.ndim == 3 and array.shape[2] not in (1, 3, 4):
            raise ValueError(f"{name} must have 1, 3 or 4 channels, got shape {array.shape}")
        return Image.fromarray(
            array.squeeze(-1) if array.ndim == 3 and array.shape[2] == 1 else array
        ).convert("RGB")
    raise TypeError(
        f"{name} must be a PIL image, a uint8 array, encoded bytes or a base64 data URL, "
        f"got {type(value).__name__}"
    )


def _data_url_bytes(url: str, name: str) -> bytes:
    if not url.startswith(DATA_URL_PREFIX):
        raise ValueError(
            f"{name} must be a base64 data URL (data:image/...;base64,...): other URLs are "
            f"not fetched, got {url[:40]!r}"
        )
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64") or not header[5:].startswith("image/"):
        raise ValueError(f"{name} must be a data URL data:image/<type>;base64,..., got {header!r}")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{name}: the data URL's payload is not base64: {exc}") from None


def image_hash(image) -> str:
    """SHA-256 (hex) of an RGB PIL image's size and pixel bytes."""
    digest = hashlib.sha256()
    digest.update(f"{image.width}x{image.height}:".encode())
    digest.update(image.convert("RGB").tobytes())
    return digest.hexdigest()
