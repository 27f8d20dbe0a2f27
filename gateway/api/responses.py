"""The OpenAI Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

A Responses request runs through the same pipeline as a chat completion (auth, limits,
routing, queues, telemetry, fallback), as the chat body `chat_request` makes of it. A
backend declared `responses: native` (OpenAI) gets the request as the client wrote it
at its own `/v1/responses`, and its answer goes back unchanged; any other backend gets
the chat translation, and its answer is re-encoded as a `response` object or the
Responses event stream. What only the Responses API can say (built-in tools,
`include`, ...) is a 400 naming the field when no candidate speaks it natively.

`previous_response_id` is resolved by the gateway from its own store (per tenant, with
a TTL), whichever backend served the earlier turn: the backend gets the whole
conversation, never an id it may not know.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from gateway.api.openai import PIPELINE, continue_unless_too_large
from gateway.api.responses_output import EventEncoder, Shell, new_id, response_of
from gateway.api.responses_request import chat_request, input_items, invalid, untranslatable
from gateway.api.responses_state import StoredResponses
from gateway.api.translators import Api, AsWritten, translator
from gateway.api.validate import check_chat
from gateway.core.attempt_facts import note_usage
from gateway.core.auth import TENANT_HEADER
from gateway.core.context import Endpoint, RequestContext
from gateway.core.errors import BadRequest, NotFound, UpstreamError
from gateway.core.whole_response import WholeResponse
from policies.load import ModelTarget

Body = dict[str, Any]

RESPONSES_STATE = web.AppKey("routegate.responses_state", StoredResponses)
_FINAL_EVENTS = (b'"response.completed"', b'"response.incomplete"')


class NativeEvents:
    """A native backend's Responses stream, passed through byte for byte; the finished
    `response` object is picked out of its last event."""

    def __init__(self) -> None:
        self.final: Body | None = None
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        if any(marker in data for marker in _FINAL_EVENTS) or self._pending:
            buffered = self._pending + data
            events = buffered.split(b"\n\n")
            self._pending = events.pop()
            for event in events:
                for line in event.split(b"\n"):
                    if line.startswith(b"data:") and any(m in line for m in _FINAL_EVENTS):
                        self.final = _response_in(line[5:])
        return data


def _response_in(payload: bytes) -> Body | None:
    """The `response` object of a final event's JSON (None if it is not one: it is
    passed on as it is, and nothing is stored)."""
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    response = event.get("response") if isinstance(event, dict) else None
    return response if isinstance(response, dict) else None


class ResponsesCall:
    """One `POST /v1/responses`, as the pipeline's dialect for that request."""

    def __init__(self, stored: StoredResponses) -> None:
        self.stored = stored
        self.raw = b""  # the client's request, its bytes
        self.source: Body = {}  # ... parsed
        self.pivot: Body = {}  # the chat body made of it
        self.tenant = "anonymous"
        self.history: list[Body] = []  # the conversation `previous_response_id` names
        self.cannot_translate: list[str] = []
        self.shell = Shell({}, "", 0)
        self.native_now = False  # the attempt being made sends the request as written
        self.encoder: EventEncoder | NativeEvents | None = None
        self.ctx: RequestContext | None = None

    # -- the Dialect --------------------------------------------------------------------
    async def request(self, ctx: RequestContext, body: Body) -> Body:
        self.ctx, self.raw, self.source = ctx, ctx.raw, body
        self.tenant = ctx.identity.tenant
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise invalid("Input should be a string", "previous_response_id")
            found = await self.stored.load(self.tenant, previous)
            if found is None:
                raise NotFound(f"Previous response with id '{previous}' not found.",
                               param="previous_response_id",
                               code="previous_response_not_found")
            self.history = found[1]
        self.cannot_translate = untranslatable(body)
        self.shell = Shell(body, new_id("resp"), int(time.time()))
        self.pivot = chat_request(body, self.history)
        return self.pivot

    def native(self, target: ModelTarget) -> tuple[str, bytes] | None:
        way = translator(Api.RESPONSES, target.backend)
        # A body rewritten since it was parsed (PII redacted) exists only as chat: the
        # client's own bytes must not go out instead.
        self.native_now = self.ctx is not None and self.ctx.body is self.pivot \
            and isinstance(way, AsWritten)
        if isinstance(way, AsWritten) and self.native_now:
            if "previous_response_id" not in self.source:  # the client's bytes
                return way.request(self.raw, self.source, target.upstream_name)
            # the backend never saw the id: it gets the conversation the gateway kept
            body = {name: value for name, value in self.source.items()
                    if name != "previous_response_id"}
            body["model"] = target.upstream_name
            body["input"] = [*self.history, *input_items(self.source)]
            return way.path, orjson.dumps(body)
        if self.cannot_translate:
            field = self.cannot_translate[0]
            raise BadRequest(
                f"{field}: not supported by backend '{target.backend_name}', which is "
                "reached through chat completions (only a backend with `responses: "
                "native` takes it).", param=field)
        return None

    def stream_encoder(self) -> Callable[[bytes], bytes]:
        self.encoder = NativeEvents() if self.native_now else EventEncoder(self.shell)
        return self.encoder.feed

    async def stream_finished(self) -> None:
        final = self.encoder.final if self.encoder is not None else None
        if final is None:
            return
        record = self.ctx.record if self.ctx is not None else None
        if self.native_now and record is not None and record.input_tokens is None \
                and record.output_tokens is None:
            usage = final.get("usage")  # a native stream reports it in its last event
            if isinstance(usage, dict):
                note_usage(record, usage)
        await self.keep(final)

    async def whole_answer(self, response: WholeResponse) -> WholeResponse:
        if response.status >= 400:
            return response  # a backend's own error, OpenAI-shaped as this API's are
        try:
            completion = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            raise UpstreamError("The backend's answer was not JSON.")
        answer = self.answer(completion)
        await self.keep(answer)
        headers = {name: value for name, value in response.headers.items()
                   if name.lower() != "content-length"}
        return WholeResponse(status=response.status, body=orjson.dumps(answer),
                             headers=headers)

    # -- state --------------------------------------------------------------------------
    async def keep(self, response: Body) -> None:
        if self.source.get("store") is False or not response.get("id"):
            return
        output = [item for item in response.get("output") or () if isinstance(item, dict)]
        await self.stored.save(self.tenant, response,
                               [*self.history, *input_items(self.source), *output])

    def answer(self, completion: Body) -> Body:
        """The backend's JSON answer as a `response` object."""
        if self.native_now:
            if completion.get("object") != "response":
                raise UpstreamError("The backend's answer was not a Responses API object.")
            if self.history:  # the gateway resolved it: the backend never saw the id
                completion["previous_response_id"] = self.source["previous_response_id"]
            return completion
        return response_of(self.shell, completion)


async def create_response(request: web.Request) -> web.StreamResponse:
    call = ResponsesCall(request.app[RESPONSES_STATE])
    endpoint = Endpoint("responses", "/chat/completions", check_chat, dialect=call)
    # streamed: re-encoded (or passed through) as it went; whole: `call.whole_answer`
    return await request.app[PIPELINE].handle(request, endpoint)


def _tenant(request: web.Request) -> str:
    pipeline = request.app[PIPELINE]
    return pipeline.auth.authenticate(request, pipeline.live.current).tenant


async def get_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    tenant = _tenant(request)
    named = {TENANT_HEADER: tenant}
    found = await request.app[RESPONSES_STATE].load(tenant, response_id)
    if found is None:
        raise NotFound(f"Response with id '{response_id}' not found.", headers=named)
    return web.Response(body=orjson.dumps(found[0]), content_type="application/json",
                        headers=named)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    tenant = _tenant(request)
    named = {TENANT_HEADER: tenant}
    if not await request.app[RESPONSES_STATE].delete(tenant, response_id):
        raise NotFound(f"Response with id '{response_id}' not found.", headers=named)
    return web.Response(body=orjson.dumps({"id": response_id, "object": "response",
                                           "deleted": True}),
                        content_type="application/json", headers=named)


def add_routes(app: web.Application, stored: StoredResponses) -> None:
    app[RESPONSES_STATE] = stored
    app.router.add_post("/v1/responses", create_response,
                        expect_handler=continue_unless_too_large)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
