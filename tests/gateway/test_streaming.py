"""SSE relay behaviour seen from a raw HTTP client: no buffering, cancellation, failures."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from tests.conftest import RunningGateway, StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

STREAM_BODY = {"model": "chat", "stream": True,
               "messages": [{"role": "user", "content": "count"}]}


async def _events(response: aiohttp.ClientResponse) -> list[bytes]:
    body = await response.read()
    return [event for event in body.split(b"\n\n") if event]


async def test_client_receives_chunk_one_before_the_upstream_sends_chunk_two(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    openai_upstream.behaviour.pause_after_chunk = 1  # upstream waits for `resume`
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=STREAM_BODY) as response:
        seen = b""
        while b'"content":"Hello"' not in seen:
            seen += await asyncio.wait_for(response.content.readany(), 2)
        assert openai_upstream.chunks_sent == 1  # chunk 2 does not exist yet
        openai_upstream.resume.set()
        rest = await response.read()
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_client_disconnect_cancels_the_upstream_request_within_100ms(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    openai_upstream.behaviour.pause_after_chunk = 1  # the stream hangs after chunk 1
    session = aiohttp.ClientSession()
    response = await session.post(gateway.base_url + "/chat/completions", json=STREAM_BODY)
    await response.content.readany()

    gone = time.perf_counter()
    response.close()  # drop the connection mid-stream
    await session.close()
    await asyncio.wait_for(openai_upstream.cancelled_event.wait(), 2)

    assert openai_upstream.cancelled[0] - gone < 0.1


async def test_a_client_gone_mid_stream_leaves_no_attempt_counted_in_flight(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    openai_upstream.behaviour.pause_after_chunk = 1  # the stream hangs after chunk 1
    async with aiohttp.ClientSession() as session:
        response = await session.post(gateway.base_url + "/chat/completions", json=STREAM_BODY)
        await response.content.readany()
        response.close()  # drop the connection mid-stream
    await asyncio.wait_for(openai_upstream.cancelled_event.wait(), 2)
    in_flight = 'routegate_in_flight{backend="up"} 0.0'
    async with aiohttp.ClientSession() as session:
        for _ in range(100):  # the request's end runs just after the upstream's cancel
            async with session.get(gateway.url + "/metrics") as metrics:
                if in_flight in await metrics.text():
                    return
            await asyncio.sleep(0.02)
    raise AssertionError(f"{in_flight} never showed on /metrics")


async def test_client_disconnect_while_waiting_for_a_json_reply_cancels_the_upstream(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    openai_upstream.behaviour.first_byte_delay_s = 5
    body = {**STREAM_BODY, "stream": False}
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.post(gateway.base_url + "/chat/completions",
                                                   json=body))
        await asyncio.wait_for(openai_upstream.request_seen.wait(), 2)
        gone = time.perf_counter()
        request.cancel()
    await asyncio.wait_for(openai_upstream.cancelled_event.wait(), 2)
    assert openai_upstream.cancelled[0] - gone < 0.1


async def test_server_timing_comment_precedes_done(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=STREAM_BODY) as response:
        events = await _events(response)

    assert events[-1] == b"data: [DONE]"
    assert events[-2].startswith(b": server-timing gw;dur=")
    assert b"upstream;dur=" in events[-2] and b"total;dur=" in events[-2]
    assert "upstream-fb;dur=" in response.headers["Server-Timing"]


async def test_null_stream_options_streams_without_the_usage_chunk(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    body = {**STREAM_BODY, "stream_options": None}
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=body) as response:
        events = await _events(response)

    assert response.status == 200 and events[-1] == b"data: [DONE]"
    assert openai_upstream.received[-1].json["stream_options"] == {"include_usage": True}
    assert not any(b'"choices":[]' in event for event in events)


async def test_upstream_dropping_mid_stream_ends_with_an_error_event(
        gateway: RunningGateway, openai_upstream: FakeOpenAI) -> None:
    openai_upstream.behaviour.drop_after_chunks = 2
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=STREAM_BODY) as response:
        events = await _events(response)

    assert response.status == 200
    error = orjson.loads(events[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_error" and "'up'" in error["message"]
    assert b"data: [DONE]" not in events


async def test_upstream_failing_before_the_first_event_falls_back_to_the_next_candidate(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    broken = await start_upstream(Behaviour(drop_after_chunks=0), name="broken")
    healthy = await start_upstream(name="healthy")
    policy = single_backend_policy(broken.url)
    policy["backends"]["spare"] = {"type": "openai", "url": healthy.url, "models": {"m": {}}}
    policy["routes"]["chat"]["targets"].append("spare/m")
    gateway = await start_gateway(policy)

    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions", json=STREAM_BODY) as response:
        events = await _events(response)

    assert response.status == 200 and events[-1] == b"data: [DONE]"
    assert len(broken.received) == 1 and healthy.received[-1].json["model"] == "m"
