"""Admission cost: the memory store in-process, and Redis (round trips and commands).

Prints, side by side in one run:
  - memory: µs per admission (synchronous core, and through the async interface);
  - redis:  µs per admission over loopback, and the commands Redis saw per
            admission (`INFO commandstats`: EVALSHA calls, plus the commands the
            script ran inside that one call);
  - redis through `Limiter.admit`, rounds alternated with the store called
            directly: what the limiter adds (its scopes and the response headers).

    .venv/bin/python bench/limits.py [--n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.limits.limiter import Limiter
from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore, connect
from gateway.limits.store import WINDOW_S, BudgetLimits, Charge, Scope
from policies.load import loads
from tests.redis_server import RedisServer, find_redis_server

# A tenant scope and a per-key scope, both with RPM and TPM, and a daily budget:
# the full work of one admission. Limits are high so every call is admitted.
SCOPES = (Scope("tenant", 10**9, 10**12), Scope("key:0123456789abcdef", 10**9, 10**12))
BUDGET = BudgetLimits(day_micros=10**12, month_micros=None)
KEY_HASH = "sha256:" + "0123456789abcdef" * 4
POLICY = f"""
version: 1
backends: {{up: {{type: openai, url: "http://127.0.0.1:9/v1", models: {{m: {{}}}}}}}}
routes: {{chat: {{targets: [up/m]}}}}
tenants:
  acme:
    api_keys: ["{KEY_HASH}"]
    limits: {{requests_per_minute: {10**9}, tokens_per_minute: {10**12}}}
    key_limits: {{requests_per_minute: {10**9}, tokens_per_minute: {10**12}}}
    budget: {{usd_per_day: 1000000}}
"""


def bench_memory_sync(n: int) -> float:
    store = MemoryStore()
    now = 1_764_400_000.0
    started = time.perf_counter()
    for i in range(n):
        store.admit_now("acme", SCOPES, 100, BUDGET, now + i * 1e-4, str(i))
    return (time.perf_counter() - started) / n * 1e6


async def bench_memory_async(n: int) -> float:
    store = MemoryStore()
    now = 1_764_400_000.0
    started = time.perf_counter()
    for i in range(n):
        await store.admit("acme", SCOPES, 100, BUDGET, now + i * 1e-4, str(i))
    return (time.perf_counter() - started) / n * 1e6


async def bench_redis(url: str, n: int) -> tuple[float, float, float]:
    store = RedisStore(connect(url))
    sync = redis.Redis.from_url(url)
    now = 1_764_400_000.0
    await store.admit("acme", SCOPES, 100, BUDGET, now, "warm-up")
    sync.config_resetstat()
    started = time.perf_counter()
    for i in range(n):
        await store.admit("acme", SCOPES, 100, BUDGET, now + i * 1e-3, str(i))
    elapsed = time.perf_counter() - started
    stats = {k.removeprefix("cmdstat_"): v["calls"]
             for k, v in sync.info("commandstats").items()}
    await store.aclose()
    evalsha = stats.pop("evalsha", 0)
    inside = sum(calls for name, calls in stats.items() if name not in ("info", "config"))
    return elapsed / n * 1e6, evalsha / n, inside / n


async def bench_redis_limiter(url: str, n: int, rounds: int = 6) -> tuple[float, float]:
    """(µs per `Limiter.admit`, µs per `RedisStore.admit`): the best of alternated rounds."""
    policy = loads(POLICY)
    limiter = Limiter(RedisStore(connect(url)))
    store = RedisStore(connect(url))
    await limiter.admit(policy, "acme", tokens=100, key_hash=KEY_HASH)
    await store.admit("other", SCOPES, 100, BUDGET, time.time(), "warm-up")
    through, direct = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            await limiter.admit(policy, "acme", tokens=100, key_hash=KEY_HASH)
        through.append((time.perf_counter() - started) / n * 1e6)
        started = time.perf_counter()
        for i in range(n):
            await store.admit("other", SCOPES, 100, BUDGET, time.time(), str(i))
        direct.append((time.perf_counter() - started) / n * 1e6)
    await limiter.aclose()
    await store.aclose()
    return min(through), min(direct)


async def bench_redis_memory(url: str, rate: int, seconds: int) -> tuple[float, float]:
    """Redis memory a tenant's limit state holds at a steady `rate` admissions/s once the
    window is full: (bytes per scope, bytes per admitted request per scope). Time is
    simulated (`now` advances 1/rate per admission), so a minute of traffic takes as
    long as `rate * seconds` admissions and settlements do."""
    store = RedisStore(connect(url))
    sync = redis.Redis.from_url(url)
    sync.flushall()
    before = int(sync.info("memory")["used_memory"])
    now = 1_764_400_000.0
    for i in range(rate * seconds):
        decision = await store.admit("acme", SCOPES, 100, BUDGET, now, f"m{i}")
        if decision.reservation is not None:
            await store.settle(decision.reservation, 80, Charge(50, 30, 10), now)
        now += 1.0 / rate
    used = int(sync.info("memory")["used_memory"]) - before
    await store.aclose()
    in_window = rate * min(seconds, WINDOW_S)
    per_scope = used / len(SCOPES)
    return per_scope, per_scope / in_window


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    n = args.n
    bench_memory_sync(1000)  # warm up
    sync_us = bench_memory_sync(n)
    async_us = asyncio.run(bench_memory_async(n))
    print(f"memory  admission (2 scopes, RPM+TPM, budget): {sync_us:6.2f} µs sync core, "
          f"{async_us:6.2f} µs via await   (target ≤ 10 µs)")
    binary = find_redis_server()
    if binary is None:
        print("redis   skipped: no redis-server binary")
        return 0
    with tempfile.TemporaryDirectory() as directory:
        server = RedisServer(binary, Path(directory))
        server.start()
        try:
            redis_n = max(1000, n // 4)
            redis_us, evalsha, inside = asyncio.run(bench_redis(server.url, redis_n))
            limiter_us, direct_us = asyncio.run(bench_redis_limiter(server.url, redis_n // 6))
            scope_bytes, request_bytes = asyncio.run(bench_redis_memory(server.url, 100, 70))
        finally:
            server.stop()
    print(f"redis   admission (loopback, same work):       {redis_us:6.1f} µs, "
          f"{evalsha:.2f} client command (EVALSHA) per admission (target 1), "
          f"{inside:.1f} commands inside the script")
    print(f"ratio   redis / memory: {redis_us / async_us:.0f}×")
    print(f"limiter redis admission through Limiter.admit: {limiter_us:6.1f} µs, the store "
          f"directly {direct_us:6.1f} µs (alternated rounds, best of each): "
          f"+{limiter_us - direct_us:.1f} µs, {limiter_us / direct_us:.3f}×")
    print(f"memory  Redis per scope at a steady 100 admissions/s (window full, settled): "
          f"{scope_bytes / 1024:.0f} KiB, {request_bytes:.0f} bytes per request in the "
          f"window (settled ids included: they are per tenant)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
