"""A real OTLP trace receiver on loopback: HTTP (`POST /v1/traces`) and gRPC.

Requests are decoded with `opentelemetry-proto`, exactly as a collector would,
and flattened into `ReceivedSpan`s that tests can query.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

KINDS = {
    PbSpan.SPAN_KIND_INTERNAL: "INTERNAL",
    PbSpan.SPAN_KIND_SERVER: "SERVER",
    PbSpan.SPAN_KIND_CLIENT: "CLIENT",
    PbSpan.SPAN_KIND_PRODUCER: "PRODUCER",
    PbSpan.SPAN_KIND_CONSUMER: "CONSUMER",
}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


@dataclass
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[str] = field(default_factory=list)
    status_code: int = 0

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def decode(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(ReceivedSpan(
                    service=str(resource.get("service.name", "")),
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None,
                    name=span.name,
                    kind=KINDS.get(span.kind, str(span.kind)),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes={kv.key: _value(kv.value) for kv in span.attributes},
                    events=[event.name for event in span.events],
                    status_code=span.status.code,
                ))
    return out


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = asyncio.Event()

    def _accept(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        self.requests += 1
        self.spans.extend(decode(request))
        self._changed.set()

    async def handle_http(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(body)
        self._accept(message)
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    async def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 10.0
    ) -> list[ReceivedSpan]:
        """Wait until the spans received so far satisfy `predicate`."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self.spans):
                self._changed.clear()
                await self._changed.wait()
        return self.spans

    def by_name(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]


class _GrpcTraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver, loop: asyncio.AbstractEventLoop) -> None:
        self.receiver, self.loop = receiver, loop

    async def Export(self, request: Any, context: Any) -> Any:  # gRPC names the method
        self.receiver._accept(request)
        return trace_service_pb2.ExportTraceServiceResponse()


async def start_http(receiver: OtlpReceiver) -> tuple[web.AppRunner, str]:
    """Serve `POST /v1/traces`; returns the runner and the base URL."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", receiver.handle_http)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def start_grpc(receiver: OtlpReceiver) -> tuple[Any, str]:
    import grpc

    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
        _GrpcTraceService(receiver, asyncio.get_running_loop()), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"http://127.0.0.1:{port}"
