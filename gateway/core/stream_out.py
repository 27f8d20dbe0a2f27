"""Writing an event stream to the client: its headers, and writers that re-encode it
for an endpoint of another API (the Anthropic Messages stream) and keep a copy for the
response cache when asked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.core.context import Dialect

STREAM_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                   "X-Accel-Buffering": "no"}


def stream_writers(client: web.StreamResponse, dialect: Dialect | None,
                   capture: list[bytes] | None = None,
                   ) -> tuple[Callable[[bytes], Awaitable[None]],
                              Callable[[bytes], Awaitable[None]]]:
    """(`write`, `write_eof`) of `client`; for another API's endpoint, both re-encode;
    with `capture`, what is written (before re-encoding) is also kept there."""
    if dialect is None and capture is None:
        return client.write, client.write_eof
    encode = dialect.stream_encoder() if dialect is not None else None

    async def write(data: bytes) -> None:
        if capture is not None:
            capture.append(data)
        await client.write(encode(data) if encode is not None else data)

    async def write_last(data: bytes) -> None:
        if capture is not None:
            capture.append(data)
        if dialect is None or encode is None:
            await client.write_eof(data)
            return
        encoded = encode(data)
        await dialect.stream_finished()
        await client.write_eof(encoded)

    return write, write_last
