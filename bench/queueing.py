"""Queueing under overload and its per-request cost, measured side by side in one run.

    .venv/bin/python bench/queueing.py [--seconds 6]

1. Overload: a loopback upstream with a fixed concurrency (8) and service time
   (100 ms to the first token) is offered 2× its capacity as Poisson arrivals,
   30 % high / 30 % normal / 40 % low priority, each with a TTFT budget
   (0.5 s / 1 s / 2 s). Two set-ups see the same arrival sequence:
     - "no gateway queue": everything goes straight to the upstream, which
       queues it FIFO itself (piling onto the backend);
     - "routegate queue": `BackendQueues` with the upstream's concurrency,
       priority bands, deadlines and shedding; a refused request counts as shed
       (it would spill to the next candidate, or get 503 + Retry-After).
   Printed per priority: served, shed, expired in queue, TTFT p50/p99 of those
   served, and the share of *all* requests answered within budget.
2. Overhead: acquire+release of a free slot, and enqueue → grant → release of a
   queued request, next to `asyncio.Semaphore` doing the same.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.queueing import (
    BackendQueues,
    Priority,
    QueueDeadlinePassed,
    QueueRejected,
    ShedPolicy,
)

CAPACITY = 8
SERVICE_S = 0.100
LOAD_FACTOR = 2.0
MIX: dict[Priority, float] = {"high": 0.3, "normal": 0.3, "low": 0.4}
BUDGET_S: dict[Priority, float] = {"high": 0.5, "normal": 1.0, "low": 2.0}
TENANTS = ("acme", "globex", "initech", "umbrella")


async def start_upstream() -> tuple[web.AppRunner, str]:
    engine_slots = asyncio.Semaphore(CAPACITY)  # the backend's own FIFO batch limit

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        async with engine_slots:
            await asyncio.sleep(SERVICE_S)
        return web.json_response({"object": "chat.completion"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1/chat/completions"


def arrivals(seconds: float, seed: int = 7) -> list[tuple[float, Priority, str]]:
    rng = random.Random(seed)
    rate = LOAD_FACTOR * CAPACITY / SERVICE_S
    out: list[tuple[float, Priority, str]] = []
    t = 0.0
    priorities, weights = list(MIX), list(MIX.values())
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append((t, rng.choices(priorities, weights)[0], rng.choice(TENANTS)))


async def run_overload(url: str, schedule: list[tuple[float, Priority, str]],
                       queues: BackendQueues | None) -> dict[Priority, dict[str, float]]:
    outcome: dict[Priority, Counter[str]] = defaultdict(Counter)
    ttfts: dict[Priority, list[float]] = defaultdict(list)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def post() -> None:
            async with session.post(url, json={"model": "m"}) as response:
                await response.read()

        async def one(priority: Priority, tenant: str) -> None:
            start = time.monotonic()
            try:
                if queues is None:
                    await post()
                else:
                    # The slot is useful only if the first token can still make the
                    # budget: grant by (budget − the upstream's own time to first token).
                    deadline = start + BUDGET_S[priority] - SERVICE_S
                    async with queues.acquire("local", tenant=tenant, priority=priority,
                                              deadline=deadline, now=start):
                        await post()
            except QueueRejected:
                outcome[priority]["shed"] += 1
                return
            except QueueDeadlinePassed:
                outcome[priority]["expired"] += 1
                return
            ttft = time.monotonic() - start
            ttfts[priority].append(ttft)
            outcome[priority]["served"] += 1
            outcome[priority]["in_budget"] += ttft <= BUDGET_S[priority]

        tasks = []
        begin = time.monotonic()
        for at, priority, tenant in schedule:
            delay = begin + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(priority, tenant)))
        await asyncio.gather(*tasks)

    report: dict[Priority, dict[str, float]] = {}
    for priority in MIX:
        total = sum(1 for _, p, _ in schedule if p == priority)
        served = sorted(ttfts[priority])
        report[priority] = {
            "offered": total, "served": outcome[priority]["served"],
            "shed": outcome[priority]["shed"], "expired": outcome[priority]["expired"],
            "p50_ms": 1000 * statistics.median(served) if served else float("nan"),
            "p99_ms": 1000 * served[min(len(served) - 1, int(0.99 * len(served)))]
            if served else float("nan"),
            "within_budget": outcome[priority]["in_budget"] / total if total else 0.0,
        }
    return report


def print_overload(name: str, report: dict[Priority, dict[str, float]]) -> None:
    print(f"\n  {name}")
    print(f"    {'priority':8} {'budget':>7} {'offered':>7} {'served':>6} {'shed':>5} "
          f"{'expired':>7} {'p50 TTFT':>9} {'p99 TTFT':>9} {'in budget':>9}")
    for priority, row in report.items():
        print(f"    {priority:8} {BUDGET_S[priority] * 1000:5.0f}ms {row['offered']:7.0f} "
              f"{row['served']:6.0f} {row['shed']:5.0f} {row['expired']:7.0f} "
              f"{row['p50_ms']:7.0f}ms {row['p99_ms']:7.0f}ms {row['within_budget']:9.0%}")


async def overhead(n: int = 20_000, repeats: int = 5) -> None:
    """Best of `repeats` runs of each figure: the machine is shared, noise only adds."""
    figures = [await overhead_once(n) for _ in range(repeats)]
    free_ours, free_sem, queued_ours_s, queued_sem_s = (
        min(column) for column in zip(*figures, strict=True))
    print("\n  per-request overhead (one event loop, best of 5, µs)")
    print(f"    {'':34} {'routegate':>10} {'asyncio.Semaphore':>18}")
    print(f"    {'free slot: acquire + release':34} {free_ours * 1e6:10.2f} "
          f"{free_sem * 1e6:18.2f}")
    print(f"    {'queued: grant + resume + release':34} {queued_ours_s * 1e6:10.2f} "
          f"{queued_sem_s * 1e6:18.2f}")


async def overhead_once(n: int) -> tuple[float, float, float, float]:
    queues = BackendQueues(shed=ShedPolicy(max_waiting=n))
    queues.set_limit("k", 1)
    semaphore = asyncio.Semaphore(1)

    start = time.perf_counter()
    for _ in range(n):
        ticket = await queues.acquire("k", tenant="acme")
        ticket.release()
    free_ours = (time.perf_counter() - start) / n

    start = time.perf_counter()
    for _ in range(n):
        await semaphore.acquire()
        semaphore.release()
    free_sem = (time.perf_counter() - start) / n

    async def queued_ours(i: int) -> None:
        async with queues.acquire("k", tenant=TENANTS[i % 4], priority="normal"):
            pass

    async def queued_sem() -> None:
        async with semaphore:
            pass

    async def contended(make: object) -> float:
        holder = None
        if make is queued_ours:
            holder = await queues.acquire("k", tenant="acme")
        else:
            await semaphore.acquire()
        tasks = [asyncio.create_task(make(i) if make is queued_ours else make())  # type: ignore[operator]
                 for i in range(n)]
        await asyncio.sleep(0)  # all enqueue
        start = time.perf_counter()
        if holder is not None:
            holder.release()
        else:
            semaphore.release()
        await asyncio.gather(*tasks)
        return (time.perf_counter() - start) / n

    # The queued figures include creating and scheduling one task per request.
    queued_sem_s = await contended(queued_sem)
    queued_ours_s = await contended(queued_ours)
    return free_ours, free_sem, queued_ours_s, queued_sem_s


async def main(seconds: float) -> None:
    runner, url = await start_upstream()
    try:
        schedule = arrivals(seconds)
        print(f"overload: capacity {CAPACITY} × {SERVICE_S * 1000:.0f} ms = "
              f"{CAPACITY / SERVICE_S:.0f} req/s, offered {LOAD_FACTOR:.0f}× "
              f"({len(schedule)} requests over {seconds:.0f} s)")
        print_overload("no gateway queue (the backend queues FIFO)",
                       await run_overload(url, schedule, None))
        queues = BackendQueues()
        queues.set_limit("local", CAPACITY, service_prior_s=SERVICE_S)
        print_overload("routegate queue (priority, deadline, fair share, shedding)",
                       await run_overload(url, schedule, queues))
    finally:
        await runner.cleanup()
    await overhead()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    asyncio.run(main(parser.parse_args().seconds))
