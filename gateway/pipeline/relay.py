"""Relaying a backend's response to the client: one JSON body, or an SSE stream.

`relay_body` reads a JSON reply once and sends it as one response, its bytes
untouched; `relay_stream` relays events as they arrive, never buffered. Until the
first byte has reached the client a failure raises an `UpstreamFailure` kind, so the
pipeline may try the next candidate; after that it ends the stream with an
OpenAI-style error event — never a silent truncation.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from aiohttp import web

from gateway.core.attempt_facts import Attempt, note_usage
from gateway.core.context import RequestContext
from gateway.core.drain import drain_cut_error, is_drain_cut
from gateway.core.errors import UpstreamClientError
from gateway.core.failures import (
    UNSUPPORTED_ENDPOINT,
    ClientRejected,
    Incapable,
    MalformedResponse,
    Redirected,
    ResponseTooLarge,
    UpstreamClosed,
    UpstreamFailure,
)
from gateway.core.sse import DONE_EVENT, MalformedEvent, SseRelay, comment, error_event
from gateway.core.stream_out import STREAM_HEADERS, stream_writers
from gateway.core.whole_response import WholeResponse
from gateway.upstream.failures import READ_ERRORS, read_failure
from gateway.upstream.http1_errors import BodyTooLarge
from gateway.upstream.openai import PASSTHROUGH_HEADERS, incapable
from gateway.upstream.pool import UpstreamResponse

# A larger JSON reply (a big embeddings batch, mostly floats) is relayed without being
# parsed: only its `usage` object is picked out of the bytes (`usage_of`).
MAX_PARSED_REPLY_BYTES = 1 << 20
CLIENT_CLOSED = 499  # nginx's status for "the client went away first"

async def relay_body(ctx: RequestContext, attempt: Attempt,
                     response: UpstreamResponse) -> WholeResponse:
    name = attempt.target.backend_name
    # never relay a shape the client did not ask for
    if ctx.record.stream and response.status < 300:
        response.close()
        raise MalformedResponse(
            f"Backend '{name}' answered a streaming request with "
            f"{response.content_type}, not an event stream.", status=response.status)
    limit = ctx.policy.file.server.max_upstream_body_bytes
    try:
        data = await response.read(limit)
    except BodyTooLarge as exc:
        response.close()
        raise ResponseTooLarge(
            f"Backend '{name}' sent a reply over {limit} bytes "
            "(server.max_upstream_body_bytes).") from exc
    except READ_ERRORS as exc:
        raise read_failure(
            exc, f"Backend '{name}' failed while sending its response: {exc!r}.") from exc
    finally:
        response.release()
    ctx.timing.upstream_ended()
    status = response.status
    if 300 <= status < 400:  # a misconfigured `url:` (http → https, a moved API)
        raise Redirected(
            f"Backend '{name}' redirected the request (HTTP {status}) to "
            f"{response.headers.get('Location', 'nowhere')}; its url needs updating.",
            status=status)
    if 400 <= status < 500:
        error = _openai_error(data)
        if error is None and status in (404, 405) and ctx.endpoint.path != "/chat/completions":
            # a chat-only server asked for /embeddings answers its framework's bare Not
            # Found: it cannot do this, and another candidate may
            raise ClientRejected(
                f"Backend '{name}' has no /v1{ctx.endpoint.path} endpoint (HTTP {status}).",
                status=status, body=data, cannot=Incapable(
                    UNSUPPORTED_ENDPOINT, None, f"no /v1{ctx.endpoint.path} endpoint"))
        if error is None:
            raise UpstreamClientError(status, f"Backend '{name}' rejected the request "
                                      f"(HTTP {status}).",
                                      detail=f"It said: {data[:300].decode(errors='replace')}")
        cannot = incapable(status, error)
        if cannot is not None:  # nothing sent yet: the next candidate may do it
            raise ClientRejected(
                f"Backend '{name}' cannot serve this request ({cannot.code}"
                + (f", param {cannot.param}" if cannot.param else "") + ").",
                status=status, body=data, cannot=cannot)
    if status < 300 and len(data) <= MAX_PARSED_REPLY_BYTES:
        reply = _parsed(data)  # parsed once: usage here, model/id/finish reasons for spans
        if reply is None:  # an HTML page from a proxy, a cut body: nothing sent yet
            raise MalformedResponse(
                f"Backend '{name}' answered HTTP {status} with something other than a "
                f"JSON object ({len(data)} bytes of "
                f"{response.headers.get('Content-Type', 'no stated type')}).",
                status=status)
        attempt.reply(reply)
    elif status < 300:
        usage = usage_of(data)
        if usage is not None:
            note_usage(ctx.record, usage)
    headers = {"Content-Type": response.headers.get("Content-Type", "application/json"),
               "X-Request-Id": ctx.record.request_id, **ctx.response_headers}
    for header in PASSTHROUGH_HEADERS:
        if header in response.headers:
            headers[header] = response.headers[header]
    return WholeResponse(status=status, body=data, headers=headers)


async def relay_stream(ctx: RequestContext, attempt: Attempt,
                       response: UpstreamResponse) -> web.StreamResponse:
    name = attempt.target.backend_name
    record = ctx.record
    relay = SseRelay(strip_usage_chunk=not record.client_wants_usage,
                     max_event_bytes=ctx.policy.file.server.max_event_bytes)
    content = response.content
    finished = False
    try:
        broken: MalformedEvent | None = None
        try:  # nothing has reached the client yet: a failure here may fall back
            first = data = await content.readany()
            out = relay.feed(data)
            while data and not out:  # no whole event yet: still nothing committed
                data = await content.readany()
                out = relay.feed(data)
        except READ_ERRORS as exc:
            raise read_failure(
                exc, f"Backend '{name}' failed before streaming: {exc!r}.") from exc
        except MalformedEvent as exc:
            if not exc.forward:  # not one good event: not a stream this client can use
                raise MalformedResponse(_malformed(name, exc)) from None
            broken, out = exc, b""
        if not first:
            raise MalformedResponse(
                f"Backend '{name}' closed the stream without sending an event.")
        client = web.StreamResponse(status=200, headers={
            **STREAM_HEADERS, **ctx.response_headers, "X-Request-Id": ctx.record.request_id,
            "Server-Timing": ctx.timing.server_timing()})
        await client.prepare(ctx.request)
        write, write_last = stream_writers(client, ctx.endpoint.dialect, ctx.cache_capture)
        ctx.bytes_sent = True
        record.status = 200
        try:
            attempt.relayed(out)
            await write(out)
            failure: UpstreamFailure | None = None
            try:
                if broken is not None:  # the first read's good events, then the error
                    raise broken
                while data := await content.readany():
                    out = relay.feed(data)
                    if out:
                        attempt.relayed(out)
                        await write(out)
            except READ_ERRORS as exc:
                failure = read_failure(exc, f"Backend '{name}' failed mid-stream: {exc!r}.")
            except MalformedEvent as exc:
                attempt.relayed(exc.forward)
                await write(exc.forward)
                failure = MalformedResponse(_malformed(name, exc))
            else:
                finished = True
            # before usage is read: the last event may carry it
            leftover = relay.leftover() if failure is None else b""
            if leftover is None:  # the connection ended the stream mid-event
                failure = UpstreamClosed(f"Backend '{name}' ended the stream mid-event.")
            elif failure is None and not relay.complete:  # a clean end, but too soon
                failure = UpstreamClosed(
                    f"Backend '{name}' ended the stream before it was complete (no "
                    "finish_reason, no [DONE]); the reply may be cut short.")
            last_event = leftover or b""
            if failure is not None:
                relay.drop_partial()
                attempt.failure = failure  # its kind, for ejection and metrics
                attempt.broke(failure.metric_reason)
                error = failure.error
                record.error_code = error.code
                last_event = error_event(error.body())
            attempt.relayed(last_event)
            attempt.body(relay.usage_chunk)
            ctx.timing.upstream_ended()
            tail = last_event + comment("server-timing " + ctx.timing.server_timing())
            # the last bytes and the chunked terminator leave in one transport write
            await write_last(tail + DONE_EVENT if relay.done and failure is None else tail)
        except ConnectionResetError:  # the client went away between two writes
            record.status = CLIENT_CLOSED
            finished = False
        except asyncio.CancelledError as exc:
            if is_drain_cut(exc):  # the process is stopping: the client is told why
                cut = drain_cut_error()
                record.error_code = cut.code
                relay.drop_partial()
                with contextlib.suppress(ConnectionResetError):
                    await write_last(error_event(cut.body()))
            raise
        return client
    finally:
        if finished:
            response.release()
        else:
            response.close()  # drop the connection: the backend stops generating


def _malformed(name: str, exc: MalformedEvent) -> str:
    return f"Backend '{name}' sent a malformed stream event: {exc.reason}."




def _parsed(data: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _openai_error(data: bytes) -> dict[str, Any] | None:
    """The `error` object of an OpenAI-shaped error body, or None."""
    body = _parsed(data)
    error = body.get("error") if body is not None else None
    return error if isinstance(error, dict) else None


def usage_of(data: bytes) -> dict[str, object] | None:
    """The `usage` object of a JSON response, without parsing the whole body when
    it is large (an embeddings reply is mostly floats; usage comes last)."""
    key = data.rfind(b'"usage"')
    if key < 0:
        return None
    start = data.find(b"{", key)
    if start < 0 or data[key + 7:start].strip(b" :\t\r\n"):
        return None  # `"usage": null`, or the word in some other position
    # Usage holds numbers and small nested objects (`*_tokens_details`), never strings
    # with braces, so the first `}` that balances the `{`s seen so far closes it.
    end = start
    while (end := data.find(b"}", end + 1)) >= 0:
        segment = data[start:end + 1]
        if segment.count(b"{") == segment.count(b"}"):
            try:
                usage = orjson.loads(segment)
            except orjson.JSONDecodeError:
                return None
            return usage if isinstance(usage, dict) else None
    return None
