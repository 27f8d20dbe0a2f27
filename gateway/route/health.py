"""Active health checks: each backend probed on its own schedule, its targets taken out
of routing while it fails (`backends.<name>.health_check`).

    dedicated backend   GET <scheme://host:port>/health      (local_backend, vLLM, TGI)
    shared API          off unless enabled; then GET <url>/models (cheap, authenticated)

A check passes on any 2xx within `timeout_s`. Every result goes into the one health
model of the backend's targets (`routing.outliers.Ejections`): `unhealthy_threshold`
failures in a row take them down (routing's `backend_unhealthy`), `healthy_threshold`
passes in a row bring them back, and a check is the probe of a target whose ejection
time is up. Each check
is bounded by its timeout and at most one runs per backend at a time; the loop is owned
by the app's `cleanup_ctx`. Between checks it sleeps until the next one is due, woken
early by a policy swap or a check that ends (not a 10 Hz poll: an idle gateway stays
idle).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from gateway.core.background import Wakeup, run_while_serving
from gateway.core.live_policy import LivePolicy
from gateway.core.log_text import escaped
from gateway.upstream.pool import UpstreamPool
from policies.schema import Backend
from routing.outliers import Ejections

log = logging.getLogger("routegate.backend_health")

RETRY_S = 0.1  # how soon a backend that has no client yet (launching) is looked at again


@dataclass(slots=True)
class BackendHealth:
    healthy: bool = True
    passes: int = 0  # in a row
    failures: int = 0  # in a row
    last_error: str | None = None
    checked_at: float | None = None  # monotonic
    due_at: float = 0.0

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"state": "healthy" if self.healthy else "unhealthy",
                "consecutive_passes": self.passes, "consecutive_failures": self.failures,
                "last_error": self.last_error,
                "checked_s_ago": None if self.checked_at is None
                else round(now - self.checked_at, 3)}


def checks_enabled(backend: Backend) -> bool:
    enabled = backend.health_check.enabled
    return backend.deployment == "dedicated" if enabled is None else enabled


def check_url(backend: Backend, base_url: str) -> str:
    """Where to check `backend`, whose API is at `base_url`."""
    parts = urlsplit(base_url)
    path = backend.health_check.path
    if path is None:
        if backend.deployment == "dedicated":
            path = "/health"
        else:
            return base_url.rstrip("/") + "/models"
    return f"{parts.scheme}://{parts.netloc}{path}"


def auth_headers(backend: Backend) -> dict[str, str]:
    key = backend.api_key.get_secret_value() if backend.api_key is not None else ""
    if not key:
        return {}
    if backend.type == "anthropic":
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}
    return {"Authorization": f"Bearer {key}"}


class HealthChecker:
    def __init__(self, live: LivePolicy, pool: UpstreamPool, ejections: Ejections) -> None:
        self.live, self.pool, self.ejections = live, pool, ejections
        self.backends: dict[str, BackendHealth] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self.wakeup = Wakeup()  # a swap or a finished check: look at what is due now
        live.on_swap(lambda _: self.wakeup.set())

    def report(self, now: float) -> dict[str, dict[str, Any]]:
        return {name: health.to_dict(now) for name, health in sorted(self.backends.items())}

    def unhealthy(self) -> dict[str, str]:
        """Backends failing their checks now, with the last error."""
        return {name: health.last_error or "failing its health checks"
                for name, health in self.backends.items() if not health.healthy}

    def start_due(self, session: aiohttp.ClientSession, now: float) -> float:
        """Start the checks due at `now`; when the next one not running is due."""
        policy = self.live.current
        next_due = math.inf
        for name, backend in policy.file.backends.items():
            if not backend.enabled or not checks_enabled(backend) or name in self._running \
                    or backend.is_fleet:  # checked per replica (replica_watch.py)
                continue
            health = self.backends.setdefault(name, BackendHealth())
            if now < health.due_at:
                next_due = min(next_due, health.due_at)
                continue
            adapter = self.pool.get(name, backend)
            if adapter is None:  # a launched backend not up yet: the supervisor's to report
                next_due = min(next_due, now + RETRY_S)
                continue
            health.due_at = now + backend.health_check.interval_s
            task = asyncio.create_task(self.check(session, name, backend, adapter.base_url))
            self._running[name] = task
            task.add_done_callback(self._finished)
        return next_due

    async def check(self, session: aiohttp.ClientSession, name: str, backend: Backend,
                    base_url: str) -> None:
        settings = backend.health_check
        error = None
        try:
            async with session.get(check_url(backend, base_url), headers=auth_headers(backend),
                                   timeout=aiohttp.ClientTimeout(total=settings.timeout_s),
                                   allow_redirects=False) as response:
                if not 200 <= response.status < 300:
                    error = f"health check answered HTTP {response.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            error = f"health check failed: {exc.__class__.__name__}"
        self.record(name, backend, error, time.monotonic())

    def _finished(self, task: asyncio.Task[None]) -> None:
        for name, running in list(self._running.items()):
            if running is task:
                del self._running[name]
        self.wakeup.set()  # its next check is due from now on

    def record(self, name: str, backend: Backend, error: str | None, now: float) -> None:
        health = self.backends.setdefault(name, BackendHealth())
        health.checked_at, health.last_error = now, error
        settings = backend.health_check
        if error is None:
            health.passes, health.failures = health.passes + 1, 0
            if not health.healthy and health.passes >= settings.healthy_threshold:
                health.healthy = True
                log.info("backend %s passes its health checks again", name)
        else:
            health.passes, health.failures = 0, health.failures + 1
            if health.healthy and health.failures >= settings.unhealthy_threshold:
                health.healthy = False
                log.warning("backend %s is failing its health checks: %s", name,
                            escaped(error))  # may quote the backend's answer
        detection = self.live.current.file.resilience.outlier_detection
        for model in backend.models:
            key = f"{name}/{model}"
            if error is None:
                self.ejections.check_passed(key, now, back_up=health.healthy)
            else:
                self.ejections.check_failed(key, now, detection, down=not health.healthy)

    async def run(self) -> None:
        async with aiohttp.ClientSession() as session:
            try:
                while True:
                    now = time.monotonic()
                    await self.wakeup.wait(self.start_due(session, now) - now)
            finally:
                running = list(self._running.values())
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)


HEALTH = web.AppKey("routegate.backend_health", HealthChecker)


def install(app: web.Application, live: LivePolicy, pool: UpstreamPool,
            ejections: Ejections) -> HealthChecker:
    checker = HealthChecker(live, pool, ejections)
    app[HEALTH] = checker

    run_while_serving(app, "routegate.backend_health", checker.run)
    return checker
