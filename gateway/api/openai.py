"""The OpenAI-compatible HTTP surface: `/v1/...`, `/healthz`, `/readyz`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from aiohttp import HttpVersion11, hdrs, web

from gateway.api.validate import check_chat, check_completions, check_embeddings
from gateway.core.auth import TENANT_HEADER
from gateway.core.context import Endpoint
from gateway.core.drain import DRAIN
from gateway.pipeline.steps import Pipeline
from gateway.route.admin import backend_states, out_of_service
from gateway.route.readiness import readiness
from gateway.upstream.connect_probe import READINESS

CHAT = Endpoint("chat.completions", "/chat/completions", check_chat)
COMPLETIONS = Endpoint("completions", "/completions", check_completions)
EMBEDDINGS = Endpoint("embeddings", "/embeddings", check_embeddings)

PIPELINE = web.AppKey("routegate.pipeline", Pipeline)


def _json(body: object, status: int = 200,
          headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                        headers=headers)


def proxy(pipeline: Pipeline,
          endpoint: Endpoint) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await pipeline.handle(request, endpoint)

    handler.__name__ = endpoint.name.replace(".", "_")
    return handler


async def list_models(request: web.Request) -> web.Response:
    """What the caller may use: routes first (what callers should normally use), then
    the backend models it may name directly."""
    pipeline = request.app[PIPELINE]
    policy = pipeline.live.current
    identity = pipeline.auth.authenticate(request, policy)
    access = policy.access_of(identity.tenant, identity.key_hash)
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "routegate"}
            for name in policy.routes if name in access.routes]
    data.extend({"id": key, "object": "model", "created": 0, "owned_by": target.backend_name}
                for key, target in policy.targets.items() if key in access.targets)
    return _json({"object": "list", "data": data}, headers={TENANT_HEADER: identity.tenant})


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: requests can be served (`gateway.route.readiness`: every route, and
    every tenant's compliant targets, or one backend with `server.readyz: any`), and the
    process is not draining (SIGTERM). Lists every backend and route, and the tenants
    left with nothing to go to."""
    pipeline = request.app[PIPELINE]
    policy = pipeline.live.current
    backends = backend_states(request.app, policy, pipeline.pool)  # pool, health checks
    for name, failure in (await request.app[READINESS].unreachable(policy)).items():
        if backends.get(name) == "ready":
            backends[name] = failure
    ejected = out_of_service(request.app, policy)
    state = readiness(policy, backends, ejected)
    ready, status = state.ready, "ready" if state.ready else "not ready"
    if request.app[DRAIN].draining:
        ready, status = False, "draining"
    body: dict[str, object] = {"status": status, "policy": policy.version_hash,
                               "backends": backends, "routes": state.routes,
                               "ejected": ejected}
    if state.tenants:
        body["tenants"] = state.tenants
    return _json(body, status=200 if ready else 503)


async def continue_unless_too_large(request: web.Request) -> None:
    """`Expect: 100-continue` on a route that takes a body: aiohttp's own handler says
    `100 Continue` to every request, so a client (curl, past 1 MB) uploaded a body that
    was then refused. One announced over the limit gets no `100 Continue`; the handler
    answers 413 (in its API's error shape) without reading it."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    length, policy = request.content_length, request.app[PIPELINE].live.current
    if length is not None and length > policy.file.server.max_body_bytes:
        return
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response proper has not started


def add_routes(app: web.Application) -> None:
    """The OpenAI routes, served by the app's pipeline (`app[PIPELINE]`, set before)."""
    pipeline = app[PIPELINE]
    for path, endpoint in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETIONS),
                           ("/v1/embeddings", EMBEDDINGS)):
        app.router.add_post(path, proxy(pipeline, endpoint),
                            expect_handler=continue_unless_too_large)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
