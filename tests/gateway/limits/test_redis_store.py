"""What only the Redis store promises: one round trip, reloads, TTLs, Cluster-safe keys,
settlements counted once, cancelled admissions released."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import redis

from gateway.limits.redis_store import SETTLED_TTL_MS, RedisStore, connect
from gateway.limits.store import BudgetLimits, Charge, Scope
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
    assert len(keys) == 7  # two scopes × (log, tokens), day and month ledgers, settled ids
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


async def test_settled_ids_are_remembered_for_a_bounded_time(redis_server: RedisServer) -> None:
    store = RedisStore(connect(redis_server.url))
    for n, at in enumerate((T0, T0 + SETTLED_TTL_MS / 1000 + 1)):
        decision = await store.admit("acme", SCOPES, 1, BudgetLimits(), at, f"r{n}")
        await store.settle(decision.reservation, 1, Charge(), at)
    await store.aclose()
    sync = redis.Redis.from_url(redis_server.url)
    assert sync.zrange("rg:{acme}:settled", 0, -1) == [b"r1"]
    assert 0 < sync.pttl("rg:{acme}:settled") <= SETTLED_TTL_MS


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

    tokens = "rg:{acme}:w:tenant:tok"  # reservation id → tokens, and "_total"
    for _ in range(200):  # the pause ends, Redis admits it, the store gives it back
        if sync.hget(tokens, "abandoned") == b"0":
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
    await store.release(replace(decision.reservation, id="never-admitted"), T0 + 1)
    after = await store.admit("acme", scopes, 900, BudgetLimits(), T0 + 2, "b")
    usage = await store.usage("acme", T0 + 3)
    await store.aclose()
    assert after.admitted and (after.states[0].requests, after.states[0].tokens) == (2, 900)
    assert usage.day.requests == 0  # never ran: nothing in the ledger

