"""`GET /metrics`: the Prometheus exposition of `GatewayMetrics`; behind an admin key
when the policy sets `server.metrics_auth`, or leaves it unset and lists admin keys
(the series name tenants, routes and backends)."""

from __future__ import annotations

from aiohttp import web

from gateway.core.auth import require_admin
from gateway.core.live_policy import LivePolicy
from gateway.telemetry.metrics import GatewayMetrics


def metrics_route(metrics: GatewayMetrics, path: str = "/metrics", *,
                  policy: LivePolicy | None = None) -> web.RouteDef:
    async def exposition(request: web.Request) -> web.Response:
        if policy is not None:
            current = policy.current
            needs_key = current.file.server.metrics_auth
            if needs_key is None:
                needs_key = bool(current.admin_key_hashes)
            if needs_key:
                require_admin(request, current)
        # Rendered on the loop's thread, the one that updates the series (no locks).
        body, content_type = metrics.render()
        response = web.Response(body=body)
        # The exposition content type carries `version=` and `charset=`: set it verbatim.
        response.headers["Content-Type"] = content_type
        return response

    return web.get(path, exposition)
