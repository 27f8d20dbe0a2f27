"""The client side of the chaos suite: how each reply is judged, and clients that
misbehave on purpose.

An outcome is `ok` (a whole answer of the shape asked for), `clear` (an OpenAI-shaped
error: a 4xx/5xx other than 500 with an `error` object, or a stream that ends with an
error event) or `lost`, with the reason: a 500, a silent cut, a hang past the deadline,
an event the client cannot parse, a shape it did not ask for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

OK, CLEAR, LOST = "ok", "clear", "lost"
DEADLINE_S = 15.0  # a reply later than this is a hang
MESSAGES = [{"role": "user", "content": "hi"}]


def body(model: str, stream: bool) -> bytes:
    return orjson.dumps({"model": model, "messages": MESSAGES, "stream": stream})


def judge(status: int, content_type: str, raw: bytes, stream: bool) -> str:
    if status == 500:
        return f"{LOST}: 500"
    if status != 200:
        try:
            error = orjson.loads(raw)["error"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return f"{LOST}: {status} without an OpenAI error"
        return CLEAR if isinstance(error.get("message"), str) else f"{LOST}: error shape"
    if not stream:
        try:
            reply = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return f"{LOST}: unparseable JSON"
        return OK if reply.get("choices") else f"{LOST}: no choices"
    if content_type != "text/event-stream":
        return f"{LOST}: {content_type} for a stream"
    return judge_events(raw)


def judge_events(raw: bytes) -> str:
    payloads = [line[5:].strip() for event in raw.split(b"\n\n")
                for line in event.split(b"\n") if line.startswith(b"data:")]
    if not payloads:
        return f"{LOST}: an empty stream"
    for n, payload in enumerate(payloads):
        if payload == b"[DONE]":
            return OK if n == len(payloads) - 1 else f"{LOST}: events after [DONE]"
        try:
            event: Any = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return f"{LOST}: a malformed event"
        if not isinstance(event, dict):
            return f"{LOST}: an event that is no object"
        if "error" in event:
            return CLEAR if n == len(payloads) - 1 else f"{LOST}: events after an error"
    return f"{LOST}: a silent cut"


async def request(session: aiohttp.ClientSession, url: str, model: str, stream: bool,
                  *, read_pause_s: float = 0.0) -> str:
    """One chat completion, judged; `read_pause_s`: a slow reader."""
    try:
        async with asyncio.timeout(DEADLINE_S):
            async with session.post(url, data=body(model, stream),
                                    headers={"Content-Type": "application/json"}) as reply:
                if read_pause_s:
                    parts = []
                    while part := await reply.content.read(512):
                        parts.append(part)
                        await asyncio.sleep(read_pause_s)
                    raw = b"".join(parts)
                else:
                    raw = await reply.read()
                return judge(reply.status, reply.content_type, raw, stream)
    except TimeoutError:
        return f"{LOST}: a hang"
    except aiohttp.ClientError as exc:
        return f"{LOST}: {type(exc).__name__}"


async def raw_exchange(port: int, data: bytes, *, trickle_s: float = 0.0) -> str:
    """Send `data` (a byte at a time every `trickle_s`, or at once) on a fresh
    connection and judge the one answer the gateway sends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sending: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(DEADLINE_S):
            if trickle_s:
                async def trickle() -> None:
                    for byte in data:
                        writer.write(bytes([byte]))
                        await asyncio.sleep(trickle_s)
                sending = asyncio.create_task(trickle())
            else:
                writer.write(data)
            return await read_answer(reader)
    except TimeoutError:
        return f"{LOST}: a hang"
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        return f"{LOST}: {type(exc).__name__}"
    finally:
        if sending is not None:
            sending.cancel()
        writer.close()


async def read_answer(reader: asyncio.StreamReader) -> str:
    """One HTTP response with a Content-Length (the gateway's errors and JSON), judged."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        return f"{LOST}: not HTTP"
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    if length is None:
        return f"{LOST}: no Content-Length"
    return judge(int(head.split()[1]), "application/json", await reader.readexactly(length),
                 stream=False)


async def disconnect_mid_stream(session: aiohttp.ClientSession, url: str, model: str) -> None:
    """Read the first bytes of a stream, then hang up."""
    async with session.post(url, data=body(model, True),
                            headers={"Content-Type": "application/json"}) as reply:
        await reply.content.read(64)


async def never_read(port: int, model: str, hold_s: float) -> None:
    """Ask for a stream, read nothing for `hold_s`, hang up."""
    data = body(model, True)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: chaos\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(data), data))
    await asyncio.sleep(hold_s)
    writer.transport.abort()
    del reader
