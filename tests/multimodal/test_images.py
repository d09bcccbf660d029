"""Decoding images from what prompts carry, and their content hash."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

pytest.importorskip("PIL")

from pyagent_ref.multimodal import image_hash, load_image  # noqa: E402
from tests.multimodal.conftest import random_image  # noqa: E402


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def test_every_form_gives_the_same_pixels_and_hash():
    image = random_image(0)
    data = png_bytes(image)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    forms = [image, np.asarray(image), data, url, image.convert("RGBA")]
    assert len({image_hash(load_image(f)) for f in forms}) == 1


def test_other_pixels_hash_differently():
    a, b = random_image(0), np.asarray(random_image(0)).copy()
    b[0, 0, 0] ^= 1
    assert image_hash(load_image(a)) != image_hash(load_image(b))
    # the same bytes in another shape are another image
    flat = np.asarray(a).reshape(24, 20, 3)
    assert image_hash(load_image(a)) != image_hash(load_image(flat))


@pytest.mark.parametrize(
    "value, error",
    [
        (b"\x89PNG broken", "could not be decoded"),
        ("http://example.com/a.png", "base64 data URL"),
        ("data:text/plain;base64,aGk=", "data:image/<type>;base64"),
        ("data:image/png;base64,@@@", "not base64"),
        (np.zeros((4, 4, 3), dtype=np.float32), "must be uint8"),
        (np.zeros((4, 4, 2), dtype=np.uint8), "1, 3 or 4 channels"),
    ],
)
def test_bad_images_are_value_errors_naming_the_problem(value, error):
    with pytest.raises(ValueError, match=error):
        load_image(value)


def test_other_types_are_type_errors():
    with pytest.raises(TypeError, match="must be a PIL image"):
        load_image(42)
