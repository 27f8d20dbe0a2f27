"""A small Anthropic Messages API server speaking the real wire format, for tests.

    fake = FakeAnthropic(api_key="sk-ant-test")   # requests without that x-api-key: 401
    url = await fake.start()                      # "http://127.0.0.1:<port>" (the API root)
    ...                                           # a `type: anthropic` backend's `url:`
    fake.received[-1].json["max_tokens"]          # what the gateway sent (raw bytes in .raw)
    await fake.stop()

POST /v1/messages answers a `message` JSON, or with `"stream": true` the event stream
(`message_start`, `content_block_start`, `ping`, `content_block_delta` text deltas,
`content_block_stop`, `message_delta` with stop_reason and usage, `message_stop`).
Like the real API it refuses a request without `anthropic-version`, without
`max_tokens`, or with a role other than user/assistant in `messages` (400
`invalid_request_error`). With `thinking` enabled the answer opens with a `thinking`
block (streamed as `thinking_delta` and `signature_delta`), as the real API's does.
`behaviour` can fail with a status (529 `overloaded_error`, 429 with `retry-after`,
...), answer with a tool call, or send an `error` event mid-stream.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

THINKING = "The user wants a greeting."
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


@dataclass
class AnthropicBehaviour:
    status: int | None = None  # answer every request with this error status
    fail_times: int | None = None  # ... only the first N requests (None: all)
    retry_after: str | None = None
    reply: str = "Hello from the fake Anthropic upstream."
    stop_reason: str = "end_turn"
    tool_call: tuple[str, dict[str, Any]] | None = None  # (name, input): a tool_use block
    error_after_deltas: int | None = None  # stream: an `overloaded_error` event after N
    chunk_delay_s: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    json: Any


def _words(value: object) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(item) for item in value)
    if isinstance(value, dict):
        return _words(value.get("text") or value.get("content") or "")
    return 0


def thinks(body: Any) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "enabled"


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": message}}


@dataclass
class FakeAnthropic:
    behaviour: AnthropicBehaviour = field(default_factory=AnthropicBehaviour)
    api_key: str | None = None
    received: list[Received] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._failures = 0
        self._runner: web.AppRunner | None = None
        self.app = web.Application()
        self.app.router.add_post("/v1/messages", self._messages)

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _error(self, status: int, message: str) -> web.Response:
        headers = {"request-id": "req_fake"}
        if status == 429 and self.behaviour.retry_after:
            headers["retry-after"] = self.behaviour.retry_after
        return web.Response(status=status, body=orjson.dumps(error_body(status, message)),
                            content_type="application/json", headers=headers)

    def _invalid(self, request: web.Request, body: Any) -> web.Response | None:
        if self.api_key is not None and request.headers.get("x-api-key") != self.api_key:
            return self._error(401, "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return self._error(400, "anthropic-version: header is required")
        if not isinstance(body, dict) or not isinstance(body.get("max_tokens"), int):
            return self._error(400, "max_tokens: Field required")
        for index, message in enumerate(body.get("messages") or ()):
            if message.get("role") not in ("user", "assistant"):
                return self._error(400, f"messages.{index}.role: Input should be 'user' or "
                                        "'assistant'")
        return None

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        self.received.append(Received(request.path, dict(request.headers), raw, body))
        invalid = self._invalid(request, body)
        if invalid is not None:
            return invalid
        b = self.behaviour
        if b.status is not None and (b.fail_times is None or self._failures < b.fail_times):
            self._failures += 1
            return self._error(b.status, "Overloaded" if b.status == 529
                               else f"fake fails with {b.status}")
        input_tokens = _words(body.get("messages")) + _words(body.get("system") or "")
        if body.get("stream"):
            return await self._stream(request, body, input_tokens)
        content: list[dict[str, Any]] = [{"type": "text", "text": b.reply}]
        if thinks(body):
            content.insert(0, {"type": "thinking", "thinking": THINKING, "signature": SIGNATURE})
        stop_reason = b.stop_reason
        if b.tool_call is not None:
            content.append({"type": "tool_use", "id": "toolu_fake", "name": b.tool_call[0],
                            "input": b.tool_call[1]})
            stop_reason = "tool_use"
        message = {"id": "msg_fake", "type": "message", "role": "assistant",
                   "model": body["model"], "content": content, "stop_reason": stop_reason,
                   "stop_sequence": None,
                   "usage": {"input_tokens": input_tokens, "output_tokens": _words(b.reply),
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        return web.Response(body=orjson.dumps(message), content_type="application/json",
                            headers={"request-id": "req_fake"})

    async def _stream(self, request: web.Request, body: dict[str, Any],
                      input_tokens: int) -> web.StreamResponse:
        b = self.behaviour
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "request-id": "req_fake"})
        await response.prepare(request)

        async def send(kind: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(data)
                                 + b"\n\n")

        words = b.reply.split(" ")
        pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
        await send("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}})
        text_index = 0
        if thinks(body):
            text_index = 1
            await send("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "thinking",
                                                                 "thinking": ""}})
            for delta in ({"type": "thinking_delta", "thinking": THINKING},
                          {"type": "signature_delta", "signature": SIGNATURE}):
                await send("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": delta})
            await send("content_block_stop", {"type": "content_block_stop", "index": 0})
        await send("content_block_start", {"type": "content_block_start", "index": text_index,
                                           "content_block": {"type": "text", "text": ""}})
        await send("ping", {"type": "ping"})
        for index, piece in enumerate(pieces):
            if b.error_after_deltas is not None and index == b.error_after_deltas:
                await send("error", error_body(529, "Overloaded"))
                await response.write_eof()
                return response
            if b.chunk_delay_s:
                await asyncio.sleep(b.chunk_delay_s)
            await send("content_block_delta", {"type": "content_block_delta",
                                               "index": text_index,
                                               "delta": {"type": "text_delta", "text": piece}})
        await send("content_block_stop", {"type": "content_block_stop", "index": text_index})
        stop_reason = b.stop_reason
        if b.tool_call is not None:
            stop_reason = "tool_use"
            await send("content_block_start", {"type": "content_block_start",
                                               "index": text_index + 1,
                                               "content_block": {"type": "tool_use",
                                                                 "id": "toolu_fake",
                                                                 "name": b.tool_call[0],
                                                                 "input": {}}})
            arguments = orjson.dumps(b.tool_call[1]).decode()
            for part in (arguments[:5], arguments[5:]):
                await send("content_block_delta", {"type": "content_block_delta",
                                                   "index": text_index + 1,
                                                   "delta": {"type": "input_json_delta",
                                                             "partial_json": part}})
            await send("content_block_stop", {"type": "content_block_stop",
                                              "index": text_index + 1})
        await send("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": stop_reason,
                                               "stop_sequence": None},
                                     "usage": {"output_tokens": _words(b.reply)}})
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response
