"""Redis killed mid-run: behaviour as configured, nothing hangs, recovery without restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio
import redis.exceptions

from gateway.limits.failover import FailoverStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import BudgetLimits, Charge, Scope, StoreUnavailable
from gateway.stores.redis import connect
from tests.redis_server import RedisServer

T0 = 1_764_400_000.0
# A script holds Redis for its whole run (DEBUG SLEEP would too, but Redis 7 disables it).
BUSY_FOR_A_SECOND = """
local start = redis.call('TIME')
repeat
  local now = redis.call('TIME')
until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) >= 1000000
return 1
"""


async def until_busy(server: RedisServer, timeout_s: float = 5.0) -> None:
    """Return once Redis stops answering a PING within 50 ms (a script holds it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        probe = redis.asyncio.Redis.from_url(server.url, socket_timeout=0.05,
                                             socket_connect_timeout=0.05)
        try:
            await probe.ping()
        except redis.exceptions.TimeoutError:
            return
        finally:
            await probe.aclose()
        await asyncio.sleep(0.01)
    raise AssertionError("Redis never got busy")


def impatient(server: RedisServer) -> FailoverStore:
    """A failover store whose calls give up after 0.2 s: less than Redis stays busy."""
    return FailoverStore(RedisStore(connect(server.url, socket_timeout_s=1.0), op_timeout_s=0.2),
                         probe_interval_s=0.05)


@contextlib.asynccontextmanager
async def redis_busy(server: RedisServer) -> AsyncIterator[None]:
    """Redis held by a script for a second: a command sent meanwhile waits in its socket,
    runs when the script ends, and its reply comes after an impatient call gave up."""
    busy = asyncio.create_task(asyncio.to_thread(
        redis.Redis.from_url(server.url).eval, BUSY_FOR_A_SECOND, 0))
    await until_busy(server)
    yield
    await busy
SCOPES = (Scope("tenant", 10, None),)


def failover(server: RedisServer, on_error: str = "fail_open", replicas: int = 1) -> FailoverStore:
    return FailoverStore(RedisStore(connect(server.url, socket_timeout_s=0.2)),
                         on_error=on_error, replicas=replicas,  # type: ignore[arg-type]
                         probe_interval_s=0.05)


async def admit(store: FailoverStore, request_id: str, now: float = T0):
    return await store.admit("acme", SCOPES, 1, BudgetLimits(), now, request_id)


async def wait_until_healthy(store: FailoverStore, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.healthy:
        assert time.monotonic() < deadline, "the store never went back to Redis"
        await asyncio.sleep(0.02)


async def test_fail_open_decides_locally_with_this_replicas_share(
        redis_server: RedisServer) -> None:
    store = failover(redis_server, replicas=2)
    assert (await admit(store, "before")).reservation.store == "redis"
    redis_server.kill()
    decisions = [await admit(store, f"r{n}") for n in range(8)]
    await store.aclose()
    assert [d.reservation.store for d in decisions if d.admitted] == ["fallback"] * 5
    assert store.outages == 1 and store.fallback_admissions == 8


async def test_fail_closed_rejects_while_redis_is_down(redis_server: RedisServer) -> None:
    store = failover(redis_server, on_error="fail_closed")
    redis_server.kill()
    with pytest.raises(StoreUnavailable):
        await admit(store, "a")
    with pytest.raises(StoreUnavailable):
        await admit(store, "b")
    await store.aclose()
    assert store.rejected_unavailable == 2


async def test_no_admission_waits_on_a_dead_redis(redis_server: RedisServer) -> None:
    store = failover(redis_server)
    redis_server.kill()
    started = time.monotonic()
    await asyncio.gather(*(admit(store, f"r{n}") for n in range(200)))
    elapsed = time.monotonic() - started
    await store.aclose()
    assert elapsed < 1.0


async def test_an_outage_is_logged_once(redis_server: RedisServer,
                                        caplog: pytest.LogCaptureFixture) -> None:
    store = failover(redis_server)
    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="routegate.limits"):
        for n in range(20):
            await admit(store, f"r{n}")
            await asyncio.sleep(0.01)  # let the probe fail a few times too
    await store.aclose()
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


async def test_the_store_goes_back_to_redis_when_it_returns(redis_server: RedisServer) -> None:
    store = failover(redis_server)
    redis_server.kill()
    assert (await admit(store, "during")).reservation.store == "fallback"
    redis_server.start()
    await wait_until_healthy(store)
    after = await admit(store, "after")
    await store.aclose()
    assert after.reservation.store == "redis"


async def test_spend_during_an_outage_reaches_the_redis_ledger(
        redis_server: RedisServer) -> None:
    store = failover(redis_server)
    admitted_by_redis = await admit(store, "a")
    redis_server.kill()
    admitted_locally = await admit(store, "b")
    await store.settle(admitted_by_redis.reservation, 5, Charge(2, 3, 100), T0 + 1)
    await store.settle(admitted_locally.reservation, 5, Charge(2, 3, 200), T0 + 1)
    redis_server.start()
    await wait_until_healthy(store)
    usage = await store.usage("acme", T0 + 2)
    await store.aclose()
    assert (usage.day.requests, usage.day.spend_micros) == (2, 300)


async def test_a_settlement_whose_reply_was_lost_is_replayed_and_counted_once(
        redis_server: RedisServer) -> None:
    store = impatient(redis_server)
    warm_up = await admit(store, "warm-up")
    await store.settle(warm_up.reservation, 1, Charge(), T0)  # the script is loaded
    admitted = await admit(store, "a")
    async with redis_busy(redis_server):
        await store.settle(admitted.reservation, 5, Charge(2, 3, 100), T0 + 1)
        assert not store.healthy  # so it is kept, and replayed when Redis answers
    await wait_until_healthy(store)
    usage = await store.usage("acme", T0 + 2)
    await store.aclose()
    assert (usage.day.requests, usage.day.spend_micros) == (2, 100)


async def test_an_admission_whose_reply_was_lost_holds_no_tokens_in_redis_after_it(
        redis_server: RedisServer) -> None:
    store = impatient(redis_server)
    scopes = (Scope("tenant", 10, 1000),)
    await store.admit("acme", scopes, 1, BudgetLimits(), T0, "warm-up")  # script loaded
    async with redis_busy(redis_server):  # Redis admits it after the call gave up
        local = await store.admit("acme", scopes, 900, BudgetLimits(), T0 + 1, "lost")
        assert local.reservation is not None and local.reservation.store == "fallback"
    await wait_until_healthy(store)
    after = await store.admit("acme", scopes, 900, BudgetLimits(), T0 + 2, "after")
    await store.aclose()
    assert after.admitted and after.states[0].tokens == 1 + 900  # "lost" holds none
    assert after.states[0].requests == 3  # it was admitted, so it counts


async def test_local_decisions_report_the_share_in_their_states(
        redis_server: RedisServer) -> None:
    store = failover(redis_server, replicas=2)
    redis_server.kill()
    decision = await admit(store, "a")
    await store.aclose()
    assert decision.states[0].scope.requests_per_minute == 5


async def test_a_budget_spent_before_an_outage_stays_spent_during_it(
        redis_server: RedisServer) -> None:
    store = failover(redis_server)
    budget = BudgetLimits(day_micros=1000)
    before = await store.admit("acme", SCOPES, 1, budget, T0, "a")
    await store.settle(before.reservation, 1, Charge(0, 1, 1000), T0 + 1)
    redis_server.kill()
    during = await store.admit("acme", SCOPES, 1, budget, T0 + 2, "b")
    await store.aclose()
    assert not during.admitted
    rejection = during.rejection
    assert (rejection.kind, rejection.limit, rejection.used) == ("budget_day", 1000, 1000)


async def test_spend_before_and_during_an_outage_add_up_against_the_budget(
        redis_server: RedisServer) -> None:
    store = failover(redis_server)
    budget = BudgetLimits(day_micros=1000)
    before = await store.admit("acme", SCOPES, 1, budget, T0, "a")
    await store.settle(before.reservation, 1, Charge(0, 1, 600), T0 + 1)
    redis_server.kill()
    during = await store.admit("acme", SCOPES, 1, budget, T0 + 2, "b")
    assert during.admitted and during.spent_day_micros == 600
    await store.settle(during.reservation, 1, Charge(0, 1, 500), T0 + 3)
    after = await store.admit("acme", SCOPES, 1, budget, T0 + 4, "c")
    await store.aclose()
    assert after.rejection is not None and after.rejection.used == 1100


async def test_spend_replayed_after_an_outage_is_not_counted_twice_in_the_next(
        redis_server: RedisServer) -> None:
    store = failover(redis_server)
    budget = BudgetLimits(day_micros=1000)
    before = await store.admit("acme", SCOPES, 1, budget, T0, "a")
    await store.settle(before.reservation, 1, Charge(0, 1, 300), T0 + 1)
    redis_server.kill()
    first_outage = await store.admit("acme", SCOPES, 1, budget, T0 + 2, "b")
    await store.settle(first_outage.reservation, 1, Charge(0, 1, 300), T0 + 3)
    redis_server.start()
    await wait_until_healthy(store)
    redis_server.kill()
    second_outage = await store.admit("acme", SCOPES, 1, budget, T0 + 4, "c")
    await store.aclose()
    assert second_outage.reservation.store == "fallback"
    assert second_outage.spent_day_micros == 600


async def test_one_restart_of_redis_is_one_outage(redis_server: RedisServer) -> None:
    store = failover(redis_server)
    # a burst opens the pool's connections; each is dead once Redis restarts
    await asyncio.gather(*(admit(store, f"warm{n}") for n in range(64)))
    redis_server.kill()
    await admit(store, "during")
    redis_server.start()
    await wait_until_healthy(store)
    roomy = (Scope("tenant", 100_000, None),)
    for burst in range(5):
        decisions = await asyncio.gather(*(
            store.admit("acme", roomy, 1, BudgetLimits(), T0, f"b{burst}-{n}")
            for n in range(64)))
        await asyncio.sleep(0.02)
    await store.aclose()
    assert store.outages == 1
    assert {d.reservation.store for d in decisions if d.reservation} == {"redis"}


async def test_an_outage_is_summarised_once_per_interval_with_a_count(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    store = FailoverStore(RedisStore(connect(redis_server.url, socket_timeout_s=0.2)),
                          on_error="fail_closed", probe_interval_s=0.05, log_interval_s=0.3)
    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="routegate.limits"):
        for n in range(40):
            with contextlib.suppress(StoreUnavailable):
                await admit(store, f"r{n}")
            await asyncio.sleep(0.02)
    await store.aclose()
    summaries = [r.getMessage() for r in caplog.records if "still unavailable" in r.getMessage()]
    assert 1 <= len(summaries) <= 4  # about 0.8 s of outage, one line per 0.3 s
    assert "requests refused" in summaries[0]
