"""Trying the next candidate when a backend fails before any byte reached the client."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.api.openai import PIPELINE
from tests.conftest import StartGateway, StartScripted, StartUpstream
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.test_streaming import STREAM_BODY

BODY = {**STREAM_BODY, "stream": False}


def two_backend_policy(first: str, second: str, **backend_extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "backends": {
            "a": {"type": "openai", "url": first, "models": {"m": {}}, **backend_extra},
            "b": {"type": "openai", "url": second, "models": {"m": {}}, **backend_extra}},
        "routes": {"chat": {"targets": ["a/m", "b/m"]}},
        "auth": {"anonymous": {"enabled": True}},
    }


async def _post(url: str, body: dict[str, Any] = BODY) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body) as response:
        return response.status, await response.json()


# 401/403: the backend refused the gateway's own key, which says nothing about the client
@pytest.mark.parametrize("status", [500, 503, 429, 401, 403])
async def test_a_failing_primary_falls_back_to_the_next_candidate(
        start_upstream: StartUpstream, start_gateway: StartGateway, status: int) -> None:
    primary = await start_upstream(Behaviour(status=status))
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(primary.url, spare.url))

    code, body = await _post(gateway.url)

    assert code == 200 and body["choices"][0]["message"]["content"]
    assert len(primary.received) == 1 and len(spare.received) == 1


async def test_an_unreachable_primary_falls_back(start_upstream: StartUpstream,
                                                 start_gateway: StartGateway) -> None:
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy("http://127.0.0.1:9", spare.url))
    code, _ = await _post(gateway.url)
    assert code == 200 and len(spare.received) == 1


async def test_all_candidates_failing_is_502_naming_each_backend(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first = await start_upstream(Behaviour(status=500), name="first")
    second = await start_upstream(Behaviour(status=502), name="second")
    gateway = await start_gateway(two_backend_policy(first.url, second.url))

    code, body = await _post(gateway.url)

    assert code == 502
    message = body["error"]["message"]
    assert "'a'" in message and "'b'" in message and "second fails with 502" in message


async def test_first_byte_timeout_is_504_naming_the_backend(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    slow = await start_upstream(Behaviour(first_byte_delay_s=2))
    policy = two_backend_policy(slow.url, slow.url, timeouts={"first_byte_s": 0.1})
    policy["routes"]["chat"]["targets"] = ["a/m"]
    gateway = await start_gateway(policy)

    code, body = await _post(gateway.url)

    assert code == 504 and "'a'" in body["error"]["message"]


async def test_a_client_error_from_the_backend_is_relayed_without_fallback(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    picky = await start_upstream(Behaviour(status=400))
    spare = await start_upstream()
    gateway = await start_gateway(two_backend_policy(picky.url, spare.url))

    code, body = await _post(gateway.url)

    assert code == 400 and body["error"]["message"] == "fake fails with 400"
    assert not spare.received


async def test_attempts_are_bounded_by_max_attempts(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    fakes: list[FakeOpenAI] = [await start_upstream(Behaviour(status=500)) for _ in range(4)]
    policy: dict[str, Any] = {
        "version": 1,
        "backends": {f"b{i}": {"type": "openai", "url": fake.url, "models": {"m": {}}}
                     for i, fake in enumerate(fakes)},
        "routes": {"chat": {"targets": [f"b{i}/m" for i in range(4)]}},
        "auth": {"anonymous": {"enabled": True}},
    }
    gateway = await start_gateway(policy)
    pipeline = gateway.app[PIPELINE]
    pipeline.hooks = dataclasses.replace(pipeline.hooks, max_attempts=2)

    code, _ = await _post(gateway.url)

    assert code == 502
    assert [len(fake.received) for fake in fakes] == [1, 1, 0, 0]


async def test_all_candidates_rate_limited_is_429_with_the_retry_after_one_of_them_gave(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    first = await start_upstream(Behaviour(status=429, retry_after="30"), name="first")
    second = await start_upstream(Behaviour(status=429), name="second")
    gateway = await start_gateway(two_backend_policy(first.url, second.url))

    async with aiohttp.ClientSession() as session, session.post(
            gateway.url + "/v1/chat/completions", json=BODY) as response:
        status, retry_after = response.status, response.headers.get("Retry-After")

    assert status == 429 and retry_after == "30"
    assert len(first.received) == 1 and len(second.received) == 1


async def test_a_backend_whose_connections_are_all_stuck_falls_back_under_pressure(
        scripted_upstream: StartScripted, start_upstream: StartUpstream,
        start_gateway: StartGateway) -> None:
    async def never_answers(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    stuck = await scripted_upstream(never_answers)
    spare = await start_upstream()
    policy = two_backend_policy(stuck, spare.url)
    policy["backends"]["a"].update(
        max_connections=2, timeouts={"first_byte_s": 1.0, "pool_wait_s": 0.2})
    policy["defaults"] = {"limits": {"requests_per_minute": 100_000,
                                     "tokens_per_minute": 100_000_000}}
    gateway = await start_gateway(policy)

    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            async with session.post(gateway.url + "/v1/chat/completions",
                                    json=BODY) as response:
                await response.read()
                return response.status

        # a turn at a stuck connection lasts `first_byte_s`: waiting turns would take
        # over a minute; the bounded wait falls back at once
        async with asyncio.timeout(8):
            statuses = await asyncio.gather(*(one() for _ in range(150)))

    assert Counter(statuses) == {200: 150}


async def test_backends_answering_429_stay_in_routing_and_the_client_learns_when_to_retry(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    # a 429 is an answer, not a failure: no backend is marked down for it
    first = await start_upstream(Behaviour(status=429, retry_after="30"))
    second = await start_upstream(Behaviour(status=429, retry_after="20"))
    gateway = await start_gateway(two_backend_policy(first.url, second.url))

    async with aiohttp.ClientSession() as session:
        statuses, retry_afters = [], []
        for _ in range(4):
            async with session.post(gateway.url + "/v1/chat/completions",
                                    json=BODY) as response:
                statuses.append(response.status)
                retry_afters.append(response.headers.get("Retry-After"))

    assert statuses == [429] * 4
    assert len(first.received) + len(second.received) >= 4
    assert all(value is not None and 1 <= int(value) <= 30 for value in retry_afters)
