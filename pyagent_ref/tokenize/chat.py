"""Hugging Face chat templates: finding them in a checkpoint and rendering them with jinja2.

A chat template is a Jinja program shipped with a model that turns a list of messages
into the exact prompt text the model was trained on. Templates come from the Hub, so they
are untrusted code: they run in jinja2's immutable sandbox, like in HF transformers.
What a template can see, and how the environment is set up, follows transformers, so a
template renders here exactly as `tokenizer.apply_chat_template(..., tokenize=False)`
renders it there:

* environment: `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with
  the ``loopcontrols`` extension (``{% break %}``, ``{% continue %}``) and a
  ``{% generation %}...{% endgeneration %}`` block that renders its body unchanged (it
  marks assistant text for training masks, which inference does not need);
* globals: ``raise_exception(message)`` and ``strftime_now(format)``;
* the ``tojson`` filter is `json.dumps` (non-ASCII kept, no HTML escaping) with its
  ``ensure_ascii``, ``indent``, ``separators`` and ``sort_keys`` options;
* variables: ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the
  tokenizer's named special tokens (``bos_token``, ``eos_token``, ``unk_token``,
  ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``; the ones it has) and any
  extra keyword arguments, which override special tokens of the same name.

Message keys whose value is None are dropped before rendering (an OpenAI assistant message
with ``"content": None`` and tool calls renders as if ``content`` were absent), as
transformers 5 does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .._files import read_json_object

__all__ = [
    "ChatTemplateError",
    "check_messages",
    "compile_chat_template",
    "load_chat_templates",
    "render_chat_template",
    "select_chat_template",
]

# jinja2 releases before 3.1.6 have known sandbox escapes; templates are untrusted code.
_MIN_JINJA = (3, 1, 6)


class ChatTemplateError(ValueError):
    """A chat template failed: a syntax error, an error while rendering, or its own
    ``raise_exception(message)`` call (then the message is exactly the template's)."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}body{% endgeneration %}``: renders ``body`` in its own scope."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(str(message))


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"strftime_now: the format must be a str, got {fmt!r}")
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _jinja_version() -> tuple[int, ...]:
    parts = []
    for part in jinja2.__version__.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the sandboxed environment described in the module docstring.

    Compiled templates are cached by source text.

    Raises:
        TypeError: ``source`` is not a str.
        ChatTemplateError: the template has a Jinja syntax error (the message gives the line).
        ImportError: jinja2 is older than 3.1.6 (known sandbox escapes).
    """
    if not isinstance(source, str):
        raise TypeError(f"chat template source must be a str, got {type(source).__name__}")
    if _jinja_version() < _MIN_JINJA:
        raise ImportError(
            f"chat templates need jinja2>=3.1.6 (older releases have sandbox escapes), "
            f"found jinja2 {jinja2.__version__}"
        )
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error at line {exc.lineno}: {exc}") from exc


def _plain(value: Any, where: str) -> Any:
    """A copy of JSON-like ``value`` built from dict, list, str, int, float, bool and None.

    Templates are untrusted, so they only ever see plain data (a copy: rendering can never
    change the caller's objects). Tuples stay tuples.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be str, got {key!r}")
            out[str.__str__(key)] = _plain(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, list):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return tuple(_plain(item, f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(
        f"{where}: chat template inputs must be JSON-like (dict, list, str, int, float, bool, "
        f"None), got {type(value).__name__}"
    )


def _is_list(value: Any) -> bool:
    """Whether ``value`` is a list-like sequence (a list or tuple; not a str or bytes)."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _check_dicts(value: Any, name: str, expected: str) -> None:
    """TypeError unless ``value`` is a list or tuple of mappings; ``expected`` says what
    ``name`` must be in the message about a ``value`` that is not a list."""
    if not _is_list(value):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise TypeError(f"{name}[{i}] must be a dict, got {type(item).__name__}: {item!r}")


def _plain_records(value: Any, name: str) -> list[dict[str, Any]] | None:
    """``tools`` / ``documents``: None, or a list or tuple of mappings (copied as plain data)."""
    if value is None:
        return None
    _check_dicts(value, name, "a list of dicts or None")
    return [_plain(item, f"{name}[{i}]") for i, item in enumerate(value)]


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check a conversation and return the copy of it that a chat template sees.

    A conversation is a non-empty list (or tuple) of messages, each a dict with:

    * ``role``: a str, required;
    * ``content``: a str, None, or a list of content parts, each a dict such as
      ``{"type": "text", "text": "..."}`` or ``{"type": "image"}``; it may be absent (an
      assistant message that only calls tools);
    * ``tool_calls``: None or a list of dicts, if present;
    * whatever else the template reads (``name``, ``tool_call_id``, ...).

    Every value must be JSON-like (dict, list, tuple, str, int, float, bool, None).

    Returns:
        Copies of the messages made of plain dicts and lists, without the keys whose value
        is None; the caller's objects are never changed.

    Raises:
        TypeError: ``messages`` is not a list, a message is not a dict, its ``role`` is not
            a str, its ``content`` or ``tool_calls`` has the wrong type, or a value is not
            JSON-like. The message names the place, e.g. ``messages[0]['content']``.
        ValueError: ``messages`` is empty, or a message has no ``role`` key.
    """
    if not _is_list(messages):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if len(messages) == 0:
        raise ValueError("messages must not be empty, got []")
    chat = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise TypeError(f"{where} must be a dict, got {type(message).__name__}")
        if "role" not in message:
            raise ValueError(f"{where} has no 'role' key; its keys are {list(message)}")
        if not isinstance(message["role"], str):
            raise TypeError(f"{where}['role'] must be a str, got {message['role']!r}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            _check_dicts(content, f"{where}['content']", "a str, a list of content parts or None")
        if message.get("tool_calls") is not None:
            _check_dicts(message["tool_calls"], f"{where}['tool_calls']", "a list of dicts or None")
        chat.append({k: _plain(v, f"{where}[{k!r}]") for k, v in message.items() if v is not None})
    return chat


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render a chat template the way HF transformers' ``apply_chat_template`` does.

    Args:
        template: the Jinja source of the template.
        messages: the conversation, a non-empty list of dicts (``role``, ``content``, and
            whatever else the template reads: ``tool_calls``, ``name``, ...), checked by
            `check_messages`. Keys whose value is None are dropped. Messages are copied; the
            caller's objects are never changed.
        tools: None, or a list of tool JSON schemas (dicts), passed as ``tools``.
        documents: None, or a list of dicts (e.g. ``title`` and ``text``) for RAG templates.
        add_generation_prompt: passed to the template; templates append the header that
            starts an assistant turn when it is true.
        special_tokens: ``{"bos_token": "<s>", ...}`` made visible to the template.
        **kwargs: extra template variables (``enable_thinking=False``, a date, ...); they
            override special tokens of the same name. Values must be JSON-like.

    Returns:
        The rendered prompt text.

    Raises:
        TypeError: ``messages`` is not a list of dicts, a message's ``role``, ``content``
            or ``tool_calls`` has the wrong type (see `check_messages`), a tool or document
            is not a dict, a value anywhere is not JSON-like, or ``add_generation_prompt``
            is not a bool.
        ValueError: ``messages`` is empty, or a message has no ``role``.
        ChatTemplateError: the template has a syntax error, fails while rendering, or
            calls ``raise_exception``.
    """
    chat = check_messages(messages)
    if not isinstance(add_generation_prompt, bool):
        raise TypeError(f"add_generation_prompt must be a bool, got {add_generation_prompt!r}")
    variables: dict[str, Any] = {}
    for name, token in (special_tokens or {}).items():
        if not isinstance(token, str):
            raise TypeError(f"special_tokens[{name!r}] must be a str, got {token!r}")
        variables[name] = token
    for name, value in kwargs.items():
        if name in ("messages", "tools", "documents", "add_generation_prompt"):
            raise TypeError(f"{name} is a chat template argument, not an extra variable")
        variables[name] = _plain(value, name)
    compiled = compile_chat_template(template)
    try:
        return compiled.render(
            messages=chat,
            tools=_plain_records(tools, "tools"),
            documents=_plain_records(documents, "documents"),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def select_chat_template(
    templates: Mapping[str, str],
    chat_template: str | None = None,
    *,
    has_tools: bool = False,
) -> str:
    """Pick the template source to render.

    ``chat_template`` is the name of one of ``templates`` or, if it names none of them, a
    template source used as is. When it is None: ``templates["tool_use"]`` if ``has_tools``
    and there is one, else ``templates["default"]``.

    Raises:
        ValueError: ``chat_template`` is None and there is no template to fall back on (the
            message lists the names there are).
    """
    if chat_template is not None:
        if not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a str or None, got {chat_template!r}")
        return templates.get(chat_template, chat_template)
    if has_tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if templates:
        raise ValueError(
            f"chat_template is None and the tokenizer has no 'default' template; pass one of "
            f"{sorted(templates)} or a template source"
        )
    raise ValueError(
        "chat_template is None and the tokenizer has no chat template; pass a template source"
    )


def _templates_from_value(value: Any, origin: str) -> dict[str, str]:
    """``"chat_template"`` as stored in JSON: a source, or a list of ``{name, template}``."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        out = {}
        for i, entry in enumerate(value):
            if not (
                isinstance(entry, Mapping)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                raise ValueError(
                    f"{origin}: chat_template[{i}] must be {{'name': str, 'template': str}}, "
                    f"got {entry!r}"
                )
            out[entry["name"]] = entry["template"]
        return out
    raise ValueError(
        f"{origin}: chat_template must be a str or a list of named templates, "
        f"got {type(value).__name__}"
    )


def load_chat_templates(
    model_dir: str | Path, tokenizer_config: Mapping[str, Any]
) -> dict[str, str]:
    """The chat templates of a checkpoint directory, by name (``"default"`` is the main one).

    Sources, each overriding same-named templates of the ones before:

    1. ``tokenizer_config["chat_template"]`` (a source, or a list of
       ``{"name": ..., "template": ...}``), as older checkpoints store it;
    2. ``chat_template.json`` with a ``"chat_template"`` key (same forms), as processor
       checkpoints store it;
    3. ``chat_template.jinja``, the default template, as newer checkpoints store it;
    4. ``additional_chat_templates/<name>.jinja``, one named template per file.

    Raises:
        ValueError: a malformed ``chat_template`` value or ``chat_template.json``.
    """
    root = Path(model_dir)
    templates = _templates_from_value(
        tokenizer_config.get("chat_template"), str(root / "tokenizer_config.json")
    )
    json_file = root / "chat_template.json"
    if json_file.is_file():
        data = read_json_object(json_file)
        if "chat_template" not in data:
            raise ValueError(f"{json_file} must be an object with a 'chat_template' key")
        templates.update(_templates_from_value(data["chat_template"], str(json_file)))
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        templates["default"] = jinja_file.read_text(encoding="utf-8")
    extra_dir = root / "additional_chat_templates"
    if extra_dir.is_dir():
        for path in sorted(extra_dir.glob("*.jinja")):
            templates[path.stem] = path.read_text(encoding="utf-8")
    return templates
