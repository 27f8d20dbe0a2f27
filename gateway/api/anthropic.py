"""The Anthropic Messages API surface: `POST /v1/messages`, `POST /v1/messages/count_tokens`.

A Messages request runs through the same pipeline as a chat completion (auth, limits,
routing, queues, telemetry, fallback) as the chat body `chat_request` makes of it, so
any backend can serve it: an OpenAI-compatible one, or an Anthropic one (whose adapter
translates to the Messages API again). What goes back is Anthropic's wire format: a
`message` JSON, the event stream (re-encoded as the pipeline writes it), and errors as
`{"type": "error", "error": {"type", "message"}}`, so the official `anthropic` SDK
works with only `base_url` changed. Keys arrive as `x-api-key` (or Bearer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.api.messages_to_chat import (
    EventEncoder,
    chat_request,
    error_body,
    message,
    openai_error_message,
)
from gateway.api.openai import PIPELINE, continue_unless_too_large
from gateway.api.validate import check_chat
from gateway.core.auth import TENANT_HEADER
from gateway.core.context import Endpoint, RequestContext
from gateway.core.errors import GatewayError, ModelNotFound, log_error
from gateway.core.whole_response import WholeResponse
from gateway.pipeline.request_body import json_object, model_name, read_limited
from gateway.route.hook import ROUTING
from policies.load import ModelTarget

log = logging.getLogger("routegate.api.anthropic")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MessagesDialect:
    """The Messages API as spoken through the chat-completions pipeline."""

    async def request(self, ctx: RequestContext, body: dict[str, Any]) -> dict[str, Any]:
        return chat_request(body)

    def native(self, target: ModelTarget) -> None:
        return None  # an Anthropic backend is reached through its adapter

    def stream_encoder(self) -> Callable[[bytes], bytes]:
        return EventEncoder().feed

    async def stream_finished(self) -> None:
        return None

    async def whole_answer(self, response: WholeResponse) -> WholeResponse:
        """A chat completion (or a backend's error) as a Messages API answer."""
        data = response.body
        request_id = response.headers.get("X-Request-Id", "")
        headers = {name: value for name, value in response.headers.items()
                   if name.lower() not in ("content-type", "content-length")}
        headers["request-id"] = request_id
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


MESSAGES = Endpoint("messages", "/chat/completions", check_chat, dialect=MessagesDialect(),
                    errors=anthropic_error)


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
    # streamed: re-encoded as Messages events as it went; whole: `MessagesDialect.whole_answer`
    return await request.app[PIPELINE].handle(request, MESSAGES)


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
