"""`GET /dashboard`: a live page over the gateway's recent traffic.

Static HTML + one JS file shipped in the package (no build step, no external
assets, so it works air-gapped), polling `GET /dashboard/data` — the JSON
summary from `LiveWindow` — every few seconds.

The data names tenants' routes and spend: when the policy lists admin keys, it is
served to an admin key only. The page takes the key from its URL fragment
(`/dashboard#key=…`), which browsers never send to a server or write to a log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.core.auth import require_admin
from gateway.core.live_policy import LivePolicy
from gateway.route.admin import target_states
from gateway.route.replica_watch import FLEETS
from gateway.telemetry.live import LiveWindow

HERE = Path(__file__).resolve().parent
# Read once at import: two small files, and a handler must not touch the disk.
_PAGE = (HERE / "index.html").read_bytes()
_SCRIPT = (HERE / "dashboard.js").read_bytes()
_NO_STORE = {"Cache-Control": "no-store"}


def dashboard_routes(live: LiveWindow, *, policy: LivePolicy | None = None,
                     state: Callable[[], dict[str, Any]] | None = None,
                     prefix: str = "/dashboard") -> list[web.RouteDef]:
    """`state`: more for the data beside the traffic window (the running policy, each
    backend's health, in-flight and queued requests)."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=_PAGE, content_type="text/html", charset="utf-8")

    async def script(request: web.Request) -> web.Response:
        return web.Response(body=_SCRIPT, content_type="application/javascript", charset="utf-8")

    async def data(request: web.Request) -> web.Response:
        if policy is not None and policy.current.admin_key_hashes:
            require_admin(request, policy.current)
        data = live.snapshot()
        if state is not None:
            data.update(state())
        if policy is not None:  # each target's ejection state, in-flight count, error rate
            data["targets"] = target_states(request.app, policy.current)
        fleets = request.app.get(FLEETS)
        if fleets is not None and fleets.fleets:  # per replica: load, health, cache hits
            data["fleets"] = fleets.report(time.monotonic())
        return web.Response(body=orjson.dumps(data), content_type="application/json",
                            headers=_NO_STORE)

    return [
        web.get(prefix, page),
        web.get(f"{prefix}/dashboard.js", script),
        web.get(f"{prefix}/data", data),
    ]
