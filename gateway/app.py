"""`create_app`: every long-lived object, wired once and stored under a typed AppKey.

Resources (upstream sessions, supervised children) open and close in
`app.cleanup_ctx`, in order, so a test or `routegate serve` gets the same lifecycle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from aiohttp import web

from gateway.api.anthropic import add_routes as add_anthropic_routes
from gateway.api.openai import PIPELINE, add_routes
from gateway.api.responses import RESPONSES_STATE
from gateway.api.responses import add_routes as add_responses_routes
from gateway.api.responses_state import StoredResponses
from gateway.batches import BATCHES
from gateway.batches import install as install_batches
from gateway.cache.http import install as install_cache
from gateway.compat import check_aiohttp
from gateway.core.drain import DRAIN, Drain
from gateway.core.errors import error_middleware
from gateway.core.live_policy import LivePolicy
from gateway.dashboard import dashboard_routes
from gateway.keys.install import install as install_keys
from gateway.launch.board import board_context
from gateway.launch.supervisor import Supervisor
from gateway.limits.http import install as install_limits
from gateway.pipeline.steps import Pipeline
from gateway.plugin import Hooks, Plugin, Wiring, assemble
from gateway.policy.admin import install as install_policy_admin
from gateway.queueing.http import install as install_queues
from gateway.route.plugin import install as install_routing
from gateway.route.replica_launch import FleetLaunches
from gateway.route.replica_watch import FLEETS
from gateway.settings import Settings
from gateway.stores.blobs import open_blobs
from gateway.telemetry.install import install_telemetry
from gateway.telemetry.service import Telemetry
from gateway.telemetry.state_metrics import StateCollector
from gateway.upstream.connect_probe import READINESS, ConnectProbe
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.tls import warm as warm_tls
from policies.load import Policy
from routing.stats import LiveStats
from routing.tokens import TokenCounter

LIVE_POLICY = web.AppKey("routegate.live_policy", LivePolicy)
UPSTREAMS = web.AppKey("routegate.upstreams", UpstreamPool)
HOOKS = web.AppKey("routegate.hooks", Hooks)
SETTINGS = web.AppKey("routegate.settings", Settings)
SUPERVISOR = web.AppKey("routegate.supervisor", Supervisor)

# Bodies are limited by the policy's `server.max_body_bytes`, checked in the pipeline
# (it can change on reload); aiohttp's own cap only has to stay out of the way.
_AIOHTTP_BODY_CAP = 1 << 30


# The plug-ins, in the order observers are told about a request. Adding one is a module
# with `install(wiring) -> Provides` and a line here (`gateway/plugin.py`).
PLUGINS: tuple[Plugin, ...] = (
    install_limits,  # rate limits and budgets: admission, settlement
    install_keys,  # managed keys: their lookup, limits and spend around the limits'
    install_routing,  # routing.decide as the router; live stats; backend load and health
    install_cache,  # routes' `cache:`: kept answers, no backend call
    install_queues,  # per-backend slots: priority, deadlines, shedding, `max_concurrency`
    install_policy_admin,  # hot reload, shadow policy, /admin/policy
)


def create_app(policy: Policy, settings: Settings | None = None, *,
               telemetry: Telemetry | None = None,
               plugins: Sequence[Plugin] = PLUGINS) -> web.Application:
    """`telemetry`: tracer provider, metrics, access log (default: metrics only, no
    trace export); `routegate serve` builds it from the `OTEL_*` environment.
    `IncompatibleAiohttp` when the installed aiohttp is not one the gateway supports."""
    check_aiohttp()
    settings = settings or Settings()
    telemetry = telemetry or Telemetry()
    app = web.Application(middlewares=[error_middleware], client_max_size=_AIOHTTP_BODY_CAP)
    live = LivePolicy(policy)
    pool = UpstreamPool()
    app[SETTINGS] = settings
    app[LIVE_POLICY] = live
    app[UPSTREAMS] = pool
    app[DRAIN] = Drain()
    live.on_swap(_warm_tls_soon, recheck=True)
    pool.follow(policy)
    # backends a reload removes close once idle; so do connections trusting a rotated CA
    live.on_swap(pool.follow, recheck=True)
    pool.on_resend = telemetry.metrics.observe_resend
    wiring = Wiring(app=app, live=live, pool=pool, metrics=telemetry.metrics,
                    settings=settings, stats=LiveStats(), tokens=TokenCounter())
    # the drain sees every request first: the requests it waits for (and cuts)
    hooks = app[HOOKS] = assemble(wiring, plugins, observers=(app[DRAIN],))
    # launched backends: children `name#i` are replicas of the fleet routing picks from
    launches = FleetLaunches(pool, app[FLEETS])
    app[SUPERVISOR] = Supervisor(policy, launches, settings)
    live.on_swap(app[SUPERVISOR].follow)  # a reload starts and stops `launch:` backends
    app[PIPELINE] = Pipeline(live, pool, hooks, telemetry)
    app[READINESS] = ConnectProbe()  # /readyz: is each URL backend reachable at all
    add_routes(app)
    add_anthropic_routes(app)  # POST /v1/messages: the Anthropic SDKs
    # POST /v1/responses, GET/DELETE /v1/responses/{id}; its store is chosen once
    state = policy.file.responses
    add_responses_routes(app, StoredResponses(open_blobs(state.store, state.max_memory_bytes),
                                              state.ttl_s))
    live.pin("responses.store", lambda policy: policy.file.responses.store)
    # backend states and the policy version, read when /metrics or the dashboard is read
    gateway_state = StateCollector(live, pool, telemetry.metrics)
    telemetry.metrics.registry.register(gateway_state)
    # /v1/files, /v1/batches: lines through the pipeline on spare dedicated capacity
    install_batches(app, live, pool, hooks, wiring.stats, telemetry, data_dir=settings.data_dir)
    # GET /metrics, flush at exit; GET /dashboard
    install_telemetry(app, telemetry, live)
    app.router.add_routes(dashboard_routes(telemetry.live, policy=live, state=lambda: {
        **gateway_state.dashboard(), "batches": app[BATCHES].dashboard()}))
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
