"""Retries, outlier ejection and metrics act on the failure's kind, through the real
gateway: what a backend did decides whether the same target is tried again, whether
the target is ejected, and the `reason` it is counted under."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import RunningGateway, StartGateway, StartScripted, StartUpstream
from tests.fakes.openai_upstream import Behaviour
from tests.fakes.raw_backend import CLOSE, Piece, RawBackend, answer
from tests.gateway.test_outlier_ejection import get, statuses
from tests.gateway.test_outlier_ejection import policy as ejection_policy

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
COMPLETION = orjson.dumps({
    "id": "c", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "from the raw backend"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}})


def retrying(*urls: str) -> dict[str, Any]:
    policy = ejection_policy(*urls)
    policy["resilience"]["retries"] = {"max_per_target": 1, "backoff_base_ms": 10}
    return policy


async def failures_counted(gateway: RunningGateway) -> dict[str, float]:
    """`routegate_upstream_failures_total` of backend a, by reason."""
    text = await get(gateway, "/metrics")
    prefix = 'routegate_upstream_failures_total{backend="a",reason="'
    return {line[len(prefix):].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


async def test_a_connection_dropped_before_the_answer_is_retried_on_the_same_target(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    answers: list[list[Piece]] = [[CLOSE], [answer(COMPLETION)]]
    flaky = RawBackend(lambda body: answers.pop(0))
    spare = await start_upstream()
    try:
        gateway = await start_gateway(retrying(await flaky.start(), spare.url))

        assert await statuses(gateway, 1) == [200]

        assert flaky.requests == 2 and not spare.received  # the retry answered
        assert await failures_counted(gateway) == {"upstream_closed": 1.0}
    finally:
        await flaky.stop()


async def test_a_malformed_answer_is_not_retried_but_falls_back(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    broken = RawBackend(lambda body: [answer(b"<html>gateway error</html>")])
    spare = await start_upstream()
    try:
        gateway = await start_gateway(retrying(await broken.start(), spare.url))

        assert await statuses(gateway, 1) == [200]

        assert broken.requests == 1 and len(spare.received) == 1
        assert await failures_counted(gateway) == {"malformed_response": 1.0}
    finally:
        await broken.stop()


async def test_a_refused_gateway_key_falls_back_without_ejecting_the_target(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    refusing = await start_upstream(Behaviour(status=401), name="refusing")
    spare = await start_upstream(name="spare")
    gateway = await start_gateway(ejection_policy(refusing.url, spare.url))

    assert await statuses(gateway, 4) == [200] * 4

    assert (await get(gateway, "/readyz"))["ejected"] == []  # not the backend's fault
    assert await failures_counted(gateway) == {
        "credentials_refused": float(len(refusing.received))}


async def test_server_errors_eject_the_target_and_are_counted_as_such(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    failing = await start_upstream(Behaviour(status=500), name="failing")
    spare = await start_upstream(name="spare")
    gateway = await start_gateway(ejection_policy(failing.url, spare.url))

    assert await statuses(gateway, 4) == [200] * 4

    assert len(failing.received) == 2  # ejected after two in a row
    assert (await get(gateway, "/readyz"))["ejected"] == ["a/m"]
    assert await failures_counted(gateway) == {"server_error": 2.0}


async def test_a_backend_that_cannot_serve_the_request_is_no_fault_and_falls_back(
        scripted_upstream: StartScripted, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    async def too_long(request: web.Request) -> web.Response:
        return web.json_response({"error": {
            "message": "This model's maximum context length is 8 tokens.",
            "type": "invalid_request_error", "code": "context_length_exceeded",
            "param": "messages"}}, status=400)

    small = await scripted_upstream(too_long)
    spare = await start_upstream(name="spare")
    gateway = await start_gateway(ejection_policy(small, spare.url))

    assert await statuses(gateway, 3) == [200] * 3

    assert (await get(gateway, "/readyz"))["ejected"] == []
    assert (await failures_counted(gateway)).get("client_error", 0.0) >= 1.0


async def test_a_rate_limit_is_an_answer_not_a_fault(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    limited = await start_upstream(Behaviour(status=429), name="limited")
    spare = await start_upstream(name="spare")
    gateway = await start_gateway(ejection_policy(limited.url, spare.url))

    assert await statuses(gateway, 3) == [200] * 3

    assert (await get(gateway, "/readyz"))["ejected"] == []
    assert await failures_counted(gateway) == {"rate_limited": float(len(limited.received))}


async def test_a_backend_that_drops_its_streams_midway_is_ejected(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    dropping = await start_upstream(Behaviour(drop_after_chunks=2), name="dropping")
    spare = await start_upstream(name="spare")
    gateway = await start_gateway(ejection_policy(dropping.url, spare.url))

    ends = [await streamed_end(gateway) for _ in range(4)]

    # the first two broke after bytes had reached the client: no fallback, an error
    # event; then the target was out and the spare answered whole
    assert [b'"error"' in end for end in ends] == [True, True, False, False]
    assert len(dropping.received) == 2 and len(spare.received) == 2
    assert (await get(gateway, "/readyz"))["ejected"] == ["a/m"]
    assert await failures_counted(gateway) == {"upstream_closed": 2.0}


async def streamed_end(gateway: RunningGateway) -> bytes:
    """The last event of one streamed chat request (what came before `[DONE]`)."""
    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/chat/completions", json={**BODY, "stream": True}) as response:
        assert response.status == 200
        events = (await response.read()).split(b"\n\n")
    return next(event for event in reversed(events)
                if event.startswith(b"data:") and event != b"data: [DONE]")


@pytest.mark.parametrize(("pieces", "reason"), [
    ([b"HTTP/1.1 301 Moved\r\nLocation: https://elsewhere/v1\r\nContent-Length: 0\r\n\r\n"],
     "redirected"),
    ([answer(b'{"pad": "' + b"x" * 4096 + b'"}')], "response_too_large"),
])
async def test_what_is_no_fault_of_the_backend_falls_back_without_ejecting_it(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        pieces: list[Piece], reason: str) -> None:
    odd = RawBackend(lambda body: pieces)
    spare = await start_upstream(name="spare")
    try:
        policy = ejection_policy(await odd.start(), spare.url)
        policy["server"] = {"max_upstream_body_bytes": 2048}
        gateway = await start_gateway(policy)

        assert await statuses(gateway, 3) == [200] * 3

        assert (await get(gateway, "/readyz"))["ejected"] == []
        assert await failures_counted(gateway) == {reason: float(odd.requests)}
    finally:
        await odd.stop()
