"""The Anthropic Messages API surface: `POST /v1/messages`, `POST /v1/messages/count_tokens`.

A Messages request runs through the same pipeline as a chat completion (auth, limits,
routing, queues, telemetry, fallback) as the chat body `chat_request` makes of it, so
any backend can serve it. An Anthropic backend gets the request as the client wrote
it (`translators.AsWritten`: `thinking`, `cache_control`, `metadata` and the rest
intact, only `model` changed) and its answer goes back unchanged, its usage read on
the way (`messages_native`); an OpenAI-compatible one gets the chat body, and its
answer is re-encoded. What goes back is Anthropic's wire format: a
`message` JSON, the event stream (re-encoded as the pipeline writes it), and errors as
`{"type": "error", "error": {"type", "message"}}`, so the official `anthropic` SDK
works with only `base_url` changed. Keys arrive as `x-api-key` (or Bearer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from aiohttp import web

from gateway.api.messages_native import NativeMessageEvents
from gateway.api.messages_to_chat import (
    EventEncoder,
    chat_request,
    error_body,
    message,
    openai_error_message,
)
from gateway.api.openai import PIPELINE, continue_unless_too_large
from gateway.api.translators import Api, AsWritten, translator
from gateway.api.validate import check_chat
from gateway.core.attempt_facts import note_usage
from gateway.core.auth import TENANT_HEADER
from gateway.core.context import Endpoint, RequestContext
from gateway.core.errors import GatewayError, ModelNotFound, log_error
from gateway.core.whole_response import WholeResponse
from gateway.pipeline.request_body import json_object, model_name, read_limited
from gateway.route.hook import ROUTING
from policies.load import ModelTarget

log = logging.getLogger("routegate.api.anthropic")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Sent on with a request passed through as written, which may use a beta feature.
BETA_HEADER = "anthropic-beta"


class MessagesCall:
    """One `POST /v1/messages`, as the pipeline's dialect for that request."""

    def __init__(self) -> None:
        self.ctx: RequestContext | None = None
        self.raw = b""  # the client's bytes
        self.source: dict[str, Any] = {}  # ... parsed
        self.pivot: dict[str, Any] = {}  # the chat body made of it
        self.native_now = False  # the attempt being made sends the request as written
        self.events: NativeMessageEvents | None = None

    async def request(self, ctx: RequestContext, body: dict[str, Any]) -> dict[str, Any]:
        self.ctx, self.raw, self.source = ctx, ctx.raw, body
        self.pivot = chat_request(body)  # checks what the Messages API requires, too
        return self.pivot

    def native(self, target: ModelTarget) -> tuple[str, bytes] | None:
        way = translator(Api.MESSAGES, target.backend)
        ctx = self.ctx
        assert ctx is not None, "request() comes first"
        # A body rewritten since it was parsed (PII redacted) exists only as chat: the
        # client's own bytes must not go out instead.
        self.native_now = isinstance(way, AsWritten) and ctx.body is self.pivot
        if not self.native_now:
            ctx.upstream_headers.pop(BETA_HEADER, None)  # set for an earlier candidate
            return None
        beta = ctx.request.headers.get(BETA_HEADER)
        if beta is not None:  # the features the body may use (1h cache TTL, ...)
            ctx.upstream_headers[BETA_HEADER] = beta
        return cast(AsWritten, way).request(self.raw, self.source, target.upstream_name)

    def stream_encoder(self) -> Callable[[bytes], bytes]:
        if self.native_now:
            self.events = NativeMessageEvents()
            return self.events.feed
        return EventEncoder().feed

    async def stream_finished(self) -> None:
        events, ctx = self.events, self.ctx
        if events is None or ctx is None:
            return
        usage = events.usage
        if usage is not None:
            # Anthropic splits it over message_start and message_delta; the relay saw
            # only the last
            note_usage(ctx.record, usage)
        if events.stop_reason is not None:
            ctx.record.finish_reasons.append(events.stop_reason)

    async def whole_answer(self, response: WholeResponse) -> WholeResponse:
        """A chat completion (or a backend's error) as a Messages API answer; a native
        backend's answer as it is."""
        data = response.body
        request_id = response.headers.get("X-Request-Id", "")
        headers = {name: value for name, value in response.headers.items()
                   if name.lower() not in ("content-type", "content-length")}
        headers["request-id"] = request_id
        if self.native_now:  # a message, or Anthropic's own error shape
            return WholeResponse(status=response.status, body=data, headers={
                **headers, "Content-Type": "application/json"})
        if response.status >= 400:  # a backend's own error, relayed with its status
            text = openai_error_message(data) or data[:300].decode(errors="replace")
            return _json(error_body(response.status, text, request_id), response.status, headers)
        try:
            completion = orjson.loads(data)
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            return _json(error_body(502, "The backend's response was not a chat completion.",
                                    request_id), 502, headers)
        return _json(message(completion), response.status, headers)


def _json(body: object, status: int = 200, headers: dict[str, str] | None = None,
          ) -> WholeResponse:
    return WholeResponse(status=status, body=orjson.dumps(body),
                         headers={**(headers or {}), "Content-Type": "application/json"})


def anthropic_error(exc: GatewayError) -> WholeResponse:
    """A `GatewayError` in Anthropic's error shape, with its status and headers
    (`Retry-After`, `x-ratelimit-*`)."""
    headers = dict(exc.headers)
    request_id = headers.get("X-Request-Id")
    if request_id:
        headers["request-id"] = request_id
    return _json(error_body(exc.status, exc.client_message, request_id), exc.status, headers)


def anthropic_errors(handler: Handler) -> Handler:
    """A handler outside the pipeline whose errors are written in Anthropic's shape (the
    middleware would write OpenAI's)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except GatewayError as exc:
            log_error(log, request, exc)
            return anthropic_error(exc)

    wrapped.__name__ = handler.__name__
    return wrapped


@anthropic_errors
async def create_message(request: web.Request) -> web.StreamResponse:
    # streamed: re-encoded (or passed through) as it went; whole: `MessagesCall.whole_answer`
    endpoint = Endpoint("messages", "/chat/completions", check_chat, dialect=MessagesCall(),
                        errors=anthropic_error)
    return await request.app[PIPELINE].handle(request, endpoint)


@anthropic_errors
async def count_tokens(request: web.Request) -> web.StreamResponse:
    """An estimate with the gateway's own BPE tables (the ones routing budgets with),
    not the model's tokenizer: close for English text, not exact."""
    pipeline = request.app[PIPELINE]
    policy = pipeline.live.current
    identity = pipeline.auth.authenticate(request, policy)
    raw = await read_limited(request, policy.file.server.max_body_bytes,
                             policy.file.server.body_read_timeout_s)
    chat = chat_request(json_object(raw), counting=True)
    model = model_name(chat)
    if policy.usable(model, identity.tenant, identity.key_hash) is None:
        raise ModelNotFound(f"model: {model}", param="model")
    return _json({"input_tokens": request.app[ROUTING].tokens.count_request(chat)},
                 headers={TENANT_HEADER: identity.tenant})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", create_message,
                        expect_handler=continue_unless_too_large)
    app.router.add_post("/v1/messages/count_tokens", count_tokens,
                        expect_handler=continue_unless_too_large)
