"""OpenAI chat completions → Anthropic Messages and back, for Anthropic backends (pure)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.errors import BadRequest
from gateway.upstream.chat_to_anthropic import (
    DEFAULT_MAX_TOKENS,
    ChunkTranslator,
    StreamError,
    chat_completion,
    messages_request,
    openai_error,
)

USER = {"role": "user", "content": "hi"}


def request(**fields: Any) -> dict[str, Any]:
    return messages_request({"model": "claude", "messages": [USER], **fields})


@pytest.mark.parametrize("fields, expected", [
    ({}, {"max_tokens": DEFAULT_MAX_TOKENS}),
    ({"max_tokens": 10}, {"max_tokens": 10}),
    ({"max_tokens": 10, "max_completion_tokens": 20}, {"max_tokens": 20}),
    ({"temperature": 0.3, "top_p": 0.9}, {"temperature": 0.3, "top_p": 0.9}),
    ({"temperature": 1.7}, {"temperature": 1.0}),  # Anthropic's range ends at 1
    ({"stop": "END"}, {"stop_sequences": ["END"]}),
    ({"stop": ["a", "b"]}, {"stop_sequences": ["a", "b"]}),
    ({"stream": True, "stream_options": {"include_usage": True}}, {"stream": True}),
    ({"user": "u-1"}, {"metadata": {"user_id": "u-1"}}),
    ({"seed": 3, "presence_penalty": 1.0, "logprobs": True}, {}),  # no counterpart
    ({"tool_choice": "required"}, {"tool_choice": {"type": "any"}}),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}},
     {"tool_choice": {"type": "tool", "name": "f"}}),
])
def test_request_fields(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    out = request(**fields)
    base = {"model": "claude", "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert out == {**base, **expected}


@pytest.mark.parametrize("messages, system, turns", [
    ([{"role": "system", "content": "A"}, {"role": "developer", "content": "B"}, USER],
     "A\n\nB", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
    ([{"role": "user", "content": [{"type": "text", "text": "x"},
                                   {"type": "image_url", "image_url": {
                                       "url": "data:image/png;base64,AAAA"}}]}],
     None, [{"role": "user", "content": [
         {"type": "text", "text": "x"},
         {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                      "data": "AAAA"}}]}]),
    ([USER, USER], None,  # consecutive turns of one role are merged
     [{"role": "user", "content": [{"type": "text", "text": "hi"}] * 2}]),
    ([USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}], None,
     [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f",
                                         "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                    "content": "42"}]}]),
])
def test_messages_become_system_and_alternating_turns(
        messages: list[Any], system: str | None, turns: list[Any]) -> None:
    out = messages_request({"model": "m", "messages": messages})
    assert out.get("system") == system
    assert out["messages"] == turns


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages"),
    ({"tools": [{"type": "custom", "custom": {}}]}, "tools"),
])
def test_requests_without_a_counterpart_are_refused(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        request(**fields)
    assert caught.value.param == param


@pytest.mark.parametrize("stop_reason, finish", [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
    ("tool_use", "tool_calls"), ("refusal", "content_filter"), ("something_new", "stop"),
])
def test_stop_reasons_map_to_finish_reasons(stop_reason: str, finish: str) -> None:
    message = {"id": "msg_1", "type": "message", "model": "claude", "stop_reason": stop_reason,
               "content": [{"type": "text", "text": "ok"}],
               "usage": {"input_tokens": 3, "output_tokens": 2}}
    assert chat_completion(message, 0)["choices"][0]["finish_reason"] == finish


def test_a_message_becomes_a_chat_completion() -> None:
    message = {"id": "msg_1", "type": "message", "model": "claude", "stop_reason": "end_turn",
               "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
               "usage": {"input_tokens": 3, "output_tokens": 2,
                         "cache_read_input_tokens": 10, "cache_creation_input_tokens": 1}}
    assert chat_completion(message, 1700000000) == {
        "id": "msg_1", "object": "chat.completion", "created": 1700000000, "model": "claude",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello",
                                             "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 14, "completion_tokens": 2, "total_tokens": 16,
                  "prompt_tokens_details": {"cached_tokens": 10}}}


@pytest.mark.parametrize("status, kind, openai_type, code", [
    (400, "invalid_request_error", "invalid_request_error", "invalid_request_error"),
    (401, "authentication_error", "authentication_error", "invalid_api_key"),
    (404, "not_found_error", "invalid_request_error", "not_found"),
    (429, "rate_limit_error", "rate_limit_error", "rate_limit_exceeded"),
    (529, "overloaded_error", "server_error", "overloaded"),
])
def test_errors_become_openai_errors(status: int, kind: str, openai_type: str,
                                     code: str) -> None:
    body = {"type": "error", "error": {"type": kind, "message": "why"}}
    assert openai_error(status, body) == {"error": {"message": "why", "type": openai_type,
                                                    "code": code, "param": None}}


def test_an_error_body_that_is_not_anthropics_names_the_status() -> None:
    assert openai_error(502, None)["error"]["message"] == "Anthropic backend returned HTTP 502."


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\n".encode() + b"data: " + orjson.dumps(e) + b"\n\n"
                    for e in events)


START = {"type": "message_start", "message": {"id": "msg_1", "model": "claude",
                                              "usage": {"input_tokens": 5, "output_tokens": 1}}}
TEXT = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}
END = [{"type": "content_block_stop", "index": 0},
       {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
        "usage": {"output_tokens": 7}},
       {"type": "message_stop"}]


def _chunks(data: bytes) -> list[Any]:
    return [orjson.loads(event[6:]) if event != b"data: [DONE]" else "[DONE]"
            for event in data.split(b"\n\n") if event]


def test_a_stream_becomes_chat_completion_chunks_with_usage() -> None:
    translator = ChunkTranslator(created=1, include_usage=True)
    chunks = _chunks(translator.feed(_sse(START, {"type": "ping"}, TEXT, *END)))

    assert [c["choices"][0]["delta"] if c != "[DONE]" and c["choices"] else c
            for c in chunks] == [{"role": "assistant", "content": "", "refusal": None},
                                 {"content": "Hi"}, {}, chunks[-2], "[DONE]"]
    assert chunks[2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["usage"] == {"prompt_tokens": 5, "completion_tokens": 7,
                                   "total_tokens": 12}
    assert all(c["id"] == "msg_1" and c["model"] == "claude" for c in chunks[:-1])


def test_a_stream_without_include_usage_has_no_usage_chunk() -> None:
    translator = ChunkTranslator(created=1, include_usage=False)
    out = translator.feed(_sse(START, TEXT, *END))
    assert b'"usage"' not in out and out.endswith(b"data: [DONE]\n\n")


def test_events_split_across_reads_are_translated_once_complete() -> None:
    translator = ChunkTranslator(created=1, include_usage=False)
    data = _sse(START, TEXT)
    cut = len(data) - 10
    first, second = translator.feed(data[:cut]), translator.feed(data[cut:])
    assert first.count(b"data: ") == 1 and b'"content":"Hi"' in second


def test_crlf_framed_events_are_understood() -> None:
    translator = ChunkTranslator(created=1, include_usage=False)
    out = translator.feed(_sse(START, TEXT).replace(b"\n", b"\r\n"))
    assert out.count(b"data: ") == 2


def test_crlf_framed_events_split_anywhere_between_reads_are_understood() -> None:
    stream = _sse(START, TEXT, *END).replace(b"\n", b"\r\n")
    for cut in range(1, len(stream)):
        translator = ChunkTranslator(created=1, include_usage=False)
        out = translator.feed(stream[:cut]) + translator.feed(stream[cut:])
        assert out.count(b"data: ") == 4 and out.endswith(b"data: [DONE]\n\n"), cut


def test_an_error_event_mid_stream_becomes_an_openai_error_chunk() -> None:
    translator = ChunkTranslator(created=1, include_usage=False)
    translator.feed(_sse(START))
    out = translator.feed(_sse({"type": "error", "error": {"type": "overloaded_error",
                                                           "message": "Overloaded"}}))
    assert _chunks(out) == [{"error": {"message": "Overloaded", "type": "server_error",
                                       "code": "overloaded", "param": None}}]


def test_an_error_before_any_output_fails_the_attempt() -> None:
    translator = ChunkTranslator(created=1, include_usage=False)
    with pytest.raises(StreamError, match="Overloaded"):
        translator.feed(_sse({"type": "error", "error": {"type": "overloaded_error",
                                                         "message": "Overloaded"}}))


def test_tool_use_blocks_become_tool_call_deltas() -> None:
    translator = ChunkTranslator(created=1, include_usage=False)
    out = translator.feed(_sse(
        START,
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '{"a":'}}))
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in _chunks(out)[1:]]
    assert calls == [{"index": 0, "id": "toolu_1", "type": "function",
                      "function": {"name": "f", "arguments": ""}},
                     {"index": 0, "function": {"arguments": '{"a":'}}]


def test_an_undecodable_event_is_a_stream_error() -> None:
    with pytest.raises(StreamError):
        ChunkTranslator(created=1, include_usage=False).feed(b"data: {nope\n\n")
