"""Limits in the app: the admission hook, headers on every response, `/admin/usage`.

    GET /admin/usage?tenant=acme   requests, tokens and spend this day and month
                                   (admin key; 503 while a Redis store is out)
    GET /admin/limits              the limit store: up, or out and why (unreachable,
                                   slow), and its calls' latency (admin key)

The admission puts the `x-ratelimit-*` headers in the request's `response_headers`,
so they reach every response of an admitted request — JSON, streamed, or an error
after admission; a 429 carries its own on the error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import orjson
from aiohttp import web

from gateway.core.auth import require_admin
from gateway.core.errors import BadRequest
from gateway.core.live_policy import LivePolicy
from gateway.limits.admission import LimitsAdmission
from gateway.limits.failover import FailoverStore
from gateway.limits.limiter import Limiter, LimitStoreUnavailable
from gateway.limits.store import LimitStore, StoreUnavailable
from gateway.limits.store_metrics import StoreCollector
from gateway.limits.wiring import open_store, store_url
from gateway.plugin import Provides, Wiring

LIMITER = web.AppKey("routegate.limiter", Limiter)
_LIVE = web.AppKey("routegate.limits.live", LivePolicy)


def install(wiring: Wiring, *, store: LimitStore | None = None,
            clock: Callable[[], float] | None = None) -> Provides:
    """Wire the store named by the policy (`redis_url`, from `ROUTEGATE_REDIS_URL`, wins).

    The store is chosen once, at start-up: a reloaded policy changes limits and budgets
    at once, but the `limits:` section (store, its failure mode, the replica count) is
    pinned, and a reload that changes it reports that a restart is needed.
    """
    app, live, redis_url = wiring.app, wiring.live, wiring.settings.redis_url
    settings = live.current.file.limits
    if store is None:
        store = open_store(settings, url=store_url(settings, redis_url))
    live.pin("limits.store", lambda policy: store_url(policy.file.limits, redis_url))
    live.pin("limits.on_store_error", lambda policy: policy.file.limits.on_store_error)
    live.pin("limits.replicas", lambda policy: policy.file.limits.replicas)
    live.pin("limits.store_latency", lambda policy: policy.file.limits.store_latency)
    limiter = Limiter(store) if clock is None else Limiter(store, clock=clock)
    if isinstance(store, FailoverStore):
        wiring.metrics.registry.register(StoreCollector(store))
    app[LIMITER] = limiter
    app[_LIVE] = live
    app.cleanup_ctx.append(_close_store)
    app.router.add_get("/admin/usage", get_usage)
    app.router.add_get("/admin/limits", get_limits)
    return Provides(admission=LimitsAdmission(limiter, wiring.tokens))


async def _close_store(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[LIMITER].aclose()


async def get_usage(request: web.Request) -> web.Response:
    policy = request.app[_LIVE].current
    require_admin(request, policy)
    tenant = request.query.get("tenant")
    if not tenant:
        raise BadRequest("Name the tenant: GET /admin/usage?tenant=NAME.", param="tenant")
    try:
        report = await request.app[LIMITER].usage(policy, tenant)
    except StoreUnavailable as exc:
        raise LimitStoreUnavailable("Usage cannot be read: the limit store is unavailable.") \
            from exc
    return web.Response(body=orjson.dumps(report), content_type="application/json")


async def get_limits(request: web.Request) -> web.Response:
    require_admin(request, request.app[_LIVE].current)
    store = request.app[LIMITER].store
    report = store.status() if isinstance(store, FailoverStore) \
        else {"store": store.name, "up": True}
    return web.Response(body=orjson.dumps(report), content_type="application/json")
