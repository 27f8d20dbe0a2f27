"""Adapter for `type: anthropic` backends: the Messages API behind the OpenAI one.

The pipeline speaks chat completions to every adapter. This one translates the request
on the way out (`chat_to_anthropic.messages_request`) and hands back an
`AnthropicResponse` that reads like an OpenAI backend's response: a JSON body becomes a
`chat.completion` (or OpenAI's error JSON), an event stream becomes
`chat.completion.chunk` SSE, one network read at a time. So the pipeline's relay,
fallback, usage settlement and telemetry run unchanged for Anthropic backends.

Session, timeouts and failure mapping (connect errors, timeouts, 429, 5xx including
529 `overloaded_error` → `failures.Overloaded`, which falls back) are `OpenAIUpstream`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDictProxy

from gateway.core.deadline import Timeouts
from gateway.core.errors import BadRequest
from gateway.upstream.chat_to_anthropic import (
    ChunkTranslator,
    StreamError,
    chat_completion,
    messages_request,
    openai_error,
)
from gateway.upstream.http1 import Http1Response
from gateway.upstream.openai import OpenAIUpstream
from policies.schema import Backend

ANTHROPIC_VERSION = "2023-06-01"
CHAT_PATH = "/chat/completions"  # the only OpenAI endpoint with a Messages counterpart
# A Messages request sent as the client wrote it: its answer is returned untranslated.
MESSAGES_PATH = "/messages"


class _TranslatedContent:
    """`response.content` as the pipeline reads it: `readany()` returning translated
    bytes, and b"" only at the end of the stream."""

    __slots__ = ("_source", "_translator")

    def __init__(self, source: aiohttp.StreamReader, translator: ChunkTranslator) -> None:
        self._source = source
        self._translator = translator

    async def readany(self) -> bytes:
        while data := await self._source.readany():
            try:
                out = self._translator.feed(data)
            except StreamError as exc:  # the pipeline's "backend failed" path
                raise aiohttp.ClientPayloadError(f"Anthropic stream: {exc}") from exc
            if out:  # a read holding only pings or half an event yields nothing yet
                return out
        return b""


class AnthropicResponse:
    """An Anthropic response, read as an OpenAI-compatible one (see the module doc)."""

    __slots__ = ("_created", "_response", "content", "status")

    def __init__(self, response: Http1Response, *, include_usage: bool) -> None:
        self._response = response
        self._created = int(time.time())
        self.status = response.status
        self.content = _TranslatedContent(
            response.content, ChunkTranslator(created=self._created, include_usage=include_usage))

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._response.headers

    @property
    def content_type(self) -> str:
        return self._response.content_type

    async def read(self, max_bytes: int | None = None) -> bytes:
        data = await self._response.read(max_bytes)
        try:
            body: Any = orjson.loads(data)
        except orjson.JSONDecodeError:
            body = None
        if self.status >= 300:
            return orjson.dumps(openai_error(self.status, body))
        if not isinstance(body, dict) or body.get("type") != "message":
            raise aiohttp.ClientPayloadError(
                f"Anthropic backend sent something other than a message ({len(data)} bytes)")
        return orjson.dumps(chat_completion(body, self._created))

    def release(self) -> None:
        self._response.release()

    def close(self) -> None:
        self._response.close()


class AnthropicUpstream(OpenAIUpstream):
    """One Anthropic backend. `url` is the API root (`https://api.anthropic.com`; a
    trailing `/v1` is accepted too)."""

    def __init__(self, name: str, backend: Backend, base_url: str) -> None:
        super().__init__(name, backend, base_url)
        self._headers = {"Content-Type": "application/json",
                         "anthropic-version": ANTHROPIC_VERSION}
        if backend.api_key is not None and backend.api_key.get_secret_value():
            self._headers["x-api-key"] = backend.api_key.get_secret_value()
        self._messages_path = "/messages" if self.base_url.endswith("/v1") else "/v1/messages"

    def prepare(self, path: str, raw: bytes, body: dict[str, Any], *, model: str,
                stream_usage: bool, priority: str = "normal") -> bytes:
        """The Messages request for a chat completion, from the parsed body (a
        `BadRequest` names what the Messages API cannot express: `n` > 1, a part or
        role it has no counterpart for)."""
        if path != CHAT_PATH:
            raise BadRequest(unsupported_message(self.name, path))
        return orjson.dumps(messages_request({**body, "model": model}))

    # Returns the OpenAI-shaped view, not the aiohttp response the base class returns;
    # the pipeline reads both through `pool.UpstreamResponse`. `body`: from `prepare`,
    # or, at `MESSAGES_PATH`, the client's own Messages request.
    async def open(self, path: str, body: bytes,  # type: ignore[override]
                   headers: Mapping[str, str] | None = None,
                   timeouts: Timeouts | None = None) -> AnthropicResponse | Http1Response:
        response = await super().open(self._messages_path, body, headers, timeouts)
        if path == MESSAGES_PATH:
            return response
        # The gateway asks every stream for its usage; the relay strips that chunk
        # again when the client did not ask for it.
        return AnthropicResponse(response, include_usage=True)


def unsupported_message(backend: str, path: str) -> str:
    return (f"Backend '{backend}' is an Anthropic backend and does not support "
            f"/v1{path}; only /v1/chat/completions (and /v1/messages) can be served by it.")
