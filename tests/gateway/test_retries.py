"""Retrying the same target: on what, after how long, within the deadline and the budget."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour

BODY = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}


def policy(*urls: str, retries: dict[str, Any] | None = None,
           budget: dict[str, float] | None = None, **extra: Any) -> dict[str, Any]:
    names = "ab"[:len(urls)]
    route: dict[str, Any] = {"targets": [f"{name}/m" for name in names]}
    if budget:
        route["latency_budget"] = budget
    return {"version": 1,
            "backends": {name: {"type": "openai", "url": url, "models": {"m": {
                "input_usd_per_mtok": price, "output_usd_per_mtok": price}}}
                for price, (name, url) in enumerate(zip(names, urls, strict=True))},
            "routes": {"chat": route},
            "resilience": {"retries": {"max_per_target": 1, "backoff_base_ms": 20,
                                       **(retries or {})}},
            "auth": {"anonymous": {"enabled": True}}, **extra}


async def post(url: str) -> tuple[int, dict[str, str], float]:
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=BODY) as response:
        await response.read()
        return response.status, dict(response.headers), time.perf_counter() - started


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        return await response.text()


def counted(metrics: str, series: str) -> float:
    """The sum of a counter's samples over all its labels (0 when it has none)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(series))


async def test_a_503_is_retried_on_the_same_target(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    flaky = await start_upstream(Behaviour(status=503, fail_times=1))
    gateway = await start_gateway(policy(flaky.url))

    status, _, _ = await post(gateway.url)

    assert status == 200 and len(flaky.received) == 2


async def test_a_retry_is_counted_as_a_retry_not_as_a_fallback(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    flaky = await start_upstream(Behaviour(status=503, fail_times=1))
    gateway = await start_gateway(policy(flaky.url))

    status, _, _ = await post(gateway.url)

    metrics = await scrape(gateway.url)
    assert status == 200
    assert counted(metrics, "routegate_retries_total{") == 1
    assert counted(metrics, "routegate_fallbacks_total{") == 0


async def test_a_429_with_retry_after_is_retried_after_that_long(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    limited = await start_upstream(Behaviour(status=429, fail_times=1, retry_after="0.3"))
    spare = await start_upstream()
    gateway = await start_gateway(policy(limited.url, spare.url))

    status, _, took_s = await post(gateway.url)

    assert status == 200 and len(limited.received) == 2 and spare.received == []
    assert took_s >= 0.3


async def test_a_429_without_advice_moves_on_to_the_next_target(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    limited = await start_upstream(Behaviour(status=429, fail_times=1))
    spare = await start_upstream()
    gateway = await start_gateway(policy(limited.url, spare.url))

    status, _, _ = await post(gateway.url)

    assert status == 200 and len(limited.received) == 1 and len(spare.received) == 1


async def test_a_retry_after_past_the_deadline_is_not_waited_for(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    busy = await start_upstream(Behaviour(status=503, retry_after="1"))
    gateway = await start_gateway(policy(busy.url, budget={"ttft_ms": 600}))

    status, _, took_s = await post(gateway.url)

    assert status == 502 and len(busy.received) == 1 and took_s < 0.5


async def test_a_timeout_is_not_retried(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    slow = await start_upstream(Behaviour(first_byte_delay_s=1))
    gateway = await start_gateway(policy(slow.url, budget={"ttft_ms": 300}))

    status, _, _ = await post(gateway.url)

    assert status == 504 and len(slow.received) == 1


async def test_the_retry_budget_bounds_extra_attempts_on_a_failing_backend(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    down = await start_upstream(Behaviour(status=503))
    gateway = await start_gateway(policy(down.url, retries={
        "max_per_target": 3, "budget_percent": 20, "min_per_window": 2,
        "backoff_base_ms": 1}))

    statuses = [(await post(gateway.url))[0] for _ in range(20)]

    # 502 while it is tried, 503 once routing marks it down for its error rate
    assert set(statuses) <= {502, 503}
    retries = counted(await scrape(gateway.url), "routegate_retries_total{")
    assert 1 <= retries <= max(2, 20 * 0.2)  # the budget: 20 % of the requests, at least 2
    assert len(down.received) <= 20 + retries


async def test_a_retried_request_counts_once_against_the_rate_limit(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    flaky = await start_upstream(Behaviour(status=503, fail_times=1))
    gateway = await start_gateway(policy(flaky.url, defaults={
        "limits": {"requests_per_minute": 10, "tokens_per_minute": 100_000}}))

    _, retried, _ = await post(gateway.url)
    _, plain, _ = await post(gateway.url)

    assert len(flaky.received) == 3
    assert int(retried["x-ratelimit-remaining-requests"]) == 9
    assert int(plain["x-ratelimit-remaining-requests"]) == 8


async def test_retries_are_off_unless_the_policy_turns_them_on(
        start_upstream: StartUpstream, start_gateway: StartGateway) -> None:
    flaky = await start_upstream(Behaviour(status=503, fail_times=1))
    off = policy(flaky.url)
    del off["resilience"]
    gateway = await start_gateway(off)
    status, _, _ = await post(gateway.url)
    assert status == 502 and len(flaky.received) == 1


async def test_a_connection_reset_before_any_answer_is_retried(
        start_gateway: StartGateway) -> None:
    connections = 0
    reply = (b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":'
             b'[{"index":0,"message":{"role":"assistant","content":"ok"},'
             b'"finish_reason":"stop"}]}')

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        if connections == 1:  # the first request: the connection is dropped, unanswered
            writer.transport.abort()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(reply), reply))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gateway = await start_gateway(policy(f"http://127.0.0.1:{port}/v1"))
        status, _, _ = await post(gateway.url)
    finally:
        server.close()
    assert status == 200 and connections == 2
