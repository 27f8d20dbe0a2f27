"""Watching fleets: each replica's `/metrics` and `/health`, and DNS for `resolve: all`.

Every `fleet.poll_interval_s` each replica's `/metrics` gives its waiting and running
requests and KV-cache use (local_backend's and vLLM's `vllm:` gauges, `load.py`), and
its `/health` feeds the replica's health: `health_check.unhealthy_threshold` failures
in a row take it out until `healthy_threshold` pass, and a passing check is the probe of
a replica whose ejection time is up. Every `fleet.resolve_interval_s` a `resolve: all`
URL's host name is resolved again: an address that appears is a replica, one that is
gone leaves. The best replica's load (the least busy in service) is what routing's
statistics see for the backend's targets, so the predicted TTFT of a fleet is that of
the replica a request would go to.

Each poll is bounded by its timeout; the loop is owned by the app's `cleanup_ctx` and
sleeps until the next poll or lookup is due (or a policy swap), so it costs nothing
where no backend is a fleet.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from gateway.core.background import Wakeup, run_while_serving
from gateway.core.live_policy import LivePolicy
from gateway.route.health import check_url
from gateway.route.hook import RoutingHook
from gateway.route.load import MAX_METRICS_BYTES, metrics_url, parse_load
from gateway.route.prefix_events import follow
from gateway.route.replica_call import ReplicaChooser
from gateway.route.replica_metrics import ReplicaCollector
from gateway.route.replicas import Fleet, Fleets, Replica, replica_name
from gateway.telemetry.metrics import GatewayMetrics
from routing.replica_pick import in_service
from routing.stats import LiveStats

log = logging.getLogger("routegate.replicas")

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_all(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (a headless service's pods), sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def replica_urls(url: str, addresses: list[str]) -> dict[str, str]:
    """`http://name:8000/v1` and its addresses → {"10.0.0.5:8000": "http://10.0.0.5:8000/v1"}."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    out = {}
    for address in addresses:
        host = f"[{address}]" if ":" in address else address
        base = f"{parts.scheme}://{host}:{port}{parts.path}".rstrip("/")
        out[replica_name(base)] = base
    return out


class FleetWatcher:
    def __init__(self, live: LivePolicy, fleets: Fleets, stats: LiveStats,
                 resolver: Resolver = resolve_all) -> None:
        self.live, self.fleets, self.stats, self.resolver = live, fleets, stats, resolver
        self._due: dict[tuple[str, str], float] = {}  # (backend, poll|resolve) → when
        self._checks: dict[str, tuple[int, int, bool]] = {}  # replica → passes, fails, up
        self.wakeup = Wakeup()  # a policy swap may bring a fleet: look at once
        live.on_swap(lambda _: self.wakeup.set())

    async def tick(self, session: aiohttp.ClientSession, now: float) -> float:
        """Resolve and poll what is due at `now`; when the next of them is due."""
        jobs = []
        next_due = math.inf
        due = self._due
        for name, fleet in list(self.fleets.fleets.items()):
            settings = fleet.backend.fleet
            if fleet.backend.resolve == "all":
                if now >= due.get((name, "resolve"), 0.0):
                    due[(name, "resolve")] = now + settings.resolve_interval_s
                    jobs.append(self.resolve(fleet))
                next_due = min(next_due, due[(name, "resolve")])
            if now >= due.get((name, "poll"), 0.0):
                due[(name, "poll")] = now + settings.poll_interval_s
                jobs.append(self.poll(session, fleet))
            next_due = min(next_due, due[(name, "poll")])
        if jobs:
            await asyncio.gather(*jobs)
        return next_due

    async def resolve(self, fleet: Fleet) -> None:
        url = fleet.backend.url
        if url is None:
            return
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            async with asyncio.timeout(fleet.backend.timeouts.connect_s):
                addresses = await self.resolver(parts.hostname or "", port)
        except (OSError, TimeoutError) as exc:
            # a failed lookup changes nothing: the replicas known keep serving
            log.warning("backend %s: resolving %s failed: %r", fleet.name, parts.hostname, exc)
            return
        fleet.set_urls(replica_urls(url, addresses), "dns")

    async def poll(self, session: aiohttp.ClientSession, fleet: Fleet) -> None:
        known = {name for each in self.fleets.fleets.values() for name in each.replicas}
        for gone in [name for name in self._checks if name not in known]:
            del self._checks[gone]
        await asyncio.gather(*(self._poll_replica(session, fleet, replica)
                               for replica in list(fleet.replicas.values())))
        self._publish_best(fleet)

    async def _poll_replica(self, session: aiohttp.ClientSession, fleet: Fleet,
                            replica: Replica) -> None:
        settings = fleet.backend.health_check
        timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
        error = None
        try:
            async with session.get(check_url(fleet.backend, replica.url),
                                   timeout=timeout, allow_redirects=False) as response:
                if not 200 <= response.status < 300:
                    error = f"HTTP {response.status}"
            async with session.get(metrics_url(replica.url), timeout=timeout) as response:
                text = (await response.content.read(MAX_METRICS_BYTES)).decode(
                    errors="replace") if response.status == 200 else ""
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            error, text = exc.__class__.__name__, ""
        now = time.monotonic()
        if text:
            replica.waiting, replica.running, replica.kv_use = parse_load(text)
            replica.load_at = now
        self._record_check(fleet, replica.name, error, now)
        if fleet.precise and error is None:
            await follow(session, fleet, replica, timeout)

    def _record_check(self, fleet: Fleet, name: str, error: str | None, now: float) -> None:
        settings = fleet.backend.health_check
        passes, fails, up = self._checks.get(name, (0, 0, True))
        if error is None:
            passes, fails = passes + 1, 0
            up = up or passes >= settings.healthy_threshold
            fleet.ejections.check_passed(name, now, back_up=up)
        else:
            passes, fails = 0, fails + 1
            up = up and fails < settings.unhealthy_threshold
            fleet.ejections.check_failed(
                name, now, self.live.current.file.resilience.outlier_detection, down=not up)
        self._checks[name] = (passes, fails, up)

    def _publish_best(self, fleet: Fleet) -> None:
        """The least busy replica in service is what routing predicts the backend by."""
        now = time.monotonic()
        views = fleet.views(now)
        serving = in_service(views, now, len(views) - 1)
        if not serving:
            return
        best = min(serving, key=lambda view: (view.busy, view.kv_use or 0.0))
        if best.waiting is None and best.running is None and best.kv_use is None:
            return
        for model in fleet.backend.models:
            self.stats.set_backend_load(f"{fleet.name}/{model}", now, waiting=best.waiting,
                                        running=best.running, kv_cache_use=best.kv_use)

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                next_due = await self.tick(session, time.monotonic())
                await self.wakeup.wait(next_due - time.monotonic())


FLEETS = web.AppKey("routegate.fleets", Fleets)
WATCHER = web.AppKey("routegate.fleet_watcher", FleetWatcher)


def install(app: web.Application, live: LivePolicy, routing: RoutingHook,
            metrics: GatewayMetrics, resolver: Resolver | None = None) -> ReplicaChooser:
    """Fleets for the live policy (`app[FLEETS]`: the supervisor tells them of launched
    replicas), the replica choice on every attempt, and the watcher (owned by
    `cleanup_ctx`). `resolver` replaces DNS (tests)."""
    fleets = Fleets()
    fleets.follow(live.current)
    live.on_swap(fleets.follow)
    chooser = ReplicaChooser(fleets)
    fleets.tokens = metrics.prompt_tokens  # each replica's figures in /admin/backends
    metrics.prompt_tokens.prune = chooser.forget_gone_replicas
    metrics.registry.register(ReplicaCollector(chooser, metrics.prompt_tokens))
    routing.cached_share = chooser.cached_share  # the prefill a held prefix saves
    watcher = FleetWatcher(live, fleets, routing.stats, resolver or resolve_all)
    app[FLEETS], app[WATCHER] = fleets, watcher

    run_while_serving(app, "routegate.fleet_watcher", watcher.run)
    return chooser
