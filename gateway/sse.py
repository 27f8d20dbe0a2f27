"""Server-sent events passed through from a backend, one network chunk at a time.

The relay never holds more than one incomplete event: whatever complete events a
network read brings are forwarded at once, byte for byte. It looks inside an event
only when it must — to capture the usage report, to drop the usage-only chunk the
gateway asked for on the client's behalf, and to hold back `data: [DONE]` so the
caller can put the `: server-timing` comment in front of it.
"""

from __future__ import annotations

from typing import Any

import orjson

DONE_EVENT = b"data: [DONE]\n\n"
_DONE = b"[DONE]"
_USAGE = b'"usage"'
_NULL_USAGE = (b'"usage":null', b'"usage": null')


class SseRelay:
    __slots__ = ("_pending", "content_events", "done", "strip_usage_chunk", "usage",
                 "usage_chunk")

    def __init__(self, *, strip_usage_chunk: bool) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self.usage: dict[str, Any] | None = None
        # the whole chunk that carried usage: a backend's timings (`metrics`) ride on it
        self.usage_chunk: dict[str, Any] | None = None
        self.done = False  # `data: [DONE]` seen (and withheld)
        self._pending = b""
        # chunks with a non-empty content/text delta: what a stream cut short produced
        self.content_events = 0

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward now for one network read from the backend."""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if b"\r" in data:  # CRLF framing is legal SSE; normalise so one delimiter suffices
            # (after joining: a read may end between the \r and the \n)
            data = data.replace(b"\r\n", b"\n")
        if data.endswith(b"\n\n") and _USAGE not in data and _DONE not in data:
            self.content_events += _content_count(data)
            return data  # the common case: whole token events, nothing to look at
        out: list[bytes] = []
        start = 0
        while True:
            end = data.find(b"\n\n", start)
            if end < 0:
                self._pending = data[start:]
                break
            event = data[start:end + 2]
            start = end + 2
            if self._keep(event):
                out.append(event)
        kept = b"".join(out)
        self.content_events += _content_count(kept)
        return kept

    def _keep(self, event: bytes) -> bool:
        payload = _data_field(event)
        if payload is None:
            return True
        if payload == _DONE:
            self.done = True
            return False
        if _USAGE in payload and not any(null in payload for null in _NULL_USAGE):
            try:
                chunk = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return True
            if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                self.usage, self.usage_chunk = chunk["usage"], chunk
                if self.strip_usage_chunk and not chunk.get("choices"):
                    return False
        return True

    def leftover(self) -> bytes | None:
        """An unterminated last event, completed and forwarded when the stream ends
        (its usage and `[DONE]` counted as any other's): sent as it is, its last line
        would run into whatever the caller writes after it. None when it is a `data:`
        event cut in the middle (its JSON unfinished): a stream that ended with the
        connection broke off there, and the caller says so rather than forward it."""
        rest, self._pending = self._pending, b""
        if not rest.strip():
            return b""
        event = rest.rstrip(b"\n") + b"\n\n"
        payload = _data_field(event)
        if payload is not None and payload != _DONE:
            try:
                orjson.loads(payload)
            except orjson.JSONDecodeError:
                return None
        return self.feed(event)

    def drop_partial(self) -> None:
        """The stream broke mid-event: the incomplete event is never forwarded."""
        self._pending = b""


def _content_count(data: bytes) -> int:
    """Content-bearing chunks in complete events (compact JSON, as OpenAI-compatible
    servers send it); C-speed byte counts, no parsing."""
    return (data.count(b'"content":"') + data.count(b'"text":"')
            - data.count(b'"content":""') - data.count(b'"text":""'))


def _data_field(event: bytes) -> bytes | None:
    """The payload of a single-line `data:` event, or None for anything else."""
    if not event.startswith(b"data:"):
        return None
    payload = event[5:].strip()
    return None if b"\n" in payload else payload


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def error_event(body: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"
