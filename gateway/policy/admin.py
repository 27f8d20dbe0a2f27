"""`/admin/policy`: what policy runs, reload it on demand, and what a shadow policy would do.

    GET  /admin/policy          active version hash, loaded_at, source, last_error
    POST /admin/policy/reload   validate the file again and swap it in if valid
    GET  /admin/policy/shadow   decisions where the shadow policy differs (`--shadow-policy`)

All need an admin key (`auth.admin_keys` of the running policy).
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from aiohttp import web

from gateway.core.auth import require_admin
from gateway.core.errors import GatewayError, NotFound
from gateway.core.hooks import Observer
from gateway.core.live_policy import LivePolicy
from gateway.plugin import Provides, Wiring
from gateway.policy.shadow import ShadowPolicy
from gateway.policy.watch import PolicyReloader, ReloadResult, reload_context
from policies.load import load

LIVE = web.AppKey("routegate.policy_admin.live", LivePolicy)
RELOADER = web.AppKey("routegate.policy_reloader", PolicyReloader)
SHADOW = web.AppKey("routegate.policy_shadow", ShadowPolicy)


class InvalidPolicy(GatewayError):
    """A reload found the file invalid; the running policy is unchanged."""

    status: ClassVar[int] = 422
    code: ClassVar[str | None] = "invalid_policy"
    type: ClassVar[str] = "invalid_request_error"

    def __init__(self, result: ReloadResult) -> None:
        super().__init__(str(result.error))
        self.result = result

    def body(self) -> dict[str, object]:
        return {**super().body(), "reload": self.result.to_dict()}


def install(wiring: Wiring) -> Provides:
    """Wire hot reload (when the policy came from a file), shadow mode (when asked for)
    and the admin endpoints. Both counters live in the app's own metrics registry."""
    app, live, settings, metrics = wiring.app, wiring.live, wiring.settings, wiring.metrics
    observers: list[Observer] = []
    app[LIVE] = live
    if settings.policy_path is not None:
        reloader = PolicyReloader(live, settings.policy_path, reloads=metrics.policy_reloads)
        app[RELOADER] = reloader
        app.cleanup_ctx.append(reload_context(reloader, watch=settings.watch_policy))
    if settings.shadow_policy_path is not None:
        # Same token counter and the same live statistics as the live decision.
        shadow = ShadowPolicy(load(settings.shadow_policy_path), tokens=wiring.tokens,
                              stats=wiring.stats.snapshot, registry=metrics.registry)
        app[SHADOW] = shadow
        observers.append(shadow)
    app.router.add_get("/admin/policy", get_policy)
    app.router.add_post("/admin/policy/reload", post_reload)
    app.router.add_get("/admin/policy/shadow", get_shadow)
    return Provides(observers=tuple(observers))


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


async def get_policy(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    require_admin(request, live.current)
    reloader = request.app.get(RELOADER)
    if reloader is not None:
        return _json(reloader.status())
    policy = live.current
    return _json({"version_hash": policy.version_hash, "source": policy.source, "path": None,
                  "loaded_at": None, "last_error": None, "last_attempt": None,
                  "warnings": [issue.as_dict() for issue in policy.warnings]})


async def post_reload(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    require_admin(request, live.current)
    reloader = request.app.get(RELOADER)
    if reloader is None:
        raise NotFound("This gateway runs a policy that was not read from a file; "
                       "there is nothing to reload.", code="no_policy_file")
    result = await reloader.reload("api")
    if result.error is not None:
        raise InvalidPolicy(result)
    return _json(result.to_dict())


async def get_shadow(request: web.Request) -> web.Response:
    live = request.app[LIVE]
    require_admin(request, live.current)
    shadow = request.app.get(SHADOW)
    if shadow is None:
        raise NotFound("No shadow policy is running (start with `--shadow-policy FILE`).",
                       code="no_shadow_policy")
    return _json(shadow.report())
