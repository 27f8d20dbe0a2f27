"""One exporter process serves several gateways at once (`serve --workers N`).

Real parts throughout: the exporter process as the supervisor runs it
(`SharedExporter`), gateways' connections to its socket speaking `frames.py`, and a
real OTLP/HTTP receiver (or one that refuses every export) on loopback.
"""

from __future__ import annotations

import asyncio
import marshal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.core.record import RequestRecord
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing
from gateway.telemetry.tracing.export_process import exporter_config
from gateway.telemetry.tracing.frames import (
    ACK,
    DROPPED,
    EXPORTED,
    FLUSH,
    HEAD,
    RECORDS,
    TOKEN,
    frame,
)
from gateway.telemetry.tracing.otlp_post import ExportConfig
from gateway.telemetry.tracing.pipe import MARSHAL_VERSION, SpanPipe
from gateway.telemetry.tracing.setup import (
    TracingConfigError,
    resource_from_env,
    sampler_from_env,
    shared_exporter_env,
    tracing_from_env,
)
from gateway.telemetry.tracing.shared_exporter import SharedExporter
from gateway.telemetry.tracing.trace_context import Sampling
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver
from tests.gateway.telemetry.sampling import Kept
from tests.gateway.telemetry.scripted_request import scripted_request

SPANS = 6  # a scripted request's spans
REPLY_TIMEOUT_S = 10.0


async def records(count: int) -> list[RequestRecord]:
    """`count` finished, sampled request records, as the request path hands them over."""
    kept = Kept()
    telemetry = Telemetry(tracing=Tracing(Sampling(sampler_from_env({})), kept))
    for _ in range(count):
        await scripted_request(telemetry)
    return kept.records


@dataclass
class Reply:
    """What a gateway heard back up to the ack of its flush."""

    token: int
    exported: int
    dropped: int


class Gateway:
    """A gateway's end of a connection to the shared exporter, speaking `frames.py`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: Path) -> Gateway:
        return cls(*await asyncio.open_unix_connection(str(path)))

    def send(self, batch: list[RequestRecord]) -> None:
        self.writer.write(frame(RECORDS, marshal.dumps(
            [marshal.dumps(r.plain(), MARSHAL_VERSION) for r in batch], MARSHAL_VERSION)))

    def flush(self, token: int) -> None:
        self.writer.write(frame(FLUSH, TOKEN.pack(token)))

    async def reply(self) -> Reply:
        """Counts of this connection's spans, up to and with the next ack."""
        exported = dropped = 0
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while True:
                size, kind = HEAD.unpack(await self.reader.readexactly(HEAD.size))
                (value,) = TOKEN.unpack(await self.reader.readexactly(size))
                if kind == ACK:
                    return Reply(value, exported, dropped)
                exported += value if kind == EXPORTED else 0
                dropped += value if kind == DROPPED else 0

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


StartShared = Callable[..., Awaitable[SharedExporter]]


@pytest.fixture
async def receiver_url(otlp_receiver: tuple[OtlpReceiver, str]) -> AsyncIterator[str]:
    yield otlp_receiver[1] + "/v1/traces"


@pytest.fixture
async def start_shared() -> AsyncIterator[StartShared]:
    """`await start_shared(endpoint)`: the exporter process running as the supervisor
    runs it, listening in a private directory (short: a Unix socket path is too)."""
    running: list[tuple[SharedExporter, asyncio.Task[None]]] = []

    with tempfile.TemporaryDirectory(prefix="rg-") as directory:
        async def start(endpoint: str, restart_after_s: float = 5.0,
                        schedule_delay_s: float = 3600.0) -> SharedExporter:
            config = exporter_config(ExportConfig(endpoint=endpoint, timeout_s=5.0),
                                     resource={"service.name": "routegate"}, schema_url="",
                                     max_batch_spans=2048, schedule_delay_s=schedule_delay_s)
            shared = SharedExporter(config, Path(directory) / f"e{len(running)}.sock",
                                    restart_after_s=restart_after_s)
            shared.listen()
            running.append((shared, asyncio.create_task(shared.run())))
            return shared

        yield start
        for shared, task in running:
            await shared.stop()
            await asyncio.wait_for(task, REPLY_TIMEOUT_S)


async def test_one_exporter_process_serves_two_gateways_and_acks_each_flush_on_its_connection(
    otlp_receiver: tuple[OtlpReceiver, str], start_shared: StartShared,
) -> None:
    receiver, url = otlp_receiver
    shared = await start_shared(url + "/v1/traces")
    first, second = await Gateway.connect(shared.path), await Gateway.connect(shared.path)
    first.send(await records(2))
    second.send(await records(3))
    first.flush(11)
    second.flush(22)
    assert await first.reply() == Reply(token=11, exported=2 * SPANS, dropped=0)
    assert await second.reply() == Reply(token=22, exported=3 * SPANS, dropped=0)
    assert len(receiver.spans) == 5 * SPANS
    assert len({span.trace_id for span in receiver.spans}) == 5
    assert shared.starts == 1
    await first.close()
    await second.close()


async def test_spans_the_collector_refuses_are_reported_to_the_gateway_that_sent_them(
    refusing_collector: str, start_shared: StartShared,
) -> None:
    shared = await start_shared(refusing_collector)
    first, second = await Gateway.connect(shared.path), await Gateway.connect(shared.path)
    first.send(await records(2))
    second.send(await records(1))
    first.flush(1)
    second.flush(2)
    assert await first.reply() == Reply(token=1, exported=0, dropped=2 * SPANS)
    assert await second.reply() == Reply(token=2, exported=0, dropped=SPANS)
    await first.close()
    await second.close()


async def test_a_gateway_that_goes_away_ends_only_its_own_connection(
    otlp_receiver: tuple[OtlpReceiver, str], start_shared: StartShared,
) -> None:
    receiver, url = otlp_receiver
    shared = await start_shared(url + "/v1/traces")
    leaving, staying = await Gateway.connect(shared.path), await Gateway.connect(shared.path)
    leaving.send(await records(1))
    await leaving.close()  # a worker that exited: its spans still go out with the batch
    staying.send(await records(1))
    staying.flush(5)
    assert (await staying.reply()).token == 5
    await receiver.wait_for(lambda spans: len(spans) == 2 * SPANS)
    assert shared.process is not None and shared.process.returncode is None
    await staying.close()


async def test_stopping_it_exports_what_it_holds_and_the_process_exits(
    otlp_receiver: tuple[OtlpReceiver, str], start_shared: StartShared,
) -> None:
    receiver, url = otlp_receiver
    shared = await start_shared(url + "/v1/traces")
    gateway = await Gateway.connect(shared.path)
    gateway.send(await records(2))
    gateway.flush(1)  # so the records are in the exporter process before it is stopped
    assert (await gateway.reply()).exported == 2 * SPANS
    gateway.send(await records(1))  # held for the next batch (the delay is an hour)
    await gateway.close()
    await shared.stop()
    assert shared.process is not None and shared.process.returncode == 0
    assert len(receiver.spans) == 3 * SPANS
    assert not shared.path.exists()


def connecting_pipe(endpoint: str, path: Path, **options: float) -> tuple[Telemetry, SpanPipe]:
    """A worker's pipe: sends to the exporter process at `path`, starts none."""
    resource = resource_from_env({}, "routegate")
    pipe = SpanPipe(ExportConfig(endpoint=endpoint), resource=dict(resource.attributes),
                    connect_to=str(path), **options)  # type: ignore[arg-type]
    return Telemetry(tracing=Tracing(Sampling(sampler_from_env({})), pipe)), pipe


async def test_a_workers_tracing_sends_to_the_exporter_its_supervisor_names(
    otlp_receiver: tuple[OtlpReceiver, str], start_shared: StartShared,
) -> None:
    receiver, url = otlp_receiver
    shared = await start_shared(url + "/v1/traces")
    tracing = tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": url,
                                **shared_exporter_env(shared.path)})
    assert tracing is not None and isinstance(tracing.sink, SpanPipe)
    await scripted_request(Telemetry(tracing=tracing))
    assert await asyncio.to_thread(tracing.sink.force_flush)
    assert len(receiver.spans) == SPANS
    assert tracing.sink.process is None  # no exporter process of its own
    await asyncio.to_thread(tracing.sink.shutdown)
    assert shared.process is not None and shared.process.returncode is None  # others' still


def test_a_shared_exporter_address_that_is_not_a_unix_socket_is_refused_at_start() -> None:
    with pytest.raises(TracingConfigError, match="unix:PATH"):
        tracing_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                          "ROUTEGATE_TRACE_EXPORTER": "tcp://127.0.0.1:9"})


async def test_a_pipe_whose_exporter_cannot_be_reached_drops_and_counts_without_waiting(
    receiver_url: str,
) -> None:
    with tempfile.TemporaryDirectory(prefix="rg-") as directory:
        telemetry, pipe = connecting_pipe(receiver_url, Path(directory) / "nobody.sock",
                                          handoff_s=3600.0)
        for _ in range(3):
            await scripted_request(telemetry)
        started = time.monotonic()
        pipe.hand_off()
        assert time.monotonic() - started < 0.1
        assert pipe.dropped_spans == telemetry.dropped_spans() == 3 * SPANS
        await asyncio.to_thread(pipe.shutdown)


async def test_a_pipe_connects_again_once_the_shared_exporter_is_restarted(
    otlp_receiver: tuple[OtlpReceiver, str], start_shared: StartShared,
) -> None:
    receiver, url = otlp_receiver
    shared = await start_shared(url + "/v1/traces", restart_after_s=0.2)
    telemetry, pipe = connecting_pipe(url + "/v1/traces", shared.path, handoff_s=3600.0,
                                      restart_after_s=0.2)
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)
    first = shared.process
    assert first is not None
    first.kill()
    await first.wait()
    await scripted_request(telemetry)
    pipe.hand_off()  # the connection has ended: these spans are dropped, and counted
    assert pipe.dropped_spans == SPANS
    for _ in range(200):  # restarted 0.2 s after it died
        if shared.starts == 2:
            break
        await asyncio.sleep(0.05)
    assert shared.starts == 2
    await asyncio.sleep(0.2)  # the pipe's own wait before it connects again
    await scripted_request(telemetry)
    assert await asyncio.to_thread(pipe.force_flush)
    assert len(receiver.spans) == 2 * SPANS and pipe.dropped_spans == SPANS
    assert shared.process is not None and shared.process.pid != first.pid
    await asyncio.to_thread(pipe.shutdown)
