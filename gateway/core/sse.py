"""Server-sent events passed through from a backend, one network chunk at a time.

The relay never holds more than one incomplete event: whatever complete events a
network read brings are forwarded at once, byte for byte. It looks inside an event
only when it must — to capture the usage report, to drop the usage-only chunk the
gateway asked for on the client's behalf, and to hold back `data: [DONE]` so the
caller can put the `: server-timing` comment in front of it.

It forwards only well-formed events of an OpenAI-type stream: `data:` lines whose
payload is a JSON object or `[DONE]`, comments, and `event:`/`id:`/`retry:` fields.
The common read (whole one-line `data: {…}` events) is recognised by byte counts,
without parsing; any other read is split and each event checked, its JSON parsed.
A malformed event, or one over `max_event_bytes` (complete or still arriving), raises
`MalformedEvent` with the events before it: the caller ends the stream there.
"""

from __future__ import annotations

from typing import Any, NoReturn

import orjson

DONE_EVENT = b"data: [DONE]\n\n"
# Searched for in every read with `bytes.find`, not `in`: `x in data` first tries `x` as
# an integer (`65 in data`), and for a bytes `x` raises and clears a TypeError each time
# (about 2,000 instructions; a dozen searches a streamed read).
_DONE = b"[DONE]"
_USAGE = b'"usage"'
# a choice that finished: with `[DONE]`, what tells a whole stream from a cut one
_FINISHED = (b'"finish_reason":"', b'"finish_reason": "')
# ... and for a Responses API stream (passed through from a native backend), its end
_RESPONSES = b'"response.'
_RESPONSES_ENDS = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')
# ... and for an Anthropic Messages stream (passed through to a Messages client)
_MESSAGES_END = b'"message_stop"'
_ERROR = b'{"error"'  # an OpenAI-style error event: the backend's own end of a stream
_NAMED_ERROR = b"event: error"  # Anthropic's
_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
MAX_EVENT_BYTES = 1 << 20


class MalformedEvent(Exception):
    """The backend sent an event the relay will not forward; `forward` holds the
    well-formed events of the same read that came before it."""

    def __init__(self, reason: str, forward: bytes) -> None:
        super().__init__(reason)
        self.reason = reason
        self.forward = forward


class SseRelay:
    __slots__ = ("_after_cr", "_last", "_pending", "done", "finished",
                 "max_event_bytes", "strip_usage_chunk", "usage", "usage_chunk")

    def __init__(self, *, strip_usage_chunk: bool,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.strip_usage_chunk = strip_usage_chunk
        self.max_event_bytes = max_event_bytes
        self.usage: dict[str, Any] | None = None
        # the whole chunk that carried usage: a backend's timings (`metrics`) ride on it
        self.usage_chunk: dict[str, Any] | None = None
        self.done = False  # `data: [DONE]` seen (and withheld)
        self.finished = False  # a `finish_reason` seen
        self._pending = b""
        self._after_cr = False  # the last read ended with a CR: a LF starting the next is its pair
        self._last = b""  # the latest events forwarded

    @property
    def complete(self) -> bool:
        """The backend ended its stream as a whole one ends (`[DONE]`, a finish reason,
        a Responses or Messages stream's last event, or its own error event), not merely
        stopped."""
        if self.done or self.finished:
            return True
        last = self._last
        start = last.rfind(b"\n\n", 0, -2)
        event = last[start + 2:] if start >= 0 else last
        return _ERROR in event or _NAMED_ERROR in event

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward now for one network read from the backend."""
        if self._after_cr and data:
            self._after_cr = False
            if data[0] == 0x0A:
                data = data[1:]
        if self._pending:
            data = self._pending + data
            self._pending = b""
        if data.find(b"\r") >= 0:  # CRLF and a bare CR end a line as LF does (the SSE
            # spec's three line endings): normalised, one delimiter suffices; a read may
            # end between the CR and the LF of a pair
            self._after_cr = data[-1] == 0x0D
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not self.finished and (data.find(_FINISHED[0]) >= 0 or data.find(_FINISHED[1]) >= 0
                                  or (data.find(_RESPONSES) >= 0
                                      and any(end in data for end in _RESPONSES_ENDS))
                                  or data.find(_MESSAGES_END) >= 0):
            self.finished = True
        events = data.count(b"\n\n")
        # the common case: whole one-line `data: {…}` token events, nothing to look at
        if (data.endswith(b"}\n\n") and data.startswith(b"data: {")
                and data.count(b"\n") == 2 * events == 2 * data.count(b"}\n\n")
                and data.count(b"\n\ndata: {") == events - 1
                and data.find(_USAGE) < 0 and data.find(_DONE) < 0
                and len(data) <= self.max_event_bytes):
            self._last = data
            return data
        out: list[bytes] = []
        start = 0
        while True:
            end = data.find(b"\n\n", start)
            if end < 0:
                self._pending = data[start:]
                if len(self._pending) > self.max_event_bytes:
                    self._malformed(f"an event over {self.max_event_bytes} bytes "
                                    "(server.max_event_bytes)", out)
                break
            event = data[start:end + 2]
            start = end + 2
            if len(event) > self.max_event_bytes:
                self._malformed(f"an event over {self.max_event_bytes} bytes "
                                "(server.max_event_bytes)", out)
            if self._keep(event, out):
                out.append(event)
        kept = b"".join(out)
        if kept:
            self._last = kept
        return kept

    def _keep(self, event: bytes, before: list[bytes]) -> bool:
        data = []
        for line in event[:-2].split(b"\n"):
            if not line.startswith(_FIELDS):
                self._malformed("a line that is not an SSE field", before)
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
        if not data:  # a comment, or fields without data
            return True
        payload = data[0] if len(data) == 1 else b"\n".join(data)
        if payload == _DONE:
            self.done = True
            return False
        has_usage = payload.find(_USAGE) >= 0
        if not has_usage and payload.startswith(b"{") and payload.endswith(b"}"):
            return True  # a token chunk, taken by its braces as the common case takes it
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            self._malformed("a `data:` payload that is not a JSON object", before)
        if has_usage and isinstance(chunk.get("usage"), dict):
            self.usage, self.usage_chunk = chunk["usage"], chunk
            if self.strip_usage_chunk and not chunk.get("choices"):
                return False
        return True

    def _malformed(self, reason: str, before: list[bytes]) -> NoReturn:
        self._pending = b""
        raise MalformedEvent(reason, b"".join(before))

    def leftover(self) -> bytes | None:
        """An unterminated last event, completed and forwarded when the stream ends
        (its usage and `[DONE]` counted as any other's): sent as it is, its last line
        would run into whatever the caller writes after it. None when it is a `data:`
        event cut in the middle (its JSON unfinished): a stream that ended with the
        connection broke off there, and the caller says so rather than forward it."""
        rest, self._pending = self._pending, b""
        self._after_cr = False
        if not rest.strip():
            return b""
        try:
            return self.feed(rest.rstrip(b"\n") + b"\n\n")
        except MalformedEvent:
            return None

    def drop_partial(self) -> None:
        """The stream broke mid-event: the incomplete event is never forwarded."""
        self._pending = b""


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def error_event(body: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"
