"""The access log written straight to a buffered byte stream (what `routegate serve` does)."""

from __future__ import annotations

import asyncio
import io

import orjson
from aiohttp import web

from gateway.telemetry.access_log import AccessLog
from gateway.telemetry.install import install_telemetry
from gateway.telemetry.service import Telemetry
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import PROMPT, scripted_request


class _Sink(io.RawIOBase):
    """What reached the 'file descriptor': bytes only arrive here when the buffer flushes."""

    def __init__(self) -> None:
        self.written = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.written += data
        return len(data)


async def test_each_request_is_one_json_line_on_the_stream() -> None:
    stream = io.BytesIO()
    telemetry = Telemetry(access_log=AccessLog(stream=stream))
    await scripted_request(telemetry, FakeClock())
    await scripted_request(telemetry, FakeClock(), backend="cloud")
    lines = stream.getvalue().splitlines()
    assert [orjson.loads(line)["backend"] for line in lines] == ["local", "cloud"]
    assert stream.getvalue().endswith(b"\n")
    assert PROMPT.encode() not in stream.getvalue()


async def test_buffered_lines_reach_the_stream_within_the_flush_interval() -> None:
    sink = _Sink()
    telemetry = Telemetry(access_log=AccessLog(stream=io.BufferedWriter(sink, 1 << 16)))  # type: ignore[type-var]
    app = web.Application()
    install_telemetry(app, telemetry)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await scripted_request(telemetry, FakeClock())
        assert sink.written == b""  # still in the buffer: no write per request
        for _ in range(30):
            await asyncio.sleep(0.1)
            if sink.written:
                break
        assert orjson.loads(bytes(sink.written))["request_id"] == "req-1"
    finally:
        await runner.cleanup()


async def test_shutdown_flushes_what_is_still_buffered() -> None:
    sink = _Sink()
    telemetry = Telemetry(access_log=AccessLog(stream=io.BufferedWriter(sink, 1 << 16)))  # type: ignore[type-var]
    await scripted_request(telemetry, FakeClock())
    telemetry.shutdown()
    assert orjson.loads(bytes(sink.written))["status"] == 200
