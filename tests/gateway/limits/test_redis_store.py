"""What only the Redis store promises: one round trip, reloads, TTLs, Cluster-safe keys,
state that does not grow with traffic, settlements counted once, cancelled admissions
released."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import redis

from gateway.limits.redis_store import (
    RECEIPT_SLOTS,
    RECEIPTS_TTL_MS,
    SCOPE_TTL_MS,
    Receipt,
    RedisStore,
)
from gateway.limits.store import BudgetLimits, Charge, Scope
from gateway.stores.redis import connect
from tests.redis_server import RedisServer

T0 = 1_764_400_000.0
SCOPES = (Scope("tenant", 100, 10_000), Scope("key:abc", 50, 5_000))


def commandstats(client: redis.Redis) -> dict[str, int]:
    info = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in info.items()}


async def test_each_admission_is_one_evalsha(redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    sync = redis.Redis.from_url(redis_server.url)
    await store.admit("acme", SCOPES, 10, BudgetLimits(1000, None), T0, "warm-up")
    sync.config_resetstat()
    for n in range(20):
        await store.admit("acme", SCOPES, 10, BudgetLimits(1000, None), T0 + n, f"r{n}")
    stats = commandstats(sync)
    await store.aclose()
    client_commands = {name: calls for name, calls in stats.items()
                       if name in ("evalsha", "eval", "script", "ping", "hello", "client")}
    assert client_commands == {"evalsha": 20}


async def test_the_script_is_reloaded_after_redis_forgets_it(redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    await store.admit("acme", SCOPES, 1, BudgetLimits(), T0, "a")
    redis.Redis.from_url(redis_server.url).script_flush()
    decision = await store.admit("acme", SCOPES, 1, BudgetLimits(), T0 + 1, "b")
    await store.aclose()
    assert decision.admitted and decision.states[0].requests == 2


async def test_every_key_expires_and_carries_the_tenant_hash_tag(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    decision = await store.admit("acme", SCOPES, 5, BudgetLimits(), T0, "a")
    await store.settle(decision.reservation, 3, Charge(1, 2, 9), T0 + 1)
    await store.aclose()
    sync = redis.Redis.from_url(redis_server.url)
    keys = sync.keys("*")
    assert len(keys) == 5  # two scope windows, day and month ledgers, this process's receipts
    for key in keys:
        assert key.startswith(b"rg:{acme}:")
        assert sync.pttl(key) > 0


async def test_a_settlement_run_twice_is_counted_once(redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    decision = await store.admit("acme", SCOPES, 5, BudgetLimits(), T0, "a")
    for _ in range(2):  # the second: a replay after the first one's reply was lost
        await store.settle(decision.reservation, 3, Charge(1, 2, 9), T0 + 1)
    after = await store.admit("acme", SCOPES, 1, BudgetLimits(), T0 + 2, "b")
    usage = await store.usage("acme", T0 + 2)
    await store.aclose()
    assert (usage.day.requests, usage.day.input_tokens, usage.day.spend_micros) == (1, 1, 9)
    assert after.states[0].tokens == 3 + 1


async def test_a_tenants_limit_state_does_not_grow_with_traffic(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    sync = redis.Redis.from_url(redis_server.url)
    roomy = (Scope("tenant", 10**6, 10**9), Scope("key:abc", 10**6, 10**9))
    shapes = []
    for requests in (10, 1000):  # at 1 and at 100 requests a second, for 10 s
        sync.flushall()
        for n in range(requests):
            at = T0 + n * 10 / requests
            decision = await store.admit("acme", roomy, 10, BudgetLimits(), at, f"r{n}")
            await store.settle(decision.reservation, 7, Charge(5, 2, 1), at)
        keys = sorted(sync.keys("*"))
        windows = [key for key in keys if b":w:" in key]
        (receipts,) = [key for key in keys if b":receipts:" in key]
        assert [sync.hlen(window) for window in windows] == [5, 5]  # five integers a scope
        assert sync.strlen(receipts) <= 2 * RECEIPT_SLOTS  # 16 bits a slot
        shapes.append(keys)
    await store.aclose()
    assert shapes[0] == shapes[1]


async def test_scope_windows_and_receipts_expire_on_their_own(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    decision = await store.admit("acme", SCOPES, 1, BudgetLimits(), T0, "a")
    await store.settle(decision.reservation, 1, Charge(), T0)
    await store.aclose()
    sync = redis.Redis.from_url(redis_server.url)
    (receipts,) = sync.keys("rg:{acme}:receipts:*")
    assert 0 < sync.pttl(receipts) <= RECEIPTS_TTL_MS
    assert 0 < sync.pttl("rg:{acme}:w:tenant") <= SCOPE_TTL_MS


async def test_an_admission_cancelled_while_redis_decides_holds_no_tokens(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    scopes = (Scope("tenant", 3, 1000),)
    sync = redis.Redis.from_url(redis_server.url)
    await store.admit("acme", scopes, 1, BudgetLimits(), T0, "warm-up")  # script loaded
    sync.client_pause(300, all=False)  # scripts wait: Redis admits after the caller left
    admitting = asyncio.create_task(
        store.admit("acme", scopes, 900, BudgetLimits(), T0 + 1, "abandoned"))
    await asyncio.sleep(0.05)
    admitting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitting

    window = "rg:{acme}:w:tenant"  # the scope's counts: "t" its tokens
    for _ in range(200):  # the pause ends, Redis admits it, the store gives it back
        if sync.hget(window, "r") == b"2" and sync.hget(window, "t") == b"1":
            break
        await asyncio.sleep(0.01)
    after = await store.admit("acme", scopes, 900, BudgetLimits(), T0 + 2, "after")
    await store.aclose()
    assert after.admitted and after.states[0].tokens == 1 + 900
    assert after.states[0].requests == 3  # it was admitted, so it counts


async def test_a_released_request_gives_back_its_tokens_but_still_counts_as_a_request(
        redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    scopes = (Scope("tenant", 10, 1000),)
    decision = await store.admit("acme", scopes, 900, BudgetLimits(), T0, "a")
    for _ in range(2):  # releasing again changes nothing
        await store.release(decision.reservation, T0 + 1)
    # a number this process never had admitted (its receipt slot holds another's, or none)
    await store.release(replace(decision.reservation, id="never-admitted",
                                handle=Receipt(RECEIPT_SLOTS * 7 + 3)), T0 + 1)
    after = await store.admit("acme", scopes, 900, BudgetLimits(), T0 + 2, "b")
    usage = await store.usage("acme", T0 + 3)
    await store.aclose()
    assert after.admitted and (after.states[0].requests, after.states[0].tokens) == (2, 900)
    assert usage.day.requests == 0  # never ran: nothing in the ledger

