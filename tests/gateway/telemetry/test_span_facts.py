"""Span attributes from facts: the same for a live span and for the exporter process."""

from __future__ import annotations

import marshal

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from gateway.telemetry.light_span import ChildSpans
from gateway.telemetry.record_span import give_facts
from gateway.telemetry.span_facts import DECISION, KEYS, QUEUE, ROOT, UPSTREAM, attributes_from
from gateway.telemetry.span_pipe import MARSHAL_VERSION
from gateway.telemetry.span_records import expanded
from gateway.telemetry.spans import tracer_of

DECIDED = (DECISION, "chat", "local", "cheapest", "d-1", 90.0, None, None, ["local/llama"],
           None)


def test_each_value_becomes_its_keys_attribute_and_an_unknown_one_is_left_out() -> None:
    assert attributes_from(DECIDED) == {
        "routegate.route": "chat", "routegate.backend": "local",
        "routegate.decision.reason": "cheapest", "routegate.decision.id": "d-1",
        "routegate.predicted.ttft_ms": 90.0, "routegate.decision.candidates": ["local/llama"]}
    assert attributes_from((QUEUE, "local", 0.25)) == {
        "routegate.backend": "local", "routegate.queue.wait_ms": 0.25}
    assert attributes_from((ROOT, *[None] * len(KEYS[ROOT]))) == {}
    upstream = attributes_from((UPSTREAM, "chat", "openai", "openai", "llama", "local", 2, True))
    assert upstream["routegate.attempt"] == 2 and upstream["routegate.fallback"] is True


def test_facts_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError):
        attributes_from((QUEUE, "local"))


def test_a_record_leaves_its_facts_and_the_exporter_process_makes_the_attributes() -> None:
    child: tuple[object, ...] = (0, "routegate.route", 0, 10, 20, ({}, DECIDED), (), 0, None)
    plain = (0, "routegate.auth", 0, 1, 2, {"k": "v"}, (), 0, None)
    root = (7, 0, False, "POST /v1/chat/completions", 1, 0, 30,
            ({"http.response.status_code": 200}, (QUEUE, "local", 1.5)), (), 0, None, (), 0)
    record = (("routegate.gateway", "", ""), 1, None, root, [plain, child])
    loaded = marshal.loads(marshal.dumps(record, MARSHAL_VERSION))  # as the pipe sends it
    _, _, _, out_root, (out_plain, out_child) = expanded(loaded)
    assert out_root[7] == {"http.response.status_code": 200, "routegate.backend": "local",
                           "routegate.queue.wait_ms": 1.5}
    assert out_child[5] == attributes_from(DECIDED) and out_plain == plain
    unchanged = (("s", "", ""), 1, None, (*root[:7], {"a": 1}, *root[8:]), [plain])
    assert expanded(unchanged) is unchanged


def test_a_live_span_gets_the_same_attributes_at_once() -> None:
    provider = TracerProvider()
    children = ChildSpans.for_tracer(tracer_of(provider))
    assert children is not None
    root = children.root("POST /x", Context(), SpanKind.SERVER, {})
    span = children.start("routegate.route", root.get_span_context(), SpanKind.INTERNAL, {},
                          root)
    give_facts(span, DECIDED)
    assert dict(span.attributes) == attributes_from(DECIDED)
