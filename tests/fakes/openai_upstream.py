"""A small OpenAI-compatible server speaking the real wire format, for tests and benches.

    fake = FakeOpenAI()                 # or FakeOpenAI(Behaviour(status=500))
    base_url = await fake.start()       # "http://127.0.0.1:<port>/v1"
    ...                                 # point a backend's `url:` at it
    fake.received[-1].json["model"]     # what the gateway sent, byte for byte in .raw
    await fake.stop()

Endpoints: POST /v1/chat/completions, /v1/completions (JSON, or SSE with `stream`,
honouring `stream_options.include_usage`), POST /v1/embeddings (float or base64),
GET /v1/models, GET /health.

`fake.behaviour` is mutable between requests: fail with a status (all requests, or the
first `fail_times`), delay the first byte, delay between chunks, pause after chunk N
until `fake.resume` is set, or drop the connection mid-stream. `fake.cancelled` records
(with `time.perf_counter()`) every request whose client connection went away early.
"""

from __future__ import annotations

import array
import asyncio
import base64
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class Behaviour:
    status: int | None = None  # answer every request with this error status
    fail_times: int | None = None  # ... only the first N requests (None: all)
    retry_after: str | None = None  # Retry-After header on a 429
    first_byte_delay_s: float = 0.0  # before the response headers
    chunk_delay_s: float = 0.0  # between two stream events
    pause_after_chunk: int | None = None  # wait for `resume` after this many content events
    drop_after_chunks: int | None = None  # close the connection after this many content events
    reply: str = "Hello from the fake upstream, nice to meet you."
    embedding_dim: int = 8
    processing_ms: int | None = None  # sent as `openai-processing-ms`
    health_status: int = 200  # what GET /health answers
    # (name, JSON arguments): a chat request offering tools, whose last message is not a
    # tool result, is answered with this call instead of text
    tool_call: tuple[str, str] | None = None


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    json: Any


@dataclass
class FakeOpenAI:
    behaviour: Behaviour = field(default_factory=Behaviour)
    name: str = "fake"
    received: list[Received] = field(default_factory=list)
    chunks_sent: int = 0  # content events sent, over all requests
    cancelled: list[float] = field(default_factory=list)  # perf_counter() at each cancel
    gets: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Authorization)
    url: str = ""

    def __post_init__(self) -> None:
        self.resume = asyncio.Event()
        self.cancelled_event = asyncio.Event()
        self.request_seen = asyncio.Event()  # set when a request has been read
        self._failures = 0
        self._runner: web.AppRunner | None = None
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/v1/completions", self._completions)
        self.app.router.add_post("/v1/embeddings", self._embeddings)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/health", self._health)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        # handler_cancellation: the fake notices at once when its client goes away.
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}/v1"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- request handling -------------------------------------------------------------

    async def _record(self, request: web.Request) -> Any:
        raw = await request.read()
        body = orjson.loads(raw) if raw else None
        self.received.append(Received(request.path, dict(request.headers), raw, body))
        self.request_seen.set()
        return body

    def _failure(self) -> web.Response | None:
        b = self.behaviour
        if b.status is None or (b.fail_times is not None and self._failures >= b.fail_times):
            return None
        self._failures += 1
        headers = {"Retry-After": b.retry_after} if b.retry_after else {}
        kind = "rate_limit_error" if b.status == 429 else "server_error"
        body = {"error": {"message": f"{self.name} fails with {b.status}", "type": kind,
                          "code": None, "param": None}}
        return web.json_response(body, status=b.status, headers=headers,
                                 dumps=lambda v: orjson.dumps(v).decode())

    async def _respond(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = await self._record(request)
            if self.behaviour.first_byte_delay_s:
                await asyncio.sleep(self.behaviour.first_byte_delay_s)
            failure = self._failure()
            if failure is not None:
                return failure
            call = _calls_tool(body, self.behaviour.tool_call)
            if body.get("stream"):
                return await self._stream(request, body, kind, call)
            return self._json(_completion(body, self.behaviour.reply, kind, call))
        except asyncio.CancelledError:
            self.cancelled.append(time.perf_counter())
            self.cancelled_event.set()
            raise

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._respond(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._respond(request, "text")

    def _json(self, body: object) -> web.Response:
        headers = {}
        if self.behaviour.processing_ms is not None:
            headers["openai-processing-ms"] = str(self.behaviour.processing_ms)
        return web.Response(body=orjson.dumps(body), content_type="application/json",
                            headers=headers)

    async def _stream(self, request: web.Request, body: dict[str, Any], kind: str,
                      call: tuple[str, str] | None = None) -> web.StreamResponse:
        b = self.behaviour
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if b.drop_after_chunks == 0:  # headers, then nothing: a backend dying at once
            assert request.transport is not None
            request.transport.close()
            return response
        events = _stream_events(body, b.reply, kind, include_usage, call)
        for index, (event, is_content) in enumerate(events):
            if index and b.chunk_delay_s:
                await asyncio.sleep(b.chunk_delay_s)
            await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
            if is_content:
                self.chunks_sent += 1
                sent = sum(1 for _, content in events[:index + 1] if content)
                if b.drop_after_chunks is not None and sent >= b.drop_after_chunks:
                    assert request.transport is not None
                    request.transport.close()  # no terminating chunk: a truncated stream
                    return response
                if b.pause_after_chunk is not None and sent == b.pause_after_chunk:
                    await self.resume.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        failure = self._failure()
        if failure is not None:
            return failure
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        data = []
        for index in range(len(inputs)):
            vector = [((index + 1) * (d + 1)) / 100 for d in range(self.behaviour.embedding_dim)]
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(array.array("f", vector).tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(_count_tokens(item) for item in inputs)
        return self._json({"object": "list", "data": data, "model": body["model"],
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _models(self, request: web.Request) -> web.Response:
        self.gets.append((request.path, request.headers.get("Authorization")))
        return self._json({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": self.name}]})

    async def _health(self, request: web.Request) -> web.Response:
        self.gets.append((request.path, request.headers.get("Authorization")))
        status = self.behaviour.health_status
        return web.json_response({"status": "ok" if status < 300 else "down"}, status=status)


def _count_tokens(value: object) -> int:
    """Whitespace words: a stable, obvious stand-in for a tokenizer."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_count_tokens(item) if not isinstance(item, int) else 1 for item in value)
    if isinstance(value, dict):
        return _count_tokens(value.get("content") or value.get("text") or "")
    return 0


def _prompt_tokens(body: dict[str, Any]) -> int:
    return _count_tokens(body.get("messages") or body.get("prompt") or "")


def _usage(body: dict[str, Any], reply: str) -> dict[str, int]:
    prompt, completion = _prompt_tokens(body), len(reply.split())
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _calls_tool(body: dict[str, Any],
                tool_call: tuple[str, str] | None) -> tuple[str, str] | None:
    messages = body.get("messages") or [{}]
    if tool_call is None or not body.get("tools") or messages[-1].get("role") == "tool":
        return None
    return tool_call


def _completion(body: dict[str, Any], reply: str, kind: str,
                call: tuple[str, str] | None = None) -> dict[str, Any]:
    common = {"created": int(time.time()), "model": body["model"],
              "system_fingerprint": "fp_fake", "usage": _usage(body, reply)}
    if call is not None:
        return {"id": "chatcmpl-fake", "object": "chat.completion", **common, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_fake", "type": "function",
                 "function": {"name": call[0], "arguments": call[1]}}]},
             "logprobs": None, "finish_reason": "tool_calls"}]}
    if kind == "chat":
        return {"id": "chatcmpl-fake", "object": "chat.completion", **common, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply, "refusal": None},
             "logprobs": None, "finish_reason": "stop"}]}
    return {"id": "cmpl-fake", "object": "text_completion", **common, "choices": [
        {"index": 0, "text": reply, "logprobs": None, "finish_reason": "stop"}]}


def _stream_events(body: dict[str, Any], reply: str, kind: str, include_usage: bool,
                   call: tuple[str, str] | None = None) -> list[tuple[dict[str, Any], bool]]:
    """(event, is_content) pairs in OpenAI's order: role, content..., finish, usage."""
    words = reply.split(" ")
    pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
    created = int(time.time())
    chat = kind == "chat"
    base: dict[str, Any] = {
        "id": "chatcmpl-fake" if chat else "cmpl-fake",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created, "model": body["model"], "system_fingerprint": "fp_fake"}
    if include_usage:
        base["usage"] = None

    def choice(delta: dict[str, Any] | str, finish: str | None) -> dict[str, Any]:
        if chat:
            return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]}
        return {**base, "choices": [{"index": 0, "text": delta, "logprobs": None,
                                     "finish_reason": finish}]}

    events: list[tuple[dict[str, Any], bool]] = []
    if chat:
        events.append((choice({"role": "assistant", "content": "", "refusal": None}, None),
                       False))
    if call is not None:  # the call's name first, then its arguments in two pieces
        half = len(call[1]) // 2
        events.append((choice({"tool_calls": [{"index": 0, "id": "call_fake", "type": "function",
                                               "function": {"name": call[0],
                                                            "arguments": ""}}]}, None), False))
        events.extend((choice({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]},
                              None), False) for piece in (call[1][:half], call[1][half:]))
        events.append((choice({}, "tool_calls"), False))
    else:
        events.extend((choice({"content": p} if chat else p, None), True) for p in pieces)
        events.append((choice({} if chat else "", "stop"), False))
    if include_usage:
        events.append(({**base, "choices": [], "usage": _usage(body, reply)}, False))
    return events
