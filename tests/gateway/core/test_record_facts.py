"""What the pipeline writes into a request's record, and what telemetry reports of it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.core.attempt_facts import Attempt, content_events
from gateway.core.errors import GatewayError
from gateway.core.record import RequestRecord
from gateway.limits.limiter import BudgetExceeded, RequestsLimitExceeded, TokensLimitExceeded
from gateway.pipeline.queue_wait import QueuedSlot
from gateway.pipeline.request_facts import note_decision
from gateway.telemetry.service import Telemetry
from gateway.telemetry.tracing import Tracing
from policies.load import ModelTarget
from routing.compliance import Excluded
from routing.decide import Candidate, RouteDecision
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import target

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}]}\n\n'


def chunk(text: str, finish: str | None = None) -> bytes:
    return CHUNK % (text.encode(), (f'"{finish}"' if finish else "null").encode())


def traced() -> tuple[Telemetry, InMemorySpanExporter, FakeClock]:
    spans = InMemorySpanExporter()
    clock = FakeClock()
    tracing = Tracing.to_processors([SimpleSpanProcessor(spans)])
    return Telemetry(tracing=tracing, clock=clock), spans, clock


def begin(telemetry: Telemetry) -> RequestRecord:
    return telemetry.begin(request_id="r", method="POST", path="/v1/chat/completions",
                           headers={})


def attempt(telemetry: Telemetry, record: RequestRecord, to: ModelTarget) -> Attempt:
    assert record.timings is not None
    return Attempt.start(record, to, record.timings,
                              telemetry.metrics.in_flight_of(to.backend_name), {},
                              telemetry.new_span_id)


def finish(telemetry: Telemetry, record: RequestRecord, status: int = 200) -> RequestRecord:
    record.status = status
    telemetry.finish(record)
    return record


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
    record = begin(telemetry)
    facts = attempt(telemetry, record, target("local"))
    clock.advance_ms(30)
    facts.relayed(chunk(""))  # the role-only first chunk is not a token
    clock.advance_ms(10)
    facts.relayed(chunk("Hi") + chunk(" there"))
    clock.advance_ms(10)
    facts.relayed(chunk("!", finish="stop"))
    facts.end()
    finish(telemetry, record)
    assert record.ttft_ms == pytest.approx(40)
    assert record.timings is not None and record.timings.tokens_relayed == 3
    assert record.finish_reasons == ["stop"]
    (upstream,) = [s for s in spans.get_finished_spans() if s.name == "chat llama"]
    assert [e.name for e in upstream.events] == ["gen_ai.first_token"]


def test_final_chunk_metrics_become_the_inference_figure() -> None:
    telemetry, _, _ = traced()
    record = begin(telemetry)
    facts = attempt(telemetry, record, target("local"))
    facts.body({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                "metrics": {"queue_ms": 1.0, "inference_ms": 42.0}})
    finish(telemetry, record)
    assert record.inference_ms == 42.0
    assert (record.input_tokens, record.output_tokens) == (5, 2)


def test_the_decision_is_read_from_the_routers_route_decision() -> None:
    telemetry, spans, _ = traced()
    record = begin(telemetry)
    local, openai = target("local"), target("openai")
    primary = Candidate(local.key, local, ttft_ms=120.0, total_ms=900.0, cost_micro_usd=150,
                        within_budget=True, queue_ms=0.0, explained_ttft_ms=120.0)
    decision = _decision(primary, Excluded("openai/x", "pii", "a rule"))
    with record.step("routegate.route"):
        note_decision(record, "chat", [local, openai], decision)
    finish(telemetry, record)
    route = next(s for s in spans.get_finished_spans() if s.name == "routegate.route")
    attrs = dict(route.attributes or {})
    assert attrs["routegate.decision.reason"] == "fastest"
    assert attrs["routegate.predicted.cost_usd"] == pytest.approx(0.00015)
    assert attrs["routegate.decision.candidates"] == ("local/llama", "openai/llama")
    assert attrs["routegate.decision.excluded"] == ("openai/x: pii",)


def _decision(primary: Candidate, excluded: Excluded) -> RouteDecision:
    fields: dict[str, Any] = {name: None for name in RouteDecision.__dataclass_fields__}
    fields.update(decision_id="dec-9", route="chat", objective="fastest",
                  candidates=(primary,), excluded=(excluded,), budget_missed=False)
    return RouteDecision(**fields)


def test_a_fallback_to_another_backend_is_counted_and_the_first_attempt_closed() -> None:
    telemetry, spans, _ = traced()
    record = begin(telemetry)
    record.route, record.decided_backend, record.reason = "chat", "local", "cheapest"
    first = attempt(telemetry, record, target("local"))
    first.failed("connection refused")
    attempt(telemetry, record, target("openai"))
    finish(telemetry, record)
    text = telemetry.metrics.render()[0].decode()
    assert 'routegate_fallbacks_total{from_backend="local",route="chat",to_backend="openai"} 1.0' \
        in text
    assert 'routegate_in_flight{backend="local"} 0.0' in text
    attempts = [s for s in spans.get_finished_spans() if s.name == "chat llama"]
    assert [dict(s.attributes or {})["routegate.attempt"] for s in attempts] == [1, 2]


@pytest.mark.parametrize(("error", "expected"), [
    (RequestsLimitExceeded("over"), 'limit="rpm"'),
    (TokensLimitExceeded("over"), 'limit="tpm"'),
    (BudgetExceeded("over"), 'limit="budget"'),
])
def test_refusals_before_any_attempt_count_as_rejections(
    error: GatewayError, expected: str,
) -> None:
    telemetry = Telemetry()
    record = begin(telemetry)
    record.tenant = "acme"
    record.rejection, record.rejected_limit = error.rejection, error.rejected_limit
    finish(telemetry, record, error.status)
    assert expected in telemetry.metrics.render()[0].decode()


def test_an_upstream_failure_is_not_our_rejection() -> None:
    assert GatewayError("upstream").rejection is None
    telemetry = Telemetry()
    record = begin(telemetry)
    attempt(telemetry, record, target("openai")).failed("rate limited", 429)
    finish(telemetry, record, 429)
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


def queued(telemetry: Telemetry, record: RequestRecord, slot: Any) -> QueuedSlot:
    assert record.timings is not None
    return QueuedSlot(record, record.timings, "local",
                      telemetry.metrics.queue_depth_of("local"), slot)


async def test_the_wait_for_a_slot_is_recorded_and_the_slot_released() -> None:
    telemetry, spans, clock = traced()
    record = begin(telemetry)
    slot = Slot()

    async def use() -> None:
        async with queued(telemetry, record, slot()):
            assert slot.entered == 1

    task = asyncio.create_task(use())
    await asyncio.sleep(0)
    assert 'routegate_queue_depth{backend="local"} 1.0' in telemetry.metrics.render()[0].decode()
    clock.advance_ms(25)
    slot.free.set()
    await task
    assert slot.exited == 1
    finish(telemetry, record)
    assert record.queue_ms == pytest.approx(25)
    (queue,) = [s for s in spans.get_finished_spans() if s.name == "routegate.queue.wait"]
    assert dict(queue.attributes or {})["routegate.queue.wait_ms"] == pytest.approx(25)


class Reporting:
    """A slot whose queue reports its own, more precise, wait."""

    def __init__(self, record: RequestRecord, clock: FakeClock) -> None:
        self.record, self.clock = record, clock

    async def __aenter__(self) -> None:
        self.clock.advance_ms(25)
        assert self.record.timings is not None
        self.record.timings.add_wait("queue", 0.020)

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_a_wait_the_queue_reports_itself_is_not_counted_twice() -> None:
    telemetry, _, clock = traced()
    record = begin(telemetry)
    async with queued(telemetry, record, Reporting(record, clock)):
        pass
    finish(telemetry, record)
    assert record.queue_ms == pytest.approx(20)
