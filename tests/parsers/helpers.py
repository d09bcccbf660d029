"""Run a parser on a text, whole and streamed, and compare the two."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pyagent_ref.parsers import DeltaMessage


@dataclass
class Streamed:
    """What a client rebuilds from the deltas of a stream."""

    content: str = ""
    reasoning: str = ""
    calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"} by index


def split(text: str, cuts) -> list[str]:
    """``text`` cut at the given positions (any ints; out-of-range ones are clamped)."""
    points = sorted({min(max(c, 0), len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False)]


def collect(deltas: list[DeltaMessage]) -> Streamed:
    """Rebuild the message from deltas, checking OpenAI's rules on the way: a call's
    first delta has its id, type and name, later ones only an arguments fragment, and calls
    are numbered 0, 1, 2, ... in the order they first appear."""
    out = Streamed()
    for delta in deltas:
        assert delta, "an empty delta was returned instead of None"
        wire = delta.to_openai()
        assert wire, delta
        out.content += delta.content or ""
        out.reasoning += delta.reasoning_content or ""
        seen = set()
        for call in delta.tool_calls:
            assert call.index not in seen, "two parts of one call in one delta"
            seen.add(call.index)
            item = call.to_openai()
            if call.index == len(out.calls):
                assert call.id and call.name, f"the first delta of a call needs id and name: {item}"
                assert item["type"] == "function"
                out.calls.append({"id": call.id, "name": call.name, "arguments": ""})
            else:
                assert call.index < len(out.calls), f"call index {call.index} skipped ahead"
                assert call.id is None and call.name is None, f"id/name sent twice: {item}"
                assert call.arguments, f"a later delta without arguments: {item}"
            out.calls[call.index]["arguments"] += call.arguments or ""
    return out


def stream(parser, chunks: list[str]) -> Streamed:
    deltas = [d for chunk in chunks if (d := parser.stream(chunk)) is not None]
    if (last := parser.finish()) is not None:
        deltas.append(last)
    return collect(deltas)


def as_calls(extracted) -> list[dict]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in extracted.tool_calls]


def is_subsequence(small: list[dict], big: list[dict]) -> bool:
    it = iter(big)
    return all(
        any(b["name"] == s["name"] and b["arguments"] == s["arguments"] for b in it) for s in small
    )


def check_tool_stream(cls, text: str, chunks: list[str], exact: bool = True, **kwargs) -> None:
    """Streaming ``chunks`` (which join to ``text``) agrees with ``extract(text)``.

    Always: the same content, every call's arguments valid JSON objects, and the extracted
    calls a subsequence of the streamed ones. ``exact``: the very same calls, ids included
    (both parsers are seeded alike).
    """
    assert "".join(chunks) == text
    whole = cls(seed=7, **kwargs).extract(text)
    streamed = stream(cls(seed=7, **kwargs), chunks)
    assert streamed.content == (whole.content or ""), (text, chunks)
    for call in whole.tool_calls:
        assert isinstance(json.loads(call.arguments), dict), call
    if exact:
        assert streamed.calls == as_calls(whole), (text, chunks)
    else:
        assert is_subsequence(as_calls(whole), streamed.calls), (text, chunks)


def check_reasoning_stream(cls, text: str, chunks: list[str], **kwargs) -> None:
    """Streaming ``chunks`` gives exactly ``extract(text)``."""
    whole = cls(**kwargs).extract(text)
    streamed = stream(cls(**kwargs), chunks)
    assert not streamed.calls
    assert (streamed.reasoning or None, streamed.content or None) == (
        whole.reasoning,
        whole.content,
    ), (text, chunks)
