"""`GatewayRunner`: the `AppRunner` routegate serves with (`routegate serve`, the tests).

Three things differ from aiohttp's own runner:

- **Fixed-path routes by a dict lookup** (`FixedPaths`, below).
- **Malformed HTTP gets an OpenAI-shaped answer, and nothing of it is logged**
  (`_RequestHandler`). aiohttp answers a request it cannot parse (a header line over
  8,190 bytes, a control character in a header, bad chunking) in plain text quoting
  the offending bytes, and logs them with a traceback at ERROR — an `Authorization`
  line with one stray byte put its API key in the log. Here the client gets a JSON
  error naming the kind of fault (431 for a line too long, 400 otherwise) and the log
  one line with the exception's class, never its text. A request line of another HTTP
  version, which the parser takes (`HTTP/2.0`, `HTTP/0.9`), is a 505
  (`refuse_other_http_versions`).
- **Slow, silent and greedy clients are bounded** (`_RequestHandler`, `ClientGuard`):
  a connection's first head must be complete within `server.header_read_timeout_s` of
  the connection opening (nginx's `client_header_timeout`), a later one within as long
  of its first byte, else a 408 and the connection closes: a connection that sends
  nothing, blank lines, or headers a byte at a time holds nothing for long. A kept-alive
  connection idle between requests closes after `server.keep_alive_timeout_s` (aiohttp's
  keep-alive timer, set per connection from the live policy). One client address holds
  at most `server.max_connections_per_client` connections (more are answered 429 and
  closed at once). A stalled body is the body reader's (`request_body.py`,
  `server.body_read_timeout_s`).

Fixed paths:

aiohttp's `Application` resolves every request through its router, builds (or looks
up) the middleware chain for the match and freezes a fresh match info, for paths that
never change (what that costs a request, counted against the router doing it, is in
docs/benchmarks.md, "aiohttp's private parts"). At start-up the runner takes each
route of a fixed path (`/v1/chat/completions`, `/healthz`, …) with its handler already
wrapped in the app's middlewares, and one frozen match info per route; a request for
one of them goes straight to it (the match info set as the router would set it:
`compat.aiohttp.set_match_info`). Anything else (a path with variables, an unknown path,
the wrong method) takes the app's own path, so 404s, 405s and sub-applications behave
exactly as before.

What a matched request sees is what the app would give it: `request.app`,
`request.match_info`, the route's `Expect` handler, the middlewares in the same order.
Sub-applications' middlewares are not involved: only the top-level router's own routes
are taken, and `_fix_request_current_app` (which only switches between sub-apps) is not
needed for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from http import HTTPStatus
from typing import Any, cast

import orjson
from aiohttp import HttpVersion10, HttpVersion11, StreamReader, hdrs, web

from gateway.app import LIVE_POLICY
from gateway.compat.aiohttp import (
    BadHttpMessage,
    BadHttpMethod,
    HookedAppRunner,
    LineTooLong,
    MatchedSubAppResource,
    make_connections_with,
    set_match_info,
)
from gateway.core.errors import (
    BadRequest,
    GatewayError,
    HttpVersionNotSupported,
    InternalError,
    RequestLineTooLong,
    RequestTimeout,
    TooManyConnections,
)
from policies.schema import ServerSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger("routegate.server")


class GatewayRunner(HookedAppRunner):
    """Use in place of `web.AppRunner(app, ...)`; same arguments."""

    def server_built(self, server: web.Server) -> web.Server:
        # Connections read `request_handler` when they open: none has opened yet.
        server.request_handler = FixedPaths(self.app, server.request_handler)
        live = self.app.get(LIVE_POLICY)
        guard = ClientGuard(
            (lambda: live.current.file.server) if live is not None else ServerSettings)
        make_connections_with(server, partial(_RequestHandler, guard=guard))
        return server


class ClientGuard:
    """Connections open per client address, against the live `server` settings."""

    def __init__(self, settings: Callable[[], ServerSettings]) -> None:
        self.settings = settings
        self.open: dict[str, int] = {}

    def admit(self, address: str) -> bool:
        count = self.open.get(address, 0)
        if count >= self.settings().max_connections_per_client:
            return False
        self.open[address] = count + 1
        return True

    def release(self, address: str) -> None:
        count = self.open.pop(address, 1) - 1
        if count:
            self.open[address] = count


def _raw_reply(error: GatewayError) -> bytes:
    """A whole HTTP response for a connection no request handler is serving."""
    body = orjson.dumps(error.body())
    return (f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


_BLANK = b"\r\n"  # the bytes of the blank lines a request may be preceded by


class _RequestHandler(web.RequestHandler):
    __slots__ = ("_address", "_guard", "_head_timer", "_unread_body", "awaiting_head")

    def __init__(self, manager: web.Server, *, guard: ClientGuard, **kwargs: Any) -> None:
        kwargs["keepalive_timeout"] = guard.settings().keep_alive_timeout_s
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._address: str | None = None  # counted against the cap while connected
        self._head_timer: asyncio.TimerHandle | None = None
        self.awaiting_head = True  # between requests: the next bytes start a head
        # a finished request's body still arriving (a 413 sent before it was read):
        # what comes before its end is not the next request's head
        self._unread_body: StreamReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else None  # a Unix socket: no cap
        if address is None:
            return
        if self._guard.admit(address):
            self._address = address
            # the first head's clock starts now: a client that connects and sends
            # nothing (or blank lines) is timed out like one that trickles
            self._start_head_timer()
            return
        # a flood of them is what the cap is for: not a log line each
        log.debug("connection from %s refused: over server.max_connections_per_client",
                  address)
        cast(asyncio.Transport, transport).write(_raw_reply(TooManyConnections(
            "This client address has too many connections open to the gateway "
            "(server.max_connections_per_client); reuse or close some.")))
        transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._address is not None:
            self._guard.release(self._address)
            self._address = None
        self.head_read()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._unread_body is not None and self._unread_body.is_eof():
            self._unread_body, self.awaiting_head = None, True
        # no timer for a head that arrives whole (the usual request, in one read): one
        # that ends in this read and does not start with blank lines, which the parser
        # skips (they could carry the end-of-head mark ahead of half a head); b"" is
        # aiohttp resuming its parser, not bytes from the client
        if self.awaiting_head and self._head_timer is None and data \
                and (data.find(b"\r\n\r\n") < 0 or data[0] in _BLANK):
            self._start_head_timer()
        super().data_received(data)

    def _start_head_timer(self) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(
            self._guard.settings().header_read_timeout_s, self._head_too_slow)

    def head_read(self) -> None:
        """A whole request head has arrived (its handler runs now)."""
        self.awaiting_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def request_done(self, body: StreamReader) -> None:
        """A request's handler has returned: whatever arrives after its body is the
        next request's head."""
        if body.is_eof():
            self.awaiting_head = True
        else:
            self._unread_body = body

    def _head_too_slow(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or not self.awaiting_head:
            return
        timeout_s = self._guard.settings().header_read_timeout_s
        log.info("request head from %s incomplete after %g s: 408", self._address, timeout_s)
        transport.write(_raw_reply(RequestTimeout(
            f"The request's headers did not arrive within {timeout_s:g} s "
            "(server.header_read_timeout_s).")))
        transport.close()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (4xx) or a failure outside the app's error
        middleware (500). The connection closes after it, as aiohttp's own does."""
        if request.writer.output_size > 0 or isinstance(exc, AnsweredAndClosed):
            # the response has begun, or was sent whole on the transport: nothing to add
            raise ConnectionError("the response has begun; the connection is dropped")
        error = _error_for(status, exc)
        if isinstance(error, InternalError):
            log.error("unhandled error outside the app: %s", type(exc).__name__,
                      exc_info=exc)
        else:  # the exception's text quotes the request's bytes: only its class
            # (not HTTP at all, e.g. TLS to this plain port, is common noise: debug)
            level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
            log.log(level, "malformed HTTP request from %s: %s", request.remote,
                    type(exc).__name__ if exc is not None else status)
        response = error.to_response()
        response.force_close()
        return response


def _error_for(status: int, exc: BaseException | None) -> GatewayError:
    if status >= 500 or not isinstance(exc, BadHttpMessage):
        return InternalError("The gateway failed to process the request; it has been "
                             "logged.")
    if isinstance(exc, LineTooLong):
        return RequestLineTooLong("The request line or one of its headers is longer than "
                                  "the gateway accepts (8,190 bytes).")
    if isinstance(exc, BadHttpMethod):
        return BadRequest("The request method is not valid HTTP.", code="invalid_http")
    return BadRequest(f"The request is not valid HTTP/1.1 ({type(exc).__name__}).",
                      code="invalid_http")


class AnsweredAndClosed(Exception):
    """The connection has been answered on its transport and closed."""


_HTTP_1 = (HttpVersion11, HttpVersion10)


def refuse_other_http_versions(request: web.BaseRequest) -> None:
    """aiohttp's parser takes `HTTP/0.9` (a request line without a version) and
    `HTTP/2.0` request lines, and aiohttp would serve them as HTTP/1.1 requests: they
    get a 505 (written in HTTP/1.1) instead, and the connection closes."""
    version = request.version
    if version in _HTTP_1:
        return
    transport = request.transport
    if transport is not None:
        transport.write(_raw_reply(HttpVersionNotSupported(
            f"HTTP/{version.major}.{version.minor} is not supported: the gateway speaks "
            "HTTP/1.1 (and HTTP/1.0).")))
        transport.close()
    log.info("HTTP/%d.%d request from %s: 505", version.major, version.minor,
             request.remote)
    raise AnsweredAndClosed


class FixedPaths:
    """The server's request handler: fixed-path routes directly, the rest via the app."""

    def __init__(self, app: web.Application, fallback: Handler) -> None:
        self._fallback = fallback
        self._routes: dict[tuple[str, str], tuple[Handler, web.UrlMappingMatchInfo]] = {}
        resources = app.router.resources()
        if any(isinstance(resource, MatchedSubAppResource) for resource in resources):
            return  # a sub-app by domain comes before any path: leave it all to the app
        for resource in resources:
            if not isinstance(resource, web.PlainResource):
                continue
            for route in resource:
                if route.method == hdrs.METH_ANY:
                    continue
                handler: Handler = route.handler
                for middleware in reversed(app.middlewares):
                    handler = partial(middleware, handler=handler)
                match_info = web.UrlMappingMatchInfo({}, route)
                match_info.add_app(app)
                match_info.freeze()
                # the first registered wins, as in the router
                self._routes.setdefault((route.method, resource.canonical), (handler, match_info))

    @property
    def fixed(self) -> frozenset[tuple[str, str]]:
        """(method, path) of every route this lane answers itself."""
        return frozenset(self._routes)

    async def __call__(self, base: web.BaseRequest) -> web.StreamResponse:
        request = cast(web.Request, base)  # the app's request factory makes `Request`s
        protocol = base.protocol
        guarded = protocol if isinstance(protocol, _RequestHandler) else None
        if guarded is not None:
            guarded.head_read()
        try:
            refuse_other_http_versions(base)
            found = self._routes.get((request.method, request.rel_url.path_safe))
            if found is None:
                return await self._fallback(request)
            handler, match_info = found
            set_match_info(request, match_info)
            if request.headers.get(hdrs.EXPECT):  # as the app does: before the handler
                response = await match_info.expect_handler(request)
                await request.writer.drain()
                if response is not None:
                    return response
            return await handler(request)
        finally:
            if guarded is not None:
                guarded.request_done(base.content)
