"""SIGTERM drains `routegate serve` (a real process) with streams in flight."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from gateway.launch.supervisor import free_port
from tests.conftest import single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.waiting import until

STREAM = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Gateway:
    process: asyncio.subprocess.Process
    url: str

    def signal(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    async def exited(self, within_s: float) -> int:
        return await asyncio.wait_for(self.process.wait(), within_s)


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[object]:
    processes: list[asyncio.subprocess.Process] = []

    async def start(upstream: FakeOpenAI, *, announce_s: float, timeout_s: float) -> Gateway:
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump(single_backend_policy(
            upstream.url, server={"drain": {"announce_s": announce_s,
                                            "timeout_s": timeout_s}})))
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--policy", str(policy),
            "--port", str(port), stdout=asyncio.subprocess.DEVNULL)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session, asyncio.timeout(20):
            while True:
                try:
                    async with session.get(url + "/readyz") as ready:
                        if ready.status == 200:
                            return Gateway(process, url)
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)

    yield start
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def read_stream(url: str) -> list[bytes]:
    """Every SSE event of one streamed chat completion, on its own connection."""
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=STREAM) as response:
        assert response.status == 200
        body = await response.read()
    return [event for event in body.split(b"\n\n") if event.startswith(b"data: ")]


def error_of(events: list[bytes]) -> dict[str, object] | None:
    for event in events:
        if event != b"data: [DONE]" and b'"error"' in event:
            return orjson.loads(event[6:])["error"]  # type: ignore[no-any-return]
    return None


async def test_sigterm_fails_readyz_at_once_and_streams_in_flight_finish_whole(
        serve, start_upstream) -> None:
    upstream = await start_upstream()
    upstream.behaviour.chunk_delay_s = 0.15  # a stream takes about 1.5 s
    gateway = await serve(upstream, announce_s=0.6, timeout_s=20)
    streams = [asyncio.create_task(read_stream(gateway.url)) for _ in range(3)]
    await until(lambda: len(upstream.received) >= 3)
    signalled = time.monotonic()
    gateway.signal()
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as session, session.get(
            gateway.url + "/readyz") as ready:
        assert ready.status == 503
        assert (await ready.json())["status"] == "draining"
    # during the announce period a new connection is still served
    late = await read_stream(gateway.url)
    assert late[-1] == b"data: [DONE]"
    for events in await asyncio.gather(*streams):
        assert events[-1] == b"data: [DONE]" and error_of(events) is None
    assert await gateway.exited(10) == 0
    assert time.monotonic() - signalled < 10


async def test_the_listener_closes_after_the_announce_period(serve, start_upstream) -> None:
    upstream = await start_upstream()
    upstream.behaviour.pause_after_chunk = 1  # keeps the process draining
    gateway = await serve(upstream, announce_s=0.3, timeout_s=20)
    stream = asyncio.create_task(read_stream(gateway.url))
    await until(lambda: bool(upstream.received))
    gateway.signal()
    await asyncio.sleep(0.8)
    assert gateway.process.returncode is None  # still draining the stream
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as session, session.get(gateway.url + "/healthz"):
            pass
    upstream.resume.set()
    assert (await stream)[-1] == b"data: [DONE]"
    assert await gateway.exited(10) == 0


async def test_a_stream_still_running_at_the_drain_timeout_ends_with_an_error_event(
        serve, start_upstream) -> None:
    upstream = await start_upstream()
    upstream.behaviour.pause_after_chunk = 2  # never resumed
    gateway = await serve(upstream, announce_s=0.0, timeout_s=1.0)
    stream = asyncio.create_task(read_stream(gateway.url))
    await until(lambda: upstream.chunks_sent >= 2)
    signalled = time.monotonic()
    gateway.signal()
    events = await asyncio.wait_for(stream, 10)
    error = error_of(events)
    assert error is not None and error["code"] == "server_shutting_down"
    assert b'"content"' in events[0]  # what was relayed before the cut stays relayed
    assert time.monotonic() - signalled >= 1.0
    assert await gateway.exited(10) == 0


async def test_a_second_sigterm_stops_at_once(serve, start_upstream) -> None:
    upstream = await start_upstream()
    upstream.behaviour.pause_after_chunk = 1
    gateway = await serve(upstream, announce_s=30.0, timeout_s=60.0)
    stream = asyncio.create_task(read_stream(gateway.url))
    await until(lambda: upstream.chunks_sent >= 1)
    gateway.signal()
    await asyncio.sleep(0.3)
    signalled = time.monotonic()
    gateway.signal()
    assert await gateway.exited(5) == 0
    assert time.monotonic() - signalled < 4
    events = await asyncio.wait_for(stream, 5)
    assert error_of(events) is not None  # cut, but never silently
