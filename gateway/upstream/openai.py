"""Adapter for OpenAI-compatible backends (OpenAI, local_backend, vLLM, SGLang, TGI, ...).

One pool of kept-alive connections per backend (`http1.Http1Client`), bounded by
`max_connections`. Timeouts come from the policy's `Backend.timeouts`:
  connect_s     TCP (and TLS) connect
  first_byte_s  longest silence on the socket: waiting for the response headers, and
                between two chunks of a stream (a backend that stays silent that long
                is treated as dead)
  total_s       the whole exchange, streamed body included
  pool_wait_s   waiting for a free connection when all `max_connections` are busy
An https backend is verified (chain and server name) against the system's CAs, or
against the backend's `ca_file` when the policy names one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.core.deadline import Timeouts
from gateway.core.failures import (
    CONTEXT_LENGTH_EXCEEDED,
    Incapable,
    status_failure,
    status_kind,
)
from gateway.upstream.failures import READ_ERRORS, send_failure
from gateway.upstream.http1 import Http1Client, Http1Response
from gateway.upstream.rewrite import spliced_fields, upstream_body, with_fields
from gateway.upstream.tls import ca_stamp, tls_context
from policies.bands import PRIORITY_BANDS
from policies.schema import Backend

# Response headers relayed from the backend (the rest describe its own transport):
# its inference time, which telemetry reads as the backend's side of the latency.
PASSTHROUGH_HEADERS = ("openai-processing-ms",)
# The caller's priority band, for a backend that schedules by it (`priority: header`).
PRIORITY_HEADER = "x-routegate-priority"


_CANNOT_CODES = frozenset({CONTEXT_LENGTH_EXCEEDED, "unsupported_parameter",
                           "unsupported_value"})


def incapable(status: int, error: object) -> Incapable | None:
    """What a backend's 4xx OpenAI error object says it cannot do, if that is what it
    says. vLLM and older servers give no code for an overflowing prompt, only the words."""
    if status not in (400, 422) or not isinstance(error, dict):
        return None
    code, param, message = error.get("code"), error.get("param"), error.get("message")
    message = message if isinstance(message, str) else ""
    if code not in _CANNOT_CODES:
        if "maximum context length" not in message.lower():
            return None
        code = CONTEXT_LENGTH_EXCEEDED
    return Incapable(str(code), param if isinstance(param, str) else None, message[:300])


# An error reply is read for its message only; past this it is dropped unread.
MAX_ERROR_BODY_BYTES = 64 * 1024


class OpenAIUpstream:
    """One backend: its session, base URL and request defaults.

    After a reload replaces it (`retire`) it keeps serving the requests that already
    hold it and closes its session when the last of them has released its response.
    """

    def __init__(self, name: str, backend: Backend, base_url: str) -> None:
        self.name = name
        self.backend = backend
        self.base_url = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if backend.api_key is not None and backend.api_key.get_secret_value():
            self._headers["Authorization"] = f"Bearer {backend.api_key.get_secret_value()}"
        self._client: Http1Client | None = None
        self._users = 0  # requests between `open` and their response's release/close
        self._retired = False
        self._closing: asyncio.Task[None] | None = None  # held so it is not collected
        self._ca_stamp: tuple[str, int] | None = None  # the `ca_file` its client trusts
        self._band_headers, self._band_fields = _priority_wire(backend)
        self.on_resend: Callable[[str], None] | None = None  # told this backend's name

    def client(self) -> Http1Client:
        if self._client is None:
            timeouts, ca_file = self.backend.timeouts, self.backend.ca_file
            if ca_file is not None:
                self._ca_stamp = ca_stamp(ca_file)
            self._client = Http1Client(
                self.base_url, max_connections=self.backend.max_connections,
                timeouts=Timeouts(timeouts.connect_s, timeouts.first_byte_s, timeouts.total_s,
                                  timeouts.pool_wait_s),
                headers=self._headers,
                # the system's CAs unless the policy names a bundle (`Http1Client`'s default)
                ssl_context=None if ca_file is None else tls_context(ca_file),
                on_resend=None if self.on_resend is None else self._resent)
        return self._client

    def _resent(self) -> None:
        if self.on_resend is not None:
            self.on_resend(self.name)

    def retire(self) -> None:
        """A reload replaced this adapter: close its session once no request uses it.
        A request that took the adapter before the reload but opens only now (it was
        queued) still gets a session, closed in turn when that request is done."""
        self._retired = True
        self._close_if_idle()

    @property
    def trust_rotated(self) -> bool:
        """Its connections trust a `ca_file` that has changed on disk since (a bundle
        that cannot be read now is no change: the trust it has keeps serving)."""
        if self._ca_stamp is None:  # no client yet, or it trusts the system's CAs
            return False
        now = ca_stamp(self._ca_stamp[0])
        return now is not None and now != self._ca_stamp

    @property
    def idle_closed(self) -> bool:
        """Retired, and nothing left open: the pool can forget it."""
        return self._retired and self._users == 0 and self._client is None

    def _finished(self) -> None:
        self._users -= 1
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if not self._retired or self._users or self._client is None:
            return
        client, self._client = self._client, None
        self._closing = asyncio.get_running_loop().create_task(client.close())

    async def close(self) -> None:
        if self._closing is not None:
            await self._closing
        if self._client is not None:
            await self._client.close()

    def prepare(self, path: str, raw: bytes, body: dict[str, Any], *, model: str,
                stream_usage: bool, priority: str = "normal") -> bytes:
        """The bytes to send for a request (`raw`, parsed as `body`) to this backend's
        `model`, made before the attempt starts: the client's bytes with `model`
        changed, `stream_options.include_usage` when `stream_usage`, and the caller's
        `priority` as this backend takes it in the body (vLLM's band, OpenAI's tier).
        An adapter whose API cannot express the request raises `BadRequest` here,
        before anything is sent or counted, and the pipeline moves on to the next
        candidate."""
        encoded = upstream_body(raw, body, model, add_include_usage=stream_usage)
        fields = self._band_fields.get(priority)
        if fields is None:
            return encoded
        return with_fields(encoded, body, fields[0], fields[1])

    def band_header(self, priority: str) -> str | None:
        """The `x-routegate-priority` value for a caller of `priority` (None: not sent)."""
        return self._band_headers.get(priority)

    async def open(self, path: str, body: bytes, headers: Mapping[str, str] | None = None,
                   timeouts: Timeouts | None = None) -> Http1Response:
        """POST and wait for the response headers (`timeouts`: this attempt's, when a
        deadline makes them tighter than the backend's). A 2xx/4xx response is returned open
        (the caller reads and releases it); connection failures, timeouts, 429, 5xx and
        a refusal of the gateway's own credentials (401/403) raise `UpstreamFailure` so
        the caller can try the next candidate."""
        self._users += 1
        try:
            response = await self._post(path, body, headers, timeouts)
        except BaseException:
            self._finished()
            raise
        response.on_done = self._finished
        kind = status_kind(response.status)
        if kind is None:
            return response
        try:
            error_body = await response.read(MAX_ERROR_BODY_BYTES)
        except READ_ERRORS:
            error_body = b""
        finally:
            response.release()
        raise status_failure(kind, self.name, response.status, error_body, response.headers)

    async def _post(self, path: str, body: bytes, headers: Mapping[str, str] | None,
                    timeouts: Timeouts | None) -> Http1Response:
        try:
            return await self.client().post(path, body, headers, timeouts)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise send_failure(self.name, exc) from exc


def _priority_wire(backend: Backend) -> tuple[dict[str, str], dict[str, tuple[dict[str, Any],
                                                                           bytes]]]:
    """Per caller priority, made once per backend: the header value, and the body fields
    with their spliced bytes, that carry it to this backend."""
    carrier = backend.band_carrier
    headers: dict[str, str] = {}
    if carrier == "header":
        headers.update((p, str(band)) for p, band in PRIORITY_BANDS.items())
    fields: dict[str, dict[str, Any]] = {}
    for priority, band in PRIORITY_BANDS.items():
        these: dict[str, Any] = {"priority": band} if carrier == "vllm" else {}
        tier = backend.service_tier.get(priority)
        if tier is not None:
            these["service_tier"] = tier
        if these:
            fields[priority] = these
    return headers, {p: (f, spliced_fields(f)) for p, f in fields.items()}
