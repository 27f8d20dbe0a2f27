"""Spans leave the gateway through its exporter process, and nothing there can stall it.

Real parts throughout: the exporter process (`python -m
gateway.telemetry.export_process`), a real OTLP/HTTP receiver on loopback, and a
collector that accepts connections and never answers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from gateway.telemetry.otlp_post import ExportConfig
from gateway.telemetry.record_span import RecordSpans
from gateway.telemetry.service import Telemetry
from gateway.telemetry.span_pipe import SpanPipe
from gateway.telemetry.tracing import resource_from_env, tracer_provider_from_env
from tests.conftest import single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.telemetry.conftest import StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver
from tests.gateway.telemetry.scripted_request import scripted_request
from tests.gateway.telemetry.test_gateway_telemetry import CHAT, post

SPANS = 6  # a scripted request's spans


def piped(endpoint: str, timeout_s: float = 5.0,
          **options: float) -> tuple[Telemetry, SpanPipe, TracerProvider]:
    resource = resource_from_env({}, "routegate")
    provider = TracerProvider(resource=resource)
    export = ExportConfig(endpoint=endpoint, timeout_s=timeout_s)
    pipe = SpanPipe(export, resource=dict(resource.attributes), **options)  # type: ignore[arg-type]
    provider.add_span_processor(pipe)
    telemetry = Telemetry(provider=provider)
    assert isinstance(telemetry.children, RecordSpans)
    return telemetry, pipe, provider


def the_pipe(provider: TracerProvider) -> SpanPipe:
    (pipe,) = provider._active_span_processor._span_processors
    assert isinstance(pipe, SpanPipe)
    return pipe


@pytest.fixture
def stalled_collector() -> Iterator[str]:
    """Accepts connections (the kernel's backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1/traces"


@pytest.fixture
async def receiver_url(otlp_receiver: tuple[OtlpReceiver, str]) -> AsyncIterator[str]:
    yield otlp_receiver[1] + "/v1/traces"


async def test_the_environments_otlp_http_export_runs_in_a_separate_process(
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, url = otlp_receiver
    provider = tracer_provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    assert provider is not None
    telemetry = Telemetry(provider=provider)
    tel = await scripted_request(telemetry)
    started = time.monotonic()
    assert await asyncio.to_thread(provider.force_flush)  # starts it, sends, waits
    assert time.monotonic() - started < 2.0
    pipe = the_pipe(provider)
    assert pipe.process is not None and pipe.process.pid != os.getpid()
    spans = await receiver.wait_for(lambda s: len(s) == SPANS)
    assert {s.trace_id for s in spans} == {tel.trace_id}
    await asyncio.to_thread(provider.shutdown)


async def test_shutdown_exports_what_is_queued_and_the_process_exits(
    otlp_receiver: tuple[OtlpReceiver, str], receiver_url: str,
) -> None:
    receiver, _ = otlp_receiver
    telemetry, pipe, provider = piped(receiver_url, handoff_s=0.01)
    await scripted_request(telemetry)
    await asyncio.to_thread(pipe.force_flush)
    process = pipe.process
    for _ in range(3):
        await scripted_request(telemetry)  # queued, not handed off or exported yet
    await asyncio.to_thread(provider.shutdown)
    assert len(receiver.spans) == 4 * SPANS
    assert process is not None and process.returncode == 0


async def test_a_killed_exporter_process_is_logged_its_spans_counted_and_it_restarts(
    otlp_receiver: tuple[OtlpReceiver, str], receiver_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver, _ = otlp_receiver
    telemetry, pipe, provider = piped(receiver_url, handoff_s=3600.0, restart_after_s=0.3)
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)
    first = pipe.process
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)
    await asyncio.to_thread(first.wait)
    with caplog.at_level(logging.WARNING, "routegate.tracing"):
        for _ in range(2):
            await scripted_request(telemetry)  # the request path goes on as ever
        pipe.hand_off()
    assert pipe.dropped_spans == 2 * SPANS
    assert any("exporter process exited" in r.message for r in caplog.records)
    assert any("dropped spans" in r.message for r in caplog.records)
    await asyncio.sleep(0.3)
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)  # restarted: this one gets through
    assert pipe.process is not None and pipe.process.pid != first.pid
    assert len(receiver.spans) == 2 * SPANS
    await asyncio.to_thread(provider.shutdown)


async def test_a_full_socket_drops_rather_than_blocks(stalled_collector: str) -> None:
    # Batches of one request: the first export blocks the exporter process on a
    # collector that never answers; the gateway side must then drop, never wait.
    telemetry, pipe, provider = piped(stalled_collector, handoff_s=3600.0,
                                      max_batch_spans=SPANS, buffer_bytes=16384,
                                      timeout_s=30.0)
    slowest = 0.0
    for _ in range(40):
        for _ in range(10):
            await scripted_request(telemetry)
        started = time.monotonic()
        pipe.hand_off()
        slowest = max(slowest, time.monotonic() - started)
    assert pipe.dropped_spans > 0
    assert slowest < 0.1
    assert pipe.process is not None and pipe.process.poll() is None  # stuck, not dead
    pipe.process.kill()
    await asyncio.to_thread(provider.shutdown)


async def test_the_queue_is_bounded_and_counts_what_it_drops(receiver_url: str) -> None:
    telemetry, pipe, provider = piped(receiver_url, handoff_s=3600.0,
                                      max_queue_spans=10 * SPANS)
    for _ in range(15):
        await scripted_request(telemetry)
    assert pipe.dropped_spans == 5 * SPANS
    await asyncio.to_thread(provider.shutdown)


async def test_the_gateway_keeps_serving_when_its_exporter_process_is_killed(
    openai_upstream: FakeOpenAI, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    traced = await start_traced(single_backend_policy(openai_upstream.url), otlp_url)
    assert traced.provider is not None
    pipe = the_pipe(traced.provider)
    assert (await post(traced.gateway.url, CHAT))[0] == 200
    await traced.flush()
    await receiver.wait_for(lambda s: len(s) == SPANS)
    assert pipe.process is not None
    pipe.process.kill()
    await asyncio.to_thread(pipe.process.wait)
    for _ in range(3):
        assert (await post(traced.gateway.url, CHAT))[0] == 200
    await asyncio.to_thread(pipe.hand_off)
    assert pipe.dropped_spans == 3 * SPANS
