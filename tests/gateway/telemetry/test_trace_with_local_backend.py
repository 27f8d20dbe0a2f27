"""The acceptance test of the timing contract: gateway → real local_backend, one trace.

The local backend runs as its own process (`python -m local_backend --model demo`),
exporting its spans through the standard OTEL_* variables to the same real OTLP
receiver as the gateway; the receiver must end up with one trace holding both.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from gateway.core.inference_time import parse_server_timing
from tests.gateway.route.local_replicas import start_local_backend
from tests.gateway.telemetry.conftest import StartTraced
from tests.gateway.telemetry.otlp_receiver import OtlpReceiver, ReceivedSpan

ENGINE_SPANS = ("engine.queue", "engine.prefill", "engine.decode")
pytestmark = pytest.mark.slow


@pytest.fixture
async def local_backend(
    otlp_receiver: tuple[OtlpReceiver, str], tmp_path: Path,
) -> AsyncIterator[str]:
    """`python -m local_backend --model demo` exporting spans to the receiver; its /v1 URL."""
    _, otlp_url = otlp_receiver
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url,
           "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "routegate-local-backend"}
    env.pop("OTEL_TRACES_EXPORTER", None)
    backend = await start_local_backend(tmp_path, env=env)
    try:
        yield backend.url
    finally:
        await backend.stop()


def local_policy(url: str) -> dict:
    return {
        "version": 1,
        "backends": {"local": {"type": "openai", "url": url, "deployment": "dedicated",
                               "models": {"demo": {}}}},
        "routes": {"chat": {"targets": ["local/demo"]}},
        "auth": {"anonymous": {"enabled": True, "loopback_only": True}},
    }


def full_trace(trace_id: str) -> Callable[[list[ReceivedSpan]], bool]:
    def ready(spans: list[ReceivedSpan]) -> bool:
        names = {s.name for s in spans if s.trace_id == trace_id}
        return "POST /v1/chat/completions" in names and all(n in names for n in ENGINE_SPANS)
    return ready


async def test_gateway_and_engine_spans_form_one_consistent_trace(
    local_backend: str, start_traced: StartTraced, otlp_receiver: tuple[OtlpReceiver, str],
) -> None:
    receiver, otlp_url = otlp_receiver
    traced = await start_traced(local_policy(local_backend), otlp_url)
    for index, stream in enumerate((False, True)):
        trace_id = f"{index + 1:032x}"
        caller = f"00-{trace_id}-{index + 1:016x}-01"
        body = {"model": "chat", "max_tokens": 8, "stream": stream,
                "messages": [{"role": "user", "content": "hello there"}]}
        async with aiohttp.ClientSession() as session, session.post(
                traced.gateway.url + "/v1/chat/completions", json=body,
                headers={"traceparent": caller}) as response:
            assert response.status == 200
            raw = await response.read()
            header = response.headers["Server-Timing"]
        await traced.flush()
        spans = await receiver.wait_for(full_trace(trace_id), timeout_s=20)
        check_trace([s for s in spans if s.trace_id == trace_id], raw, header, stream)


def check_trace(trace: list[ReceivedSpan], raw: bytes, header: str, stream: bool) -> None:
    (root,) = [s for s in trace if s.name == "POST /v1/chat/completions"]
    by_id = {s.span_id: s for s in trace}
    (client,) = [s for s in trace if s.kind == "CLIENT"]
    engine = {name: next(s for s in trace if s.name == name) for name in ENGINE_SPANS}
    for span in engine.values():  # each engine phase hangs, via the engine's span, under ours
        ancestors = []
        while span.parent_span_id in by_id:
            span = by_id[span.parent_span_id]
            ancestors.append(span.span_id)
        assert client.span_id in ancestors and ancestors[-1] == root.span_id
    assert {s.service for s in trace} == {"routegate", "routegate-local-backend"}
    for name in ("routegate.auth", "routegate.rate_limit", "routegate.route",
                 "routegate.queue.wait"):
        assert any(s.name == name and s.parent_span_id == root.span_id for s in trace), name

    # The split the client saw, in the final SSE comment for a stream.
    if stream:
        (line,) = [e for e in raw.split(b"\n\n") if e.startswith(b": server-timing ")]
        header = line.decode().removeprefix(": server-timing ")
    t = parse_server_timing(header)
    assert t["queue"] + t["upstream"] <= t["total"] + 0.001
    assert abs(t["gw"] + t["queue"] + t["upstream"] - t["total"]) <= 1.0
    assert 0 < t["inference"] <= t["upstream"]  # the engine's own figure, not ours
    a = root.attributes
    assert a["routegate.timing.inference_ms"] == t["inference"]
    assert a["routegate.timing.inference_ms"] <= a["routegate.timing.upstream_ms"]
    # The engine's phases fit inside the upstream call as the gateway measured it.
    engine_ms = sum(s.duration_ms for s in engine.values())
    assert engine_ms <= client.duration_ms + 1.0
    assert client.duration_ms <= root.duration_ms
