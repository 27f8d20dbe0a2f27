"""`GatewayRunner` answers every well-formed request exactly as `web.AppRunner` would,
taking fixed-path routes without the router, and answers malformed HTTP in OpenAI's
error shape without logging what the client sent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.server.runner import FixedPaths, GatewayRunner
from gateway.settings import Settings
from tests.conftest import StartGateway, as_policy, single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.malformed_http import MALFORMED, assert_refused_cleanly

NAME = web.AppKey("name", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def tagging(tag: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        response.headers.add("X-Order", tag)
        return response
    return middleware


async def fixed(request: web.Request) -> web.Response:
    route = request.match_info.route
    return web.json_response({"app": request.app[NAME], "path": route.resource.canonical
                              if route.resource else None, "body": await request.text()})


async def variable(request: web.Request) -> web.Response:
    return web.json_response({"app": request.app[NAME], "name": request.match_info["name"]})


async def refuse_large(request: web.Request) -> web.Response | None:
    if (request.content_length or 0) > 10:
        return web.Response(status=413, text="too large")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return None


def demo_app() -> web.Application:
    app = web.Application(middlewares=[tagging("outer"), tagging("inner")])
    app[NAME] = "demo"
    app.router.add_post("/v1/fixed", fixed, expect_handler=refuse_large)
    app.router.add_get("/v1/fixed", fixed)
    app.router.add_get("/v1/items/{name}", variable)
    return app


@pytest.fixture
async def both() -> AsyncIterator[dict[str, str]]:
    """The same app served by `web.AppRunner` and by `GatewayRunner`: name → base URL."""
    runners, urls = [], {}
    for name, kind in (("app", web.AppRunner), ("gateway", GatewayRunner)):
        runner = kind(demo_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield urls
    for runner in runners:
        await runner.cleanup()


REQUESTS = [
    ("POST", "/v1/fixed", b"hello", {}),
    ("GET", "/v1/fixed", b"", {}),
    ("HEAD", "/v1/fixed", b"", {}),
    ("GET", "/v1/items/abc", b"", {}),
    ("PUT", "/v1/fixed", b"", {}),  # 405 naming what is allowed
    ("POST", "/v1/nowhere", b"", {}),  # 404
    ("POST", "/v1/fixed/", b"", {}),  # no trailing-slash leniency
    ("POST", "/v1/fixed", b"short", {"Expect": "100-continue"}),
    ("POST", "/v1/fixed", b"far too long a body", {"Expect": "100-continue"}),
]


@pytest.mark.parametrize(("method", "path", "body", "headers"), REQUESTS)
async def test_answers_as_the_app_would(both: dict[str, str], method: str, path: str,
                                        body: bytes, headers: dict[str, str]) -> None:
    answers = []
    # a missing `Expect` handler would leave the client waiting for `100 Continue`
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for base in (both["app"], both["gateway"]):
            async with session.request(method, base + path, data=body,
                                       headers=headers) as response:
                answers.append((response.status, await response.read(),
                                response.headers.getall("X-Order", []),
                                response.headers.get("Allow")))
    assert answers[0] == answers[1]


async def test_fixed_path_routes_are_looked_up_without_the_router() -> None:
    app = demo_app()
    lane = FixedPaths(app, fallback=lambda request: pytest.fail("went to the app"))
    assert lane.fixed == {("POST", "/v1/fixed"), ("GET", "/v1/fixed"),
                                 ("HEAD", "/v1/fixed")}


async def test_the_gateways_endpoints_take_the_fixed_lane() -> None:
    app = create_app(as_policy(single_backend_policy("http://127.0.0.1:9/v1")),
                     Settings(port=0, supervise=False))
    lane = FixedPaths(app, fallback=lambda request: pytest.fail("went to the app"))
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                 "/v1/messages"):
        assert ("POST", path) in lane.fixed


@pytest.mark.parametrize(("request_bytes", "status", "code"), MALFORMED)
async def test_malformed_http_gets_an_openai_error_and_the_log_keeps_none_of_it(
        openai_upstream: FakeOpenAI, start_gateway: StartGateway,
        caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: int,
        code: str) -> None:
    gateway = await start_gateway(single_backend_policy(openai_upstream.url))
    address = urlsplit(gateway.url)
    await assert_refused_cleanly(address.hostname or "127.0.0.1", address.port or 80,
                                 request_bytes, status, code, caplog)
    # and the gateway carries on
    reply = await gateway.openai().chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices
