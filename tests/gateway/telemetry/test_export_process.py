"""Spans leave the gateway through its exporter process, and nothing there can stall it.

Real parts throughout: the exporter process (`python -m
gateway.telemetry.tracing.export_process`), a real OTLP/HTTP receiver on loopback, and a
collector that accepts connections and never answers.
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing, tracing_from_env
from gateway.telemetry.tracing.export_process import Exporter, lower_autogroup_priority
from gateway.telemetry.tracing.otlp_post import ExportConfig
from gateway.telemetry.tracing.pipe import MARSHAL_VERSION, SpanPipe
from gateway.telemetry.tracing.setup import resource_from_env, sampler_from_env
from gateway.telemetry.tracing.trace_context import Sampling
from tests.conftest import single_backend_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.telemetry.conftest import StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, decode
from tests.gateway.telemetry.sampling import Kept
from tests.gateway.telemetry.scripted_request import scripted_request
from tests.gateway.telemetry.test_gateway_telemetry import CHAT, post

SPANS = 6  # a scripted request's spans
ROOT = Path(__file__).resolve().parents[3]


def piped(endpoint: str, timeout_s: float = 5.0,
          **options: float) -> tuple[Telemetry, SpanPipe, SpanPipe]:
    """(telemetry, its pipe, the pipe again: what flushes and shuts the export down)."""
    resource = resource_from_env({}, "routegate")
    export = ExportConfig(endpoint=endpoint, timeout_s=timeout_s)
    pipe = SpanPipe(export, resource=dict(resource.attributes), **options)  # type: ignore[arg-type]
    telemetry = Telemetry(tracing=Tracing(Sampling(sampler_from_env({})), pipe))
    return telemetry, pipe, pipe


def the_pipe(tracing: Tracing) -> SpanPipe:
    pipe = tracing.sink
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
    tracing = tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    assert tracing is not None
    provider = tracing.sink
    telemetry = Telemetry(tracing=tracing)
    tel = await scripted_request(telemetry)
    started = time.monotonic()
    assert await asyncio.to_thread(provider.force_flush)  # starts it, sends, waits
    assert time.monotonic() - started < 2.0
    pipe = the_pipe(tracing)
    assert pipe.process is not None and pipe.process.pid != os.getpid()
    spans = await receiver.wait_for(lambda s: len(s) == SPANS)
    assert {s.trace_id for s in spans} == {tel.trace_id}
    await asyncio.to_thread(provider.shutdown)


async def test_the_exporter_process_runs_below_the_gateway_even_in_a_session_of_its_own(
    receiver_url: str,
) -> None:
    telemetry, pipe, provider = piped(receiver_url)
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)
    assert pipe.process is not None
    pid = pipe.process.pid
    assert os.getsid(pid) == pid != os.getsid(0)  # Ctrl-C for the gateway does not reach it
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
    if autogroup_nice(os.getpid()) is not None:  # Linux with autogroup: per session
        assert autogroup_nice(pid) == 10
    await asyncio.to_thread(provider.shutdown)


def autogroup_nice(pid: int) -> int | None:
    """The nice value of `pid`'s scheduler autogroup; None where there is none.

    The file reads "/autogroup-N nice K"; it is missing without autogroup support and
    empty where the task is not in an autogroup (autogroup off, or a cgroup of its own)."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return int(fields[2]) if len(fields) == 3 and fields[1] == "nice" else None


def test_the_autogroup_priority_is_best_effort(tmp_path: Path) -> None:
    target = tmp_path / "autogroup"
    assert lower_autogroup_priority(str(target)) and target.read_text() == "10"
    assert not lower_autogroup_priority(str(tmp_path / "missing" / "autogroup"))


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


async def test_shutdown_before_the_first_hand_off_still_starts_the_exporter_and_exports(
    otlp_receiver: tuple[OtlpReceiver, str], receiver_url: str,
) -> None:
    receiver, _ = otlp_receiver
    telemetry, pipe, provider = piped(receiver_url, handoff_s=3600.0)
    await scripted_request(telemetry)  # a gateway stopped right after its first request
    await asyncio.to_thread(provider.shutdown)
    assert len(receiver.spans) == SPANS
    assert pipe.dropped_spans == 0


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


async def test_spans_an_exporter_process_dies_holding_are_counted_as_dropped(
    otlp_receiver: tuple[OtlpReceiver, str], receiver_url: str,
) -> None:
    receiver, _ = otlp_receiver
    telemetry, pipe, provider = piped(receiver_url, handoff_s=3600.0, restart_after_s=3600.0,
                                      schedule_delay_s=3600.0)
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)  # exported and reported: not at risk
    for _ in range(3):
        await scripted_request(telemetry)
    pipe.hand_off()  # handed over; the exporter holds them for its next batch
    process = pipe.process
    assert process is not None
    process.kill()
    await asyncio.to_thread(process.wait)
    pipe.hand_off()  # nothing queued: the hand-off thread's regular turn notices
    assert pipe.dropped_spans == telemetry.dropped_spans() == 3 * SPANS
    assert len(receiver.spans) == SPANS
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


async def test_the_queue_is_bounded_and_what_it_drops_is_counted_in_the_metrics(
        receiver_url: str) -> None:
    telemetry, pipe, provider = piped(receiver_url, handoff_s=3600.0,
                                      max_queue_spans=10 * SPANS)
    for _ in range(15):
        await scripted_request(telemetry)
    assert pipe.dropped_spans == telemetry.dropped_spans() == 5 * SPANS
    telemetry.metrics.observe_dropped_spans(telemetry.dropped_spans())  # read every second
    telemetry.metrics.observe_dropped_spans(telemetry.dropped_spans())  # counted once
    exposition = telemetry.metrics.render()[0].decode()
    assert f"routegate_trace_spans_dropped_total {float(5 * SPANS)}" in exposition
    await asyncio.to_thread(provider.shutdown)


async def test_the_gateway_keeps_serving_when_its_exporter_process_is_killed(
    openai_upstream: FakeOpenAI, start_traced: StartTraced,
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    traced = await start_traced(single_backend_policy(openai_upstream.url), otlp_url)
    assert traced.tracing is not None
    pipe = the_pipe(traced.tracing)
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


async def test_endpoint_headers_and_gzip_from_the_environment_reach_the_collector(
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    _, url = otlp_receiver
    seen: list[tuple[dict[str, str], bytes]] = []
    arrived = asyncio.Event()

    async def collector(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.read()))  # aiohttp un-gzips
        arrived.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/custom/traces", collector)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    tracing = tracing_from_env({
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,  # the traces endpoint wins, used as it is
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/custom/traces",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s%20cret,tenant=t1",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    assert tracing is not None
    provider = tracing.sink
    try:
        await scripted_request(Telemetry(tracing=tracing))
        assert await asyncio.to_thread(provider.force_flush)
        await asyncio.wait_for(arrived.wait(), 5.0)
        ((headers, body),) = seen
        assert headers["x-api-key"] == "s cret" and headers["tenant"] == "t1"
        assert headers["Content-Encoding"] == "gzip"
        assert int(headers["Content-Length"]) < len(body)  # it was sent compressed
        spans = decode(ExportTraceServiceRequest.FromString(body))
        assert len(spans) == SPANS
    finally:
        await asyncio.to_thread(provider.shutdown)
        await runner.cleanup()


GATEWAY_THAT_DIES = """
import asyncio, os, sys
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import tracing_from_env
from tests.gateway.telemetry.scripted_request import scripted_request
tracing = tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1]})
pipe = tracing.sink
asyncio.run(scripted_request(Telemetry(tracing=tracing)))
pipe.hand_off()  # handed to the exporter process, which waits for a full batch or 5 s
os._exit(0)  # no shutdown, no flush: the exporter sees end of file
"""


async def test_the_exporter_process_exports_and_exits_when_the_gateway_dies(
    otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, url = otlp_receiver
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", GATEWAY_THAT_DIES, url, cwd=ROOT)
    assert await process.wait() == 0
    spans = await receiver.wait_for(lambda s: len(s) == SPANS, timeout_s=3.0)
    assert len({s.trace_id for s in spans}) == 1


async def test_a_value_that_cannot_be_sent_costs_its_spans_not_the_request(
    otlp_receiver: tuple[OtlpReceiver, str], receiver_url: str,
) -> None:
    receiver, _ = otlp_receiver
    telemetry, pipe, provider = piped(receiver_url, handoff_s=3600.0)
    record = telemetry.begin(request_id="r", method="POST", path="/v1/chat/completions",
                             headers={})
    record.response_model = lambda: None  # type: ignore[assignment]  # not a plain value
    record.status = 200
    telemetry.finish(record)
    assert pipe.dropped_spans == 1
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)
    assert len(receiver.spans) == SPANS  # the next request's spans went out as ever
    await asyncio.to_thread(provider.shutdown)


async def test_spans_the_collector_refuses_are_counted_as_dropped(
        refusing_collector: str) -> None:
    telemetry, pipe, provider = piped(refusing_collector, handoff_s=3600.0)
    for _ in range(3):
        await scripted_request(telemetry)
    assert await asyncio.to_thread(provider.force_flush)
    assert pipe.dropped_spans == telemetry.dropped_spans() == 3 * SPANS
    telemetry.metrics.observe_dropped_spans(telemetry.dropped_spans())
    exposition = telemetry.metrics.render()[0].decode()
    assert f"routegate_trace_spans_dropped_total {float(3 * SPANS)}" in exposition
    await asyncio.to_thread(provider.shutdown)


async def test_frames_are_encoded_as_they_arrive_and_posted_a_batch_at_a_time() -> None:
    kept = Kept()
    telemetry = Telemetry(tracing=Tracing(Sampling(sampler_from_env({})), kept))
    for _ in range(7):
        await scripted_request(telemetry)
    posted: list[ExportTraceServiceRequest] = []

    def post(data: bytes) -> bool:
        posted.append(ExportTraceServiceRequest.FromString(data))
        return True

    exporter = Exporter({"export": {"endpoint": "http://127.0.0.1:9/v1/traces"},
                         "resource": {}, "max_batch_spans": 2 * SPANS,
                         "schedule_delay_s": 5.0}, post)
    frames = [kept.records[:3], kept.records[3:4], kept.records[4:]]
    for records in frames:  # as SpanPipe frames them: a marshalled list of records
        exporter.add(marshal.dumps([marshal.dumps(r.plain(), MARSHAL_VERSION)
                                    for r in records], MARSHAL_VERSION))
    assert [spans_in(p) for p in posted] == [2 * SPANS, 2 * SPANS, 2 * SPANS]
    assert exporter.pending_spans == SPANS and exporter.due_in() is not None
    exporter.export()  # the last, partial batch
    assert [spans_in(p) for p in posted][-1] == SPANS and exporter.due_in() is None
    assert exporter.exported == 7 * SPANS
    trace_ids = {s.trace_id for p in posted for rs in p.resource_spans
                 for ss in rs.scope_spans for s in ss.spans}
    assert len(trace_ids) == 7  # every request once, none split across requests


def spans_in(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
