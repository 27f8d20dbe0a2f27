"""Reading a client's request body: bounded in size, in how long it may pause and in
how deep its JSON nests."""

from __future__ import annotations

import asyncio
import re
from itertools import accumulate
from typing import Any

import orjson
from aiohttp import StreamReader, web

from gateway.core.errors import BadRequest, PayloadTooLarge, RequestTimeout, wrong_type


async def read_limited(request: web.Request, limit: int, pause_s: float) -> bytes:
    """The request body, or 413 once it is known to exceed `limit` bytes: by its
    Content-Length before reading, else counted as it arrives, never held whole. Counted
    even with a Content-Length: a `Content-Encoding: gzip` body is inflated as it is read,
    and its Content-Length says nothing about what it inflates to. A body that stops
    arriving for `pause_s` is a 408 (no timer when it is all here already)."""
    length = request.content_length
    if length is not None and length > limit:
        raise _too_large(limit)
    chunks, size, content = [], 0, request.content
    try:
        # the usual small body came with the head: read at once, no timer
        while chunk := (await content.readany() if content.is_eof()
                        else await _arriving(content, pause_s)):
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
            if content.at_eof():  # in one piece: no second read
                break
    except web.RequestPayloadError as exc:  # bad chunking or a body that does not inflate
        raise BadRequest(f"We could not read the body of your request ({exc}).") from exc
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _arriving(content: StreamReader, pause_s: float) -> bytes:
    """The next piece of a body still arriving; a 408 after `pause_s` without one."""
    try:
        async with asyncio.timeout(pause_s):
            return await content.readany()
    except TimeoutError:
        raise RequestTimeout(f"The request body stopped arriving for {pause_s:g} s "
                             "(server.body_read_timeout_s).") from None


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")


# Nesting levels (arrays and objects) a request body may have. orjson writes at most
# 254 and the gateway re-serialises bodies, some inside a wrapper (a cache key, a stored
# response): a body past this is refused as it is parsed, before anything is called.
MAX_JSON_DEPTH = 128
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_object(raw: bytes) -> dict[str, Any]:
    """A client's JSON body, parsed: a 400 when it is empty, not JSON, not an object, or
    nested deeper than `MAX_JSON_DEPTH`."""
    if not raw.strip():
        raise BadRequest("The request body is empty; send a JSON object.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"We could not parse the JSON body of your request ({exc}).",
                         code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.", code="invalid_json")
    # fewer brackets than the limit cannot nest past it: the usual body is not scanned
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH \
            and nesting_depth(raw) > MAX_JSON_DEPTH:
        raise BadRequest(f"The JSON body nests arrays and objects deeper than "
                         f"{MAX_JSON_DEPTH} levels, the most the gateway accepts.",
                         code="json_too_deep")
    return body


def nesting_depth(raw: bytes) -> int:
    """How deep the arrays and objects of valid JSON `raw` nest (brackets inside
    strings do not count)."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(_DEPTH_STEP[byte] for byte in brackets), default=0)


def model_name(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise BadRequest("You must provide a model parameter.", param="model",
                         code="missing_required_parameter")
    if not isinstance(model, str):
        raise wrong_type("model", "a string", model)
    if not model:
        raise BadRequest("'model' must not be empty.", param="model", code="invalid_value")
    return model
