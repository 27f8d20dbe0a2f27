"""Admission cost and Redis memory of the limit state: the window counter the stores
use now, side by side with the sliding-window log they used before (its scripts are
kept in bench/ as the reference, `sliding_window_log.py`; no part of the product).

Prints, in one run:
  - memory: µs per admission (synchronous core, and through the async interface);
  - redis:  µs per admission over loopback, counter and log in alternated rounds
            (each at a steady 100 admissions/s of simulated time, a full window of
            them first, so the log holds a window's entries), the time Redis itself
            spent per EVALSHA, and the commands Redis saw per admission (`INFO
            commandstats`: EVALSHA calls, plus the commands the script ran inside);
  - redis through `Limiter.admit`, rounds alternated with the store called
            directly: what the limiter adds (its scopes and the response headers);
  - the Redis memory one tenant's limit state holds at a steady 100 admissions/s,
            each settled, once everything is at its steady size (130 s simulated):
            per scope, per tenant (the log's settled ids; the counter's receipts), the
            ledger, and INFO's used_memory over the run; log and counter alike.

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
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import BudgetLimits, Charge, Scope
from gateway.stores.redis import connect
from policies.load import loads
from tests.redis_server import RedisServer, find_redis_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sliding_window_log import SlidingWindowLog

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


RATE = 100  # admissions per second of simulated time, in the Redis runs
T0 = 1_764_400_000.0  # 2025-11-29 07:06:40 UTC (the reference's ledger period)


class _Variant:
    """One of the two Redis stores, admitting at RATE a second of its own clock."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.now = T0
        self.count = 0
        if name == "counter":
            self.store: RedisStore | None = RedisStore(connect(url))
            self.log: SlidingWindowLog | None = None
        else:
            self.store, self.log = None, SlidingWindowLog(connect(url))

    async def admit(self, settle: bool = False) -> None:
        self.count += 1
        request_id = f"{self.name}-{self.count}"
        if self.store is not None:
            decision = await self.store.admit("acme", SCOPES, 100, BUDGET, self.now, request_id)
            assert decision.reservation is not None
            if settle:
                await self.store.settle(decision.reservation, 80, Charge(50, 30, 10), self.now)
        else:
            assert self.log is not None
            logged, _ = await self.log.admit("acme-log", SCOPES, 100, BUDGET, self.now,
                                             request_id)
            assert logged.reservation is not None
            if settle:
                await self.log.settle("acme-log", SCOPES, request_id, -20, Charge(50, 30, 10),
                                      self.now)
        self.now += 1.0 / RATE

    async def aclose(self) -> None:
        if self.store is not None:
            await self.store.aclose()
        else:
            assert self.log is not None
            await self.log.client.aclose()


async def bench_redis(url: str, n: int, rounds: int = 12) -> dict[str, tuple[float, float, float]]:
    """Per store: (µs per admission, best of alternated rounds; µs Redis spent per
    EVALSHA; commands inside the script per admission)."""
    sync = redis.Redis.from_url(url)
    sync.flushall()
    variants = [_Variant("counter", url), _Variant("log", url)]
    for variant in variants:  # a window's worth first: the log at its steady size
        for _ in range(int(RATE * 60)):
            await variant.admit()
    timings: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(rounds):
        for variant in variants:
            started = time.perf_counter()
            for _ in range(n):
                await variant.admit()
            timings[variant.name].append((time.perf_counter() - started) / n * 1e6)
    results = {}
    for variant in variants:
        sync.config_resetstat()
        for _ in range(n):
            await variant.admit()
        stats = sync.info("commandstats")
        evalsha = stats.pop("cmdstat_evalsha")
        inside = sum(value["calls"] for name, value in stats.items()
                     if name not in ("cmdstat_info", "cmdstat_config"))
        results[variant.name] = (min(timings[variant.name]), float(evalsha["usec_per_call"]),
                                 inside / evalsha["calls"])
        await variant.aclose()
    return results


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


async def bench_redis_memory(url: str, seconds: int) -> dict[str, dict[str, float]]:
    """Per store, bytes Redis holds for one tenant (two scopes) at RATE admissions/s,
    each settled, after `seconds` of simulated time: per scope, per tenant (settled ids
    or receipts), ledger, and INFO used_memory over the run."""
    sync = redis.Redis.from_url(url)
    results = {}
    for name in ("log", "counter"):
        sync.flushall()
        before = int(sync.info("memory")["used_memory"])
        variant = _Variant(name, url)
        for _ in range(RATE * seconds):
            await variant.admit(settle=True)
        used = int(sync.info("memory")["used_memory"]) - before
        await variant.aclose()
        sizes = {"scope": 0.0, "tenant": 0.0, "ledger": 0.0, "used_memory": used / len(SCOPES)}
        for key in sync.keys("*"):
            size = sync.memory_usage(key, samples=0) or 0
            key_name = key.decode() if isinstance(key, bytes) else key
            part = key_name.split("}:", 1)[1]
            kind = ("scope" if part.startswith("w:") else
                    "ledger" if part.startswith("spend:") else "tenant")
            sizes[kind] += size / len(SCOPES) if kind == "scope" else size
        results[name] = sizes
    return results


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
            admissions = asyncio.run(bench_redis(server.url, redis_n // 2))
            limiter_us, direct_us = asyncio.run(bench_redis_limiter(server.url, redis_n // 6))
            memory = asyncio.run(bench_redis_memory(server.url, 130))
        finally:
            server.stop()
    counter_us, counter_server_us, counter_inside = admissions["counter"]
    log_us, log_server_us, log_inside = admissions["log"]
    print(f"redis   admission (loopback, same work, {RATE}/s): window counter "
          f"{counter_us:6.1f} µs, sliding-window log {log_us:6.1f} µs "
          f"(alternated rounds, best of each): {counter_us / log_us:.2f}×")
    print(f"redis   time in Redis per admission (EVALSHA usec_per_call): counter "
          f"{counter_server_us:.1f} µs, log {log_server_us:.1f} µs; commands inside the "
          f"script: counter {counter_inside:.1f}, log {log_inside:.1f}; 1 EVALSHA each")
    print(f"ratio   redis / memory: {counter_us / async_us:.0f}×")
    print(f"limiter redis admission through Limiter.admit: {limiter_us:6.1f} µs, the store "
          f"directly {direct_us:6.1f} µs (alternated rounds, best of each): "
          f"+{limiter_us - direct_us:.1f} µs, {limiter_us / direct_us:.3f}×")
    print(f"memory  Redis for one tenant with two scopes at a steady {RATE} admissions/s, each "
          "settled, after 130 s (bytes, MEMORY USAGE per key):")
    print(f"{'':8}{'':34}{'sliding-window log':>20}{'window counter':>16}")
    rows = (("per scope (its window)", "scope"),
            ("per tenant (settled ids / receipts)", "tenant"),
            ("per tenant (day and month ledger)", "ledger"),
            ("used_memory over the run, per scope", "used_memory"))
    for label, kind in rows:
        print(f"{'':8}{label:34}{memory['log'][kind]:>20,.0f}{memory['counter'][kind]:>16,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
