"""Reading a relayed `chat.completion.chunk` stream event by event, for the encoders
that re-express it as another API's events (Anthropic Messages, Responses)."""

from __future__ import annotations

from typing import Any

import orjson


class EventSplitter:
    """Splits the bytes written to it into whole SSE events, each rewritten by `_event`;
    an event's start is held until its blank line arrives."""

    _pending: bytes = b""

    def feed(self, data: bytes) -> bytes:
        data = self._pending + data
        out: list[bytes] = []
        start = 0
        while (end := data.find(b"\n\n", start)) >= 0:
            out.append(self._event(data[start:end + 2]))
            start = end + 2
        self._pending = data[start:]
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        raise NotImplementedError


class ChunkReader(EventSplitter):
    """`: comments` pass through, each chunk object goes to `_chunk`, `[DONE]` to
    `_finish`. Anything else is dropped: the relay has already ended the stream with an
    error event on a malformed one."""

    def _event(self, event: bytes) -> bytes:
        if not event.startswith(b"data:"):
            return event  # `: server-timing ...` and other comments
        payload = event[5:].strip()
        if payload == b"[DONE]":
            return self._finish()
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        return self._chunk(chunk) if isinstance(chunk, dict) else b""

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _finish(self) -> bytes:
        raise NotImplementedError
