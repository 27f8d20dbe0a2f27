"""The calls the pipeline makes on `RequestTelemetry`, with plain values."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry.attempt import content_events
from gateway.telemetry.service import Telemetry
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import target

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}\n\n'


def chunk(text: str, finish: str | None = None) -> bytes:
    return CHUNK % (text.encode(), (f'"{finish}"' if finish else "null").encode())


def traced() -> tuple[Telemetry, InMemorySpanExporter, FakeClock]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    clock = FakeClock()
    return Telemetry(provider=provider, clock=clock), spans, clock


def test_content_events_count_only_chunks_with_text() -> None:
    data = chunk("") + chunk("Hel") + chunk("lo") + b'data: {"choices":[],"usage":{}}\n\n'
    assert content_events(data) == 2


def test_content_events_count_chunks_written_with_spaces_after_colons() -> None:
    data = (b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n'
            b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n'
            b'data: {"choices": [{"text": "lo", "index": 0}]}\n\n')
    assert content_events(data) == 2


def test_relayed_bytes_give_ttft_tokens_and_finish_reasons() -> None:
    telemetry, spans, clock = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/v1/chat/completions",
                          headers={})
    attempt = tel.upstream(target("local"), {})
    clock.advance_ms(30)
    tel.relayed(chunk(""))  # the role-only first chunk is not a token
    clock.advance_ms(10)
    tel.relayed(chunk("Hi") + chunk(" there"))
    clock.advance_ms(10)
    tel.relayed(chunk("!", finish="stop"))
    attempt.end()
    split = tel.finish(200)
    assert split.ttft_ms == pytest.approx(40)
    assert tel.timings.tokens_relayed == 3
    assert tel.finish_reasons == ["stop"]
    (upstream,) = [s for s in spans.get_finished_spans() if s.name == "chat llama"]
    assert [e.name for e in upstream.events] == ["gen_ai.first_token"]


def test_final_chunk_metrics_become_the_inference_figure() -> None:
    telemetry, _, _ = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    tel.upstream(target("local"), {})
    tel.final_chunk({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                     "metrics": {"queue_ms": 1.0, "inference_ms": 42.0}})
    split = tel.close(200, usage={"prompt_tokens": 5, "completion_tokens": 2},
                      target=target("local"))
    assert split.inference_ms == 42.0
    assert (tel.input_tokens, tel.output_tokens) == (5, 2)
    assert tel.cost_usd == pytest.approx(5 * 100e-6 + 2 * 300e-6)


def test_decided_reads_a_route_decision_by_attribute() -> None:
    telemetry, spans, _ = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    primary = SimpleNamespace(ttft_ms=120.0, total_ms=900.0, cost_micro_usd=150)
    decision = SimpleNamespace(route="chat", objective="fastest", budget_missed=False,
                               decision_id="dec-9", primary=primary,
                               excluded=[SimpleNamespace(key="openai/x", reason="pii")])
    with tel.step("routegate.route") as span:
        tel.decided(span, "chat", [target("local"), target("openai")], decision)
    tel.finish(200)
    route = next(s for s in spans.get_finished_spans() if s.name == "routegate.route")
    attrs = dict(route.attributes or {})
    assert attrs["routegate.decision.reason"] == "fastest"
    assert attrs["routegate.predicted.cost_usd"] == pytest.approx(0.00015)
    assert attrs["routegate.decision.candidates"] == ("local/llama", "openai/llama")
    assert attrs["routegate.decision.excluded"] == ("openai/x: pii",)


def test_a_fallback_to_another_backend_is_counted_and_the_first_attempt_closed() -> None:
    telemetry, spans, _ = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    tel.routed(None, route="chat", backend="local", model="llama", reason="cheapest")
    first = tel.upstream(target("local"), {})
    first.failed("connection refused")
    tel.upstream(target("openai"), {})
    tel.finish(200)
    text = telemetry.metrics.render()[0].decode()
    assert 'routegate_fallbacks_total{from_backend="local",route="chat",to_backend="openai"} 1.0' \
        in text
    assert 'routegate_in_flight{backend="local"} 0.0' in text
    attempts = [s for s in spans.get_finished_spans() if s.name == "chat llama"]
    assert [dict(s.attributes or {})["routegate.attempt"] for s in attempts] == [1, 2]


@pytest.mark.parametrize(("status", "code", "kind", "expected"), [
    (429, "rate_limit_exceeded", "requests", 'limit="rpm"'),
    (429, "rate_limit_exceeded", "tokens", 'limit="tpm"'),
    (429, "budget_exceeded", "insufficient_quota", 'limit="budget"'),
])
def test_refusals_before_any_attempt_count_as_rejections(
    status: int, code: str, kind: str, expected: str,
) -> None:
    telemetry = Telemetry()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    tel.identify(tenant="acme")
    tel.refused(status, code, kind)
    assert expected in telemetry.metrics.render()[0].decode()


def test_a_429_from_the_upstream_is_not_our_rejection() -> None:
    telemetry = Telemetry()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    tel.upstream(target("openai"), {})
    tel.refused(429, "rate_limit_exceeded", "requests")
    assert "routegate_rate_limit_rejections_total{" not in telemetry.metrics.render()[0].decode()


class Slot:
    """A one-place queue slot, like the pipeline's `hooks.queue.slot(...)`."""

    def __init__(self) -> None:
        self.free = asyncio.Event()
        self.entered = self.exited = 0

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[None]:
        await self.free.wait()
        self.entered += 1
        try:
            yield
        finally:
            self.exited += 1


async def test_queued_traces_the_wait_for_a_slot_and_releases_it() -> None:
    telemetry, spans, clock = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    slot = Slot()

    async def use() -> None:
        async with tel.queued("local", slot()):
            assert slot.entered == 1

    task = asyncio.create_task(use())
    await asyncio.sleep(0)
    assert 'routegate_queue_depth{backend="local"} 1.0' in telemetry.metrics.render()[0].decode()
    clock.advance_ms(25)
    slot.free.set()
    await task
    assert slot.exited == 1
    assert tel.split().queue_ms == pytest.approx(25)
    (queue,) = [s for s in spans.get_finished_spans() if s.name == "routegate.queue.wait"]
    assert dict(queue.attributes or {})["routegate.queue.wait_ms"] == pytest.approx(25)


async def test_a_wait_the_queue_reports_itself_is_not_counted_twice() -> None:
    telemetry, _, clock = traced()
    tel = telemetry.begin(request_id="r", method="POST", path="/p", headers={})
    async with tel.queue_wait("local"):
        clock.advance_ms(25)
        tel.timings.add_wait("queue", 0.020)  # the queue's own, more precise figure
    assert tel.split().queue_ms == pytest.approx(20)
