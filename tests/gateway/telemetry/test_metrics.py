from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.timing import TimingSplit
from gateway.telemetry.metric_series import CounterFamily, GaugeFamily, HistogramFamily
from gateway.telemetry.metrics import GatewayMetrics, LabelGuard
from gateway.telemetry.service import Telemetry
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import scripted_request

EXPECTED = {
    # histograms
    "routegate_request_duration_seconds", "routegate_gateway_overhead_seconds",
    "routegate_queue_wait_seconds", "routegate_upstream_first_byte_seconds",
    "routegate_ttft_seconds", "routegate_inter_token_latency_seconds",
    "routegate_inference_seconds",
    # counters (exposed without the _total suffix as family names)
    "routegate_requests", "routegate_tokens", "routegate_spend_usd",
    "routegate_routing_decisions", "routegate_rate_limit_rejections", "routegate_shed_rejections",
    "routegate_fallbacks",
    # gauges
    "routegate_in_flight", "routegate_queue_depth",
}


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


async def test_exposition_parses_and_has_every_metric_after_traffic() -> None:
    clock = FakeClock()
    telemetry = Telemetry(clock=clock)
    await scripted_request(telemetry, clock)
    telemetry.metrics.observe_rejection("acme", "rpm")
    telemetry.metrics.observe_shed("local", "low")
    telemetry.metrics.observe_fallback("chat", "openai", "local")
    body, content_type = telemetry.metrics.render()
    assert content_type.startswith("text/plain")
    found = families(body.decode())
    missing = EXPECTED - {name for name, samples in found.items() if samples}
    assert not missing


async def test_request_metrics_carry_bounded_labels_and_values() -> None:
    clock = FakeClock()
    telemetry = Telemetry(clock=clock)
    await scripted_request(telemetry, clock)
    found = families(telemetry.metrics.render()[0].decode())
    (requests,) = [s for s in found["routegate_requests"] if s.name.endswith("_total")]
    assert requests.labels == {"route": "chat", "backend": "local", "model": "llama",
                               "tenant": "acme", "status": "200"}
    tokens = {s.labels["direction"]: s.value for s in found["routegate_tokens"]
              if s.name.endswith("_total")}
    assert tokens == {"input": 12.0, "output": 3.0}
    inference_sum = next(s for s in found["routegate_inference_seconds"] if s.name.endswith("_sum"))
    assert inference_sum.value == 0.0555
    gauges = {s.labels["backend"]: s.value for s in found["routegate_in_flight"]}
    assert gauges == {"local": 0.0}  # the attempt ended


async def test_inference_histogram_stays_empty_when_the_backend_reports_nothing() -> None:
    clock = FakeClock()
    telemetry = Telemetry(clock=clock)
    await scripted_request(telemetry, clock, upstream_headers={}, final_body={"choices": []})
    found = families(telemetry.metrics.render()[0].decode())
    counts = [s.value for s in found["routegate_inference_seconds"] if s.name.endswith("_count")]
    assert not any(counts)  # nothing observed: no zero standing in for "unknown"
    durations = [s.value for s in found["routegate_request_duration_seconds"]
                 if s.name.endswith("_count")]
    assert durations == [1.0]


def test_two_apps_do_not_share_metrics() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    a.observe_decision("chat", "local", "cheapest")
    assert b"cheapest" not in b.render()[0]


def test_label_guard_folds_values_past_its_cap_into_other() -> None:
    guard = LabelGuard(max_values=2)
    assert [guard("model", m) for m in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]


def samples_of(metrics: GatewayMetrics, family: str) -> list:
    return families(metrics.render()[0].decode())[family]


def finished(metrics: GatewayMetrics, *, total_ms: float, tenant: str = "acme",
             model: str = "llama") -> None:
    metrics.observe_request(route="chat", backend="local", model=model, tenant=tenant,
                            status=200, split=TimingSplit(gw_ms=0.5, queue_ms=0.0,
                                                          upstream_ms=total_ms, total_ms=total_ms))


def test_a_value_equal_to_a_bucket_bound_lands_in_that_bucket() -> None:
    m = GatewayMetrics()
    finished(m, total_ms=250.0)  # 0.25 s: exactly the `le="0.25"` bound
    buckets = {s.labels["le"]: s.value for s in samples_of(m, "routegate_request_duration_seconds")
               if s.name.endswith("_bucket")}
    assert (buckets["0.1"], buckets["0.25"], buckets["0.5"]) == (0.0, 1.0, 1.0)


def test_bucket_counts_are_cumulative_and_inf_equals_count() -> None:
    m = GatewayMetrics()
    for total_ms in (3.0, 40.0, 40.0, 2_000.0, 900_000.0):  # the last one past every bound
        finished(m, total_ms=total_ms)
    samples = samples_of(m, "routegate_request_duration_seconds")
    buckets = [s.value for s in samples if s.name.endswith("_bucket")]
    (count,) = [s.value for s in samples if s.name.endswith("_count")]
    (total,) = [s.value for s in samples if s.name.endswith("_sum")]
    assert buckets == sorted(buckets) and buckets[0] == 1.0 and buckets[-2] == 4.0
    assert buckets[-1] == count == 5.0
    assert total == pytest.approx(0.003 + 0.04 + 0.04 + 2.0 + 900.0)


def test_gauges_go_up_and_down() -> None:
    m = GatewayMetrics()
    in_flight = m.in_flight_of("local")
    in_flight.inc()
    in_flight.inc()
    m.queue_depth_of("local").inc()
    assert [s.value for s in samples_of(m, "routegate_in_flight")] == [2.0]
    in_flight.dec()
    m.queue_depth_of("local").dec()
    assert [s.value for s in samples_of(m, "routegate_in_flight")] == [1.0]
    assert [s.value for s in samples_of(m, "routegate_queue_depth")] == [0.0]


def test_label_values_past_the_guards_cap_are_counted_under_other() -> None:
    m = GatewayMetrics(max_label_values=2)
    for tenant in ("a", "b", "c", "d", "a"):
        finished(m, total_ms=10.0, tenant=tenant)
    counts = {s.labels["tenant"]: s.value for s in samples_of(m, "routegate_requests")
              if s.name.endswith("_total")}
    assert counts == {"a": 2.0, "b": 1.0, "other": 2.0}


def test_a_counter_refuses_to_go_down() -> None:
    with pytest.raises(ValueError, match="only go up"):
        CounterFamily("c", "doc", ["x"]).labels("1").inc(-1)


def test_unlabelled_counter_shows_zero_before_any_increment() -> None:
    m = GatewayMetrics()
    (total,) = [s for s in samples_of(m, "routegate_trace_spans_dropped")
                if s.name.endswith("_total")]
    assert total.value == 0.0


def without_created_values(text: str) -> str:
    return re.sub(r"(_created(?:\{[^}]*\})?) \S+", r"\1 T", text)


@pytest.mark.parametrize("bounds", [(0.005, 0.25, 1.0), (-1.0, -0.1, 0.0, 0.1, 1.0)])
def test_families_render_as_prometheus_client_metrics_do(bounds: tuple[float, ...]) -> None:
    values = (-2.0, -0.1, 0.0, 0.005, 0.1, 0.3, 1.0, 7.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = HistogramFamily("x_seconds", "h doc", ["a", "b"], bounds, registry=ours)
    c = CounterFamily("x_events", "c doc", ["a"], registry=ours)
    g = GaugeFamily("x_level", "g doc", ["a"], registry=ours)
    ref_h = Histogram("x_seconds", "h doc", ["a", "b"], buckets=bounds, registry=theirs)
    ref_c = Counter("x_events", "c doc", ["a"], registry=theirs)
    ref_g = Gauge("x_level", "g doc", ["a"], registry=theirs)
    for v in values:
        h.labels("p", "q").observe(v)
        ref_h.labels("p", "q").observe(v)
    for labels in (("u",), ("v",), ("u",)):
        c.labels(*labels).inc(2.5)
        ref_c.labels(*labels).inc(2.5)
        g.labels(*labels).inc()
        ref_g.labels(*labels).inc()
    g.labels("v").dec(3)
    ref_g.labels("v").dec(3)
    assert without_created_values(generate_latest(ours).decode()) == \
        without_created_values(generate_latest(theirs).decode())
