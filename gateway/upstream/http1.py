"""A lean HTTP/1.1 keep-alive client for backends, on aiohttp's own protocol and parser.

`aiohttp.ClientSession` does much more per request on this path (URL and header
objects, the connector, cookie and trace hooks, a timer context, payload objects, the
response wrapper): counted, 22–26 % more instructions for the whole proxied request
(docs/benchmarks.md, "aiohttp's private parts"). A backend call is always the same
shape — POST a JSON body to a known host and read one response — so this client keeps
only the parts that do the work:

- aiohttp's `ResponseHandler` protocol with its C (llhttp) response parser (not public
  API: taken from `gateway.compat.aiohttp`, which checks the aiohttp release): chunked and
  content-length bodies, gzip/deflate/br/zstd, the socket-read timeout, `ClientPayloadError`
  and `ServerDisconnectedError` exactly as a `ClientSession` raises them; interim 1xx
  responses (100 Continue, 103 Early Hints) skipped as HTTP/1.1 says; a response that
  breaks HTTP (a bad chunk size, a body that does not decode) fails the attempt at once,
  as a `MalformedResponse` (`compat.aiohttp.PooledResponseHandler`);
- a pool of kept-alive connections per backend, bounded (`max_connections`), LIFO so
  the warmest connection is reused; a request waits in FIFO order for a free one. A
  connection goes back to the pool only when its response was read to the end and
  nothing else came with it, and a byte arriving while it is idle aborts it: no answer
  is ever read by a request it was not sent for;
- the request written as one `bytes` (head precomputed per path) in one socket write;
  a body over `LARGE_BODY_BYTES` is written after its head a slice at a time, waiting
  whenever the transport's buffer is over its high-water mark (flow control), so a
  backend that reads slowly holds the request back rather than the gateway's memory,
  `first_byte_s` starts once the body is sent, and `total_s` covers the writing;
- TLS for https URLs, with the system's CAs or a given `ssl.SSLContext`; the server's
  name is sent (SNI) and checked against its certificate, as `ClientSession` does;
- one retry, on a new connection, when a kept-alive connection fails under a request
  before any byte of an answer (a backend's idle timeout racing it: a close, a reset, a
  transport gone before the write), counted by `on_resend`: never for a new connection,
  never for a timeout, never once a response has begun.

Timeouts: `pool_wait_s` for a free connection when all `max_connections` are busy (a
failure like any other: the caller may fall back); `connect_s` for opening a
connection; `first_byte_s` for the whole response head (however slowly it trickles in)
and for any silence between chunks of a stream; `total_s` for the whole exchange, body
included — it fails whatever is waiting with `ServerTimeoutError` and drops the
connection. A dropped connection is aborted, so whatever of the request it still
buffers is discarded, not flushed to the backend.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from time import monotonic
from urllib.parse import urlsplit

from aiohttp import EMPTY_PAYLOAD, ClientConnectionError, ServerTimeoutError, StreamReader
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.compat.aiohttp import MalformedResponse, PooledResponseHandler
from gateway.core.deadline import Timeouts
from gateway.upstream.flow_control import write_with_flow_control
from gateway.upstream.http1_errors import (
    BodyTooLarge,
    ConnectFailed,
    ConnectTimedOut,
    PoolTimedOut,
)
from gateway.upstream.tls import tls_context

USER_AGENT = "routegate"
# br and zstd are decoded when a backend sends them anyway, but not asked for: a backend
# on a fast network gains nothing from them, and small stream chunks compress poorly.
_FIXED_HEADERS = {"Accept": "*/*", "Accept-Encoding": "gzip, deflate",
                  "User-Agent": USER_AGENT}


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
# Bodies above this are written apart from their head, in slices under flow control
# (`flow_control.write_with_flow_control`); a chat request is far smaller and keeps the
# one write.
LARGE_BODY_BYTES = 256 * 1024
# 1xx heads a backend may send before its answer; past this it is not answering
MAX_INTERIM_RESPONSES = 16


class Http1Response:
    """One backend response: status and headers, `content` (aiohttp's `StreamReader`:
    `readany()`, `read()`), and the connection it holds until `release()` (body read
    to the end: the connection goes back to the pool) or `close()` (dropped, which
    tells the backend to stop)."""

    __slots__ = ("_client", "_deadline", "_protocol", "content", "headers", "on_done",
                 "status")

    def __init__(self, client: Http1Client, protocol: PooledResponseHandler) -> None:
        self._client: Http1Client | None = client
        self._protocol = protocol
        self._deadline: asyncio.TimerHandle | None = None
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self.content: StreamReader = EMPTY_PAYLOAD
        self.on_done: Callable[[], None] | None = None

    @property
    def content_type(self) -> str:
        raw = self.headers.get("Content-Type")
        if not raw:
            return "application/octet-stream"
        return raw.partition(";")[0].strip().lower()

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The whole body; `BodyTooLarge` as soon as it is known to exceed `max_bytes`
        (its Content-Length, else counted as it arrives), the rest left unread."""
        if max_bytes is None:
            return await self.content.read()
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > max_bytes:
            raise BodyTooLarge(max_bytes)
        chunks, size, content = [], 0, self.content
        while chunk := await content.readany():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(max_bytes)
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def release(self) -> None:
        content, protocol = self.content, self._protocol
        reusable = (content.is_eof() and protocol.is_connected()
                    and not protocol.should_close)
        self._finish(reusable)

    def close(self) -> None:
        self._finish(False)

    def _finish(self, reusable: bool) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        client._give_back(self._protocol, reusable)
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done()

    def _head_overdue(self) -> None:
        """`first_byte_s` is up: fail unless a head has come (in the same turn of the
        loop, when it was busy: it only waits for its reader)."""
        if not len(self._protocol):
            self._expire("response head")

    def _expire(self, which: str = "total") -> None:
        """`total_s` (or a request's own `first_byte_s`) is up: fail whoever waits
        (headers or body) and drop the socket."""
        error = ServerTimeoutError(f"Deadline: no {which} in time" if which != "total"
                                   else "Total timeout: the exchange took too long")
        self._protocol.set_exception(error)
        self.content.set_exception(error)
        self.close()


class Http1Client:
    """POSTs to one backend over a bounded pool of kept-alive connections."""

    def __init__(self, base_url: str, *, max_connections: int, timeouts: Timeouts,
                 headers: Mapping[str, str] | None = None, keepalive_s: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None,
                 on_resend: Callable[[], None] | None = None) -> None:
        """`ssl_context`: for an https URL, what to trust (default: the system's CAs);
        `on_resend`: called each time a request is sent again on a new connection."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend URL must be http(s)://host[:port][/path], not {base_url!r}")
        if "@" in parts.netloc:  # never echoed: a secret; never silently dropped either
            raise ValueError("backend URL must not carry credentials (user:password@); "
                             "send them as a header")
        if ssl_context is not None and parts.scheme != "https":
            raise ValueError("an ssl_context needs an https backend URL")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = (ssl_context or tls_context()  # shared: see gateway/upstream/tls.py
                     if parts.scheme == "https" else None)
        self._prefix = parts.path.rstrip("/")
        default_port = parts.port is None or parts.port == (443 if self._ssl else 80)
        host_header = parts.hostname if default_port else f"{parts.hostname}:{parts.port}"
        if ":" in parts.hostname:  # an IPv6 literal keeps its brackets in Host
            host_header = parts.netloc.rpartition("@")[2]
        fixed = {"Host": host_header, **_FIXED_HEADERS, **(headers or {})}
        self._fixed_lines = _header_lines(fixed)
        self._heads: dict[str, bytes] = {}
        self._limit = max_connections
        self.timeouts = timeouts
        self._keepalive_s = keepalive_s
        self._idle: list[tuple[PooledResponseHandler, float]] = []
        self._open = 0  # connections open or being opened, idle ones included
        self._waiters: deque[asyncio.Future[PooledResponseHandler | None]] = deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_resend = on_resend

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def address(self) -> str:
        return f"{self._host}:{self._port}"

    async def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None,
                   timeouts: Timeouts | None = None) -> Http1Response:
        """Send `body` to `path` (under the base URL's path) and wait for the response
        headers; the caller reads `content` and then releases or closes the response.
        `timeouts`: this request's own, tighter than the client's (a request's deadline);
        its `first_byte_s` bounds the wait for the response headers only, the silences
        of a stream after them stay bounded by the client's."""
        loop = self._loop
        if loop is None:  # one client, one event loop: looked up once
            loop = self._loop = asyncio.get_running_loop()
        timeouts = timeouts or self.timeouts
        protocol, reused = await self._acquire(loop, timeouts)
        try:
            return await self._exchange(loop, protocol, path, body, headers, timeouts)
        except ClientConnectionError as exc:
            # a timeout is one too (slow is not closed); a MalformedResponse is not
            if not reused or protocol.answered or isinstance(exc, TimeoutError):
                raise
        # The backend closed a kept-alive connection just as this request went out on it
        # (its idle timeout): nothing was answered, so once more, on a new connection.
        if self.on_resend is not None:
            self.on_resend()
        protocol, _ = await self._acquire(loop, timeouts, reuse=False)
        return await self._exchange(loop, protocol, path, body, headers, timeouts)

    async def _exchange(self, loop: asyncio.AbstractEventLoop, protocol: PooledResponseHandler,
                        path: str, body: bytes, headers: Mapping[str, str] | None,
                        timeouts: Timeouts) -> Http1Response:
        response = Http1Response(self, protocol)
        first_byte: asyncio.TimerHandle | None = None
        protocol.idle = protocol.answered = False
        try:
            response._deadline = loop.call_at(loop.time() + timeouts.total_s,
                                              response._expire)
            # read_until_eof: a body with neither length nor chunking ends with the
            # connection, as `ClientSession` reads it
            protocol.set_response_params(read_until_eof=True,
                                         read_timeout=self.timeouts.first_byte_s)
            head = self._heads.get(path)
            if head is None:
                head = self._heads[path] = (f"POST {self._prefix}{path} HTTP/1.1\r\n"
                                            .encode() + self._fixed_lines)
            extra = _header_lines(headers) if headers else b""
            transport = protocol.transport
            if transport is None or transport.is_closing():
                raise ClientConnectionError("connection closed before the request was sent")
            early = None
            if len(body) > LARGE_BODY_BYTES:
                transport.write(b"%b%bContent-Length: %d\r\n\r\n" % (head, extra, len(body)))
                early = await write_with_flow_control(
                    protocol, body, lambda: response._client is None)
            else:
                transport.write(b"%b%bContent-Length: %d\r\n\r\n%b"
                                % (head, extra, len(body), body))
            if early is None:
                protocol.start_timeout()  # first_byte_s runs from the end of the writing
                # ... and bounds the whole head: the socket timer restarts at every byte
                first_byte = loop.call_at(loop.time() + timeouts.first_byte_s,
                                          response._head_overdue)
                message, payload = await protocol.read()
            else:
                message, payload = early
            interim = 0
            while 100 <= message.code < 200:
                if message.code == 101 or interim == MAX_INTERIM_RESPONSES:
                    raise MalformedResponse(f"malformed response: HTTP {message.code} "
                                            "where an answer to a POST was due")
                interim += 1  # 100 Continue, 103 Early Hints: the answer follows
                message, payload = await protocol.read()
        except BaseException:
            response.close()
            raise
        finally:
            if first_byte is not None:
                first_byte.cancel()
        payload.on_eof(protocol.response_ended)  # from then on, a byte is a stray one
        response.status = message.code
        response.headers = message.headers
        response.content = payload
        return response

    async def _acquire(self, loop: asyncio.AbstractEventLoop, timeouts: Timeouts, *,
                       reuse: bool = True) -> tuple[PooledResponseHandler, bool]:
        """A connection and whether it served an earlier request; `reuse=False` opens
        a new one (as soon as the bound allows)."""
        if self._closed:
            raise ClientConnectionError("the backend's client is closed")
        idle = self._idle
        while idle and reuse:
            protocol, since = idle.pop()
            if (protocol.is_connected() and not protocol.should_close
                    and monotonic() - since < self._keepalive_s):
                return protocol, True
            protocol.close()
            self._open -= 1
        if self._open >= self._limit:
            waiter: asyncio.Future[PooledResponseHandler | None] = loop.create_future()
            self._waiters.append(waiter)
            wait_s = min(self.timeouts.pool_wait_s, timeouts.total_s)
            try:
                async with asyncio.timeout(wait_s):
                    handed = await waiter
            except (asyncio.CancelledError, TimeoutError) as exc:
                if waiter.done() and not waiter.cancelled():  # handed over, then cancelled
                    self._give_back(waiter.result(), True)
                elif waiter in self._waiters:  # `_give_back` may have passed over it
                    self._waiters.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise PoolTimedOut(
                        f"No free connection to {self.address} within {wait_s:g} s: all "
                        f"max_connections ({self._limit}) are busy") from None
                raise
            if handed is not None:
                if handed.is_connected() and not handed.should_close and reuse:
                    return handed, True
                handed.close()  # closed by the backend on its way here: open anew
            # here the slot is ours (None: a connection closed and passed it on)
        else:
            self._open += 1
        try:
            return await self._connect(loop, timeouts.connect_s), False
        except BaseException:
            self._give_back(None, False)
            raise

    async def _connect(self, loop: asyncio.AbstractEventLoop,
                       connect_s: float) -> PooledResponseHandler:
        try:
            async with asyncio.timeout(connect_s):
                _, protocol = await loop.create_connection(
                    lambda: PooledResponseHandler(loop), self._host, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None)
        except TimeoutError:
            raise ConnectTimedOut(f"Connect timeout to {self.address}") from None
        except OSError as exc:
            raise ConnectFailed(self.address, exc) from exc
        return protocol

    def _give_back(self, protocol: PooledResponseHandler | None, reusable: bool) -> None:
        """A request is done with `protocol` (None: a connection that never opened)."""
        if protocol is not None and reusable and not self._closed:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(protocol)
                    return
            self._idle.append((protocol, monotonic()))
            return
        if protocol is not None:
            protocol.abort()  # a request still buffered is dropped, not flushed
        while self._waiters:  # the slot passes to the next waiter, who opens anew
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._open -= 1

    async def close(self) -> None:
        self._closed = True
        for protocol, _ in self._idle:
            protocol.close()
        self._open -= len(self._idle)
        self._idle.clear()


def _header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} has a line break in it")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1", "replace")
