"""Requests and scheduling."""

from .request import MultiModalFeature, Request

__all__ = ["MultiModalFeature", "Request"]
