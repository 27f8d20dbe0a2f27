"""A request recorded for the exporter process: its root is sampled as `Tracer.start_span`
would sample it, whatever the sampler and the inbound `traceparent`."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, _TracerConfig
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    INVALID_SPAN,
    SpanKind,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry.record_span import RecordedTrace, RecordSpans
from gateway.telemetry.span_records import Resource, SpansOf
from gateway.telemetry.spans import extract_parent, tracer_of
from tests.gateway.telemetry.sampling import INBOUND, UNSAMPLED, Kept, Tagging

ATTRIBUTES = {"http.route": "/v1/chat/completions", "routegate.request_id": "r1"}


class Sequential(IdGenerator):
    """Ids from a fixed sequence spread over all 128 bits (so a ratio sampler decides
    both ways), the same for two providers built alike."""

    def __init__(self, random: bool) -> None:
        self._next: Iterator[int] = (n * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128) or 1
                                     for n in count(1))
        self._random = random

    def generate_span_id(self) -> int:
        return next(self._next) & ((1 << 64) - 1) or 1

    def generate_trace_id(self) -> int:
        return next(self._next)

    def is_trace_id_random(self) -> bool:
        return self._random


def sdk_root(provider: TracerProvider, headers: dict[str, str]) -> Any:
    return tracer_of(provider).start_span("POST /x", context=extract_parent(headers),
                                          kind=SpanKind.SERVER, attributes=dict(ATTRIBUTES))


def parent_of(span: Any) -> tuple[int, bool] | None:
    parent = span.parent
    return None if parent is None else (parent.span_id, parent.is_remote)


def traceparent_of(span: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(out, context=set_span_in_context(span))
    return out


SAMPLERS = [ALWAYS_ON, ALWAYS_OFF, ParentBased(ALWAYS_ON), ParentBased(ALWAYS_OFF),
            TraceIdRatioBased(0.5), ParentBased(TraceIdRatioBased(0.5)), Tagging()]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s.get_description())
@pytest.mark.parametrize("headers", [{}, INBOUND, UNSAMPLED], ids=["new", "sampled", "unsampled"])
@pytest.mark.parametrize("random_ids", [True, False])
def test_the_root_is_sampled_and_propagated_as_the_sdk_does(
        sampler: Sampler, headers: dict[str, str], random_ids: bool) -> None:
    sdk = TracerProvider(sampler=sampler, id_generator=Sequential(random_ids))
    kept = Kept()
    ours = TracerProvider(sampler=sampler, id_generator=Sequential(random_ids))
    ours.add_span_processor(kept)
    records = RecordSpans.for_tracer(tracer_of(ours))
    assert records is not None
    decisions = set()
    for _ in range(40):  # a ratio sampler takes some and leaves others
        theirs = sdk_root(sdk, headers)
        trace = records.trace("POST /x", headers, dict(ATTRIBUTES))
        assert isinstance(trace, RecordedTrace)
        assert trace.recording is theirs.is_recording()
        decisions.add(trace.recording)
        injected: dict[str, str] = {}
        trace.inject(INVALID_SPAN, injected)  # not a child of this trace: the root's own
        assert injected == traceparent_of(theirs)
        assert trace.trace_id == f"{theirs.get_span_context().trace_id:032x}"
        kept.records.clear()
        trace.end(200)
        if not theirs.is_recording():
            assert kept.records == []
            continue
        theirs.end()
        sdk_span: ReadableSpan = theirs
        (root,) = SpansOf(Resource({}), count(1).__next__)(kept.records)
        assert root.context.span_id == sdk_span.context.span_id
        assert parent_of(root) == parent_of(sdk_span)
        expected = {**dict(sdk_span.attributes or {}), "http.response.status_code": 200}
        assert root.attributes == expected
    if isinstance(sampler, TraceIdRatioBased) and headers == {}:
        assert decisions == {True, False}


def test_a_tracer_disabled_after_start_records_nothing_and_forwards_the_inbound_context(
) -> None:
    kept = Kept()
    provider = TracerProvider()
    provider.add_span_processor(kept)
    tracer = tracer_of(provider)
    records = RecordSpans.for_tracer(tracer)
    assert records is not None
    tracer._set_tracer_config(_TracerConfig(is_enabled=False))  # type: ignore[attr-defined]
    trace = records.trace("POST /x", INBOUND, dict(ATTRIBUTES))
    assert not isinstance(trace, RecordedTrace) and not trace.recording
    injected: dict[str, str] = {}
    trace.inject(INVALID_SPAN, injected)
    assert injected == INBOUND
    trace.end(200)
    assert kept.records == []
