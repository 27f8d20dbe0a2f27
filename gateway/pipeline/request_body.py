"""Reading a client's request body: bounded in size and in how long it may pause."""

from __future__ import annotations

import asyncio

from aiohttp import StreamReader, web

from gateway.errors import BadRequest, PayloadTooLarge, RequestTimeout


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
