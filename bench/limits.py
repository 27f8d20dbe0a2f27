"""Admission cost: the memory store in-process, and Redis (round trips and commands).

Prints, side by side in one run:
  - memory: µs per admission (synchronous core, and through the async interface);
  - redis:  µs per admission over loopback, and the commands Redis saw per
            admission (`INFO commandstats`: EVALSHA calls, plus the commands the
            script ran inside that one call).

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

from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore, connect
from gateway.limits.store import BudgetLimits, Scope
from tests.redis_server import RedisServer, find_redis_server

# A tenant scope and a per-key scope, both with RPM and TPM, and a daily budget:
# the full work of one admission. Limits are high so every call is admitted.
SCOPES = (Scope("tenant", 10**9, 10**12), Scope("key:0123456789abcdef", 10**9, 10**12))
BUDGET = BudgetLimits(day_micros=10**12, month_micros=None)


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
        finally:
            server.stop()
    print(f"redis   admission (loopback, same work):       {redis_us:6.1f} µs, "
          f"{evalsha:.2f} client command (EVALSHA) per admission (target 1), "
          f"{inside:.1f} commands inside the script")
    print(f"ratio   redis / memory: {redis_us / async_us:.0f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
