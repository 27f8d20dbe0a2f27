"""Dedicated backends' own view of their load, read from their Prometheus `/metrics`.

local_backend and vLLM both export `vllm:num_requests_waiting`,
`vllm:num_requests_running` and `vllm:kv_cache_usage_perc` (older vLLM:
`vllm:gpu_cache_usage_perc`). Polling them lets routing see load this gateway
did not cause (other replicas, direct clients). A backend that does not answer, or
answers without these gauges, is simply not reported: routing falls back to the
gateway's own in-flight counts, and stale reports expire (`routing.stats.LOAD_FRESH_S`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping

import aiohttp
from aiohttp import web

from gateway.core.background import run_while_serving
from gateway.core.live_policy import LivePolicy
from gateway.upstream.pool import UpstreamPool
from routing.stats import LiveStats

log = logging.getLogger("routegate.backend_load")

POLL_INTERVAL_S = 2.0
POLL_TIMEOUT_S = 1.0
MAX_METRICS_BYTES = 1 << 20  # a metrics page is a few kB; never buffer more than this
_WAITING = ("vllm:num_requests_waiting",)
_RUNNING = ("vllm:num_requests_running",)
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def parse_load(text: str) -> tuple[int | None, int | None, float | None]:
    """(waiting, running, kv_cache_use) from Prometheus text; summed over label sets
    (one per model), KV use as the maximum."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        if name not in (*_WAITING, *_RUNNING, *_KV):
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if not math.isfinite(number):
            continue
        if name in _KV:
            sums[name] = max(sums.get(name, 0.0), number)
        else:
            sums[name] = sums.get(name, 0.0) + number
    return (_first_int(sums, _WAITING), _first_int(sums, _RUNNING),
            next((sums[name] for name in _KV if name in sums), None))


def _first_int(sums: Mapping[str, float], names: tuple[str, ...]) -> int | None:
    return next((round(sums[name]) for name in names if name in sums), None)


def metrics_url(base_url: str) -> str:
    """`http://host:port/v1` → `http://host:port/metrics`."""
    base = base_url.rstrip("/")
    return (base[:-3] if base.endswith("/v1") else base) + "/metrics"


class BackendLoadPoller:
    def __init__(self, live: LivePolicy, pool: UpstreamPool, stats: LiveStats, *,
                 interval_s: float = POLL_INTERVAL_S, timeout_s: float = POLL_TIMEOUT_S) -> None:
        self.live, self.pool, self.stats = live, pool, stats
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        policy = self.live.current
        jobs = []
        for name, backend in policy.file.backends.items():
            if not backend.enabled or backend.deployment != "dedicated" or backend.is_fleet:
                continue  # a fleet's replicas are read one by one (replica_watch.py)
            adapter = self.pool.get(name, backend)
            if adapter is None:
                continue
            keys = [f"{name}/{model}" for model in backend.models]
            jobs.append(self._poll(session, metrics_url(adapter.base_url), keys))
        await asyncio.gather(*jobs)

    async def _poll(self, session: aiohttp.ClientSession, url: str, keys: list[str]) -> None:
        try:
            async with session.get(url, timeout=self.timeout) as response:
                if response.status != 200:
                    return
                data = await response.content.read(MAX_METRICS_BYTES)
        except (TimeoutError, aiohttp.ClientError) as exc:
            log.debug("backend load from %s unavailable: %r", url, exc)
            return
        waiting, running, kv_use = parse_load(data.decode(errors="replace"))
        if waiting is None and running is None and kv_use is None:
            return
        now = time.monotonic()  # the routing statistics' clock (routing_hook)
        for key in keys:
            self.stats.set_backend_load(key, now, waiting=waiting, running=running,
                                        kv_cache_use=kv_use)

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.interval_s)


def install(app: web.Application, live: LivePolicy, pool: UpstreamPool,
            stats: LiveStats) -> BackendLoadPoller:
    """Poll for the app's lifetime; the task is owned by `cleanup_ctx`."""
    poller = BackendLoadPoller(live, pool, stats)

    run_while_serving(app, "routegate.backend_load", poller.run)
    return poller
