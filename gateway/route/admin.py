"""`GET /admin/backends`: each backend's state and each of its targets' health.

    {"backends": {"local": {"status": "ready",
                            "targets": {"local/llama": {"state": "ejected",
                                                        "consecutive_failures": 0,
                                                        "ejections_in_a_row": 2, ...}}}}}

`health` is the backend's active health checks (`null` when it has none). A target's
`state` is `in_service`, `ejected` (outlier ejection: failures in a row), `probing`
(its ejection is over and one request is finding out) or `degraded` (ejected, but the
only target a tenant's compliance rules allow on some route, so it keeps serving that
tenant while it passes its health checks; `degraded_for` names "tenant on route").
Needs an admin key. The same states feed `/readyz` (`backends`, `ejected`) and the
dashboard's data (`targets`).
"""

from __future__ import annotations

from time import monotonic
from typing import Any

import orjson
from aiohttp import web

from gateway.core.auth import require_admin
from gateway.core.live_policy import LivePolicy
from gateway.route.health import HEALTH
from gateway.route.hook import ROUTING
from gateway.route.replica_watch import FLEETS
from gateway.upstream.pool import UpstreamPool
from policies.load import Policy

_IN_SERVICE = {"state": "in_service", "consecutive_failures": 0, "ejections_in_a_row": 0,
               "ejections_total": 0, "ejected_for_s": None}


def target_states(app: web.Application, policy: Policy) -> dict[str, dict[str, Any]]:
    """Every enabled target of `policy`: ejection state, in-flight count, error rate."""
    routing = app.get(ROUTING)
    if routing is None:
        return {key: dict(_IN_SERVICE) for key in policy.targets}
    report = routing.ejections.report(monotonic())
    stats = routing.stats.snapshot()
    sole = routing.sole_targets(policy) if report else {}
    states = {}
    for key in policy.targets:
        target = stats.target(key)
        state = {**report.get(key, _IN_SERVICE), "in_flight": target.in_flight,
                 "queue_depth": target.queue_depth, "error_rate": round(target.error_rate, 3)}
        if state["state"] in ("ejected", "probing") and key in sole:
            # out for everyone else, still serving the tenants it is all they may use
            state["state"], state["degraded_for"] = "degraded", sole[key]
        states[key] = state
    return states


def backend_states(app: web.Application, policy: Policy,
                   pool: UpstreamPool) -> dict[str, str]:
    """`ready`, or why not, per enabled backend: the pool's view, then its health checks."""
    states = pool.status(policy)
    checker = app.get(HEALTH)
    if checker is not None:
        for name, error in checker.unhealthy().items():
            if states.get(name) == "ready":
                states[name] = f"failing its health checks ({error})"
    return states


def out_of_service(app: web.Application, policy: Policy) -> list[str]:
    """Targets ejected or being probed now (for `/readyz`)."""
    routing = app.get(ROUTING)
    if routing is None:
        return []
    return sorted(key for key in routing.ejections.ejected_keys(monotonic())
                  if key in policy.targets)


def install(app: web.Application, live: LivePolicy, pool: UpstreamPool) -> None:
    async def get_backends(request: web.Request) -> web.Response:
        policy = live.current
        require_admin(request, policy)
        states = target_states(request.app, policy)
        checker = request.app.get(HEALTH)
        health = checker.report(monotonic()) if checker is not None else {}
        fleets = request.app.get(FLEETS)
        replicas = fleets.report(monotonic()) if fleets is not None else {}
        backends = {name: {"status": status, "health": health.get(name), "targets": {
            key: state for key, state in states.items()
            if policy.targets[key].backend_name == name}}
            for name, status in backend_states(request.app, policy, pool).items()}
        for name, fleet in replicas.items():  # per replica: load, health, cache hits
            if name in backends:
                backends[name]["fleet"] = fleet
        return web.Response(body=orjson.dumps({"backends": backends}),
                            content_type="application/json")

    app.router.add_get("/admin/backends", get_backends)
