"""Adapter for OpenAI-compatible backends (OpenAI, local_backend, vLLM, SGLang, TGI, ...).

One pooled keep-alive `ClientSession` per backend with a bounded connector. Timeouts
come from the policy's `Backend.timeouts`:
  connect_s     TCP (and TLS) connect
  first_byte_s  longest silence on the socket: waiting for the response headers, and
                between two chunks of a stream (a backend that stays silent that long
                is treated as dead)
  total_s       the whole exchange, streamed body included
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.errors import UpstreamError, UpstreamTimeout
from policies.schema import Backend

# Response headers relayed from the backend (the rest describe its own transport):
# its inference time, which telemetry reads as the backend's side of the latency.
PASSTHROUGH_HEADERS = ("openai-processing-ms",)


class UpstreamFailure(Exception):
    """An attempt that failed before any byte reached the client; `error` is what the
    client would be told if no other candidate succeeds."""

    def __init__(self, error: UpstreamError | UpstreamTimeout, *, status: int | None = None,
                 body: bytes = b"", headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.status = status  # the backend's HTTP status, when it answered
        self.body = body
        self.headers = dict(headers or {})


class LeasedResponse(aiohttp.ClientResponse):
    """A response that tells its adapter when the request is done with it (the first
    `release` or `close`), so a retired adapter knows when its session is idle."""

    on_done: Callable[[], None] | None = None

    def release(self) -> Any:
        try:
            return super().release()
        finally:
            self._done()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._done()

    def _done(self) -> None:
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done()


class OpenAIUpstream:
    """One backend: its session, base URL and request defaults.

    After a reload replaces it (`retire`) it keeps serving the requests that already
    hold it and closes its session when the last of them has released its response.
    """

    def __init__(self, name: str, backend: Backend, base_url: str) -> None:
        self.name = name
        self.backend = backend
        self.base_url = base_url.rstrip("/")
        timeouts = backend.timeouts
        self._timeout = aiohttp.ClientTimeout(
            total=timeouts.total_s, sock_connect=timeouts.connect_s,
            sock_read=timeouts.first_byte_s)
        self._headers = {"Content-Type": "application/json"}
        if backend.api_key is not None and backend.api_key.get_secret_value():
            self._headers["Authorization"] = f"Bearer {backend.api_key.get_secret_value()}"
        self._session: aiohttp.ClientSession | None = None
        self._users = 0  # requests between `open` and their response's release/close
        self._retired = False
        self._closing: asyncio.Task[None] | None = None  # held so it is not collected

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.backend.max_connections, limit_per_host=0,
                keepalive_timeout=30, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, headers=self._headers,
                skip_auto_headers=("User-Agent",), auto_decompress=True,
                response_class=LeasedResponse)
        return self._session

    def retire(self) -> None:
        """A reload replaced this adapter: close its session once no request uses it.
        A request that took the adapter before the reload but opens only now (it was
        queued) still gets a session, closed in turn when that request is done."""
        self._retired = True
        self._close_if_idle()

    @property
    def idle_closed(self) -> bool:
        """Retired, and nothing left open: the pool can forget it."""
        return self._retired and self._users == 0 and self._session is None

    def _finished(self) -> None:
        self._users -= 1
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if not self._retired or self._users or self._session is None:
            return
        session, self._session = self._session, None
        if not session.closed:
            self._closing = asyncio.get_running_loop().create_task(session.close())

    async def close(self) -> None:
        if self._closing is not None:
            await self._closing
        if self._session is not None:
            await self._session.close()

    async def open(self, path: str, body: bytes,
                   headers: Mapping[str, str] | None = None) -> aiohttp.ClientResponse:
        """POST and wait for the response headers. A 2xx/4xx response is returned open
        (the caller reads and releases it); connection failures, timeouts, 429 and 5xx
        raise `UpstreamFailure` so the caller can try the next candidate."""
        self._users += 1
        try:
            response = await self._post(path, body, headers)
        except BaseException:
            self._finished()
            raise
        if isinstance(response, LeasedResponse):
            response.on_done = self._finished
        if response.status == 429 or response.status >= 500:
            try:
                error_body = await response.read()
            except (TimeoutError, aiohttp.ClientError):
                error_body = b""
            finally:
                response.release()
            raise UpstreamFailure(
                UpstreamError(f"Backend '{self.name}' returned HTTP {response.status}."),
                status=response.status, body=error_body, headers=response.headers)
        return response

    async def _post(self, path: str, body: bytes,
                    headers: Mapping[str, str] | None) -> aiohttp.ClientResponse:
        url = self.base_url + path
        try:
            return await self.session().post(url, data=body, headers=headers)
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamFailure(UpstreamTimeout(
                f"Backend '{self.name}' did not respond in time ({exc.__class__.__name__})."
            )) from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure(UpstreamError(
                f"Backend '{self.name}' is unreachable: {exc.os_error or exc}.")) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(UpstreamError(
                f"Backend '{self.name}' failed: {exc.__class__.__name__}: {exc}.")) from exc
