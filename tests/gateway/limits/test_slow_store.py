"""A Redis that answers, but slowly (behind a delaying proxy): out as configured, and
taken back once it is fast again."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator

import aiohttp
import openai
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.limits.failover import FailoverStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import BudgetLimits, Decision, Scope, StoreUnavailable
from gateway.limits.store_latency import LatencyBudget, LatencyWindow
from gateway.limits.store_metrics import StoreCollector
from gateway.stores.redis import connect
from tests.conftest import StartGateway, StartUpstream
from tests.delay_proxy import DelayProxy
from tests.gateway.limits.test_gateway_limits import ADMIN_KEY, MESSAGES, limited_policy
from tests.redis_server import RedisServer
from tests.waiting import until

SCOPES = (Scope("tenant", 10**6, None),)
# out once the p99 stayed over 50 ms through two clock seconds in a row: within 2 s
BUDGET = LatencyBudget(p99_s=0.05, window_s=2, call_timeout_s=1.0)


@pytest.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[DelayProxy]:
    proxy = DelayProxy(redis_server.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def behind(proxy: DelayProxy, on_error: str = "fail_open",
           budget: LatencyBudget = BUDGET) -> FailoverStore:
    client = connect(proxy.url, socket_timeout_s=budget.call_timeout_s / 2)
    return FailoverStore(RedisStore(client, op_timeout_s=budget.call_timeout_s),
                         on_error=on_error,  # type: ignore[arg-type]
                         probe_interval_s=0.05, latency=budget)


async def admit(store: FailoverStore, request_id: str) -> Decision:
    return await store.admit("acme", SCOPES, 1, BudgetLimits(), time.time(), request_id)


async def timed_admissions(store: FailoverStore, n: int) -> list[float]:
    """Seconds each of `n` admissions in a row took."""
    took = []
    for i in range(n):
        started = time.monotonic()
        with contextlib.suppress(StoreUnavailable):  # refused (fail_closed): answered too
            await admit(store, f"timed-{i}")
        took.append(time.monotonic() - started)
    return took


def metric(store: FailoverStore, name: str, **labels: str) -> float:
    for family in StoreCollector(store).collect():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no {name}{labels}")


@pytest.mark.parametrize("on_error", ["fail_open", "fail_closed"])
async def test_a_redis_slower_than_the_p99_budget_is_out_then_taken_back_when_fast(
        proxy: DelayProxy, on_error: str) -> None:
    store = behind(proxy, on_error)
    fast = await timed_admissions(store, 20)
    assert store.healthy and store.outages == 0

    proxy.delay_s = 0.04  # 80 ms a round trip: under the call timeout, over the budget
    slow = await timed_admissions(store, 60)
    assert not store.healthy and store.out_reason == "slow"
    # the calls of the (at most) two seconds that showed it slow waited for Redis, no more
    assert sum(took for took in slow if took >= 0.08) <= 2.3
    assert statistics.median(slow) < 0.04 + statistics.median(fast)
    status = store.status()
    assert status["out_reason"] == "slow"
    assert "over the budget of 50 ms for 2 s" in str(status["out_detail"])
    assert metric(store, "routegate_limit_store_out", reason="slow") == 1
    assert metric(store, "routegate_limit_store_out", reason="unreachable") == 0
    assert metric(store, "routegate_limit_store_slow_outages_total") == 1
    if on_error == "fail_open":
        decision = await admit(store, "while-slow")
        assert decision.reservation is not None and decision.reservation.store == "fallback"
    else:
        with pytest.raises(StoreUnavailable):
            await admit(store, "while-slow")

    await asyncio.sleep(0.5)  # ten probes: each answers, too slowly to take it back
    assert not store.healthy
    proxy.delay_s = 0.0
    await until(lambda: store.healthy)
    decision = await admit(store, "fast-again")
    assert decision.reservation is not None and decision.reservation.store == "redis"
    assert store.out_reason is None and store.outages == 1
    assert metric(store, "routegate_limit_store_out", reason="slow") == 0
    await store.aclose()


async def test_a_far_away_redis_is_waited_for_two_seconds_at_most_not_by_every_request(
        proxy: DelayProxy) -> None:
    """Redis 200 ms away each way: with no call over the timeout, every request used to
    wait for its round trips."""
    store = behind(proxy)
    await timed_admissions(store, 1)  # connected (a new connection takes round trips too)
    proxy.delay_s = 0.2
    took = await timed_admissions(store, 30)
    assert store.out_reason == "slow"
    assert sum(t >= 0.4 for t in took) <= 6  # at most two seconds of 400 ms round trips
    assert statistics.median(took) < 0.05
    await store.aclose()


async def test_a_call_past_the_call_timeout_puts_the_store_out_at_once(
        proxy: DelayProxy) -> None:
    proxy.delay_s = 0.2
    store = behind(proxy, budget=LatencyBudget(p99_s=0.05, window_s=2, call_timeout_s=0.25))
    started = time.monotonic()
    decision = await admit(store, "first")
    assert time.monotonic() - started < 0.4  # the timeout, not the 400 ms round trip
    assert decision.reservation is not None and decision.reservation.store == "fallback"
    assert store.out_reason == "slow" and "no answer in time" in store.out_detail
    await store.aclose()


async def test_a_redis_that_is_killed_is_out_as_unreachable_not_slow(
        proxy: DelayProxy, redis_server: RedisServer) -> None:
    store = behind(proxy)
    await admit(store, "before")
    redis_server.kill()
    await admit(store, "during")
    assert store.out_reason == "unreachable" and store.slow_outages == 0
    redis_server.start()
    await until(lambda: store.healthy)
    await store.aclose()


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.tuples(st.floats(0.0, 0.2), st.floats(0.0, 1.5)), max_size=200),
       budget_s=st.sampled_from([0.01, 0.05, 0.1]), seconds=st.integers(1, 4))
def test_the_window_is_out_exactly_when_the_p99_stayed_over_for_its_seconds_in_a_row(
        calls: list[tuple[float, float]], budget_s: float, seconds: int) -> None:
    """Generated calls (latency, gap before it) against a plain list of every call."""
    window = LatencyWindow(LatencyBudget(p99_s=budget_s, window_s=seconds, call_timeout_s=1.0))
    seen: list[tuple[int, float]] = []  # (second, latency)
    now = 1000.0
    for latency, gap in calls:
        now += gap
        seen.append((int(now), latency))

        def slow(second: int) -> bool:
            took = [t for at, t in seen if at == second]
            return sum(t > budget_s for t in took) > 0.01 * len(took)

        expected = latency > budget_s and all(slow(int(now) - back) for back in range(seconds))
        assert window.observe(latency, now) == expected
        calls_recent, over_recent, _ = window.recent(now)
        recent = [t for at, t in seen if at >= int(now) - 1]
        assert (calls_recent, over_recent) == (len(recent), sum(t > budget_s for t in recent))


async def timed_requests(client: openai.AsyncOpenAI, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.monotonic()
        await client.chat.completions.create(model="chat", messages=MESSAGES)
        took.append(time.monotonic() - started)
    return took


async def admin_get(base: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(
            base + path, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
        return response.status, await response.text()


async def test_the_gateway_stops_waiting_on_a_far_away_redis_and_says_it_is_out_for_slowness(
        start_upstream: StartUpstream, start_gateway: StartGateway,
        proxy: DelayProxy) -> None:
    upstream = await start_upstream()
    gateway = await start_gateway(limited_policy(upstream.url, store=proxy.url))
    client = gateway.openai(timeout=10.0)
    fast = await timed_requests(client, 10)
    proxy.delay_s = 0.2  # an admission and a settlement: 0.8 s a request if waited for
    slow = await timed_requests(client, 20)
    assert statistics.median(slow) < statistics.median(fast) + 0.1
    status, body = await admin_get(gateway.url, "/admin/limits")
    report = orjson.loads(body)
    assert status == 200 and report["up"] is False and report["out_reason"] == "slow"
    assert report["latency"]["p99_budget_ms"] == 50
    _, metrics = await admin_get(gateway.url, "/metrics")
    assert 'routegate_limit_store_out{reason="slow"} 1.0' in metrics
    assert "routegate_limit_store_slow_outages_total 1.0" in metrics

    proxy.delay_s = 0.0
    for _ in range(300):  # three probes in a row within the budget, a second apart
        if orjson.loads((await admin_get(gateway.url, "/admin/limits"))[1])["up"]:
            break
        await asyncio.sleep(0.05)
    report = orjson.loads((await admin_get(gateway.url, "/admin/limits"))[1])
    assert report["up"] is True and report["out_reason"] is None
    await client.close()
