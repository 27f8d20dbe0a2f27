"""What a client gets when a backend's reply is malformed or cut short.

Each backend here is a few lines of aiohttp handler writing exactly the bytes under test.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import StartGateway, StartScripted, single_backend_policy
from tests.gateway.limits.test_gateway_limits import limited_policy, usage

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = {"model": "chat", "messages": MESSAGES}
async def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.read()


def _data_lines(stream: bytes) -> list[bytes]:
    return [line[6:] for event in stream.split(b"\n\n") for line in event.split(b"\n")
            if line.startswith(b"data: ")]


async def test_a_last_event_without_its_blank_line_reaches_the_client_whole(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"b"},'
                             b'"finish_reason":"stop"}]}')
        await response.write_eof()
        return response

    gateway = await start_gateway(single_backend_policy(await scripted_upstream(handler)))
    status, stream = await _post(gateway.url, {**CHAT, "stream": True})

    assert status == 200
    chunks = [orjson.loads(data) for data in _data_lines(stream)]
    assert [chunk["choices"][0]["delta"]["content"] for chunk in chunks] == ["a", "b"]


async def test_a_stream_broken_mid_event_ends_with_the_error_and_no_half_event(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
                             b'data: {"choices":[{"index":0,"delta":{"con')
        assert request.transport is not None
        request.transport.close()  # no terminating chunk: the stream breaks
        return response

    gateway = await start_gateway(single_backend_policy(await scripted_upstream(handler)))
    status, stream = await _post(gateway.url, {**CHAT, "stream": True})

    assert status == 200
    events = [orjson.loads(data) for data in _data_lines(stream)]
    assert events[0]["choices"][0]["delta"]["content"] == "a"
    assert events[1]["error"]["code"] == "upstream_error" and len(events) == 2


async def test_a_success_status_without_json_is_502_naming_the_backend(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"<html>upstream proxy</html>", content_type="text/html")

    gateway = await start_gateway(single_backend_policy(await scripted_upstream(handler)))
    status, body = await _post(gateway.url, CHAT)

    assert status == 502
    error = orjson.loads(body)["error"]
    assert error["code"] == "upstream_error" and "'up'" in error["message"]


async def test_a_success_status_without_json_falls_back_to_the_next_candidate(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def broken(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b'{"id": "chatcmpl-1", "choi', content_type="application/json")

    async def healthy(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "chatcmpl-2", "object": "chat.completion",
                                  "choices": [], "usage": None})

    policy = single_backend_policy(await scripted_upstream(broken))
    policy["backends"]["spare"] = {"type": "openai", "url": await scripted_upstream(healthy),
                                   "models": {"m": {}}}
    policy["routes"]["chat"]["targets"].append("spare/m")
    gateway = await start_gateway(policy)
    status, body = await _post(gateway.url, CHAT)

    assert status == 200 and orjson.loads(body)["id"] == "chatcmpl-2"


async def test_a_json_body_that_stalls_past_the_timeout_is_504(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b'{"id": "chatcmpl-1", ')
        await asyncio.sleep(5)  # the rest never comes in time
        return response

    policy = single_backend_policy(await scripted_upstream(handler))
    policy["backends"]["up"]["timeouts"] = {"first_byte_s": 0.2}
    gateway = await start_gateway(policy)
    status, body = await _post(gateway.url, CHAT)

    assert status == 504
    assert orjson.loads(body)["error"]["code"] == "upstream_timeout"


async def test_a_redirecting_backend_is_502_naming_where_it_points(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=301, text="Moved",
                            headers={"Location": "https://api.example.com/v1/chat/completions"})

    gateway = await start_gateway(single_backend_policy(await scripted_upstream(handler)))
    status, body = await _post(gateway.url, CHAT)

    assert status == 502
    message = orjson.loads(body)["error"]["message"]
    assert "'up'" in message and "https://api.example.com/v1/chat/completions" in message


async def test_a_reply_without_usage_is_charged_what_was_reserved_for_it(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "four words right here"},
             "finish_reason": "stop"}]})  # no `usage`, as some servers answer

    gateway = await start_gateway(limited_policy(await scripted_upstream(handler)))
    status, _ = await _post(gateway.url, {**CHAT, "max_tokens": 50})
    day = (await usage(gateway.url))["day"]

    assert status == 200 and day["requests"] == 1
    assert day["input_tokens"] > 0 and day["output_tokens"] == 50


async def test_a_stream_the_connection_ends_mid_event_ends_with_an_error_event(
        start_gateway: StartGateway) -> None:
    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the body is never needed here
        # neither Content-Length nor chunking: the body ends when the connection does
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\n\r\n"
                     b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
                     b'data: {"choices":[{"index":0,"delta":{"con')
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(backend, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gateway = await start_gateway(single_backend_policy(f"http://127.0.0.1:{port}/v1"))
        status, stream = await _post(gateway.url, {**CHAT, "stream": True})
    finally:
        server.close()

    assert status == 200
    events = [orjson.loads(data) for data in _data_lines(stream)]
    assert events[0]["choices"][0]["delta"]["content"] == "a"
    assert events[1]["error"]["code"] == "upstream_error" and len(events) == 2


async def test_what_a_backend_answered_reaches_the_client_but_never_the_logs(
        scripted_upstream: StartScripted, start_gateway: StartGateway,
        caplog: pytest.LogCaptureFixture) -> None:
    secret = "the prompt text: my card is 4111"

    async def rejects(request: web.Request) -> web.Response:  # echoes the input back
        await request.read()
        return web.Response(status=422, text=f"invalid input {secret!r}")

    async def cut(request: web.Request) -> web.Response:  # a completion cut short
        await request.read()
        return web.Response(body=f'{{"choices": [{{"text": "{secret}'.encode(),
                            content_type="application/json")

    for handler, expected in ((rejects, 422), (cut, 502)):
        gateway = await start_gateway(single_backend_policy(await scripted_upstream(handler)))
        with caplog.at_level(logging.DEBUG):
            status, body = await _post(gateway.url, CHAT)
        assert status == expected
        assert (secret in orjson.loads(body)["error"]["message"]) == (expected == 422)
    assert caplog.records and not any(secret in record.getMessage()
                                      for record in caplog.records)
