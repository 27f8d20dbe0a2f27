"""What only the Redis store promises: one round trip, reloads, TTLs, Cluster-safe keys."""

from __future__ import annotations

import redis

from gateway.limits.redis_store import RedisStore, connect
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
    assert len(keys) == 6  # two scopes × (log, tokens) + day + month ledgers
    for key in keys:
        assert key.startswith(b"rg:{acme}:")
        assert sync.pttl(key) > 0
