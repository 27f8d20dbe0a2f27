"""An Anthropic backend's own Messages answer, passed through to a Messages client.

The event stream goes to the client byte for byte. Two things are read on the way:
the usage, which Anthropic splits over two events (`message_start` carries the input
tokens, cache reads and writes; `message_delta` the output tokens, cumulative), and
the gateway's own error event (`data: {"error": …}`, OpenAI-shaped: what the relay
writes when the backend fails mid-stream), which is re-encoded as Anthropic's
`event: error` so the client's SDK raises its usual error.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.chunk_reader import EventSplitter
from gateway.api.messages_to_chat import error_body, sse

Body = dict[str, Any]

_USAGE = b'"usage"'
_GATEWAY_ERROR = b'data: {"error"'  # the relay's own error event (no `event:` line)


class NativeMessageEvents(EventSplitter):
    """Feed it the SSE bytes the pipeline writes; it returns what the client gets."""

    def __init__(self) -> None:
        self._usage: Body = {}
        self._reported = False  # a message_delta's usage seen
        self.stop_reason: str | None = None  # end_turn, max_tokens, tool_use, …

    @property
    def usage(self) -> Body | None:
        """The stream's usage (`input_tokens`, `output_tokens`, cache counts), None until
        a `message_delta` has reported the output (a stream cut before it is charged
        what the relay counted instead)."""
        return dict(self._usage) if self._reported else None

    def feed(self, data: bytes) -> bytes:
        if not self._pending and data.endswith(b"\n\n") and _USAGE not in data \
                and _GATEWAY_ERROR not in data:
            return data  # the common write: whole text deltas, passed as they are
        return super().feed(data)

    def _event(self, event: bytes) -> bytes:
        if event.startswith(_GATEWAY_ERROR):
            error = _payload(event[5:])
            detail = error.get("error") if error is not None else None
            detail = detail if isinstance(detail, dict) else {}
            status = 529 if detail.get("code") == "overloaded" else 500
            return sse("error", error_body(status, str(detail.get("message", ""))))
        if _USAGE in event:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._note(_payload(line[5:]))
        return event

    def _note(self, payload: Body | None) -> None:
        if payload is None:
            return
        if payload.get("type") == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
        else:  # message_delta: the output tokens so far (and, lately, the input's too)
            usage = payload.get("usage")
            self._reported = self._reported or isinstance(usage, dict)
            delta = payload.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
        if isinstance(usage, dict):
            self._usage.update((name, value) for name, value in usage.items()
                               if isinstance(value, int) and not isinstance(value, bool))


def _payload(data: bytes) -> Body | None:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None
