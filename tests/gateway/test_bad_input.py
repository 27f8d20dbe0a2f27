"""Every malformed request gets a 4xx that says what is wrong, and the server stays up."""

from __future__ import annotations

import gzip

import aiohttp
import orjson
import pytest

from tests.conftest import RunningGateway, StartGateway, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI

OK_MESSAGES = [{"role": "user", "content": "hi"}]

# (path, raw body, expected status, expected param or None, a phrase of the message)
CASES: list[tuple[str, bytes, int, str | None, str]] = [
    ("chat/completions", b"", 400, None, "empty"),
    ("chat/completions", b"{not json", 400, None, "parse the JSON"),
    ("chat/completions", b"[1, 2]", 400, None, "JSON object"),
    ("chat/completions", b'"just a string"', 400, None, "JSON object"),
    ("chat/completions", b'{"messages": []}', 400, "model", "model"),
    ("chat/completions", b'{"model": 5, "messages": []}', 400, "model", "string"),
    ("chat/completions", b'{"model": "", "messages": []}', 400, "model", "empty"),
    ("chat/completions", b'{"model": "chat"}', 400, "messages", "messages"),
    ("chat/completions", b'{"model": "chat", "messages": "hi"}', 400, "messages", "array"),
    ("chat/completions", b'{"model": "chat", "messages": []}', 400, "messages", "at least"),
    ("chat/completions", b'{"model": "chat", "messages": [3]}', 400, "messages[0]", "object"),
    ("chat/completions", b'{"model": "chat", "messages": [{"content": "x"}]}', 400,
     "messages[0].role", "role"),
    ("chat/completions", b'{"model": "chat", "messages": [{"role": "robot", "content": "x"}]}',
     400, "messages[0].role", "robot"),
    ("chat/completions", b'{"model": "chat", "messages": [{"role": "user", "content": 7}]}',
     400, "messages[0].content", "string"),
    ("chat/completions", b'{"model": "chat", "messages": [{"role": "user"}]}', 400,
     "messages[0].content", "required"),
    ("chat/completions", b'{"model": "chat", "messages": [{"role": "user", "content": [1]}]}',
     400, "messages[0].content[0]", "type"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "stream": "yes"}', 400, "stream", "boolean"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "stream_options": {"include_usage": true}}', 400, "stream_options", "stream"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "max_tokens": "ten"}', 400, "max_tokens", "integer"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "max_tokens": 0}', 400, "max_tokens", "minimum"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "temperature": 3}', 400, "temperature", "outside"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "top_p": true}', 400, "top_p", "number"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "stop": ["a", "b", "c", "d", "e"]}', 400, "stop", "at most 4"),
    ("chat/completions", b'{"model": "chat", "messages": ' + orjson.dumps(OK_MESSAGES)
     + b', "n": 1.5}', 400, "n", "integer"),
    ("chat/completions", b'{"model": "gpt-5-imaginary", "messages": '
     + orjson.dumps(OK_MESSAGES) + b"}", 404, "model", "does not exist"),
    ("completions", b'{"model": "chat"}', 400, "prompt", "prompt"),
    ("completions", b'{"model": "chat", "prompt": {"a": 1}}', 400, "prompt", "string"),
    ("completions", b'{"model": "chat", "prompt": [[1, "x"]]}', 400, "prompt", "token"),
    ("embeddings", b'{"model": "chat"}', 400, "input", "input"),
    ("embeddings", b'{"model": "chat", "input": []}', 400, "input", "empty"),
    ("embeddings", b'{"model": "chat", "input": "x", "encoding_format": "hex"}', 400,
     "encoding_format", "base64"),
    ("embeddings", b'{"model": "chat", "input": "x", "stream": true}', 400, "stream",
     "streamed"),
]


@pytest.mark.parametrize(("path", "raw", "status", "param", "phrase"), CASES,
                         ids=[f"{i:02d}-{case[0]}" for i, case in enumerate(CASES)])
async def test_malformed_body_gets_a_useful_4xx(
        gateway: RunningGateway, openai_upstream: FakeOpenAI, path: str, raw: bytes,
        status: int, param: str | None, phrase: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway.base_url}/{path}", data=raw,
                                headers={"Content-Type": "application/json"}) as response:
            body = await response.json()
        async with session.get(gateway.url + "/healthz") as health:
            assert health.status == 200

    assert response.status == status
    error = body["error"]
    assert error["param"] == param
    assert phrase.lower() in error["message"].lower()
    assert set(error) == {"message", "type", "code", "param"}
    assert not openai_upstream.received  # nothing malformed reaches a backend


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 20


async def test_body_over_the_limit_by_content_length_is_413_without_reading_it(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url,
                                                        server={"max_body_bytes": 1000}))
    body = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "x" * 2000}]})
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=body) as response:
        error = (await response.json())["error"]
    assert response.status == 413 and "1000 bytes" in error["message"]


async def test_chunked_body_over_the_limit_is_413(openai_upstream: FakeOpenAI,
                                                  start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url,
                                                        server={"max_body_bytes": 1000}))

    async def chunks():  # no Content-Length: the limit applies while reading
        for _ in range(10):
            yield b"x" * 200

    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=chunks()) as response:
        assert response.status == 413


async def test_a_compressed_body_over_the_limit_once_inflated_is_413(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url,
                                                        server={"max_body_bytes": 100_000}))
    body = orjson.dumps({"model": "chat", "messages": [{"role": "user",
                                                        "content": " " * 1_000_000}]})
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=gzip.compress(body),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    ) as response:
        error = (await response.json())["error"]
    assert response.status == 413 and "100000 bytes" in error["message"]
    assert openai_upstream.received == []


async def test_a_body_that_does_not_inflate_is_400(gateway: RunningGateway) -> None:
    body = orjson.dumps({"model": "chat", "messages": OK_MESSAGES})
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", data=body,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    ) as response:
        error = (await response.json())["error"]
    assert response.status == 400 and error["type"] == "invalid_request_error"


async def test_unknown_path_and_wrong_method_are_openai_shaped(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(gateway.base_url + "/nothing-here") as missing:
            missing_body = await missing.json()
        async with session.get(gateway.base_url + "/chat/completions") as wrong:
            wrong_body = await wrong.json()
    assert missing.status == 404 and missing_body["error"]["type"] == "invalid_request_error"
    assert wrong.status == 405 and wrong_body["error"]["code"] == "method_not_allowed"
    assert wrong_body["error"]["message"] == (
        "GET is not allowed on this path; it takes POST.")
    assert wrong.headers["Allow"] == "POST"
    assert "Server-Timing" in missing.headers


async def test_an_unknown_path_under_v1_says_so_and_lists_what_is_served(
        gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/v1/assistants") as response:
        assert response.status == 404
        message = (await response.json())["error"]["message"]
    assert message.startswith("Unknown path /v1/assistants: this gateway does not serve it.")
    assert "/chat/completions" in message and "/models" in message
    assert "served under /v1" not in message
