"""Resilience under faults: retries and outlier ejection on, then off, side by side in one run.

    .venv/bin/python bench/resilience.py [--requests 600] [--concurrency 16]

Three loopback upstreams behind one route, tried in this order (cheapest first):
  flaky     answers 503 to half its requests (seeded), the rest after 20 ms
  stalled   accepts requests and never answers (its `first_byte_s` is 0.3 s)
  healthy   answers after 20 ms
The same request sequence runs through two gateways: one with retries on
(`resilience.retries.max_per_target: 1`) and outlier ejection as by default, one with
both off. Printed per
set-up: success rate, latency p50/p99 against the route's budget, attempts per request
and retries as a share of requests (the retry budget allows 20 %), and what each
upstream received.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.app import create_app
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from policies.load import loads

SERVICE_S = 0.020
STALL_S = 30.0
TOTAL_BUDGET_MS = 2000
REPLY = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})


class Upstream:
    def __init__(self, name: str, *, fail_share: float = 0.0, stall: bool = False,
                 seed: int = 7) -> None:
        self.name, self.fail_share, self.stall = name, fail_share, stall
        self.random = random.Random(seed)
        self.received = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.received += 1
        if self.stall:
            await asyncio.sleep(STALL_S)
        if self.random.random() < self.fail_share:
            return web.json_response({"error": {"message": "overloaded", "type": "server_error",
                                                "code": None, "param": None}}, status=503)
        await asyncio.sleep(SERVICE_S)
        return web.Response(body=REPLY, content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/health", lambda _: web.json_response({"status": "ok"}))
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def policy_text(upstreams: list[Upstream], resilient: bool) -> str:
    backends = "\n".join(
        f"  {u.name}: {{type: openai, url: '{u.url}', deployment: shared, "
        f"{'timeouts: {first_byte_s: 0.3}, ' if u.stall else ''}"
        f"models: {{m: {{input_usd_per_mtok: {price}, output_usd_per_mtok: {price}}}}}}}"
        for price, u in enumerate(upstreams, start=1))
    resilience = """
resilience:
  retries: {max_per_target: 1}""" if resilient else """
resilience:
  retries: {max_per_target: 0}
  outlier_detection: {enabled: false}"""
    return f"""
version: 1
backends:
{backends}
routes:
  chat:
    targets: [{", ".join(f"{u.name}/m" for u in upstreams)}]
    latency_budget: {{total_ms: {TOTAL_BUDGET_MS}}}
auth: {{anonymous: {{enabled: true}}}}
defaults: {{limits: {{requests_per_minute: 1000000, tokens_per_minute: 100000000}}}}
{resilience}"""


async def run(resilient: bool, requests: int, concurrency: int) -> dict[str, Any]:
    upstreams = [Upstream("flaky", fail_share=0.5), Upstream("stalled", stall=True),
                 Upstream("healthy")]
    for upstream in upstreams:
        await upstream.start()
    runner = GatewayRunner(create_app(loads(policy_text(upstreams, resilient)),
                                      Settings(port=0, supervise=False)),
                           access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    body = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    latencies: list[float] = []
    statuses: list[int] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            queue.get_nowait()
            started = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                await response.read()
                statuses.append(response.status)
            latencies.append(time.perf_counter() - started)

    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        async with session.get(url + "/metrics") as response:
            metrics = await response.text()
    retries = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("routegate_retries_total{"))
    await runner.cleanup()
    for upstream in upstreams:
        await upstream.stop()
    ordered = sorted(latencies)
    return {
        "success": statuses.count(200) / len(statuses),
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000,
        "attempts": sum(u.received for u in upstreams) / requests,
        "retries": retries / requests,
        "received": {u.name: u.received for u in upstreams},
        "elapsed_s": elapsed,
    }


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the 504s of the run without retries, one line each
    print(f"{args.requests} requests, {args.concurrency} at a time; route budget "
          f"{TOTAL_BUDGET_MS} ms; flaky fails 50 %, stalled never answers, healthy answers")
    header = (f"{'set-up':<28} {'success':>8} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'attempts/req':>13} {'retries/req':>12}  received (flaky/stalled/healthy)")
    print(header)
    for resilient in (True, False):
        result = await run(resilient, args.requests, args.concurrency)
        name = "retries + ejection on" if resilient else "retries and ejection off"
        received = result["received"]
        print(f"{name:<28} {result['success']:>8.2%} {result['p50_ms']:>8.1f} "
              f"{result['p99_ms']:>8.1f} {result['attempts']:>13.2f} {result['retries']:>12.1%}"
              f"  {received['flaky']}/{received['stalled']}/{received['healthy']}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
