"""Multimodal (image) inputs: decoding, preprocessing, placeholder expansion, content
hashes, and the encoder cache (see docs/multimodal.md)."""

from .encoder_cache import EncoderCacheManager
from .images import image_hash, load_image
from .processor import MultiModalProcessor

__all__ = ["EncoderCacheManager", "MultiModalProcessor", "image_hash", "load_image"]
