"""`create_app`: every long-lived object, wired once and stored under a typed AppKey.

Resources (upstream sessions, supervised children) open and close in
`app.cleanup_ctx`, in order, so a test or `routegate serve` gets the same lifecycle.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.api.anthropic import add_routes as add_anthropic_routes
from gateway.api.openai import PIPELINE, add_routes
from gateway.api.responses import RESPONSES_STATE
from gateway.api.responses import add_routes as add_responses_routes
from gateway.api.responses_state import StoredResponses
from gateway.blob_store import open_blobs
from gateway.cache import install as install_cache
from gateway.compat import check_aiohttp
from gateway.errors import error_middleware
from gateway.hooks import Hooks
from gateway.launch.board import board_context
from gateway.launch.supervisor import Supervisor
from gateway.limits.http import install as install_limits
from gateway.pipeline.steps import Pipeline
from gateway.policy.admin import install_policy_admin
from gateway.policy.live import LivePolicy
from gateway.queueing.http import install as install_queues
from gateway.route.admin import install as install_backends_admin
from gateway.route.health import install as install_backend_health
from gateway.route.hook import install as install_routing
from gateway.route.replica_launch import FleetLaunches
from gateway.route.replica_watch import install as install_fleets
from gateway.route.replicas import Fleets
from gateway.server.drain import DRAIN, Drain
from gateway.settings import Settings
from gateway.telemetry.install import install_telemetry
from gateway.telemetry.service import Telemetry
from gateway.telemetry.state_metrics import StateCollector
from gateway.upstream.connect_probe import READINESS, ConnectProbe
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.tls import warm as warm_tls
from policies.load import Policy

LIVE_POLICY = web.AppKey("routegate.live_policy", LivePolicy)
UPSTREAMS = web.AppKey("routegate.upstreams", UpstreamPool)
HOOKS = web.AppKey("routegate.hooks", Hooks)
SETTINGS = web.AppKey("routegate.settings", Settings)
SUPERVISOR = web.AppKey("routegate.supervisor", Supervisor)

# Bodies are limited by the policy's `server.max_body_bytes`, checked in the pipeline
# (it can change on reload); aiohttp's own cap only has to stay out of the way.
_AIOHTTP_BODY_CAP = 1 << 30


def create_app(policy: Policy, settings: Settings | None = None, *,
               telemetry: Telemetry | None = None) -> web.Application:
    """`telemetry`: tracer provider, metrics, access log (default: metrics only, no
    trace export); `routegate serve` builds it from the `OTEL_*` environment.
    `IncompatibleAiohttp` when the installed aiohttp is not one the gateway supports."""
    check_aiohttp()
    settings = settings or Settings()
    app = web.Application(middlewares=[error_middleware], client_max_size=_AIOHTTP_BODY_CAP)
    live = LivePolicy(policy)
    pool = UpstreamPool()
    hooks = Hooks()
    if telemetry is not None:
        hooks.telemetry = telemetry
    app[SETTINGS] = settings
    app[LIVE_POLICY] = live
    app[UPSTREAMS] = pool
    app[HOOKS] = hooks
    app[DRAIN] = Drain()
    hooks.observers.append(app[DRAIN])  # the requests a drain waits for (and cuts)
    fleets = Fleets()  # dedicated backends' replicas (launched ones told by the supervisor)
    launches = FleetLaunches(pool, fleets)  # children `name#i` are a fleet's replicas
    app[SUPERVISOR] = Supervisor(policy, launches, settings)
    live.on_swap(app[SUPERVISOR].follow)  # a reload starts and stops `launch:` backends
    live.on_swap(_warm_tls_soon, recheck=True)
    pool.follow(policy)
    # backends a reload removes close once idle; so do connections trusting a rotated CA
    live.on_swap(pool.follow, recheck=True)
    app[PIPELINE] = Pipeline(live, pool, hooks)
    app[READINESS] = ConnectProbe()  # /readyz: is each URL backend reachable at all
    add_routes(app)
    add_anthropic_routes(app)  # POST /v1/messages: the Anthropic SDKs
    # POST /v1/responses, GET/DELETE /v1/responses/{id}; its store is chosen once
    state = policy.file.responses
    add_responses_routes(app, StoredResponses(open_blobs(state.store, state.max_memory_bytes),
                                              state.ttl_s))
    live.pin("responses.store", lambda policy: policy.file.responses.store)
    # rate limits and budgets; a deployment's Redis URL overrides the policy's `limits.store`
    install_limits(app, live, hooks, redis_url=os.environ.get("ROUTEGATE_REDIS_URL"))
    # backend states and the policy version, read when /metrics or the dashboard is read
    gateway_state = StateCollector(live, pool, hooks.telemetry.metrics)
    hooks.telemetry.metrics.registry.register(gateway_state)
    # GET /metrics, GET /dashboard; flush at exit
    install_telemetry(app, hooks.telemetry, live, state=gateway_state.dashboard)
    # routing.decide as hooks.router; live stats; x-routegate-* headers; backend /metrics
    routing = install_routing(app, hooks, live=live, pool=pool)
    pool.on_capabilities = routing.backend_reported  # what a launched backend can do
    pool.on_resend = hooks.telemetry.metrics.observe_resend
    install_backend_health(app, live, pool, routing.ejections)  # active checks per backend
    install_fleets(app, live, hooks, routing, fleets)  # replicas: pick, salt, watch
    install_cache(app, live, hooks)  # routes' `cache:`: kept answers, no backend call
    # per-backend slots: priority, deadlines, shedding; `max_concurrency` shared by workers
    install_queues(app, live, hooks, share=settings.workers)
    install_policy_admin(app, live, hooks, settings)
    install_backends_admin(app, live, pool)  # GET /admin/backends: state, ejections
    app.cleanup_ctx.append(_upstreams)
    app.cleanup_ctx.append(_responses_state)
    if settings.launch_board is not None:  # a worker: the supervisor launched them
        app.cleanup_ctx.append(board_context(settings.launch_board, launches))
    else:
        app.cleanup_ctx.append(_supervised_backends)
    return app


async def _upstreams(app: web.Application) -> AsyncIterator[None]:
    # TLS contexts of https backends read CA stores (milliseconds each): in a thread,
    # before the first request rather than inside it
    await asyncio.to_thread(warm_tls, app[LIVE_POLICY].current)
    yield
    await app[UPSTREAMS].close()


async def _responses_state(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[RESPONSES_STATE].blobs.aclose()


def _warm_tls_soon(policy: Policy) -> None:
    """After a reload: the new policy's TLS contexts, in a thread, before requests need
    them (a reload runs on the event loop; without one, as in a script, right here)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        warm_tls(policy)
        return
    loop.run_in_executor(None, warm_tls, policy)


async def _supervised_backends(app: web.Application) -> AsyncIterator[None]:
    supervisor = app[SUPERVISOR]
    if app[SETTINGS].supervise:
        await supervisor.start()
    yield
    await supervisor.stop()
