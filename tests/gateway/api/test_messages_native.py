"""An Anthropic backend's event stream, passed through to a Messages client: bytes as
they came, usage and stop reason read on the way, the gateway's own error event in
Anthropic's shape."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.api.messages_native import NativeMessageEvents
from gateway.core.attempt_facts import Attempt
from tests.gateway.core.test_record_facts import attempt, begin, traced
from tests.gateway.telemetry.scripted_request import target


def event(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **data}) + b"\n\n"


START = event("message_start", message={
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [],
    "usage": {"input_tokens": 25, "cache_read_input_tokens": 100, "output_tokens": 1}})
DELTA = event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
END = (event("message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None},
             usage={"output_tokens": 15}) + event("message_stop"))


def test_events_pass_through_byte_for_byte_however_they_are_cut() -> None:
    events = NativeMessageEvents()
    stream = [START[:40], START[40:] + DELTA, DELTA, END[:30], END[30:]]

    assert b"".join(events.feed(part) for part in stream) == b"".join(stream)
    assert events.usage is not None and events.usage["input_tokens"] == 25


def test_usage_joins_message_start_and_message_delta() -> None:
    events = NativeMessageEvents()
    for part in (START, DELTA, END):
        events.feed(part)

    assert events.usage == {"input_tokens": 25, "cache_read_input_tokens": 100,
                            "output_tokens": 15}
    assert events.stop_reason == "max_tokens"


def test_a_stream_cut_before_message_delta_reports_no_usage() -> None:
    events = NativeMessageEvents()
    events.feed(START + DELTA)

    assert events.usage is None  # the relay's count of what was produced is charged


def test_the_gateways_own_error_event_is_sent_in_anthropics_shape() -> None:
    events = NativeMessageEvents()
    gateway_error = b'data: {"error":{"message":"Backend \'claude\' failed mid-stream.",' \
                    b'"type":"server_error","code":"upstream_error","param":null}}\n\n'

    out = events.feed(DELTA + gateway_error + b": server-timing gw;dur=1\n\n")

    error = out.split(b"\n\n")[1]
    assert error.startswith(b"event: error\ndata: ")
    assert orjson.loads(error.split(b"data: ", 1)[1]) == {"type": "error", "error": {
        "type": "api_error", "message": "Backend 'claude' failed mid-stream."}}
    assert out.startswith(DELTA) and out.endswith(b": server-timing gw;dur=1\n\n")


def test_a_messages_reply_gives_its_stop_reason_as_the_finish_reason() -> None:
    telemetry, _, _ = traced()
    record = begin(telemetry)
    facts: Attempt = attempt(telemetry, record, target("claude"))

    facts.reply({"type": "message", "stop_reason": "tool_use",
                 "usage": {"input_tokens": 3, "output_tokens": 2}})

    assert record.finish_reasons == ["tool_use"]
    assert (record.input_tokens, record.output_tokens) == (3, 2)
