"""Admissions and settlements of one event-loop turn reach Redis as one pipeline, each
caller keeping its own outcome; a call alone in its turn goes at once."""

from __future__ import annotations

import asyncio

import pytest
import redis

from gateway.limits.redis_store import RedisStore
from gateway.limits.store import BudgetLimits, Charge, Scope, StoreUnavailable
from gateway.stores.redis import connect
from tests.redis_server import RedisServer

T0 = 1_764_400_000.0
SCOPES = (Scope("tenant", 1000, 1_000_000),)


def calls_of(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0))


async def test_admissions_of_one_turn_go_in_one_pipeline_each_with_its_own_decision(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    assert store.batch is not None
    decisions = await asyncio.gather(*(
        store.admit(f"tenant-{n % 3}", SCOPES, 10, BudgetLimits(), T0, f"r{n}")
        for n in range(12)))
    await store.aclose()
    assert (store.batch.batches, store.batch.calls) == (1, 12)
    sync = redis.Redis.from_url(redis_server.url)
    assert calls_of(sync, "evalsha") == 24  # all 12 refused NOSCRIPT once, then ran
    assert all(decision.admitted for decision in decisions)
    # each tenant's window counted its own four requests, in the order they were made
    by_tenant: dict[str, list[int]] = {}
    for decision in decisions:
        assert decision.reservation is not None
        by_tenant.setdefault(decision.reservation.tenant, []).append(
            decision.states[0].requests)
    assert by_tenant == {f"tenant-{n}": [1, 2, 3, 4] for n in range(3)}


async def test_a_call_alone_in_its_turn_is_sent_at_once_without_waiting_for_others(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    assert store.batch is not None
    for n in range(3):  # one after another: three batches of one
        assert (await store.admit("acme", SCOPES, 1, BudgetLimits(), T0 + n, f"r{n}")).admitted
    await store.aclose()
    assert (store.batch.batches, store.batch.calls) == (3, 3)


async def test_the_limit_is_exact_when_a_whole_burst_arrives_in_one_turn(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    scopes = (Scope("tenant", 7, None),)
    decisions = await asyncio.gather(*(
        store.admit("acme", scopes, 1, BudgetLimits(), T0, f"r{n}") for n in range(20)))
    await store.aclose()
    assert sum(decision.admitted for decision in decisions) == 7


async def test_a_flushed_script_is_loaded_again_and_every_call_of_the_batch_answered(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    await store.admit("acme", SCOPES, 1, BudgetLimits(), T0, "warm-up")
    sync = redis.Redis.from_url(redis_server.url)
    sync.script_flush()
    decisions = await asyncio.gather(*(
        store.admit("acme", SCOPES, 1, BudgetLimits(), T0 + 1, f"r{n}") for n in range(5)))
    await store.aclose()
    assert [decision.states[0].requests for decision in decisions] == [2, 3, 4, 5, 6]
    assert calls_of(sync, "script|load") + calls_of(sync, "script") >= 1


async def test_settlements_of_one_turn_share_a_pipeline_and_all_reach_the_ledger(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    decisions = await asyncio.gather(*(
        store.admit("acme", SCOPES, 10, BudgetLimits(), T0, f"r{n}") for n in range(6)))
    before = store.batch.batches if store.batch else 0
    await asyncio.gather(*(store.settle(d.reservation, 4, Charge(10, 4, 25), T0 + 1)
                           for d in decisions if d.reservation is not None))
    usage = await store.usage("acme", T0 + 1)
    await store.aclose()
    assert store.batch is not None and store.batch.batches - before == 1
    assert (usage.day.requests, usage.day.output_tokens, usage.day.spend_micros) == (6, 24, 150)


async def test_a_caller_that_stops_waiting_does_not_stop_the_others_in_its_batch(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    await store.admit("acme", SCOPES, 1, BudgetLimits(), T0, "warm-up")
    tasks = [asyncio.ensure_future(store.admit("acme", SCOPES, 1, BudgetLimits(), T0, f"r{n}"))
             for n in range(4)]
    await asyncio.sleep(0)  # every admission has joined this turn's batch
    tasks[1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.2)  # the cancelled one's admission is released in the background
    after = await store.admit("acme", SCOPES, 1, BudgetLimits(), T0, "after")
    await store.aclose()
    assert isinstance(results[1], asyncio.CancelledError)
    assert all(r.admitted for i, r in enumerate(results) if i != 1)  # type: ignore[union-attr]
    # the cancelled admission still reached Redis (released, it stays counted as a
    # request): warm-up, four, and this one
    assert after.states[0].requests == 6 and after.states[0].tokens == 5


async def test_a_failed_pipeline_fails_every_call_in_it_as_store_unavailable(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url), op_timeout_s=2.0)
    await store.admit("acme", SCOPES, 1, BudgetLimits(), T0, "warm-up")
    redis_server.kill()
    try:
        results = await asyncio.gather(*(
            store.admit("acme", SCOPES, 1, BudgetLimits(), T0, f"r{n}") for n in range(3)),
            return_exceptions=True)
    finally:
        redis_server.start()
        await store.aclose()
    assert all(isinstance(result, StoreUnavailable) for result in results), results


@pytest.mark.parametrize("bad_at", [0, 2])
async def test_a_script_error_reaches_only_its_own_caller(redis_server: RedisServer,
                                                          bad_at: int) -> None:
    store = RedisStore(connect(redis_server.url))
    # A key of another type makes the script fail for that tenant alone.
    redis.Redis.from_url(redis_server.url).set("rg:{broken}:w:tenant", "not a hash")
    tenants = ["acme", "acme", "acme"]
    tenants[bad_at] = "broken"
    results = await asyncio.gather(*(
        store.admit(tenant, SCOPES, 1, BudgetLimits(), T0, f"r{n}")
        for n, tenant in enumerate(tenants)), return_exceptions=True)
    await store.aclose()
    for n, result in enumerate(results):
        if n == bad_at:
            assert isinstance(result, StoreUnavailable)
        else:
            assert not isinstance(result, BaseException) and result.admitted
