"""Chat messages with image parts (OpenAI's content parts), for a chat template.

A message's content may be a list of parts: {"type": "text", "text": ...} and
{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}} (the url may
also be given directly as "image_url"'s value). A list of text parts alone becomes its
texts joined by newlines (what text-only templates expect); a list with images stays a
list, each image as {"type": "image"}, which the templates of vision-language models
render as the model's image placeholder, and the images' URLs are collected in order
for the prompt's multi_modal_data. The URLs are decoded later (`images.load_image`:
data URLs only, no network).
"""

from __future__ import annotations

from typing import Any


class ContentPartError(ValueError):
    """A content part that is neither text nor an image_url; `param` is its path in the
    request ("messages.<i>.content.<j>")."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def split_image_parts(messages: list[dict]) -> tuple[list[dict], list[str]]:
    """(messages for the chat template, the image URLs in order); see the module
    docstring. Raises ContentPartError for a part of another kind."""
    out, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts = [_part(part, f"messages.{i}.content.{j}") for j, part in enumerate(content)]
            if any(kind == "image" for kind, _ in parts):
                images += [value for kind, value in parts if kind == "image"]
                content = [
                    {"type": "text", "text": value} if kind == "text" else {"type": "image"}
                    for kind, value in parts
                ]
            else:
                content = "\n".join(value for _, value in parts)
            message = {**message, "content": content}
        out.append(message)
    return out, images


def _part(part: Any, param: str) -> tuple[str, str]:
    """("text", its text) or ("image", its URL) of one content part."""
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return "text", part["text"]
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if isinstance(url, str):
            return "image", url
    raise ContentPartError(
        f"{param}: a content part must be text or an image_url with a data URL, got "
        f"{str(part)[:100]}",
        param,
    )
