"""Every part of aiohttp the gateway uses that aiohttp does not publish, in one place,
and the check that the installed aiohttp still has them (`check_aiohttp`).

aiohttp's public API here is what `aiohttp` and `aiohttp.web` export (their `__all__`),
`aiohttp.abc` and `aiohttp.hdrs`. The gateway goes under it in three places, each kept
for a saving measured in docs/benchmarks.md or a behaviour the public API cannot give:

- whole responses in one write (`gateway/whole_response.py`): the request's payload
  writer, the response's status, header, keep-alive, cookie and end-of-body state, the
  prepare hook and the C header serialiser (`one_write_start`, `run_prepare_hook`,
  `write_whole`, `must_be_empty_body`);
- the server (`gateway/runner.py`): the runner's server factory (`HookedAppRunner`), the
  class of its connections (`make_connections_with`), which of them are idle when the
  drain closes the listener (`waiting_for_request`), a request's match info set without
  the router (`set_match_info`), the parser's exceptions, domain-matched sub-apps;
- the backend client (`gateway/upstream/http1.py`): aiohttp's client protocol with its
  llhttp parser (`ResponseHandler`, `RawResponseMessage`), kept safe for a pool
  (`PooledResponseHandler`), and the wait for a paused transport to drain (`drained`).

Any aiohttp release may move these: `SUPPORTED` is the range they are tested with (the
same as pyproject.toml's), and `check_aiohttp` refuses any other release, or one that
lacks a name listed in `_NEEDED`, with an error that names the installed and the
supported versions. `create_app` and `routegate serve` call it before anything runs.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import cast

import aiohttp
from aiohttp import HttpVersion11, hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

# The releases this module is tested with: >= MINIMUM, < BELOW (pyproject.toml says the same).
MINIMUM = (3, 14, 0)
BELOW = (3, 15)
SUPPORTED = f">={'.'.join(map(str, MINIMUM))},<{'.'.join(map(str, BELOW))}"


class IncompatibleAiohttp(ImportError):
    """The installed aiohttp is not one the gateway's use of aiohttp's insides supports."""


def _refusal(installed: str, why: str) -> str:
    return (f"routegate needs aiohttp {SUPPORTED}, and aiohttp {installed} is installed "
            f"({why}). The gateway relies on parts of aiohttp that are not public API "
            f"(gateway/compat/aiohttp.py); install a supported release: "
            f"pip install 'aiohttp{SUPPORTED}'.")


try:  # a release that lost one of these modules gets the same error as any other
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.helpers import (
        _EXC_SENTINEL,
        EMPTY_BODY_STATUS_CODES,
        rfc822_formatted_time,
        set_exception,
    )
    from aiohttp.http import SERVER_SOFTWARE, RawRequestMessage, RawResponseMessage
    from aiohttp.http_exceptions import (
        BadHttpMessage,
        BadHttpMethod,
        HttpProcessingError,
        LineTooLong,
    )
    from aiohttp.http_writer import StreamWriter, _serialize_headers
    from aiohttp.streams import EMPTY_PAYLOAD
    from aiohttp.web_urldispatcher import MatchedSubAppResource
except ImportError as exc:  # pragma: no cover - only with an unsupported aiohttp
    raise IncompatibleAiohttp(_refusal(aiohttp.__version__, str(exc))) from exc

__all__ = [
    "EMPTY_BODY_STATUS_CODES",
    "SERVER_SOFTWARE",
    "SUPPORTED",
    "BadHttpMessage",
    "BadHttpMethod",
    "HookedAppRunner",
    "IncompatibleAiohttp",
    "LineTooLong",
    "MalformedResponse",
    "MatchedSubAppResource",
    "PooledResponseHandler",
    "RawResponseMessage",
    "ResponseHandler",
    "StreamWriter",
    "check_aiohttp",
    "drained",
    "internal_request",
    "make_connections_with",
    "must_be_empty_body",
    "one_write_start",
    "rfc822_formatted_time",
    "run_prepare_hook",
    "set_match_info",
    "write_whole",
]

# What the functions below (and the gateway's subclasses and calls) use, by the class or
# module that holds it: an attribute, a method, or an instance attribute its methods set.
_NEEDED: tuple[tuple[object, str], ...] = (
    *((web.StreamResponse, name) for name in (
        "_eof_sent", "_keep_alive", "_cookies", "_body_length", "_must_be_empty_body",
        "_status", "_reason", "_compression", "_chunked", "_headers")),
    *((web.Request, name) for name in ("_payload_writer", "_match_info", "_prepare_hook")),
    (StreamWriter, "_writelines"),
    (web.AppRunner, "_make_server"),
    *((web.Server, name) for name in ("_loop", "_kwargs")),
    *((web.RequestHandler, name) for name in (
        "handle_error", "data_received", "connection_made", "connection_lost", "_waiter",
        "_messages")),
    *((ResponseHandler, name) for name in (
        "_drain_helper", "set_response_params", "start_timeout", "read", "should_close",
        "writing_paused", "force_close", "set_exception", "is_connected", "_payload",
        "data_received")),
    (web.UrlMappingMatchInfo, "add_app"),
)


def _release(version: str) -> tuple[int, ...]:
    """`3.14.5` → (3, 14, 5); a suffix (`rc1`, `.post1`, `+local`) is not looked at."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    if match is None:
        raise IncompatibleAiohttp(_refusal(version, "not a version number"))
    return tuple(int(part) for part in match.group().split("."))


def _has(holder: object, name: str) -> bool:
    """An attribute of `holder`, a `__slots__` entry, or one its classes' methods set."""
    if hasattr(holder, name):
        return True
    for cls in getattr(holder, "__mro__", ()):
        if name in (getattr(cls, "__slots__", None) or ()):
            return True
        for member in vars(cls).values():
            if name in getattr(getattr(member, "__code__", None), "co_names", ()):
                return True
    return False


def missing_names(needed: Iterable[tuple[object, str]] = _NEEDED) -> list[str]:
    """`Holder.name` for each needed name the installed aiohttp lacks."""
    return [f"{getattr(holder, '__qualname__', holder)}.{name}"
            for holder, name in needed if not _has(holder, name)]


def check_aiohttp(version: str | None = None) -> None:
    """Raise `IncompatibleAiohttp` unless `version` (default: the installed aiohttp's)
    is in `SUPPORTED` and the installed aiohttp has every name the gateway uses."""
    installed = aiohttp.__version__ if version is None else version
    release = _release(installed)
    if not MINIMUM <= release < BELOW:
        raise IncompatibleAiohttp(_refusal(installed, "outside the supported range"))
    missing = missing_names()
    if missing:
        raise IncompatibleAiohttp(_refusal(installed, "missing " + ", ".join(missing)))


# -- whole responses in one write (gateway/whole_response.py) --------------------------

def one_write_start(request: web.BaseRequest,
                    response: web.StreamResponse) -> tuple[StreamWriter, bool] | None:
    """(the request's payload writer, whether the connection stays open) when `response`,
    not yet prepared, can go out in one write: HTTP/1.1, not HEAD, a status with a body,
    aiohttp's own writer (not a test's), no cookies, compression, chunking or
    Content-Length set by hand. Keep-alive is settled as `prepare` settles it (the
    request's unless the response decided), since aiohttp's handler reads it back."""
    writer = request._payload_writer
    if (request.version != HttpVersion11 or request.method == hdrs.METH_HEAD
            or response._status in EMPTY_BODY_STATUS_CODES or response._cookies
            or response._compression or response._chunked
            or hdrs.CONTENT_LENGTH in response._headers
            or not isinstance(writer, StreamWriter)):
        return None
    keep_alive = response._keep_alive
    if keep_alive is None:
        keep_alive = response._keep_alive = request.keep_alive
    return writer, keep_alive


def run_prepare_hook(request: web.BaseRequest,
                     response: web.StreamResponse) -> Awaitable[None]:
    """The apps' `on_response_prepare` receivers, as aiohttp calls them from `prepare`
    (aiohttp's own coroutine, returned to be awaited: no second one around it)."""
    return request._prepare_hook(response)


def write_whole(writer: StreamWriter, response: web.StreamResponse,
                headers: CIMultiDict[str], body: bytes) -> None:
    """Status line, headers and body in one write, and `response` marked as finished.
    aiohttp's own serialiser (C) refuses a control character in a header."""
    head = _serialize_headers(f"HTTP/1.1 {response._status} {response._reason}", headers)
    writer._writelines((head, body) if body else (head,))
    response._eof_sent = True
    response._body_length = writer.output_size


def must_be_empty_body(response: web.StreamResponse) -> bool:
    """Set by `prepare`: HEAD, 1xx, 204 or 304, whose body is not sent."""
    return bool(response._must_be_empty_body)


# -- the server (gateway/runner.py) ---------------------------------------------------

class HookedAppRunner(web.AppRunner):
    """`web.AppRunner` that hands the server it builds to `server_built` before any
    connection opens."""

    async def _make_server(self) -> web.Server:
        return self.server_built(await super()._make_server())

    def server_built(self, server: web.Server) -> web.Server:
        return server


class _ConnectionsServer(web.Server):
    make_handler: Callable[..., web.RequestHandler]

    def __call__(self) -> web.RequestHandler:  # what `web.Server.__call__` builds, made here
        return self.make_handler(self, loop=self._loop, **self._kwargs)

    def pre_shutdown(self) -> None:
        """An idle connection closes now, a busy one after its response. aiohttp's own
        marks every connection as closing, and an idle one then drops what arrives on it
        unanswered and stays open until the shutdown: a request sent on it after the
        drain's listener closed waited for the whole drain."""
        for handler in self.connections:
            if waiting_for_request(handler):
                handler.force_close()
            else:
                handler.close()


def waiting_for_request(handler: web.RequestHandler) -> bool:
    """Between requests, or with only part of a head: no handler runs and none is queued
    (the test aiohttp's own keep-alive timer makes before it closes a connection)."""
    waiter = handler._waiter
    return waiter is not None and not waiter.done() and not handler._messages


def make_connections_with(server: web.Server,
                          make_handler: Callable[..., web.RequestHandler]) -> None:
    """Each connection `server` accepts from now on is `make_handler(server, loop=…,
    **server's handler options)` instead of a plain `RequestHandler` (the app built the
    server, so only the class of the object changes)."""
    server.__class__ = _ConnectionsServer
    cast(_ConnectionsServer, server).make_handler = make_handler


def set_match_info(request: web.Request, match_info: web.UrlMappingMatchInfo) -> None:
    """What the router's resolve would have set (the match info is frozen, with its app)."""
    request._match_info = match_info


# -- the backend client (gateway/upstream/http1.py) ---------------------------------

async def drained(protocol: ResponseHandler) -> None:
    """Until the paused transport under `protocol` has drained (aiohttp's own writer
    waits so); ConnectionError when it closes instead."""
    await protocol._drain_helper()



class MalformedResponse(aiohttp.ClientPayloadError):
    """The backend's response broke HTTP/1.1 (its framing, a chunk size, an encoding
    that does not decode): aiohttp's parser error, as the `ClientError` callers catch."""


class PooledResponseHandler(ResponseHandler):
    """aiohttp's client protocol for a connection that serves one request after another.

    - `idle` (set once a response has been read to its end, cleared when the next request
      goes out): a byte arriving then is nothing anyone asked for (a late answer, junk),
      so the connection is aborted; it must never be read as the next request's answer;
    - a parse error (a bad chunk size, an undecodable body) fails the body being read at
      once, where aiohttp fails only the queue of response heads (a reader of the body
      would wait for the total timeout), and it is a `MalformedResponse` rather than
      an `HttpProcessingError`, which is no `ClientError`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.idle = False
        self.answered = False  # a byte of a response has arrived since the request went out

    def response_ended(self) -> None:
        self.idle = True

    def data_received(self, data: bytes) -> None:
        if self.idle:
            if data:  # (b"" is aiohttp resuming its own decompression)
                self.abort()
            return
        if data:
            self.answered = True
        super().data_received(data)

    def set_exception(self, exc: BaseException,
                      exc_cause: BaseException = _EXC_SENTINEL) -> None:
        if isinstance(exc, HttpProcessingError):
            exc, exc_cause = MalformedResponse(f"malformed response: {exc.message}"), exc
        super().set_exception(exc, exc_cause)
        payload = self._payload
        if payload is not None and not payload.is_eof() and payload.exception() is None:
            set_exception(payload, exc, exc_cause)


class _NoConnection:
    """What `web.Request`'s constructor reads of the connection a request came on, for a
    request that came on none."""

    ssl_context = None
    peername = None
    sockname = None
    transport = None


def internal_request(method: str, path: str, headers: dict[str, str], *,
                     remote: str) -> web.Request:
    """A request made inside the gateway (a Batch API line), for the pipeline that takes
    `web.Request`s: method, path, headers, `remote` and per-request state work; it has no
    body to read (the caller supplies it) and no connection to answer on, so only whole
    (unprepared) responses may be made for it."""
    fields = CIMultiDictProxy(CIMultiDict(headers))
    raw = tuple((name.encode(), value.encode()) for name, value in headers.items())
    message = RawRequestMessage(method, path, HttpVersion11, fields, raw, False, None,
                                False, False, URL(path))
    task = asyncio.current_task()
    assert task is not None, "made inside a task"
    return web.Request(message, EMPTY_PAYLOAD, cast(web.RequestHandler, _NoConnection()),
                       cast(StreamWriter, None), task, asyncio.get_running_loop(),
                       remote=remote)
