"""A stream reaches the client whole, or ends with an OpenAI-style error event: never
a silent cut, never a shape the client did not ask for, never an event it cannot parse.

Each backend is a few lines of aiohttp handler writing exactly the bytes under test;
the client is the official `openai` SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import openai
import orjson
import pytest
from aiohttp import web

from tests.conftest import StartGateway, StartScripted, StartUpstream, single_backend_policy
from tests.gateway.test_fallback import two_backend_policy

MESSAGES = [{"role": "user", "content": "hi"}]


def chunk(content: str, finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content},
                         "finish_reason": finish}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def streaming(*parts: bytes, content_type: str = "text/event-stream",
              ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A backend handler that writes `parts` (one write each) and ends its body cleanly."""
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        for part in parts:
            await response.write(part)
        await response.write_eof()
        return response
    return handler


async def consume(client: openai.AsyncOpenAI, model: str = "chat") -> list[str]:
    """The content of every chunk; raises what the SDK raises."""
    stream = await client.chat.completions.create(model=model, messages=MESSAGES,  # type: ignore[call-overload]
                                                  stream=True)
    return [c.choices[0].delta.content or "" async for c in stream if c.choices]


async def test_a_stream_that_ends_cleanly_before_it_finishes_ends_with_an_error_event(
        scripted_upstream: StartScripted, start_gateway: StartGateway,
        caplog: pytest.LogCaptureFixture) -> None:
    url = await scripted_upstream(streaming(chunk("a"), chunk("b"), chunk("c")))
    gateway = await start_gateway(single_backend_policy(url))
    seen: list[str] = []

    with caplog.at_level(logging.INFO, logger="routegate.access"):
        stream = await gateway.openai().chat.completions.create(
            model="chat", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match="before it was complete"):
            async for c in stream:
                seen.append(c.choices[0].delta.content or "")

    assert seen == ["a", "b", "c"]
    access = [orjson.loads(r.getMessage()) for r in caplog.records
              if r.name == "routegate.access"]
    assert access[-1]["error_code"] == "upstream_error"


async def test_a_stream_with_a_finish_reason_but_no_done_is_whole(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    url = await scripted_upstream(streaming(chunk("a"), chunk("", finish="stop")))
    gateway = await start_gateway(single_backend_policy(url))
    assert await consume(gateway.openai()) == ["a", ""]


async def test_json_for_a_stream_request_falls_back_to_a_backend_that_streams(
        scripted_upstream: StartScripted, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    reply = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": "x"}}]})
    json_only = await scripted_upstream(streaming(reply, content_type="application/json"))
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(json_only, spare.url))

    assert "".join(await consume(gateway.openai())).startswith("Hello from the fake")
    assert len(spare.received) == 1


async def test_json_for_a_stream_request_is_never_relayed_as_json(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    reply = b'{"id":"x","object":"chat.completion","choices":[]}'
    url = await scripted_upstream(streaming(reply, content_type="application/json"))
    gateway = await start_gateway(single_backend_policy(url))

    with pytest.raises(openai.APIStatusError, match="not an event stream") as raised:
        await consume(gateway.openai())
    assert raised.value.status_code == 502


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: \xff\xfe\x00binary\n\n",
                                 b"\x00\x01\x02 raw binary\n\n", b"data: [1, 2]\n\n"])
async def test_a_malformed_event_mid_stream_ends_the_stream_with_an_error_event(
        scripted_upstream: StartScripted, start_gateway: StartGateway, bad: bytes) -> None:
    url = await scripted_upstream(streaming(
        chunk("a"), chunk("b"), bad, chunk("c", finish="stop"), b"data: [DONE]\n\n"))
    gateway = await start_gateway(single_backend_policy(url))
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    seen: list[str] = []

    with pytest.raises(openai.APIError, match="malformed stream event"):
        async for c in stream:
            seen.append(c.choices[0].delta.content or "")
    assert seen == ["a", "b"]


async def test_a_malformed_first_event_falls_back_to_the_next_candidate(
        scripted_upstream: StartScripted, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    garbled = await scripted_upstream(streaming(b"data: {not json\n\n", chunk("x")))
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(garbled, spare.url))

    assert "".join(await consume(gateway.openai())).startswith("Hello from the fake")


async def test_an_event_over_max_event_bytes_ends_the_stream_naming_the_cap(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    huge = chunk("x" * 5000)
    url = await scripted_upstream(streaming(chunk("a"), huge[:3000], huge[3000:],
                                            chunk("", finish="stop")))
    gateway = await start_gateway(single_backend_policy(
        url, server={"max_event_bytes": 4096}))
    stream = await gateway.openai().chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    seen: list[str] = []

    with pytest.raises(openai.APIError, match="max_event_bytes"):
        async for c in stream:
            seen.append(c.choices[0].delta.content or "")
    assert seen == ["a"]


async def test_a_reply_over_max_upstream_body_bytes_is_502_naming_the_cap(
        scripted_upstream: StartScripted, start_gateway: StartGateway) -> None:
    async def big(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)  # chunked: no length to refuse it by up front
        await response.write(b'{"id":"x","padding":"' + b"x" * 300_000)
        await response.write(b'"}')
        await response.write_eof()
        return response

    gateway = await start_gateway(single_backend_policy(
        await scripted_upstream(big), server={"max_upstream_body_bytes": 100_000}))

    with pytest.raises(openai.APIStatusError, match="max_upstream_body_bytes") as raised:
        await gateway.openai().chat.completions.create(model="chat", messages=MESSAGES)  # type: ignore[arg-type]
    assert raised.value.status_code == 502
