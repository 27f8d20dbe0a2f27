"""The one path every proxied request takes, as small named steps on a `RequestContext`.

    begin           request id, timing, the policy this request runs under
    authenticate    API key → tenant                              (gateway.auth)
    read_body       size limit (Content-Length first, then the actual bytes)
    parse           orjson once; validate the fields we need; model must exist
                    (an endpoint's `dialect` — Anthropic Messages — becomes a chat body
                    here, and its stream is re-encoded as it is written back)
    admit           hooks.admission.admit       ← rate limits   (gateway/limits)
    route           hooks.router                ← routing.decide (ordered candidates)
    forward         per candidate: hooks.queue.slot ← queueing; upstream call; relay
                    fallback to the next candidate on connect errors, timeouts, 429 and
                    5xx, while no byte has reached the client (hooks.max_attempts)
    settle          hooks.admission.settle      (always, once admitted; ctx.usage)
    finish          hooks.observers             ← telemetry (spans, metrics, access log)

Observers are told `request_started`, `attempt_finished` after each try and
`request_finished` at the very end (status, usage and error are final by then).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.api.rewrite import upstream_body
from gateway.api.validate import model_name
from gateway.auth import Authenticator
from gateway.context import Attempt, Dialect, Endpoint, RequestContext
from gateway.errors import (
    TIMING_KEY,
    BadRequest,
    GatewayError,
    ModelNotFound,
    NoBackendAvailable,
    PayloadTooLarge,
    RateLimited,
    UpstreamClientError,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.hooks import Hooks
from gateway.live_policy import LivePolicy
from gateway.queueing.slot_hook import BackendSaturated, priority_of
from gateway.sse import DONE_EVENT, SseRelay, comment, error_event
from gateway.upstream.openai import PASSTHROUGH_HEADERS, UpstreamFailure
from gateway.upstream.pool import UpstreamPool, UpstreamResponse

log = logging.getLogger("routegate.pipeline")

# A larger JSON reply (a big embeddings batch, mostly floats) is relayed without being
# parsed: only its `usage` object is picked out of the bytes (`usage_of`).
MAX_PARSED_REPLY_BYTES = 1 << 20
CLIENT_CLOSED = 499  # nginx's status for "the client went away first"
_STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                   "X-Accel-Buffering": "no"}
_TRACE_HEADERS = ("traceparent", "tracestate")


class Pipeline:
    def __init__(self, live: LivePolicy, pool: UpstreamPool, hooks: Hooks) -> None:
        self.live = live
        self.pool = pool
        self.hooks = hooks
        self.auth = Authenticator()

    async def handle(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        ctx = self.begin(request, endpoint)
        tel = ctx.telemetry
        observers = self.hooks.observers
        for observer in observers:
            observer.request_started(ctx)
        try:
            with tel.step("routegate.auth"):
                self.authenticate(ctx)
            tenant = ctx.identity.tenant if ctx.identity else None
            tel.identify(tenant=tenant, priority=priority_of(ctx, tenant) if tenant else None)
            await self.read_body(ctx)
            self.parse(ctx)
            tel.identify(requested_model=ctx.model, stream=ctx.stream,
                         operation=ctx.endpoint.name, max_tokens=ctx.body.get("max_tokens"),
                         temperature=ctx.body.get("temperature"))
            with tel.step("routegate.rate_limit"):
                await self.hooks.admission.admit(ctx)
            try:
                with tel.step("routegate.route") as span:
                    self.route(ctx)
                    tel.decided(span, ctx.model, ctx.candidates, ctx.decision)
                response = await self.forward(ctx)
            finally:
                await self.hooks.admission.settle(ctx)
            if ctx.status is None:
                ctx.status = response.status
            return response
        except GatewayError as exc:
            ctx.error, ctx.status = exc, exc.status
            exc.headers.setdefault("X-Request-Id", ctx.request_id)
            tel.refused(exc.status, exc.code, exc.type)
            raise
        except asyncio.CancelledError:
            ctx.status = CLIENT_CLOSED
            raise
        finally:
            for observer in observers:
                observer.request_finished(ctx)
            tel.close(ctx.status, usage=ctx.usage, target=ctx.target,
                      error_code=ctx.error.code if ctx.error else None)

    def begin(self, request: web.Request, endpoint: Endpoint) -> RequestContext:
        policy, timing, request_id = self.live.current, request[TIMING_KEY], os.urandom(12).hex()
        telemetry = self.hooks.telemetry.begin(
            request_id=request_id, method=request.method, path=request.path,
            headers=request.headers, timings=timing,
            record_content=policy.file.compliance.record_content)
        return RequestContext(request=request, endpoint=endpoint, policy=policy, timing=timing,
                              request_id=request_id, telemetry=telemetry)

    def authenticate(self, ctx: RequestContext) -> None:
        ctx.identity = self.auth.authenticate(ctx.request, ctx.policy)

    async def read_body(self, ctx: RequestContext) -> None:
        limit = ctx.policy.file.server.max_body_bytes
        request = ctx.request
        length = request.content_length
        if length is not None:
            if length > limit:
                raise _too_large(limit)
            ctx.raw = await request.read()
            return
        chunks, size = [], 0
        while chunk := await request.content.readany():  # chunked: count as it arrives
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        ctx.raw = b"".join(chunks)

    def parse(self, ctx: RequestContext) -> None:
        if not ctx.raw.strip():
            raise BadRequest("The request body is empty; send a JSON object.")
        try:
            body = orjson.loads(ctx.raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"We could not parse the JSON body of your request ({exc}).",
                             code="invalid_json") from exc
        if not isinstance(body, dict):
            raise BadRequest("The request body must be a JSON object.", code="invalid_json")
        dialect = ctx.endpoint.dialect
        if dialect is not None:  # e.g. an Anthropic Messages request, as a chat completion
            body = dialect.request(body)
            ctx.raw = orjson.dumps(body)
        ctx.body = body
        ctx.model = model_name(body)
        ctx.endpoint.check(body)
        tenant = ctx.identity.tenant if ctx.identity is not None else None
        if ctx.policy.resolve_model(ctx.model, tenant) is None:
            raise ModelNotFound(
                f"The model '{ctx.model}' does not exist; GET /v1/models lists the routes "
                "and models you can use.", param="model")
        ctx.stream = body.get("stream") is True
        options = body.get("stream_options")
        ctx.client_wants_usage = bool(options and options.get("include_usage") is True)
        headers = ctx.request.headers
        ctx.upstream_headers["X-Request-Id"] = ctx.request_id
        for name in _TRACE_HEADERS:
            if name in headers:
                ctx.upstream_headers[name] = headers[name]

    def route(self, ctx: RequestContext) -> None:
        # an Anthropic backend has no /embeddings: routing never picks what cannot serve
        ctx.candidates = self.pool.serving(ctx.endpoint.path, self.hooks.router(ctx))
        if not ctx.candidates:
            raise NoBackendAvailable(f"No backend can serve '{ctx.model}' now.")

    async def forward(self, ctx: RequestContext) -> web.StreamResponse:
        failures: list[UpstreamFailure] = []
        unavailable: list[str] = []
        saturated: list[BackendSaturated] = []  # refused by a full queue, at no cost
        tried = 0
        for target in ctx.candidates:
            if tried >= self.hooks.max_attempts:
                break
            upstream = self.pool.get(target.backend_name, target.backend)
            if upstream is None:
                reason = self.pool.unavailable_reason(target.backend_name)
                unavailable.append(f"{target.key}: {reason}")
                continue
            tried += 1
            body = upstream_body(ctx.raw, ctx.body, target.upstream_name,
                                 add_include_usage=ctx.stream and not ctx.client_wants_usage)
            attempt = Attempt(target=target)
            ctx.attempts.append(attempt)
            # Entered and left by hand, not through an AsyncExitStack (~5 µs a request):
            # a refusal at the door moves on to the next candidate at no cost.
            held = ctx.telemetry.queued(target.backend_name, self.hooks.queue.slot(ctx, target))
            try:
                await held.__aenter__()
            except BackendSaturated as refused:  # nothing sent yet: spill to the next
                ctx.attempts.pop()
                tried -= 1
                saturated.append(refused)
                unavailable.append(refused.message)
                continue
            try:
                ctx.target = target
                # starts the upstream clock and span; injects this attempt's traceparent
                traced = ctx.telemetry.upstream(target, ctx.upstream_headers)
                try:
                    response = await upstream.open(ctx.endpoint.path, body, ctx.upstream_headers)
                    traced.responded(response.headers, response.status)
                    attempt.status = response.status
                    if ctx.stream and response.content_type == "text/event-stream":
                        result = await self.relay_stream(ctx, response)
                    else:
                        result = await self.relay_body(ctx, response)
                except UpstreamFailure as failure:
                    attempt.error, attempt.status = failure.error.message, failure.status
                    traced.failed(failure.error.message)
                    failures.append(failure)
                    self._attempt_finished(ctx, attempt)
                    log.info("request %s: %s failed (%s)", ctx.request_id, target.key,
                             failure.error.message)
                    result = None
            except BaseException as exc:
                await held.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            await held.__aexit__(None, None, None)
            if result is None:
                continue
            traced.end()
            self._attempt_finished(ctx, attempt)
            return result
        if saturated and not failures:  # shed: 503 with the soonest Retry-After
            raise BackendSaturated.for_all(ctx.model, saturated, unavailable)
        raise self.exhausted(ctx, failures, unavailable)

    def _attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        for observer in self.hooks.observers:
            observer.attempt_finished(ctx, attempt)

    async def relay_body(self, ctx: RequestContext,
                         response: UpstreamResponse) -> web.Response:
        name = ctx.target.backend_name if ctx.target else "?"
        try:
            data = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamFailure(UpstreamError(
                f"Backend '{name}' failed while sending its response: {exc!r}.")) from exc
        finally:
            response.release()
        ctx.timing.upstream_finished()
        status = response.status
        if 400 <= status < 500 and not _is_openai_error(data):
            raise UpstreamClientError(status, f"Backend '{name}' rejected the request "
                                      f"(HTTP {status}): {data[:300].decode(errors='replace')}")
        if status < 300:
            reply = _parsed(data) if len(data) <= MAX_PARSED_REPLY_BYTES else None
            if reply is not None:  # parsed once: usage here, model/id/finish reasons for spans
                usage = reply.get("usage")
                ctx.usage = usage if isinstance(usage, dict) else None
                ctx.telemetry.response_json(reply)
            else:
                ctx.usage = usage_of(data)
        headers = {"Content-Type": response.headers.get("Content-Type", "application/json"),
                   "X-Request-Id": ctx.request_id}
        for header in PASSTHROUGH_HEADERS:
            if header in response.headers:
                headers[header] = response.headers[header]
        return web.Response(status=status, body=data, headers=headers)

    async def relay_stream(self, ctx: RequestContext,
                           response: UpstreamResponse) -> web.StreamResponse:
        name = ctx.target.backend_name if ctx.target else "?"
        relay = SseRelay(strip_usage_chunk=not ctx.client_wants_usage)
        ctx.state["sse_relay"] = relay  # settlement counts what a cut-short stream produced
        content = response.content
        finished = False
        try:
            try:  # nothing has reached the client yet: a failure here may fall back
                first = await content.readany()
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise UpstreamFailure(UpstreamError(
                    f"Backend '{name}' failed before streaming: {exc!r}.")) from exc
            if not first:
                raise UpstreamFailure(UpstreamError(
                    f"Backend '{name}' closed the stream without sending an event."))
            client = web.StreamResponse(status=200, headers=_STREAM_HEADERS)
            client.headers["X-Request-Id"] = ctx.request_id
            client.headers["Server-Timing"] = ctx.timing.header()
            await client.prepare(ctx.request)
            write, write_last = _writers(client, ctx.endpoint.dialect)
            ctx.bytes_sent = True
            ctx.status = 200
            try:
                out = relay.feed(first)
                ctx.telemetry.relayed(out)
                await write(out)
                try:
                    while data := await content.readany():
                        out = relay.feed(data)
                        if out:
                            ctx.telemetry.relayed(out)
                            await write(out)
                except (TimeoutError, aiohttp.ClientError) as exc:
                    failure = (UpstreamTimeout if isinstance(exc, TimeoutError)
                               else UpstreamError)(
                        f"Backend '{name}' failed mid-stream: {exc!r}.")
                    ctx.error = failure
                    await write(error_event(failure.body()))
                else:
                    finished = True
                ctx.usage = relay.usage
                ctx.telemetry.final_chunk(relay.usage_chunk)
                ctx.timing.upstream_finished()
                tail = relay.leftover() + comment("server-timing " + ctx.timing.header())
                # the last bytes and the chunked terminator leave in one transport write
                await write_last(tail + DONE_EVENT if relay.done else tail)
            except ConnectionResetError:  # the client went away between two writes
                ctx.status = CLIENT_CLOSED
                finished = False
            return client
        finally:
            if finished:
                response.release()
            else:
                response.close()  # drop the connection: the backend stops generating

    def exhausted(self, ctx: RequestContext, failures: Sequence[UpstreamFailure],
                  unavailable: Sequence[str]) -> GatewayError:
        if not failures:
            return NoBackendAvailable(
                f"No backend can serve '{ctx.model}': " + "; ".join(unavailable) + ".")
        summary = "; ".join(_describe(failure) for failure in failures)
        last = failures[-1]
        if len(failures) > 1 or unavailable:
            summary = f"All candidates for '{ctx.model}' failed: {summary}" + (
                "; " + "; ".join(unavailable) if unavailable else "")
        if all(failure.status == 429 for failure in failures):
            headers = {}
            if "Retry-After" in last.headers:
                headers["Retry-After"] = last.headers["Retry-After"]
            return RateLimited(summary, headers=headers)
        error = last.error.__class__(summary)
        return error


def _writers(client: web.StreamResponse, dialect: Dialect | None,
             ) -> tuple[Callable[[bytes], Awaitable[None]], Callable[[bytes], Awaitable[None]]]:
    """(`write`, `write_eof`) of `client`; for another API's endpoint, both re-encode."""
    if dialect is None:
        return client.write, client.write_eof
    encode = dialect.stream_encoder()

    async def write(data: bytes) -> None:
        await client.write(encode(data))

    async def write_last(data: bytes) -> None:
        await client.write_eof(encode(data))

    return write, write_last


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")


def _describe(failure: UpstreamFailure) -> str:
    text = failure.error.message.rstrip(".")
    if failure.body:
        try:
            message = orjson.loads(failure.body)["error"]["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = None
        if isinstance(message, str):
            text += f" ({message[:200]})"
    return text


def _parsed(data: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _is_openai_error(data: bytes) -> bool:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


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
