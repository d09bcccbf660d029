"""From a prompt with images to a request: preprocessing, placeholders, features.

A vision-language prompt holds one image placeholder token (the model's image token,
"<image>" for LLaVA, "<|image_pad|>" for Qwen2-VL) per image, in the images' order. For
each image:

1. it is decoded to RGB (`images.load_image`) and hashed (`images.image_hash`: the
   `mm_hash`);
2. the model's HF image processor (preprocessor_config.json of the model directory:
   resize, center crop, rescale, normalise) makes its pixel_values; Qwen2-VL's
   (Qwen2VLImageProcessor) resizes to multiples of patch * merge pixels within
   min/max_pixels and returns the patches and their grid (t, h, w): the data is then an
   `ImagePatches`;
3. its placeholder is expanded to the number of decoder positions the image fills
   (`num_image_tokens`: (image_size / patch_size)^2 for LLaVA's default strategy;
   t * h * w / merge^2 for Qwen2-VL, different for images of different sizes).

The request then carries a `MultiModalFeature` per image: its hash, the offset of its
first placeholder in the expanded prompt, its length, and its pixel_values. The hash
and offset enter the prefix-cache key of every KV block the span overlaps
(`kv_cache.request_hashing`), so that identical images at the same place share blocks
and different images never do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..model.config import ModelConfig
from ..sched.request import MultiModalFeature
from .images import image_hash, load_image

DYNAMIC_RESOLUTION = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
IMAGE_ARCHITECTURES = ("LlavaForConditionalGeneration", *DYNAMIC_RESOLUTION)
MODALITIES = ("image",)


def preprocessor_max_pixels(model_dir: str | Path) -> int | None:
    """The max_pixels of the Qwen2-VL image processor in a model directory, read from
    its preprocessor_config.json as HF's Qwen2VLImageProcessor reads it, without
    importing transformers: a top-level max_pixels (the released checkpoints' layout)
    over size["longest_edge"] (transformers 5's), then size["max_pixels"] (4.x's); None
    without the file or any of them (HF's default applies).

    Raises:
        ValueError: a file that is not a JSON object, or a value that is not an int >= 1.
    """
    import json

    path = Path(model_dir) / "preprocessor_config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    if not isinstance(cfg, dict) or not isinstance(cfg.get("size") or {}, dict):
        raise ValueError(f"{str(path)!r} must be a JSON object with an object as its size")
    size = cfg.get("size") or {}
    for key, value in (
        ("max_pixels", cfg.get("max_pixels")),
        ("size.longest_edge", size.get("longest_edge")),
        ("size.max_pixels", size.get("max_pixels")),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{str(path)!r}: {key} must be an int >= 1, got {value!r}")
        return value
    return None


def max_image_positions(model_dir: str | Path, architecture: str, vision: Any) -> int:
    """The most decoder positions one image of the model fills, which the engine's
    encoder budget per step and its encoder cache hold at least: `vision`'s
    num_image_tokens for a tower of fixed size (LLaVA); for dynamic resolution (the
    Qwen2-VL family) those of the largest image the image processor makes at its
    max_pixels (`preprocessor_max_pixels`; HF's default without one). An image the
    processor makes larger (an extreme aspect ratio: a side is never below one merge
    unit) is refused at admission."""
    if architecture not in DYNAMIC_RESOLUTION:
        return vision.num_image_tokens
    max_pixels = preprocessor_max_pixels(model_dir)
    return vision.max_image_tokens() if max_pixels is None else vision.max_image_tokens(max_pixels)


class MultiModalProcessor:
    """The multimodal side of a model's prompts (see the module docstring).

    Args:
        model_dir: the model directory (its preprocessor_config.json is read for a
            vision-language model).
        config: the model's configuration.
        max_images: the most images one prompt may carry (limit_mm_per_prompt).
    Raises:
        FileNotFoundError: a vision-language model without preprocessor_config.json.
    """

    def __init__(self, model_dir: str | Path, config: ModelConfig, max_images: int) -> None:
        self.architecture = config.architecture
        self.max_images = max_images
        self.supports_images = config.architecture in IMAGE_ARCHITECTURES
        self.image_token_id: int | None = None
        self._hf = None
        self.dynamic = config.architecture in DYNAMIC_RESOLUTION
        if self.dynamic:
            from ..model.registry import resolve_architecture

            model_class = resolve_architecture(config.architecture)
            self.qwen2_vl = model_class.vision_config_class.from_hf(config.raw)
            self.image_token_id = self.qwen2_vl.image_token_id
        elif self.supports_images:
            from ..model.llava import VisionConfig

            vision = VisionConfig.from_hf(config.raw)
            self.image_token_id = vision.image_token_id
            self.tokens_per_image = vision.num_image_tokens
            self.pixel_shape = (vision.num_channels, vision.image_size, vision.image_size)
        if self.supports_images:
            path = Path(model_dir) / "preprocessor_config.json"
            if not path.is_file():
                raise FileNotFoundError(
                    f"{config.architecture} takes images, but {str(model_dir)!r} has no "
                    "preprocessor_config.json (its image processor)"
                )
            self.model_dir = Path(model_dir)

    def _image_processor(self):
        if self._hf is None:
            import warnings

            from transformers import AutoImageProcessor

            with warnings.catch_warnings():  # "falling back to the PIL backend": expected
                warnings.simplefilter("ignore")
                self._hf = AutoImageProcessor.from_pretrained(self.model_dir)
        return self._hf

    def __call__(
        self, ids: list[int], mm_data: Any
    ) -> tuple[list[int], tuple[MultiModalFeature, ...]]:
        """(expanded prompt ids, one feature per image) of a prompt and its
        multi_modal_data (None: a text prompt, returned as it is).

        Raises:
            ValueError: multi_modal_data for a text-only model, a modality the model does
                not take, more images than max_images, placeholders that do not match the
                images one to one, an image that does not decode (messages name which).
            TypeError: multi_modal_data that is not a dict, an image of another type.
        """
        if mm_data is None:
            if self.supports_images and self.image_token_id in ids:
                raise ValueError(
                    f"the prompt has {ids.count(self.image_token_id)} image placeholder "
                    f"token(s) (id {self.image_token_id}) but no multi_modal_data image"
                )
            return ids, ()
        if not isinstance(mm_data, dict):
            raise TypeError(
                f"multi_modal_data must be a dict such as {{'image': image}}, got "
                f"{type(mm_data).__name__}"
            )
        if not self.supports_images:
            raise ValueError(
                f"{self.architecture} is a text-only model: it takes no multi_modal_data "
                f"(got {sorted(map(str, mm_data))})"
            )
        wrong = [k for k in mm_data if k not in MODALITIES]
        if wrong:
            raise ValueError(
                f"multi_modal_data has modality {wrong[0]!r}, but {self.architecture} takes "
                f"only {list(MODALITIES)}"
            )
        images = mm_data.get("image")
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        if len(images) > self.max_images:
            raise ValueError(
                f"the prompt has {len(images)} images, more than the {self.max_images} allowed "
                "per prompt (limit_mm_per_prompt)"
            )
        return self._expand(ids, images)

    def _expand(self, ids: list[int], images: Sequence[Any]):
        token = self.image_token_id
        places = [i for i, t in enumerate(ids) if t == token]
        if len(places) != len(images):
            raise ValueError(
                f"the prompt has {len(places)} image placeholder token(s) (id {token}) for "
                f"{len(images)} image(s): put one placeholder per image"
            )
        decoded = [load_image(image, f"image {i}") for i, image in enumerate(images)]
        pixels = self.patches(decoded) if self.dynamic else self.pixel_values(decoded)
        out: list[int] = []
        features = []
        start = 0
        for place, image, values in zip(places, decoded, pixels, strict=True):
            out += ids[start:place]
            n = (
                self.qwen2_vl.image_tokens(values.grid_thw)
                if self.dynamic
                else self.tokens_per_image
            )
            features.append(MultiModalFeature(image_hash(image), len(out), n, data=values))
            out += [token] * n
            start = place + 1
        return out + ids[start:], tuple(features)

    def pixel_values(self, images: list) -> list:
        """The model's pixel_values of each RGB image, float32 tensors of pixel_shape."""
        if not images:
            return []
        values = self._image_processor()(images=images, return_tensors="pt")["pixel_values"]
        if tuple(values.shape[1:]) != self.pixel_shape:
            raise ValueError(
                f"the image processor of {str(self.model_dir)!r} makes pixel_values of shape "
                f"{tuple(values.shape[1:])}, the model takes {self.pixel_shape}"
            )
        return list(values.float())

    def patches(self, images: list) -> list:
        """Qwen2-VL's `ImagePatches` of each RGB image (its own size: one call each).

        Raises:
            ValueError: an image the image processor refuses (an aspect ratio over
                200), or patches that do not fit the model (the messages name which).
        """
        from ..model.qwen2_vl import ImagePatches

        cfg, out = self.qwen2_vl, []
        for i, image in enumerate(images):
            try:
                made = self._image_processor()(images=[image], return_tensors="pt")
            except ValueError as error:
                raise ValueError(f"image {i} ({image.width} x {image.height}): {error}") from None
            values, grid = made["pixel_values"], made["image_grid_thw"]
            grid = tuple(int(n) for n in grid[0])
            m = cfg.spatial_merge_size
            if (
                tuple(values.shape) != (grid[0] * grid[1] * grid[2], cfg.patch_values)
                or grid[1] % m
                or grid[2] % m
            ):
                raise ValueError(
                    f"the image processor of {str(self.model_dir)!r} makes patches of shape "
                    f"{tuple(values.shape)} on grid {grid}; the model takes {cfg.patch_values} "
                    f"values per patch on grids whose h and w are multiples of {m}"
                )
            out.append(ImagePatches(values.float(), grid))
        return out
