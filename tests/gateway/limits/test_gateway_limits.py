"""Limits in the running gateway: headers, 429s, settlement of cut-short streams, usage."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re

import aiohttp
import openai
import pytest

from gateway.core.drain import DRAIN
from tests.conftest import StartGateway, StartUpstream, single_backend_policy
from tests.fakes.openai_upstream import Behaviour
from tests.redis_server import RedisServer

ADMIN_KEY = "admin-secret"
ADMIN_HASH = "sha256:" + hashlib.sha256(ADMIN_KEY.encode()).hexdigest()
LONG_REPLY = " ".join(f"w{n}" for n in range(50))
MESSAGES = [{"role": "user", "content": "hi"}]


def limited_policy(url: str, *, rpm: int = 100, tpm: int = 100_000,
                   store: str = "memory", **extra: object) -> dict:
    return single_backend_policy(
        url, defaults={"limits": {"requests_per_minute": rpm, "tokens_per_minute": tpm}},
        auth={"anonymous": {"enabled": True, "loopback_only": True},
              "admin_keys": [ADMIN_HASH]},
        limits={"store": store, "on_store_error": "fail_open"}, **extra)


async def usage(base: str, tenant: str = "anonymous") -> dict:
    async with aiohttp.ClientSession() as session, session.get(
            f"{base}/admin/usage", params={"tenant": tenant},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_every_response_carries_openais_rate_limit_headers(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(limited_policy(upstream.url, rpm=100, tpm=100_000))
    client = gateway.openai()
    raw = await client.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES, max_tokens=50)
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert raw.headers["x-ratelimit-remaining-requests"] == "99"
    assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 100_000 - 50
    # the request weighs until half-way through the next window; the header says at
    # most the window a per-minute limit promises
    assert raw.headers["x-ratelimit-reset-requests"] == "1m0s"
    async with client.chat.completions.with_streaming_response.create(
            model="chat", messages=MESSAGES, stream=True) as streamed:
        assert streamed.headers["x-ratelimit-remaining-requests"] == "98"
        async for _ in streamed.iter_lines():
            pass
    await client.close()


async def test_an_error_after_admission_carries_the_rate_limit_headers_too(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream(Behaviour(status=503))
    gateway = await start_gateway(limited_policy(upstream.url, rpm=100))
    client = gateway.openai()
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    await client.close()
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "99"


async def test_the_sdk_sees_a_rate_limit_error_naming_requests(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(limited_policy(upstream.url, rpm=2))
    client = gateway.openai()
    for _ in range(2):
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    await client.close()
    error = caught.value
    assert error.body["type"] == "requests" and error.body["code"] == "rate_limit_exceeded"
    assert int(error.response.headers["Retry-After"]) >= 59
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(upstream.received) == 2


async def test_a_stream_cancelled_after_10_tokens_is_charged_10_tokens(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream(Behaviour(reply=LONG_REPLY, pause_after_chunk=10))
    gateway = await start_gateway(limited_policy(upstream.url))
    body = {"model": "chat", "messages": MESSAGES, "stream": True, "max_tokens": 1000}
    async with aiohttp.ClientSession() as session:
        response = await session.post(gateway.base_url + "/chat/completions", json=body)
        seen = 0
        async for line in response.content:
            if b'"content":"' in line and b'"content":""' not in line:
                seen += 1
                if seen == 10:
                    break
        response.close()  # the client goes away mid-stream
    for _ in range(200):
        report = await usage(gateway.url)
        if report["day"]["requests"]:
            break
        await asyncio.sleep(0.01)
    upstream.resume.set()
    assert report["day"]["output_tokens"] == 10
    assert report["day"]["requests"] == 1
    async with aiohttp.ClientSession() as session, \
            session.get(gateway.url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as metrics:
        exposition = await metrics.text()
    # the backend never reported usage: /metrics counts what the ledger charged
    assert re.search(r'routegate_tokens_total\{[^}]*direction="output"[^}]*\} 10\.0',
                     exposition), exposition


async def test_usage_needs_an_admin_key(start_upstream: StartUpstream,
                                        start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(limited_policy(upstream.url))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gateway.url}/admin/usage?tenant=anonymous") as response:
            assert response.status == 401
        async with session.get(f"{gateway.url}/admin/usage?tenant=anonymous",
                               headers={"Authorization": "Bearer nope"}) as response:
            assert response.status == 403


async def test_usage_reports_what_the_backend_said_was_used(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream(Behaviour(reply="one two three"))
    policy = limited_policy(upstream.url)
    policy["backends"]["up"]["models"]["gpt-4o-mini"] = {
        "input_usd_per_mtok": 1000, "output_usd_per_mtok": 2000}
    gateway = await start_gateway(policy)
    client = gateway.openai()
    await client.chat.completions.create(model="chat", messages=MESSAGES)
    await client.close()
    day = (await usage(gateway.url))["day"]
    # the fake counts words: 1 input ("hi"), 3 output
    assert (day["requests"], day["input_tokens"], day["output_tokens"]) == (1, 1, 3)
    assert day["spend_micros"] == 1 * 1000 + 3 * 2000


async def test_a_spent_budget_is_refused_with_budget_exceeded(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    key = "acme-key"
    policy = limited_policy(upstream.url, tenants={"acme": {
        "api_keys": ["sha256:" + hashlib.sha256(key.encode()).hexdigest()],
        "budget": {"usd_per_day": 0.000001}}})
    policy["backends"]["up"]["models"]["gpt-4o-mini"] = {"input_usd_per_mtok": 1}
    gateway = await start_gateway(policy)
    client = gateway.openai(api_key=key)
    await client.chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    await client.close()
    assert caught.value.body["code"] == "budget_exceeded"
    assert "daily budget" in caught.value.body["message"]


async def test_a_dead_redis_neither_fails_nor_hangs_requests_and_is_used_again(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(limited_policy(upstream.url, store=redis_server.url))
    client = gateway.openai(timeout=5.0)
    await client.chat.completions.create(model="chat", messages=MESSAGES)
    await gateway.app[DRAIN].wait_idle()  # settled (after its last byte) into Redis
    redis_server.kill()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.gather(*(client.chat.completions.create(model="chat", messages=MESSAGES)
                           for _ in range(5)))
    assert loop.time() - started < 2.0
    redis_server.start()
    for _ in range(300):
        try:
            report = await usage(gateway.url)
            break
        except AssertionError:  # 503 until the store is back
            await asyncio.sleep(0.02)
    # the restarted Redis lost the first request (no persistence); the spend of the 5
    # admitted locally during the outage was replayed into it
    for _ in range(300):
        report = await usage(gateway.url)
        if report["day"]["requests"] == 5:
            break
        await asyncio.sleep(0.02)
    await client.close()
    assert report["day"]["requests"] == 5


async def test_fail_closed_answers_503_at_once_while_redis_is_down_then_recovers(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        redis_server: RedisServer) -> None:
    upstream = await start_upstream()
    policy = limited_policy(upstream.url, store=redis_server.url)
    policy["limits"]["on_store_error"] = "fail_closed"
    gateway = await start_gateway(policy)
    client = gateway.openai(timeout=5.0)
    redis_server.kill()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    assert loop.time() - started < 2.0
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "rate_limit_store_unavailable"
    assert len(upstream.received) == 0
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/metrics",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        metrics = await response.text()
    assert "routegate_limit_store_up 0.0" in metrics
    assert "routegate_limit_store_outages_total 1.0" in metrics
    assert "routegate_limit_store_unavailable_rejections_total 1.0" in metrics
    redis_server.start()
    for _ in range(300):
        try:
            await client.chat.completions.create(model="chat", messages=MESSAGES)
            break
        except openai.InternalServerError:
            await asyncio.sleep(0.02)
    await client.close()
    assert len(upstream.received) == 1


async def test_the_reservation_expects_the_output_of_the_route_that_serves_the_tenant(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    policy = limited_policy(upstream.url, tpm=100_000, tenants={"premium": {
        "api_keys": ["sha256:" + hashlib.sha256(b"k-premium").hexdigest()],
        "routes": {"chat": "chat-long"}}})
    policy["routes"]["chat-long"] = {"targets": ["up/gpt-4o-mini"],
                                     "expected_output_tokens": 5000}
    gateway = await start_gateway(policy)
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions",
            json={"model": "chat", "messages": MESSAGES, "stream": True},
            headers={"Authorization": "Bearer k-premium"}) as response:
        assert response.status == 200
        # reserved while it runs: the input plus chat-long's 5000 expected output tokens
        assert int(response.headers["x-ratelimit-remaining-tokens"]) <= 100_000 - 5000
        await response.read()


async def test_the_reservation_expects_the_output_of_every_choice(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(limited_policy(upstream.url, tpm=100_000))
    async with aiohttp.ClientSession() as session, session.post(
            gateway.base_url + "/chat/completions",
            json={"model": "chat", "messages": MESSAGES, "n": 3, "max_tokens": 1000}
    ) as response:
        assert response.status == 200
        # the headers leave with the reservation: the input plus 3 × 1000 output tokens
        assert int(response.headers["x-ratelimit-remaining-tokens"]) <= 100_000 - 3000


async def test_requests_refused_during_an_outage_are_not_logged_one_by_one(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    upstream = await start_upstream()
    policy = limited_policy(upstream.url, store=redis_server.url)
    policy["limits"]["on_store_error"] = "fail_closed"
    gateway = await start_gateway(policy)
    redis_server.kill()
    with caplog.at_level(logging.INFO):
        async with aiohttp.ClientSession() as session:
            for _ in range(20):
                async with session.post(gateway.base_url + "/chat/completions", json={
                        "model": "chat", "messages": MESSAGES}) as response:
                    assert response.status == 503
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()
