"""Responses API requests as chat requests, and chat answers as Responses objects."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.responses_output import EventEncoder, Shell, response_of
from gateway.api.responses_request import chat_request, untranslatable
from gateway.core.errors import BadRequest


def test_items_roles_and_formats_become_their_chat_counterparts() -> None:
    body: Any = {
        "model": "chat", "instructions": "Be brief.", "max_output_tokens": 50, "top_p": 0.5,
        "input": [
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Look: "},
                         {"type": "input_image", "image_url": "https://x/cat.png"}]},
        ],
        "text": {"format": {"type": "json_schema", "name": "answer", "strict": True,
                            "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
        "tool_choice": {"type": "function", "name": "lookup"},
    }

    chat = chat_request(body, history=[])

    assert chat["messages"][:2] == [{"role": "system", "content": "Be brief."},
                                    {"role": "system", "content": "Answer in French."}]
    assert chat["messages"][2]["content"][1] == {"type": "image_url",
                                                 "image_url": {"url": "https://x/cat.png"}}
    assert (chat["max_tokens"], chat["top_p"], chat["reasoning_effort"]) == (50, 0.5, "low")
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "answer", "strict": True, "schema": {"type": "object"}}}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "file_search_call"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "input[0].content[0].type"),
    ({"input": 7}, "input"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "grammar"}}}, "text.format"),
])
def test_what_chat_cannot_say_is_a_400_naming_the_field(body: dict[str, Any],
                                                        param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        chat_request({"model": "chat", **body}, history=[])
    assert refused.value.param == param


def test_fields_only_a_native_backend_takes_are_listed_by_name() -> None:
    body = {"model": "chat", "input": "hi", "include": ["reasoning.encrypted_content"],
            "background": True, "tools": [{"type": "function", "name": "f"},
                                          {"type": "web_search"}],
            "truncation": "auto", "store": False, "metadata": {"a": "b"}}

    assert untranslatable(body) == ["include", "background", "tools[1].type", "truncation"]


def test_a_chat_answer_with_a_tool_call_becomes_a_function_call_item() -> None:
    completion = {"model": "m", "choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}

    response = response_of(Shell({"input": "hi"}, "resp_1", 0), completion)

    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["call_id"] == "call_1"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["total_tokens"] == 7


def test_a_stream_cut_by_an_error_ends_with_response_failed() -> None:
    encoder = EventEncoder(Shell({"input": "hi"}, "resp_1", 0))
    chunk = {"model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}
    error = {"error": {"message": "Backend 'up' failed mid-stream.", "code": "upstream_error"}}

    out = encoder.feed(b"data: " + orjson.dumps(chunk) + b"\n\ndata: "
                       + orjson.dumps(error) + b"\n\n")

    events = [orjson.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "upstream_error"
    assert encoder.final is None  # nothing is stored for a failed response
