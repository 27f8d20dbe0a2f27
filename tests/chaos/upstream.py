"""A backend that misbehaves on purpose, chosen by the first path segment
(`http://127.0.0.1:PORT/<fault>/v1/chat/completions`), written as raw bytes so every
fault is exactly what the name says: resets before or after the headers or mid-stream,
silence, a slow first byte, a clean end of a stream that never finished, JSON for a
stream, malformed events, oversized replies, endless streams, and error statuses with
and without `Retry-After`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import brotli
import orjson

HEALTHY_CHUNKS = 3
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


def _chunk(content: str, finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": [{"index": 0, "delta": {"content": content},
                                       "finish_reason": finish}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _framed(data: bytes) -> bytes:
    """One piece of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


_END = b"0\r\n\r\n"
_COMPLETION = orjson.dumps({
    "id": "chatcmpl-chaos", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "fine"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
_USAGE = b"data: " + orjson.dumps({"id": "chatcmpl-chaos", "object": "chat.completion.chunk",
                                   "created": 1, "model": "m", "choices": [],
                                   "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                             "total_tokens": 8}}) + b"\n\n"


def _json(status: int, body: bytes, extra: bytes = b"") -> bytes:
    reason = {200: b"OK", 429: b"Too Many Requests", 500: b"Internal Server Error",
              503: b"Service Unavailable", 529: b"Overloaded"}[status]
    return (b"HTTP/1.1 %d %b\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"%b\r\n%b" % (status, reason, len(body), extra, body))


def _error(status: int, retry_after: bool) -> bytes:
    body = orjson.dumps({"error": {"message": f"chaos {status}", "type": "server_error",
                                   "code": None, "param": None}})
    return _json(status, body, b"Retry-After: 1\r\n" if retry_after else b"")


class ChaosUpstream:
    """`await start()` → port; `stop()`; `served` counts requests per fault."""

    def __init__(self) -> None:
        self.served: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()  # each connection's, to end them

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0,
                                                  backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.transport.abort()  # each handler sees its connection end, and ends
            if self._handlers:
                await asyncio.wait(self._handlers, timeout=5)
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        try:
            while True:  # kept alive: one request after another
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                fault = head.split(b" ", 2)[1].split(b"/")[1].decode()
                self.served[fault] = self.served.get(fault, 0) + 1
                stream = b'"stream":true' in body or b'"stream": true' in body
                if not await self._answer(fault, stream, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            return
        finally:
            self._connections.discard(writer)
            writer.transport.abort()

    async def _answer(self, fault: str, stream: bool, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Write the fault's reply; False when the connection is done with."""
        write = writer.write
        if fault in FRAMING_FAULTS:
            return await _framing(fault, stream, reader, writer)
        if fault.startswith("status_"):  # status_503, status_429_retry_after, ...
            parts = fault.split("_")
            write(_error(int(parts[1]), retry_after=len(parts) > 2))
        elif fault == "reset_before_headers":
            return False
        elif fault == "stall":
            await reader.read()  # until the gateway gives up and closes
            return False
        elif fault == "slow_first_byte":
            await asyncio.sleep(0.3)
            write(_healthy(stream))
        elif fault == "json_for_stream":
            write(_json(200, _COMPLETION))
        elif fault == "oversized":
            if stream:  # one event far over the gateway's max_event_bytes
                write(_SSE_HEAD + _framed(_chunk("x" * 300_000)) + _framed(_chunk("y")))
            else:
                big = _COMPLETION[:-1] + b', "padding": "' + b"x" * 3_000_000 + b'"}'
                write(_json(200, big))
        elif not stream:
            if fault != "healthy" and fault != "slow_stream":
                return False  # the stream faults reset a plain request
            write(_json(200, _COMPLETION))
        elif fault == "healthy":
            write(_healthy(stream))
        elif fault == "reset_after_headers":
            write(_SSE_HEAD)
            await writer.drain()
            return False
        elif fault == "reset_mid_stream":
            write(_SSE_HEAD + _framed(_chunk("a")) + _framed(_chunk("b")))
            await writer.drain()
            await asyncio.sleep(0.05)
            return False
        elif fault == "eof_mid_stream":
            write(_SSE_HEAD + _framed(_chunk("a")) + _framed(_chunk("b")) + _END)
        elif fault == "malformed_events":
            write(_SSE_HEAD + _framed(_chunk("a")) + _framed(b"data: {not json\n\n")
                  + _framed(b"data: \xff\xfe binary\n\n") + _framed(_chunk("", "stop"))
                  + _framed(b"data: [DONE]\n\n") + _END)
        elif fault in ("endless", "slow_stream", "big_stream"):
            await self._stream(fault, writer)
        else:
            raise AssertionError(f"unknown fault {fault}")
        await writer.drain()
        return True

    @staticmethod
    async def _stream(fault: str, writer: asyncio.StreamWriter) -> None:
        """`endless`: an event every 20 ms forever; `slow_stream`: 20 events 50 ms apart,
        then a proper end; `big_stream`: 4 MB of events as fast as the gateway reads."""
        writer.write(_SSE_HEAD)
        count = {"endless": 10**9, "slow_stream": 20, "big_stream": 4000}[fault]
        pause = {"endless": 0.02, "slow_stream": 0.05, "big_stream": 0.0}[fault]
        started = time.monotonic()
        for _ in range(count):
            writer.write(_framed(_chunk("z" * (1000 if fault == "big_stream" else 3))))
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
            if time.monotonic() - started > 60:  # never past a test run
                break
        writer.write(_framed(_chunk("", "stop") + _USAGE + b"data: [DONE]\n\n") + _END)


def _healthy(stream: bool) -> bytes:
    if not stream:
        return _json(200, _COMPLETION)
    events = b"".join(_chunk(word) for word in ("one", " two", " three")[:HEALTHY_CHUNKS])
    events += _chunk("", "stop") + _USAGE + b"data: [DONE]\n\n"
    return _SSE_HEAD + _framed(events) + _END


# -- framing faults: HTTP/1.1 and SSE framing a backend gets wrong -------------------

FRAMING_FAULTS = ("interim_1xx", "brotli", "bad_brotli", "bad_chunk", "trickled_headers",
                  "bare_cr", "reset_on_reuse")


def _compressed(reply: bytes, encoded: Callable[[bytes], bytes]) -> bytes:
    """`reply` (head and body) with its body sent as `Content-Encoding: br`."""
    head, _, body = reply.partition(b"\r\n\r\n")
    if b"chunked" in head:  # one chunk of events, then the end
        body = body[body.index(b"\r\n") + 2:-len(b"\r\n" + _END)]
        data = encoded(body)
        return head + b"\r\nContent-Encoding: br\r\n\r\n" + _framed(data) + _END
    head = head.partition(b"\r\nContent-Length:")[0]
    data = encoded(body)
    return head + b"\r\nContent-Encoding: br\r\nContent-Length: %d\r\n\r\n%b" % (
        len(data), data)


async def _framing(fault: str, stream: bool, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> bool:
    """Write a framing fault's reply; False when the connection is done with."""
    reply = _healthy(stream)
    if fault == "interim_1xx":  # 100 Continue, a pause, 103 Early Hints, the answer
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                     + reply)
    elif fault == "brotli":
        writer.write(_compressed(reply, lambda data: bytes(brotli.compress(data))))
    elif fault == "bad_brotli":
        writer.write(_compressed(reply, lambda data: b"\xff\x00 not brotli" + data[:20]))
    elif fault == "bad_chunk":  # a chunk size that is no number, then silence
        first = _framed(_chunk("a")) if stream else b""
        writer.write(reply.partition(b"\r\n\r\n")[0].replace(b"Content-Length", b"X-Was")
                     + b"\r\nTransfer-Encoding: chunked\r\n\r\n" * (not stream)
                     + b"\r\n\r\n" * stream + first + b"zz\r\n")
        await writer.drain()
        await reader.read()  # until the gateway gives up and closes
        return False
    elif fault == "trickled_headers":  # the head a byte at a time, far past first_byte_s
        for byte in reply.partition(b"\r\n\r\n")[0]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"\r\n\r\n" + reply.partition(b"\r\n\r\n")[2])
    elif fault == "bare_cr":
        if stream:
            head, _, body = reply.partition(b"\r\n\r\n")
            events = body[body.index(b"\r\n") + 2:-len(b"\r\n" + _END)]
            reply = head + b"\r\n\r\n" + _framed(events.replace(b"\n", b"\r")) + _END
        writer.write(reply)
    elif fault == "reset_on_reuse":  # the answer, then the connection ends, unread
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(0.05)
        return False
    await writer.drain()
    return True


async def _serve_forever() -> None:  # `python -m tests.chaos.upstream`: try it by hand
    upstream = ChaosUpstream()
    print(f"chaos upstream on 127.0.0.1:{await upstream.start()}")
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve_forever())
