"""Prompt and completion text for a traced request's root span, when the policy asks
(`compliance.record_content`); nothing here runs otherwise.

The prompt is the request's `messages` (as JSON text), `prompt` or `input`; the
completion is the reply's text: `choices[].message.content` (or `.text`) of a JSON
reply, the `delta.content` (or `text`) of each streamed chunk, joined. Both are cut
to `MAX_CHARS`, so one request cannot make a span no collector takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

MAX_CHARS = 32_768  # per attribute; a longer text ends with TRUNCATED
TRUNCATED = "…[truncated]"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + TRUNCATED


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return _cut(value if isinstance(value, str) else orjson.dumps(value).decode())


def prompt_text(body: Mapping[str, Any]) -> str | None:
    """What the request asks: its messages (JSON), prompt or embedding input."""
    for field in ("messages", "prompt", "input"):
        if field in body:
            return _text(body[field])
    return None


def _choice_text(choice: Any, part: str) -> str:
    if not isinstance(choice, Mapping):
        return ""
    inner = choice.get(part)
    text = inner.get("content") if isinstance(inner, Mapping) else None
    if not isinstance(text, str):
        text = choice.get("text")
    return text if isinstance(text, str) else ""


def completion_text(body: Mapping[str, Any]) -> str | None:
    """The text of a JSON reply's choices (joined by a blank line when several)."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return None
    texts = [text for choice in choices if (text := _choice_text(choice, "message"))]
    return _cut("\n\n".join(texts)) if texts else None


class StreamText:
    """The completion of a stream, from the SSE events relayed to the client."""

    __slots__ = ("_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0

    def feed(self, events: bytes) -> None:
        """Whole SSE events (as the relay writes them)."""
        if self._size > MAX_CHARS:
            return
        for line in events.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data.startswith(b"{"):
                continue  # [DONE], or not JSON
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            choices = chunk.get("choices") if isinstance(chunk, dict) else None
            for choice in choices if isinstance(choices, list) else ():
                if text := _choice_text(choice, "delta"):
                    self._parts.append(text)
                    self._size += len(text)

    def text(self) -> str | None:
        return _cut("".join(self._parts)) if self._parts else None
