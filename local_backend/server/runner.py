"""Serving the app: `serve(app, host, port)`, with malformed HTTP answered in OpenAI's shape.

aiohttp answers a request it cannot parse (a header line over 8,190 bytes, a control
character in a header, bad chunking) in plain text quoting the offending bytes, and
logs them with a traceback at ERROR: an `Authorization` line with one stray byte put
its bearer token in the log. Here the client gets a JSON error naming the kind of
fault (431 for a line too long, 400 otherwise) and the log one line with the
exception's class, never its text. The connection closes after it, as aiohttp's own
answer does.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from local_backend.aiohttp_compat import (
    BadHttpMessage,
    BadHttpMethod,
    HookedAppRunner,
    LineTooLong,
    check_aiohttp,
    make_connections_with,
)
from local_backend.server.errors import ApiError

log = logging.getLogger("local_backend.server")


class BackendRunner(HookedAppRunner):
    """`web.AppRunner` whose connections answer unparseable requests as described above."""

    def server_built(self, server: web.Server) -> web.Server:
        make_connections_with(server, _RequestHandler)
        return server


class _RequestHandler(web.RequestHandler):
    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (4xx), or a failure outside the app's
        error middleware (500)."""
        if request.writer.output_size > 0:  # the response has begun: nothing to add
            raise ConnectionError("the response has begun; the connection is dropped")
        error = _error_for(status, exc)
        if error.status >= 500:
            log.error("unhandled error outside the app: %s", type(exc).__name__,
                      exc_info=exc)
        else:  # the exception's text quotes the request's bytes: only its class
            level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
            log.log(level, "malformed HTTP request from %s: %s", request.remote,
                    type(exc).__name__)
        response = error.response()
        response.force_close()
        return response


def _error_for(status: int, exc: BaseException | None) -> ApiError:
    if status >= 500 or not isinstance(exc, BadHttpMessage):
        return ApiError(500, "The server failed to process the request; it has been logged.",
                        type_="server_error", code="internal_error")
    if isinstance(exc, LineTooLong):
        return ApiError(431, "The request line or one of its headers is longer than the "
                        "server accepts (8,190 bytes).", code="request_header_too_large")
    if isinstance(exc, BadHttpMethod):
        return ApiError(400, "The request method is not valid HTTP.", code="invalid_http")
    return ApiError(400, f"The request is not valid HTTP/1.1 ({type(exc).__name__}).",
                    code="invalid_http")


async def serve(app: web.Application, host: str, port: int) -> int:
    """Serve `app` until SIGINT or SIGTERM, then shut it down (the engine stops with
    the app's cleanup). 1 when the address cannot be bound."""
    # handler_cancellation: a client that disconnects aborts its request in the engine
    check_aiohttp()
    runner = BackendRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", host, port, exc.strerror)
            return 1
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await runner.cleanup()
    return 0
