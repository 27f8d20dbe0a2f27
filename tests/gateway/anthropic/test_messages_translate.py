"""Anthropic Messages requests as chat completions, and chat responses as Messages (pure)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.messages_to_chat import (
    EventEncoder,
    chat_request,
    error_body,
    message,
)
from gateway.core.errors import BadRequest

TURN = {"role": "user", "content": "hi"}


def chat(**fields: Any) -> dict[str, Any]:
    return chat_request({"model": "m", "max_tokens": 8, "messages": [TURN], **fields})


@pytest.mark.parametrize("fields, expected", [
    ({}, {}),
    ({"system": "S"}, {"messages": [{"role": "system", "content": "S"}, TURN]}),
    ({"system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]},
     {"messages": [{"role": "system", "content": "S1S2"}, TURN]}),
    ({"temperature": 0.5, "top_p": 0.9, "top_k": 5}, {"temperature": 0.5, "top_p": 0.9}),
    ({"stop_sequences": ["X"]}, {"stop": ["X"]}),
    ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    ({"metadata": {"user_id": "u"}}, {"user": "u"}),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
     {"tools": [{"type": "function", "function": {"name": "f",
                                                  "parameters": {"type": "object"}}}],
      "tool_choice": "required", "parallel_tool_calls": False}),
    ({"tool_choice": {"type": "tool", "name": "f"}},
     {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
])
def test_request_fields(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert chat(**fields) == {"model": "m", "messages": [TURN], "max_tokens": 8, **expected}


@pytest.mark.parametrize("turn, messages", [
    ({"role": "user", "content": [{"type": "text", "text": "a"}]},
     [{"role": "user", "content": "a"}]),
    ({"role": "user", "content": [{"type": "text", "text": "a"},
                                  {"type": "image", "source": {"type": "base64",
                                                               "media_type": "image/png",
                                                               "data": "AA"}}]},
     [{"role": "user", "content": [{"type": "text", "text": "a"}, {
         "type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]),
    ({"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"},
                                       {"type": "text", "text": "ok"}]},
     [{"role": "assistant", "content": "ok"}]),
    ({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text",
                                                                 "text": "42"}]},
        {"type": "text", "text": "and?"}]},
     [{"role": "tool", "tool_call_id": "t1", "content": "42"},
      {"role": "user", "content": "and?"}]),
])
def test_content_blocks_become_chat_messages(turn: dict[str, Any],
                                             messages: list[Any]) -> None:
    assert chat_request({"model": "m", "max_tokens": 8, "messages": [turn]})["messages"] == \
        messages


@pytest.mark.parametrize("body, param", [
    ({"model": "m", "messages": [TURN]}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": [TURN]}, "max_tokens"),
    ({"model": "m", "max_tokens": 8, "messages": []}, "messages"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]},
     "messages.0.role"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document"}]}]}, "messages.0.content.0"),
    ({"model": "m", "max_tokens": 8, "messages": [TURN], "tool_choice": {"type": "?"}},
     "tool_choice"),
])
def test_invalid_requests_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        chat_request(body)
    assert caught.value.param == param and caught.value.message.startswith(param + ": ")


def test_counting_does_not_need_max_tokens() -> None:
    assert chat_request({"model": "m", "messages": [TURN]}, counting=True) == {
        "model": "m", "messages": [TURN]}


@pytest.mark.parametrize("finish, stop", [
    ("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"),
    ("content_filter", "refusal"),
])
def test_a_chat_completion_becomes_a_message(finish: str, stop: str) -> None:
    completion = {"id": "chatcmpl-1", "model": "gpt", "choices": [
        {"message": {"role": "assistant", "content": "Hi"}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}}
    assert message(completion) == {
        "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt",
        "content": [{"type": "text", "text": "Hi"}], "stop_reason": stop,
        "stop_sequence": None, "usage": {"input_tokens": 4, "output_tokens": 2}}


def test_tool_calls_become_tool_use_blocks() -> None:
    completion = {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": '{"a":1}'}}]},
        "finish_reason": "tool_calls"}]}
    assert message(completion)["content"] == [
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]


@pytest.mark.parametrize("status, kind", [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
    (500, "api_error"), (502, "api_error"), (503, "api_error"), (504, "timeout_error"),
    (529, "overloaded_error"), (422, "invalid_request_error"),
])
def test_error_types_follow_the_status(status: int, kind: str) -> None:
    assert error_body(status, "why", "r1") == {"type": "error", "request_id": "r1",
                                               "error": {"type": kind, "message": "why"}}


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "model": "gpt", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}], **extra}) + b"\n\n"


def _events(data: bytes) -> list[tuple[str, Any]]:
    out = []
    for event in data.split(b"\n\n"):
        lines = event.split(b"\n")
        if lines[0].startswith(b"event: "):
            out.append((lines[0][7:].decode(), orjson.loads(lines[1][6:])))
        elif event:
            out.append(("comment", event.decode()))
    return out


def test_a_chat_stream_becomes_the_messages_event_sequence() -> None:
    encoder = EventEncoder()
    usage = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}'
    out = (encoder.feed(_chunk({"role": "assistant", "content": ""}) + _chunk({"content": "A"}))
           + encoder.feed(_chunk({"content": "B"}) + _chunk({}, "length") + usage + b"\n\n")
           + encoder.feed(b": server-timing gw;dur=1\n\ndata: [DONE]\n\n"))
    events = _events(out)

    assert [kind for kind, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "comment", "message_delta", "message_stop"]
    assert events[0][1]["message"]["id"] == "c1" and events[0][1]["message"]["model"] == "gpt"
    assert [e[1]["delta"]["text"] for e in events if e[0] == "content_block_delta"] == ["A", "B"]
    assert events[6][1] == {"type": "message_delta",
                            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                            "usage": {"input_tokens": 4, "output_tokens": 2}}


def test_streamed_tool_calls_become_tool_use_blocks_after_the_text() -> None:
    encoder = EventEncoder()
    out = encoder.feed(
        _chunk({"content": "Let me look."})
        + _chunk({"tool_calls": [{"index": 0, "id": "c9", "function": {"name": "f",
                                                                      "arguments": ""}}]})
        + _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":1}'}}]})
        + _chunk({}, "tool_calls") + b"data: [DONE]\n\n")
    events = _events(out)

    starts = [e[1] for e in events if e[0] == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1]
    assert starts[1]["content_block"] == {"type": "tool_use", "id": "c9", "name": "f",
                                          "input": {}}
    assert [e[1]["delta"] for e in events if e[0] == "content_block_delta"][-1] == {
        "type": "input_json_delta", "partial_json": '{"a":1}'}
    assert [e[1]["index"] for e in events if e[0] == "content_block_stop"] == [0, 1]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_an_error_chunk_becomes_an_error_event() -> None:
    encoder = EventEncoder()
    encoder.feed(_chunk({"content": "A"}))
    out = encoder.feed(b'data: {"error":{"message":"gone","type":"server_error",'
                       b'"code":"upstream_error","param":null}}\n\n')
    assert _events(out) == [("error", {"type": "error", "error": {"type": "api_error",
                                                                  "message": "gone"}})]
