from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.metrics import GatewayMetrics, LabelGuard
from gateway.telemetry.service import Telemetry
from tests.gateway.telemetry.fake_clock import FakeClock
from tests.gateway.telemetry.scripted_request import scripted_request

ROOT = Path(__file__).resolve().parents[3]

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
    tel = await scripted_request(telemetry, clock)
    tel.rejected("rate_limit", limit="rpm")
    tel.rejected("shed", priority="low")
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


WORKER = textwrap.dedent("""
    import sys
    from gateway.telemetry.metrics import GatewayMetrics
    m = GatewayMetrics(multiprocess_dir=sys.argv[1])
    m.observe_decision("chat", "local", "cheapest")
    m.in_flight.labels("local").inc()
    if sys.argv[2] == "render":
        sys.stdout.write(m.render()[0].decode())
""")


def test_multi_process_workers_are_aggregated_by_any_worker(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    run = [sys.executable, "-c", WORKER, str(tmp_path)]
    subprocess.run([*run, "write"], env=env, check=True, cwd=ROOT, timeout=60)
    out = subprocess.run([*run, "render"], env=env, check=True, cwd=ROOT, timeout=60,
                         capture_output=True, text=True).stdout
    found = families(out)
    (decisions,) = [s for s in found["routegate_routing_decisions"] if s.name.endswith("_total")]
    assert decisions.value == 2.0  # one from each worker process
